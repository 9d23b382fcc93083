// The NVIDIA driver's user-space side a container needs to run CUDA, found on the host: the
// libraries that must match the kernel module (so they come from the host, never the image) and
// nvidia-smi. Each is handed to the container as a read-only bind mount under its soname, in one
// directory named by LD_LIBRARY_PATH: no hook, no ldconfig in the container, nothing of NVIDIA's
// container toolkit on the node. Measured on an H100 node (docs/driver-libraries.md): with
// libcuda and libnvidia-ml alone a kernel silently does nothing; the JIT libraries make it run.
//
// Where: the host's /etc/ld.so.cache (read under --host-root) maps each soname to the file the
// host's own loader opens. Which version: the running kernel module's, from
// /proc/driver/nvidia/version. The driver names its files after its version
// (libcuda.so.1 -> libcuda.so.580.159.04), so a library left behind by another driver (a stale
// cache, an upgrade half done) is told apart by its resolved name and left out: a container
// gets no library rather than the wrong one.
#ifndef EDGEACCEL_DISCOVERY_DRIVER_LIBRARIES_H_
#define EDGEACCEL_DISCOVERY_DRIVER_LIBRARIES_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/discovery/device.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/ld_so_cache.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

// Where the libraries go in the container: where NVIDIA's CUDA images already point
// LD_LIBRARY_PATH and where GKE mounts the driver.
inline constexpr absl::string_view kDefaultDriverLibraryDir = "/usr/local/nvidia/lib64";
// Where nvidia-smi goes; NVIDIA's CUDA images have it in PATH.
inline constexpr absl::string_view kDriverBinaryDir = "/usr/local/nvidia/bin";

// The sonames looked for, for the driver `version` ("580.159.04"): compute (libcuda, the PTX and
// NVVM JIT compilers and the shared compiler they load, the debugger's library) and utility
// (libnvidia-ml, for NVML and nvidia-smi). Some sonames carry the full version.
std::vector<std::string> DriverLibrarySonames(absl::string_view version);

// What a container gets of the driver.
struct DriverFiles {
  std::vector<Mount> mounts;
  std::map<std::string, std::string> envs;  // LD_LIBRARY_PATH, when there is a library
};

class DriverLibraryFinder {
 public:
  // `container_directory`: where the libraries go in the container (absolute).
  DriverLibraryFinder(const Host* host, std::string container_directory);

  // The driver's files on the host for the running driver `version` (empty: unknown, then
  // none). Never fails: what is missing or of another version is left out, each with one log
  // line naming it. Called from one thread at a time (the discoverer's scan).
  DriverFiles Find(absl::string_view version);
  // The same, with every read of the host recorded in `inputs` (the discoverer's scan's).
  DriverFiles Find(absl::string_view version, ScanInputs* inputs);

 private:
  // The host's ld.so cache, parsed again only when the file is not the one parsed last (by
  // stat(2): filesystem, inode, size, modification time); its stat is recorded in `inputs`.
  absl::StatusOr<std::vector<LdCacheEntry>> LdCache(ScanInputs* inputs);

  const Host* host_;
  std::string container_directory_;
  OnceLogger log_;
  // The cache as last parsed, and the file it was parsed from (unset: nothing kept).
  std::optional<FileInfo> ld_cache_file_;
  absl::StatusOr<std::vector<LdCacheEntry>> ld_cache_ = std::vector<LdCacheEntry>();
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_DRIVER_LIBRARIES_H_
