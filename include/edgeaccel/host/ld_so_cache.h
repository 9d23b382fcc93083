// The host's /etc/ld.so.cache: which file the host's dynamic loader opens for a library name.
//
// ldconfig writes it from the directories in /etc/ld.so.conf (and ld.so.conf.d), wherever the
// distribution or the GPU Operator put a driver, so it is how a daemon finds the driver's
// user-space libraries without guessing directories.
#ifndef EDGEACCEL_HOST_LD_SO_CACHE_H_
#define EDGEACCEL_HOST_LD_SO_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/host/host.h"

namespace edgeaccel {

inline constexpr absl::string_view kLdSoCachePath = "/etc/ld.so.cache";
// A cache larger than this is not read (a real one is tens of KiB to a few MiB).
inline constexpr size_t kMaxLdSoCacheBytes = 64 << 20;

// One entry of an ld.so.cache: the library's name (its soname, the link ldconfig made), its path,
// and ld.so's flags (the ELF class and machine it is for, FLAG_* in glibc's ldconfig.h).
struct LdCacheEntry {
  std::string name;
  std::string path;
  int32_t flags = 0;
};

// The entries of an ld.so.cache file in glibc's "glibc-ld.so.cache1.1" format (glibc >= 2.32
// writes only that; older ones put it after the "ld.so-1.7.0" table, which is skipped). An
// error names what is wrong; nothing in `data` is trusted.
absl::StatusOr<std::vector<LdCacheEntry>> ParseLdSoCache(absl::string_view data);

// ld.so's flags for a library this machine's programs can load (x86-64 or AArch64, libc6 ELF).
int32_t NativeLdCacheFlags();

// True for an entry this machine's programs can load: not the 32-bit one, not another machine's.
bool IsNativeLdCacheEntry(const LdCacheEntry& entry);

// This machine's Debian multiarch triplet ("x86_64-linux-gnu", "aarch64-linux-gnu"): the
// directories /lib/<triplet> and /usr/lib/<triplet> where Debian-family systems keep its
// libraries.
std::string NativeMultiarchTriplet();

// The host's /etc/ld.so.cache, read under the host's root and parsed. An error says what is
// wrong with it ("/etc/ld.so.cache: not an ld.so cache ...").
absl::StatusOr<std::vector<LdCacheEntry>> ReadLdSoCache(const Host& host);

// What ReadLdSoCache makes of the file's content as Host::ReadFile gave it (or why not).
absl::StatusOr<std::vector<LdCacheEntry>> LdSoCacheOf(absl::StatusOr<std::string> data);

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_LD_SO_CACHE_H_
