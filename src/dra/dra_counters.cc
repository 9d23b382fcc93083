#include "edgeaccel/dra/dra_counters.h"

namespace edgeaccel {

// The count goes up before the bucket, and Read() reads the buckets before the count: a scrape
// that sees an observation in a bucket sees it in the count (le="+Inf") too, so no bucket is
// ever above +Inf.
void DurationHistogram::Observe(absl::Duration duration) {
  count_.fetch_add(1);
  sum_nanoseconds_.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(duration)));
  const double seconds = absl::ToDoubleSeconds(duration);
  for (size_t i = 0; i < kBoundsSeconds.size(); ++i) {
    if (seconds <= kBoundsSeconds[i]) {
      buckets_[i].fetch_add(1);
      break;
    }
  }
}

DurationHistogram::Reading DurationHistogram::Read() const {
  Reading reading;
  uint64_t below = 0;
  for (size_t i = 0; i < kBoundsSeconds.size(); ++i) {
    below += buckets_[i].load();
    reading.cumulative[i] = below;
  }
  reading.count = count_.load();
  reading.sum_seconds = static_cast<double>(sum_nanoseconds_.load()) / 1e9;
  return reading;
}

const char* CleanupReasonName(CleanupReason reason) {
  switch (reason) {
    case CleanupReason::kGone:
      return "gone";
    case CleanupReason::kReplaced:
      return "replaced";
    case CleanupReason::kDeallocated:
      return "deallocated";
  }
  return "unknown";
}

}  // namespace edgeaccel
