// Exponential backoff with jitter, for the retries no kernel event can announce: a kubelet that
// refuses Register, an API server that fails a PATCH, a disk that is full.
#ifndef EDGEACCEL_HOST_BACKOFF_H_
#define EDGEACCEL_HOST_BACKOFF_H_

#include <random>

#include "absl/time/time.h"

namespace edgeaccel {

// Not thread-safe: whatever guards its owner's retry state guards it too.
class Backoff {
 public:
  // Waits start at `initial` and double up to `max`; each is spread by +-`jitter` (0.2: 80% to
  // 120%), so many nodes retrying against one kubelet or API server do not retry in step.
  Backoff(absl::Duration initial, absl::Duration max, double jitter);

  // The wait before the next retry; the one after it is twice as long, up to the maximum.
  absl::Duration Next();
  // Back to `initial`, after a success.
  void Reset();

 private:
  absl::Duration initial_;
  absl::Duration max_;
  absl::Duration current_;
  std::uniform_real_distribution<double> spread_;
  std::mt19937 random_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_BACKOFF_H_
