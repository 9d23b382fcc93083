// The NVIDIA driver's user-space side a container needs, found on the host: the libraries that
// must match the kernel module (so they come from the host, never the image) and nvidia-smi, in
// the sets NVIDIA's toolkit calls driver capabilities (compute, utility, video, graphics;
// libnvidia-container's nvc_info.c). Each library is handed to the container as read-only bind
// mounts under its soname in the directories the container's own loader searches by default:
// /usr/lib/<multiarch triplet> (Debian and Ubuntu images: their glibc's system search path is
// /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib) and /usr/lib64 (RHEL-family images: /lib64,
// /usr/lib64). The loader looks there after LD_LIBRARY_PATH and its ld.so.cache, so nothing the
// image set is replaced: no environment edit, no hook, no ldconfig in the container, and an
// image that points LD_LIBRARY_PATH at its own libraries (CUDA's forward-compatibility
// /usr/local/cuda/compat) still has them found first. Measured on an H100 node
// (docs/driver-libraries.md): with libcuda and libnvidia-ml alone a kernel silently does nothing;
// the JIT libraries make it run.
//
// Where: the host's /etc/ld.so.cache (read under --host-root) maps each soname to the file the
// host's own loader opens; where the host's cache lists no libcuda.so.1, the GPU Operator's driver
// root (/run/nvidia/driver, its own ld.so.cache and files) is read instead. Which version: the
// running kernel module's, from /proc/driver/nvidia/version. The driver names its files after its
// version (libcuda.so.1 -> libcuda.so.580.159.04), so a library left behind by another driver (a
// stale cache, an upgrade half done) is told apart by its resolved name and left out: a
// container gets no library rather than the wrong one.
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

// The Debian-family loader's own library directory for this build's architecture, which is the
// node's and so its containers': /usr/lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu.
std::string MultiarchLibraryDir();
// Where the libraries go in the container: the default search directories of a Debian-family
// loader (MultiarchLibraryDir) and of a RHEL-family one (/usr/lib64).
std::vector<std::string> DriverLibraryContainerDirs();
// Where nvidia-smi goes; NVIDIA's CUDA images have it in PATH.
inline constexpr absl::string_view kDriverBinaryDir = "/usr/local/nvidia/bin";
// The GPU Operator's driver container root, where its libraries are when the host has none.
inline constexpr absl::string_view kGpuOperatorDriverRoot = "/run/nvidia/driver";

// NVIDIA's driver capabilities (NVIDIA_DRIVER_CAPABILITIES), as bits.
enum DriverCapability : unsigned {
  kDriverCompute = 1,
  kDriverUtility = 2,
  kDriverVideo = 4,
  kDriverGraphics = 8,
};
inline constexpr unsigned kDefaultDriverCapabilities = kDriverCompute | kDriverUtility;
// "compute,utility" (any of compute, utility, video, graphics, or "all"): the bits, or an error
// naming what is not a capability.
absl::StatusOr<unsigned> ParseDriverCapabilities(absl::string_view text);
// The bits as NVIDIA_DRIVER_CAPABILITIES writes them ("compute,utility").
std::string DriverCapabilitiesText(unsigned capabilities);

// The sonames looked for, for the driver `version` ("580.159.04"), of `capabilities`: compute
// (libcuda, the PTX and NVVM JIT compilers and the shared compiler they load, OpenCL, the
// debugger's library), utility (NVML, the configuration library), video (NVDEC, NVENC, optical
// flow, VDPAU), graphics (the GLVND OpenGL, EGL and GLES ICDs, their cores, SPIR-V for Vulkan,
// frame capture). Some sonames carry the full version. Each once.
std::vector<std::string> DriverLibrarySonames(absl::string_view version,
                                              unsigned capabilities = kDefaultDriverCapabilities);

// What a container gets of the driver.
struct DriverFiles {
  std::vector<Mount> mounts;
};

struct DriverLibraryOptions {
  unsigned capabilities = kDefaultDriverCapabilities;
  // One more container directory the libraries are mounted in (absolute; "" for none): for
  // images that look only there (GKE's /usr/local/nvidia/lib64, named by the image's own
  // LD_LIBRARY_PATH).
  std::string extra_directory;
};

class DriverLibraryFinder {
 public:
  DriverLibraryFinder(const Host* host, DriverLibraryOptions options = {});

  // The driver's files on the host for the running driver `version` (empty: unknown, then
  // none). Never fails: what is missing or of another version is left out, each with one log
  // line naming it. Called from one thread at a time (the discoverer's scan).
  DriverFiles Find(absl::string_view version);
  // The same, with every read of the host recorded in `inputs` (the discoverer's scan's).
  DriverFiles Find(absl::string_view version, ScanInputs* inputs);

 private:
  // One ld.so cache (the host's, the GPU Operator's root's), parsed again only when the file is
  // not the one parsed last (by stat(2): filesystem, inode, size, modification time); its stat is
  // recorded in `inputs`.
  struct LdCacheFile {
    std::optional<FileInfo> file;
    absl::StatusOr<std::vector<LdCacheEntry>> entries = std::vector<LdCacheEntry>();
  };
  absl::StatusOr<std::vector<LdCacheEntry>> LdCache(const std::string& root, ScanInputs* inputs);
  // The libraries of `version` listed in the cache of `root` ("" for the host's), each mounted in
  // every container directory; what is missing or refused is said.
  void FindIn(const std::string& root, const std::vector<LdCacheEntry>& entries,
              absl::string_view version, ScanInputs* inputs, DriverFiles* files);

  const Host* host_;
  const DriverLibraryOptions options_;
  const std::vector<std::string> container_dirs_;
  OnceLogger log_;
  std::map<std::string, LdCacheFile> ld_caches_;  // by root
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_DRIVER_LIBRARIES_H_
