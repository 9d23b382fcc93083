#include "edgeaccel/nvml/nvml_library.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace edgeaccel {
namespace {

// The driver's directories, for each machine, as distributions and the GPU Operator lay them out.
std::vector<std::string> DriverDirectories() {
  const std::string triplet = NativeMultiarchTriplet();
  std::vector<std::string> directories;
  const std::vector<std::string> under = {"/usr/lib/" + triplet, "/usr/lib64", "/usr/lib",
                                          "/lib/" + triplet,     "/lib64",     "/lib"};
  for (const std::string prefix : {"", "/run/nvidia/driver"}) {
    for (const std::string& dir : under) {
      directories.push_back(prefix + dir);
    }
  }
  directories.push_back("/usr/local/nvidia/lib64");  // the GPU Operator's and some clouds' mount
  return directories;
}

}  // namespace

absl::StatusOr<NvmlLibrary> FindNvmlLibrary(const Host& host) {
  std::vector<std::string> looked;
  auto usable = [&host](const std::string& path) {
    absl::StatusOr<FileInfo> info = host.Stat(path);
    return info.ok() && info->type == FileInfo::Type::kRegular;
  };
  constexpr absl::string_view kCache = kLdSoCachePath;
  absl::StatusOr<std::string> cache = host.ReadFile(kCache, 64 << 20);
  if (!cache.ok()) {
    looked.push_back(absl::StrCat(kCache, " (", cache.status().message(), ")"));
  } else if (absl::StatusOr<std::vector<LdCacheEntry>> entries = ParseLdSoCache(*cache);
             !entries.ok()) {
    looked.push_back(absl::StrCat(kCache, " (", entries.status().message(), ")"));
  } else {
    bool listed = false;
    for (const LdCacheEntry& entry : *entries) {
      if (entry.name != kNvmlLibraryName) continue;
      if (!IsNativeLdCacheEntry(entry)) continue;  // the 32-bit one, or another machine's
      listed = true;
      if (!absl::StartsWith(entry.path, "/")) continue;
      if (usable(entry.path)) {
        return NvmlLibrary{entry.path, host.Resolve(entry.path), std::string(kCache)};
      }
      looked.push_back(absl::StrCat(entry.path, " (listed in ", kCache, ", not there)"));
    }
    if (!listed) looked.push_back(absl::StrCat(kCache, " (does not list ", kNvmlLibraryName, ")"));
  }
  for (const std::string& directory : DriverDirectories()) {
    const std::string path = absl::StrCat(directory, "/", kNvmlLibraryName);
    if (usable(path)) return NvmlLibrary{path, host.Resolve(path), "the driver directories"};
    looked.push_back(path);
  }
  return absl::NotFoundError(absl::StrCat("no ", kNvmlLibraryName, " on the host; looked at ",
                                          absl::StrJoin(looked, ", ")));
}

}  // namespace edgeaccel
