#include "edgeaccel/dra/dra_counters.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace edgeaccel {
namespace {

TEST(DraCountersTest, TheHistogramCountsEachCallInItsBucketCumulatively) {
  DurationHistogram histogram;
  histogram.Observe(absl::Milliseconds(3));    // <= 0.005
  histogram.Observe(absl::Milliseconds(5));    // <= 0.005: a bound is inclusive (le)
  histogram.Observe(absl::Milliseconds(300));  // <= 0.5
  histogram.Observe(absl::Seconds(60));        // past the last bound: +Inf only
  DurationHistogram::Reading reading = histogram.Read();
  EXPECT_EQ(reading.count, 4u);
  EXPECT_NEAR(reading.sum_seconds, 60.308, 1e-9);
  EXPECT_EQ(reading.cumulative[0], 2u);  // 0.005
  EXPECT_EQ(reading.cumulative[5], 2u);  // 0.25
  EXPECT_EQ(reading.cumulative[6], 3u);  // 0.5
  EXPECT_EQ(reading.cumulative.back(), 3u) << "45 s, the kubelet's deadline";
  EXPECT_EQ(DurationHistogram::kBoundsSeconds.back(), 45);
}

TEST(DraCountersTest, AReadWhileCallsAreObservedNeverHasABucketAboveTheCount) {
  DurationHistogram histogram;
  std::thread observer([&] {
    for (int i = 0; i < 20000; ++i) histogram.Observe(absl::Microseconds(i % 100));
  });
  for (int i = 0; i < 20000; ++i) {
    DurationHistogram::Reading reading = histogram.Read();
    for (uint64_t bucket : reading.cumulative) ASSERT_LE(bucket, reading.count);
  }
  observer.join();
  EXPECT_EQ(histogram.Read().count, 20000u);
}

TEST(DraCountersTest, CleanupsAreCountedByReason) {
  DraCounters counters;
  counters.cleaned_up_for(CleanupReason::kReplaced).fetch_add(2);
  EXPECT_EQ(static_cast<const DraCounters&>(counters).cleaned_up_for(CleanupReason::kReplaced), 2u);
  EXPECT_EQ(static_cast<const DraCounters&>(counters).cleaned_up_for(CleanupReason::kGone), 0u);
  EXPECT_STREQ(CleanupReasonName(CleanupReason::kGone), "gone");
  EXPECT_STREQ(CleanupReasonName(CleanupReason::kReplaced), "replaced");
  EXPECT_STREQ(CleanupReasonName(CleanupReason::kDeallocated), "deallocated");
}

}  // namespace
}  // namespace edgeaccel
