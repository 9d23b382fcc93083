#include "edgeaccel/host/backoff.h"

#include <algorithm>

namespace edgeaccel {

Backoff::Backoff(absl::Duration initial, absl::Duration max, double jitter)
    : initial_(initial),
      max_(max),
      current_(initial),
      spread_(1.0 - jitter, 1.0 + jitter),
      random_(std::random_device{}()) {}

absl::Duration Backoff::Next() {
  const absl::Duration wait = current_ * spread_(random_);
  current_ = std::min(current_ * 2, max_);
  return wait;
}

void Backoff::Reset() { current_ = initial_; }

}  // namespace edgeaccel
