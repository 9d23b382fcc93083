// WriteFileAtomically and RetryingFileWriter on real directories: what a CDI runtime or NFD
// reading the file sees, how a write that fails (here: its directory is not there yet) catches
// up once it can, and that a hung disk never holds up Stop().
#include "edgeaccel/host/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon_process.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::PathExists;
using ::edgeaccel::testing::ReadFileText;
using ::edgeaccel::testing::RunCommand;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

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
  EXPECT_EQ(ReadFileText(dir_.path() + "/spec"), "two\n");
  EXPECT_FALSE(PathExists(dir_.path() + "/.spec.tmp"));
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
  // Write() returns once the writer has settled what follows its write: with no retry pending
  // now, none is ever made.
  EXPECT_FALSE(writer.pending());
  EXPECT_EQ(writer.retries(), 0);
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
  EXPECT_EQ(ReadFileText(later_ + "/spec"), "first\n");
  EXPECT_EQ(log.Count("wrote the spec on retry"), 1);
}

// A write function the writer holds: `gone` expires once the writer has dropped it for good,
// which proves it can never run (and land) again, without waiting to see that nothing happens.
struct Tracked {
  RetryingFileWriter::WriteFn write;
  std::weak_ptr<int> gone;
};
Tracked Track(RetryingFileWriter::WriteFn write) {
  auto token = std::make_shared<int>(0);
  Tracked tracked{[token, write = std::move(write)] { return write(); }, token};
  return tracked;
}

TEST_F(AtomicFileTest, ANewerWriteReplacesThePendingOneAndTheOlderNeverLands) {
  RetryingFileWriter writer("the spec", kFast);
  Tracked older = Track(WriteLater("older\n"));
  EXPECT_FALSE(writer.Write(std::move(older.write)).ok());
  EXPECT_FALSE(writer.Write(WriteLater("newer\n")).ok());
  ASSERT_TRUE(Eventually([&] { return older.gone.expired(); })) << "the older write is still held";
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  ASSERT_TRUE(Eventually([&] { return !writer.pending(); }));
  EXPECT_EQ(ReadFileText(later_ + "/spec"), "newer\n");
}

TEST_F(AtomicFileTest, ASuccessfulWriteCancelsThePendingRetry) {
  RetryingFileWriter writer("the spec", kFast);
  Tracked older = Track(WriteLater("older\n"));
  EXPECT_FALSE(writer.Write(std::move(older.write)).ok());
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  EXPECT_TRUE(writer.Write(WriteLater("newer\n")).ok());
  EXPECT_FALSE(writer.pending());
  ASSERT_TRUE(Eventually([&] { return older.gone.expired(); })) << "the older write is still held";
  EXPECT_EQ(ReadFileText(later_ + "/spec"), "newer\n");
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

TEST_F(AtomicFileTest, StopDropsThePendingWriteAndWritesNothingAfter) {
  RetryingFileWriter writer("the spec", kFast);
  Tracked pending = Track(WriteLater("x"));
  EXPECT_FALSE(writer.Write(std::move(pending.write)).ok());
  writer.Stop();
  EXPECT_FALSE(writer.pending());
  EXPECT_TRUE(pending.gone.expired()) << "a stopped writer still holds the write it would retry";
  // After Stop nothing is written: a write there could hang on the disk Stop() must not wait for.
  ASSERT_EQ(mkdir(later_.c_str(), 0755), 0);
  absl::Status after = writer.Write(WriteLater("y"));
  EXPECT_TRUE(absl::IsFailedPrecondition(after)) << after;
  EXPECT_FALSE(PathExists(later_ + "/spec"));
}

TEST_F(AtomicFileTest, RetriesBackOffToTheLongestWait) {
  RetryingFileWriter writer("the spec", {absl::Milliseconds(5), absl::Milliseconds(40)});
  absl::Mutex mu;
  std::vector<absl::Time> attempts;
  EXPECT_FALSE(writer
                   .Write([&] {
                     absl::MutexLock lock(&mu);
                     attempts.push_back(absl::Now());
                     return absl::UnavailableError("full");
                   })
                   .ok());
  // Waits of 5, 10, 20, 40, 40, 40 ms between attempts (no jitter): each at least that long,
  // and the last ones capped (generous upper bound: only that they stop doubling).
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return attempts.size() >= 8; };
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10)));
  const absl::Duration want[] = {absl::Milliseconds(5),  absl::Milliseconds(10),
                                 absl::Milliseconds(20), absl::Milliseconds(40),
                                 absl::Milliseconds(40), absl::Milliseconds(40),
                                 absl::Milliseconds(40)};
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_GE(attempts[i + 1] - attempts[i], want[i]) << "wait " << i;
  }
  EXPECT_LT(attempts[7] - attempts[6], absl::Milliseconds(160)) << "the wait kept doubling";
}

// ---------------------------------------------------------------------------------------------
// A disk that hangs: Stop() returns at once whatever the write in flight does.

