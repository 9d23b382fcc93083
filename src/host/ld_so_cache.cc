#include "edgeaccel/host/ld_so_cache.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace edgeaccel {
namespace {

// glibc's elf/cache.c and sysdeps/generic/ldconfig.h.
constexpr absl::string_view kOldMagic = "ld.so-1.7.0";
constexpr absl::string_view kNewMagic = "glibc-ld.so.cache1.1";
constexpr size_t kOldEntrySize = 12;   // int32 flags, uint32 key, uint32 value
constexpr size_t kNewHeaderSize = 48;  // magic+version 20, nlibs, len_strings, flags, pad 3,
                                       // extension_offset, unused[3]
constexpr size_t kNewEntrySize = 24;   // flags, key, value, osversion, uint64 hwcap
constexpr int32_t kFlagElfLibc6 = 0x0003;
constexpr int32_t kFlagTypeMask = 0x00ff;
constexpr int32_t kFlagArchMask = 0xff00;
// The architecture this build runs on, as ldconfig marks its 64-bit libraries.
#if defined(__aarch64__)
constexpr int32_t kFlagNativeLib64 = 0x0a00;  // FLAG_AARCH64_LIB64
#else
constexpr int32_t kFlagNativeLib64 = 0x0300;  // FLAG_X8664_LIB64
#endif
// A cache lists every library of the host: thousands of entries at most, well under this.

uint32_t ReadU32(absl::string_view data, size_t at) {
  uint32_t value;
  std::memcpy(&value, data.data() + at, sizeof(value));
  return value;  // the cache is written in the host's byte order, which is ours
}

// The NUL-terminated string at `offset` from `base`, or an error.
absl::StatusOr<std::string> StringAt(absl::string_view strings, uint32_t offset) {
  if (offset >= strings.size()) return absl::DataLossError("a string offset past the end");
  const size_t end = strings.find('\0', offset);
  if (end == absl::string_view::npos) return absl::DataLossError("an unterminated string");
  return std::string(strings.substr(offset, end - offset));
}

}  // namespace

int32_t NativeLdCacheFlags() { return kFlagElfLibc6 | kFlagNativeLib64; }

std::string NativeMultiarchTriplet() {
#if defined(__aarch64__)
  return "aarch64-linux-gnu";
#else
  return "x86_64-linux-gnu";
#endif
}

bool IsNativeLdCacheEntry(const LdCacheEntry& entry) {
  return (entry.flags & kFlagTypeMask) == kFlagElfLibc6 &&
         (entry.flags & kFlagArchMask) == (NativeLdCacheFlags() & kFlagArchMask);
}

absl::StatusOr<std::vector<LdCacheEntry>> ParseLdSoCache(absl::string_view data) {
  size_t start = 0;
  if (absl::StartsWith(data, kOldMagic)) {
    // The old table: magic (padded to 12), uint32 nlibs, entries; the new format follows,
    // aligned to 8 (glibc's ALIGN_CACHE).
    if (data.size() < 16) return absl::DataLossError("a truncated ld.so-1.7.0 header");
    const uint64_t nlibs = ReadU32(data, 12);
    const uint64_t end = 16 + nlibs * kOldEntrySize;
    if (end > data.size()) return absl::DataLossError("a truncated ld.so-1.7.0 table");
    start = (end + 7) & ~uint64_t{7};
  }
  if (start >= data.size() || !absl::StartsWith(data.substr(start), kNewMagic)) {
    return absl::InvalidArgumentError("not an ld.so cache in the glibc-ld.so.cache1.1 format");
  }
  const absl::string_view cache = data.substr(start);  // string offsets count from here
  if (cache.size() < kNewHeaderSize) return absl::DataLossError("a truncated header");
  const uint64_t nlibs = ReadU32(cache, 20);
  if (kNewHeaderSize + nlibs * kNewEntrySize > cache.size()) {
    return absl::DataLossError(absl::StrCat("a table of ", nlibs, " entries in ", cache.size(),
                                            " bytes"));
  }
  std::vector<LdCacheEntry> entries;
  entries.reserve(nlibs);
  for (uint64_t i = 0; i < nlibs; ++i) {
    const size_t at = kNewHeaderSize + i * kNewEntrySize;
    LdCacheEntry entry;
    entry.flags = static_cast<int32_t>(ReadU32(cache, at));
    absl::StatusOr<std::string> name = StringAt(cache, ReadU32(cache, at + 4));
    absl::StatusOr<std::string> path = StringAt(cache, ReadU32(cache, at + 8));
    if (!name.ok()) return name.status();
    if (!path.ok()) return path.status();
    entry.name = std::move(*name);
    entry.path = std::move(*path);
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::vector<LdCacheEntry>> ReadLdSoCache(const Host& host) {
  return LdSoCacheOf(host.ReadFile(kLdSoCachePath, kMaxLdSoCacheBytes));
}

absl::StatusOr<std::vector<LdCacheEntry>> LdSoCacheOf(absl::StatusOr<std::string> data) {
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat(kLdSoCachePath, ": ", data.status().message()));
  }
  absl::StatusOr<std::vector<LdCacheEntry>> entries = ParseLdSoCache(*data);
  if (!entries.ok()) {
    return absl::Status(entries.status().code(),
                        absl::StrCat(kLdSoCachePath, ": ", entries.status().message()));
  }
  return entries;
}

}  // namespace edgeaccel
