// Flag syntax: --replicas, --families, --registration.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/daemon/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::map<std::string, int>> replicas = edgeaccel::ParseReplicas(text);
  if (replicas.ok()) {
    for (const auto& [resource, count] : *replicas) {
      if (count < 1 || count > 64) __builtin_trap();
    }
  }
  absl::StatusOr<std::set<std::string>> families = edgeaccel::ParseFamilies(text);
  if (families.ok()) {
    for (const std::string& family : *families) {
      if (!edgeaccel::KnownFamilies().count(family)) __builtin_trap();
    }
  }
  edgeaccel::RegistrationMode mode;
  (void)edgeaccel::ParseRegistrationMode(text, &mode);
  return 0;
}