// A write that hangs until released, as an fsync on a dying SD card does.
class HangingWrite {
 public:
  RetryingFileWriter::WriteFn Fn() {
    return [this] {
      started_.Notify();
      release_.WaitForNotification();
      return absl::OkStatus();
    };
  }
  bool WaitStarted() { return started_.WaitForNotificationWithTimeout(absl::Seconds(10)); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  absl::Notification started_, release_;
};

// Stop() on its own thread; true if it returned within `limit`. Either way it has returned by
// the time this does (after `unblock`), so a failing check never leaves a thread behind.
bool StopsWithin(RetryingFileWriter& writer, absl::Duration limit, const std::function<void()>& unblock) {
  absl::Notification stopped;
  std::thread stopper([&] {
    writer.Stop();
    stopped.Notify();
  });
  const bool in_time = stopped.WaitForNotificationWithTimeout(limit);
  unblock();
  stopper.join();
  return in_time;
}

TEST_F(AtomicFileTest, StopReturnsAtOnceWhileAWriteHangs) {
  HangingWrite hung;
  {
    RetryingFileWriter writer("the spec", kFast);
    absl::Notification returned;
    absl::Status status;
    std::thread caller([&] {
      status = writer.Write(hung.Fn());
      returned.Notify();
    });
    ASSERT_TRUE(hung.WaitStarted());
    EXPECT_TRUE(StopsWithin(writer, absl::Seconds(1), [&] { hung.Release(); }))
        << "Stop() waited for the disk";
    // The caller waiting in Write() is released by Stop() too, not by the disk.
    EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(1)));
    hung.Release();
    caller.join();
    EXPECT_TRUE(absl::IsCancelled(status) || status.ok()) << status;
  }  // the destructor joins the writer's thread once the write returned
}

TEST_F(AtomicFileTest, StopReturnsAtOnceWhileARetryHangs) {
  HangingWrite hung;
  std::atomic<int> calls{0};
  RetryingFileWriter::WriteFn hung_fn = hung.Fn();
  RetryingFileWriter writer("the spec", kFast);
  // Fails first (disk full), then the retry hangs.
  EXPECT_FALSE(writer
                   .Write([&, hung_fn] {
                     if (calls++ == 0) return absl::ResourceExhaustedError("No space left on device");
                     return hung_fn();
                   })
                   .ok());
  ASSERT_TRUE(hung.WaitStarted());
  EXPECT_TRUE(StopsWithin(writer, absl::Seconds(1), [&] { hung.Release(); }))
      << "Stop() waited for the disk";
  hung.Release();
}

TEST_F(AtomicFileTest, AWriteReleasedByStopMayOutliveTheWriter) {
  // Stop() releases the caller; the writer is destroyed (once the hung write returns) before
  // the caller's Write() has necessarily finished returning: nothing it touches may be gone.
  HangingWrite hung;
  auto writer = std::make_unique<RetryingFileWriter>("the spec", kFast);
  absl::Status status;
  std::thread caller([&] { status = writer->Write(hung.Fn()); });
  ASSERT_TRUE(hung.WaitStarted());
  EXPECT_TRUE(StopsWithin(*writer, absl::Seconds(1), [&] { hung.Release(); }));
  writer.reset();
  caller.join();
  EXPECT_TRUE(absl::IsCancelled(status) || status.ok()) << status;
}

// The same with a real fsync held by the kernel's tracer: this test runs itself again under
// strace, which delays every fsync by 3 s (docs/testing.md, "A slow disk"); the child writes
// a file through a RetryingFileWriter and stops it while the fsync is held.
constexpr char kSlowDiskChild[] = "EDGEACCEL_SLOW_DISK_CHILD";

TEST(SlowDiskTest, StopReturnsWithinASecondWhileAnFsyncIsHeldForSeconds) {
  if (getenv(kSlowDiskChild) != nullptr) {
    TempDir dir;
    auto writer = std::make_unique<RetryingFileWriter>("the spec");
    absl::Notification writing;
    std::thread caller([&] {
      writer->Write([&] {
        writing.Notify();
        return WriteFileAtomically(dir.path(), "spec", "x");
      }).IgnoreError();
    });
    writing.WaitForNotification();
    // The fsync is reached microseconds after `writing`, and held for 3 s from there.
    absl::Time start = absl::Now();
    writer->Stop();
    const absl::Duration stop = absl::Now() - start;
    caller.join();
    const absl::Duration released = absl::Now() - start;
    start = absl::Now();
    writer.reset();  // joins the writer's thread: waits for the held fsync
    const absl::Duration destroyed = absl::Now() - start;
    std::printf("stop %s released %s destroyed %s\n", absl::FormatDuration(stop).c_str(),
                absl::FormatDuration(released).c_str(), absl::FormatDuration(destroyed).c_str());
    EXPECT_LT(stop, absl::Seconds(1)) << "Stop() waited for the fsync";
    EXPECT_LT(released, absl::Seconds(1)) << "Write() waited for the fsync after Stop()";
    EXPECT_GT(stop + destroyed, absl::Seconds(1)) << "the fsync was not held: no slow disk";
    return;
  }
  if (access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "no strace here";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  CommandResult child = RunCommand(
      "/usr/bin/strace",
      {"-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e",
       "inject=fsync,fdatasync:delay_enter=3000000", "/usr/bin/env",
       absl::StrCat(kSlowDiskChild, "=1"),
       // LeakSanitizer cannot run under ptrace: an ASan build's child would fail at exit.
       absl::StrCat("ASAN_OPTIONS=", getenv("ASAN_OPTIONS") != nullptr ? getenv("ASAN_OPTIONS") : "",
                    ":detect_leaks=0"),
       self,
       absl::StrCat("--gtest_filter=", test->test_suite_name(), ".", test->name())},
      absl::Seconds(60));
  if (child.exit_code != 0 && child.err.find("ptrace") != std::string::npos) {
    GTEST_SKIP() << "strace cannot trace here: " << child.err;
  }
  EXPECT_EQ(child.exit_code, 0) << child.out << child.err;
  EXPECT_THAT(child.out, HasSubstr("[  PASSED  ] 1 test")) << child.out << child.err;
}

}  // namespace
}  // namespace edgeaccel
