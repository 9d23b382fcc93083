#include "edgeaccel/host/backoff.h"

#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

TEST(BackoffTest, DoublesUpToTheMaximumWithoutJitter) {
  Backoff backoff(absl::Milliseconds(100), absl::Milliseconds(500), 0);
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(200));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(400));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(500));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(500));
}

TEST(BackoffTest, ResetStartsAgainFromTheFirstWait) {
  Backoff backoff(absl::Seconds(1), absl::Seconds(60), 0);
  backoff.Next();
  backoff.Next();
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), absl::Seconds(1));
}

TEST(BackoffTest, JitterStaysWithinItsSpreadAndVaries) {
  Backoff backoff(absl::Seconds(1), absl::Seconds(1), 0.2);
  absl::Duration lowest = absl::InfiniteDuration();
  absl::Duration highest = absl::ZeroDuration();
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration wait = backoff.Next();
    ASSERT_GE(wait, absl::Milliseconds(800));
    ASSERT_LE(wait, absl::Milliseconds(1200));
    lowest = std::min(lowest, wait);
    highest = std::max(highest, wait);
  }
  EXPECT_LT(lowest, absl::Milliseconds(900));
  EXPECT_GT(highest, absl::Milliseconds(1100));
}

}  // namespace
}  // namespace edgeaccel
