// WriteFileAtomically and RetryingFileWriter on real directories: what a CDI runtime or NFD
// reading the file sees, and how a write that fails (here: its directory is not there yet)
// catches up once it can.
#include "edgeaccel/host/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Fast retries, so the tests do not wait seconds.
const RetryingFileWriter::Options kFast{absl::Milliseconds(5), absl::Milliseconds(20)};

class AtomicFileTest : public ::testing::Test {
 protected:
  TempDir dir_;
  const std::string later_ = dir_.path() + "/later";  // a directory made during the test
  RetryingFileWriter::WriteFn WriteLater(std::string content) {
    return [this, content] { return WriteFileAtomically(later_, "spec", content); };
  }
};

TEST_F(AtomicFileTest, ReplacesTheFileAndLeavesNoTemporary) {
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "spec", "one\n").ok());
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "spec", "two\n").ok());
  EXPECT_EQ(Read(dir_.path() + "/spec"), "two\n");
  EXPECT_FALSE(Exists(dir_.path() + "/.spec.tmp"));
}

TEST_F(AtomicFileTest, MissingDirectoryIsAnErrorThatNamesTheFile) {
  absl::Status status = WriteFileAtomically(later_, "spec", "x");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(later_ + "/.spec.tmp"));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
}

TEST_F(AtomicFileTest, AWriteThatSucceedsIsNotRetried) {
  RetryingFileWriter writer("the spec", kFast);
  EXPECT_TRUE(writer.Write([this] { return WriteFileAtomically(dir_.path(), "spec", "x"); }).ok());
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(writer.retries(), 0);
  EXPECT_FALSE(writer.pending());
}

TEST_F(AtomicFileTest, AFailedWriteLandsOnceItCanWithoutAnotherChange) {
  CapturedLog log;
  RetryingFileWriter writer("the spec", kFast);
  EXPECT_FALSE(writer.Write(WriteLater("first\n")).ok());
  EXPECT_TRUE(writer.pending());
  ASSERT_TRUE(Eventually([&] { return writer.retries() >= 3; }));
  EXPECT_EQ(log.Count("still cannot write"), 0) << "the same reason is not logged per retry";
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  ASSERT_TRUE(Eventually([&] { return !writer.pending(); }));
  EXPECT_EQ(Read(later_ + "/spec"), "first\n");
  EXPECT_EQ(log.Count("wrote the spec on retry"), 1);
}

TEST_F(AtomicFileTest, ANewerWriteReplacesThePendingOneAndTheOlderNeverLands) {
  RetryingFileWriter writer("the spec", kFast);
  EXPECT_FALSE(writer.Write(WriteLater("older\n")).ok());
  EXPECT_FALSE(writer.Write(WriteLater("newer\n")).ok());
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  ASSERT_TRUE(Eventually([&] { return !writer.pending(); }));
  EXPECT_EQ(Read(later_ + "/spec"), "newer\n");
  // Several retry periods later, still the newer one.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Read(later_ + "/spec"), "newer\n");
}

TEST_F(AtomicFileTest, ASuccessfulWriteCancelsThePendingRetry) {
  RetryingFileWriter writer("the spec", kFast);
  EXPECT_FALSE(writer.Write(WriteLater("older\n")).ok());
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  EXPECT_TRUE(writer.Write(WriteLater("newer\n")).ok());
  EXPECT_FALSE(writer.pending());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Read(later_ + "/spec"), "newer\n");
}

TEST_F(AtomicFileTest, ANewReasonIsLoggedOnceThenQuietUntilItChangesAgain) {
  CapturedLog log;
  RetryingFileWriter writer("the spec", kFast);
  // A regular file where the directory should be: "Not a directory", on every retry.
  ASSERT_TRUE(WriteFileAtomically(dir_.path(), "later", "in the way").ok());
  EXPECT_FALSE(writer.Write(WriteLater("x")).ok());
  ASSERT_TRUE(Eventually([&] { return writer.retries() >= 3; }));
  EXPECT_EQ(log.Count("still cannot write"), 0);
  // Now the reason changes: the file goes, and nothing is there.
  ASSERT_EQ(unlink(later_.c_str()), 0);
  const int64_t retries = writer.retries();
  ASSERT_TRUE(Eventually([&] { return writer.retries() >= retries + 3; }));
  EXPECT_EQ(log.Count("still cannot write the spec"), 1);
  EXPECT_TRUE(log.Contains("No such file or directory"));
}

TEST_F(AtomicFileTest, StopDropsThePendingWrite) {
  RetryingFileWriter writer("the spec", kFast);
  EXPECT_FALSE(writer.Write(WriteLater("x")).ok());
  writer.Stop();
  EXPECT_FALSE(writer.pending());
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(Exists(later_ + "/spec")) << "a stopped writer wrote";
  // After Stop a write is still made once, and not retried.
  EXPECT_TRUE(writer.Write(WriteLater("y")).ok());
  EXPECT_EQ(Read(later_ + "/spec"), "y");
}

TEST_F(AtomicFileTest, RetriesBackOffToTheLongestWait) {
  RetryingFileWriter writer("the spec", {absl::Milliseconds(5), absl::Milliseconds(80)});
  EXPECT_FALSE(writer.Write(WriteLater("x")).ok());
  // Waits of 5, 10, 20, 40, 80, 80... ms: in 400 ms about 8 retries, where a fixed 5 ms period
  // would make about 80. Generous bounds: this only shows the backoff grows and is capped.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_GE(writer.retries(), 4);
  EXPECT_LE(writer.retries(), 20);
}

}  // namespace
}  // namespace edgeaccel
