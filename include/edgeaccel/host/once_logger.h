// OnceLogger: logs each distinct message once (a warning, or information that is not a problem).
//
// Discoverers rescan on every probe and every device-node event; a malformed host file should be
// one clear log line, not one every few seconds.
#ifndef EDGEACCEL_HOST_ONCE_LOGGER_H_
#define EDGEACCEL_HOST_ONCE_LOGGER_H_

#include <string>

#include "absl/container/flat_hash_set.h"

namespace edgeaccel {

// Not thread-safe: each discoverer owns one and scans from one thread at a time.
class OnceLogger {
 public:
  void Warn(const std::string& message);
  void Info(const std::string& message);

 private:
  // True the first time `message` is seen (since the memory of them was last cleared).
  bool First(const std::string& message);

  absl::flat_hash_set<std::string> seen_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_ONCE_LOGGER_H_
