// Waiting, test side, for state that no callback reports (a registrar's own flags, a counter):
// look until it holds. The daemon never polls; tests may, briefly.
#ifndef EDGEACCEL_TESTS_SUPPORT_EVENTUALLY_H_
#define EDGEACCEL_TESTS_SUPPORT_EVENTUALLY_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace edgeaccel::testing {

inline bool Eventually(const std::function<bool()>& condition,
                       absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_EVENTUALLY_H_
