// /etc/nv_tegra_release and /proc/device-tree/compatible parsers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/discovery/tegra.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<edgeaccel::TegraRelease> release = edgeaccel::ParseTegraRelease(text);
  if (release.ok()) {
    // What we accept must look like a release: digits for the major.
    if (release->major.empty() || release->major.find_first_not_of("0123456789") != std::string::npos) {
      __builtin_trap();
    }
  }
  std::optional<std::string> soc = edgeaccel::TegraSocFromCompatible(text);
  if (soc.has_value() && (soc->size() != 8 || soc->rfind("tegra", 0) != 0)) __builtin_trap();
  if (soc.has_value()) (void)edgeaccel::TegraGpuForSoc(*soc);
  return 0;
}
