// /proc/driver/nvidia/version and gpus/<bus>/information parsers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/discovery/nvidia.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::string> version = edgeaccel::ParseNvidiaDriverVersion(text);
  if (version.ok() && version->find_first_not_of("0123456789.") != std::string::npos) {
    __builtin_trap();
  }
  for (const auto& [key, value] : edgeaccel::ParseNvidiaInformation(text)) {
    if (key.find('\n') != std::string::npos || value.find('\n') != std::string::npos) {
      __builtin_trap();
    }
  }
  return 0;
}
