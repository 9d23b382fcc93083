// The host's /etc/ld.so.cache (ParseLdSoCache): a file of another machine, possibly damaged or
// half-written. Never reads past it, and every entry it returns is made of the file's bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/nvml/nvml_library.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string cache(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<edgeaccel::LdCacheEntry>> entries = edgeaccel::ParseLdSoCache(cache);
  if (!entries.ok()) {
    if (entries.status().message().empty()) __builtin_trap();  // an error says why
    return 0;
  }
  if (entries->size() * 24 > size) __builtin_trap();
  for (const edgeaccel::LdCacheEntry& entry : *entries) {
    if (entry.name.size() >= size || entry.path.size() >= size) __builtin_trap();
    if (cache.find(entry.name) == std::string::npos) __builtin_trap();
    if (cache.find(entry.path) == std::string::npos) __builtin_trap();
  }
  return 0;
}
