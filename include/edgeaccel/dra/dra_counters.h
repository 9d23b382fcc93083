// What a DRA driver counts for /metrics (daemon/metrics.cc renders it): its kubelet calls by
// method (answered, claims answered with an error, in flight, how long they took), its health
// streams, and the claims it unprepared itself. Every field is written lock-free from the
// threads that do the work and read by the metrics thread.
#ifndef EDGEACCEL_DRA_DRA_COUNTERS_H_
#define EDGEACCEL_DRA_DRA_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace edgeaccel {

// A Prometheus histogram of call durations with fixed bounds, up to the kubelet's 45 s deadline
// for a DRA call (defaultClientCallTimeout).
class DurationHistogram {
 public:
  static constexpr std::array<double, 13> kBoundsSeconds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                            1,     2.5,  5,     10,   20,  45};
  struct Reading {
    std::array<uint64_t, kBoundsSeconds.size()> cumulative{};  // observations <= each bound
    uint64_t count = 0;                                        // all of them (le="+Inf")
    double sum_seconds = 0;
  };

  void Observe(absl::Duration duration);
  Reading Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsSeconds.size()> buckets_{};  // not cumulative
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanoseconds_{0};
};

// One method's calls (NodePrepareResources, NodeUnprepareResources; both API versions).
struct DraCallCounters {
  std::atomic<uint64_t> calls{0};         // answered
  std::atomic<uint64_t> claim_errors{0};  // claims answered with an error
  std::atomic<int64_t> in_flight{0};      // arrived and not answered yet
  DurationHistogram duration;             // arrival to answer
};

// Why the driver unprepared a claim itself (the kubelet never did): what a GET of the claim said.
enum class CleanupReason { kGone, kReplaced, kDeallocated };
inline constexpr CleanupReason kCleanupReasons[] = {CleanupReason::kGone, CleanupReason::kReplaced,
                                                    CleanupReason::kDeallocated};
// "gone", "replaced", "deallocated": the metric's reason label.
const char* CleanupReasonName(CleanupReason reason);

struct DraCounters {
  DraCallCounters prepare;
  DraCallCounters unprepare;
  std::atomic<uint64_t> health_streams{0};
  std::array<std::atomic<uint64_t>, 3> cleaned_up{};  // by CleanupReason

  std::atomic<uint64_t>& cleaned_up_for(CleanupReason reason) {
    return cleaned_up[static_cast<size_t>(reason)];
  }
  uint64_t cleaned_up_for(CleanupReason reason) const {
    return cleaned_up[static_cast<size_t>(reason)].load();
  }
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRA_COUNTERS_H_
