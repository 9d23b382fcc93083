// WriteFileAtomically on real directories: what a CDI runtime or NFD reading the file sees, and
// the error a write that cannot be made gives. (Its retries are the sinks' worker's:
// workers_test.cc; a slow disk under the real daemon: edgetpu_e2e_test.cc, SlowDiskTest.)
#include "edgeaccel/host/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::PathExists;
using ::edgeaccel::testing::ReadFileText;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

class AtomicFileTest : public ::testing::Test {
 protected:
  TempDir dir_;
  const std::string later_ = dir_.path() + "/later";  // a directory made during the test
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

}  // namespace
}  // namespace edgeaccel
