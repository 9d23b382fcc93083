#include "edgeaccel/host/once_logger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "captured_log.h"

namespace edgeaccel {
namespace {

using ::testing::HasSubstr;

TEST(OnceLoggerTest, EachDistinctWarningIsLoggedOnce) {
  testing::CapturedLog log;
  OnceLogger once;
  for (int i = 0; i < 5; ++i) {
    once.Warn("/sys/class/apex/apex_0/temp: not a number");
    once.Warn("/proc/driver/nvidia/version: unreadable");
  }
  EXPECT_EQ(log.Count("apex_0/temp: not a number"), 1);
  EXPECT_EQ(log.Count("nvidia/version: unreadable"), 1);
}

TEST(OnceLoggerTest, InformationIsLoggedOnceAtInfoNotAsAWarning) {
  testing::CapturedLog log;
  OnceLogger once;
  for (int i = 0; i < 3; ++i) once.Info("nvidia-smi is not visible to the daemon");
  EXPECT_EQ(log.Count("INFO: nvidia-smi is not visible to the daemon"), 1) << log.Text();
  EXPECT_EQ(log.Count("WARNING"), 0) << log.Text();
}

TEST(OnceLoggerTest, MemoryIsBoundedAndOldWarningsMayComeBack) {
  testing::CapturedLog log;
  OnceLogger once;
  once.Warn("the first warning");
  for (int i = 0; i < 1500; ++i) once.Warn("bad file " + std::to_string(i));
  // Past the bound the set starts afresh: an early warning is logged again rather than the
  // set growing without end on a host that keeps making new names.
  once.Warn("the first warning");
  EXPECT_EQ(log.Count("the first warning"), 2);
}

}  // namespace
}  // namespace edgeaccel
