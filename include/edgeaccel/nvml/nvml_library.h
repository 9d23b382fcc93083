// Where the host's libnvidia-ml.so.1 is, as the host's own dynamic loader would find it.
//
// First the host's /etc/ld.so.cache (what ldconfig wrote: it lists the driver's directory
// wherever the distribution or the GPU Operator put it), then the directories drivers install
// into, including the GPU Operator's driver container root /run/nvidia/driver. Every path is a
// host path read under --host-root; the result is also the path this process (and the helper it
// starts) opens, with every symlink resolved inside the root.
#ifndef EDGEACCEL_NVML_NVML_LIBRARY_H_
#define EDGEACCEL_NVML_NVML_LIBRARY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/ld_so_cache.h"

namespace edgeaccel {

inline constexpr absl::string_view kNvmlLibraryName = "libnvidia-ml.so.1";

struct NvmlLibrary {
  std::string host_path;  // as the host sees it: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
  std::string open_path;  // what this process opens: under --host-root, symlinks resolved
  std::string found_by;   // "/etc/ld.so.cache" or "the driver directories"
};

// Finds libnvidia-ml.so.1 on `host`. NotFound lists everything that was looked at.
absl::StatusOr<NvmlLibrary> FindNvmlLibrary(const Host& host);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NVML_NVML_LIBRARY_H_
