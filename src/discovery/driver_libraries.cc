#include "edgeaccel/discovery/driver_libraries.h"

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace edgeaccel {
namespace {

// Where drivers install nvidia-smi (distribution packages, the .run installer, the GPU
// Operator's driver container root); it is not in the ld.so cache.
constexpr absl::string_view kBinaryDirectories[] = {
    "/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/run/nvidia/driver/usr/bin", "/bin"};

absl::string_view BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

// Without one of these a CUDA program fails, or (the JIT compilers) silently does nothing; the
// others missing is information (a debugger, OpenCL, and libraries older drivers do not have).
bool NeededForCuda(absl::string_view soname) {
  return soname == "libcuda.so.1" || soname == "libnvidia-ml.so.1" ||
         soname == "libnvidia-ptxjitcompiler.so.1" || soname == "libnvidia-nvvm.so.4";
}

struct CapabilityName {
  DriverCapability bit;
  absl::string_view name;
};
constexpr CapabilityName kCapabilityNames[] = {{kDriverCompute, "compute"},
                                               {kDriverUtility, "utility"},
                                               {kDriverVideo, "video"},
                                               {kDriverGraphics, "graphics"}};

}  // namespace

std::string MultiarchLibraryDir() { return absl::StrCat("/usr/lib/", NativeMultiarchTriplet()); }

std::vector<std::string> DriverLibraryContainerDirs() { return {MultiarchLibraryDir(), "/usr/lib64"}; }

absl::StatusOr<unsigned> ParseDriverCapabilities(absl::string_view text) {
  unsigned capabilities = 0;
  for (absl::string_view word : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    word = absl::StripAsciiWhitespace(word);
    if (word == "all") {
      capabilities |= kDriverCompute | kDriverUtility | kDriverVideo | kDriverGraphics;
      continue;
    }
    bool known = false;
    for (const CapabilityName& capability : kCapabilityNames) {
      if (word == capability.name) {
        capabilities |= capability.bit;
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", word, "\" is not a driver capability (compute, utility, video, graphics, all)"));
    }
  }
  if (capabilities == 0) {
    return absl::InvalidArgumentError(
        "no driver capability named (compute, utility, video, graphics, all)");
  }
  return capabilities;
}

std::string DriverCapabilitiesText(unsigned capabilities) {
  std::vector<absl::string_view> names;
  for (const CapabilityName& capability : kCapabilityNames) {
    if ((capabilities & capability.bit) != 0) names.push_back(capability.name);
  }
  return absl::StrJoin(names, ",");
}

std::vector<std::string> DriverLibrarySonames(absl::string_view version, unsigned capabilities) {
  // By soname, as the ld.so cache lists them; NVIDIA's sets are libnvidia-container's
  // (nvc_info.c: utility_libs, compute_libs, video_libs, graphics_libs, graphics_libs_glvnd),
  // with what later drivers added to compute (NVVM, the shared compiler, the debugger).
  const std::string gpucomp = absl::StrCat("libnvidia-gpucomp.so.", version);
  std::vector<std::string> sonames;
  auto add = [&sonames](std::string soname) {
    for (const std::string& known : sonames) {
      if (known == soname) return;
    }
    sonames.push_back(std::move(soname));
  };
  if (capabilities & kDriverCompute) {
    add("libcuda.so.1");                   // the CUDA driver API
  }
  if (capabilities & (kDriverUtility | kDriverCompute)) {
    // NVML: nvidia-smi, and CUDA's own device queries (a compute container without it fails
    // cudaGetDeviceCount on some drivers), so compute brings it too.
    add("libnvidia-ml.so.1");
  }
  if (capabilities & kDriverCompute) {
    add("libnvidia-ptxjitcompiler.so.1");  // PTX to SASS (libcuda loads it for PTX-only kernels)
    add("libnvidia-nvvm.so.4");            // NVVM IR to PTX (JIT LTO, libNVVM programs)
    add(gpucomp);                          // the compiler the JIT libraries share
    add("libcudadebugger.so.1");           // cuda-gdb's in-driver debugger
    add("libnvidia-opencl.so.1");          // the OpenCL ICD
  }
  if (capabilities & kDriverUtility) {
    add("libnvidia-cfg.so.1");  // GPU configuration
  }
  if (capabilities & kDriverVideo) {
    add("libnvcuvid.so.1");              // NVDEC
    add("libnvidia-encode.so.1");        // NVENC
    add("libnvidia-opticalflow.so.1");   // optical flow
    add("libvdpau_nvidia.so.1");         // the VDPAU ICD
  }
  if (capabilities & kDriverGraphics) {
    add("libGLX_nvidia.so.0");           // the GLVND OpenGL/GLX ICD
    add("libEGL_nvidia.so.0");           // the GLVND EGL ICD
    add("libGLESv2_nvidia.so.2");        // OpenGL ES 2 and 3
    add("libGLESv1_CM_nvidia.so.1");     // OpenGL ES 1
    add(absl::StrCat("libnvidia-eglcore.so.", version));
    add(absl::StrCat("libnvidia-glcore.so.", version));
    add(absl::StrCat("libnvidia-tls.so.", version));
    add(absl::StrCat("libnvidia-glsi.so.", version));
    add(absl::StrCat("libnvidia-glvkspirv.so.", version));  // SPIR-V for Vulkan
    add(gpucomp);
    add("libnvidia-fbc.so.1");           // frame capture
  }
  return sonames;
}

DriverLibraryFinder::DriverLibraryFinder(const Host* host, DriverLibraryOptions options)
    : host_(host), options_(std::move(options)), container_dirs_([this] {
        std::vector<std::string> dirs = DriverLibraryContainerDirs();
        if (!options_.extra_directory.empty()) dirs.push_back(options_.extra_directory);
        return dirs;
      }()) {}

DriverFiles DriverLibraryFinder::Find(absl::string_view version) {
  ScanInputs inputs(host_);
  return Find(version, &inputs);
}

absl::StatusOr<std::vector<LdCacheEntry>> DriverLibraryFinder::LdCache(const std::string& root,
                                                                       ScanInputs* inputs) {
  const std::string path = absl::StrCat(root, kLdSoCachePath);
  LdCacheFile& kept = ld_caches_[root];
  absl::StatusOr<FileInfo> file = inputs->Stat(path);
  if (file.ok() && kept.file == *file) return kept.entries;
  // Looked at before it is read: a file replaced in between is parsed again at the next scan.
  absl::StatusOr<std::string> data =
      inputs->ReadFile(path, kMaxLdSoCacheBytes, ScanInputs::Reread::kUntilRead);
  if (file.ok() && data.ok()) {
    kept.file = *file;
    kept.entries = LdSoCacheOf(std::move(data));
    return kept.entries;
  }
  kept.file.reset();
  return LdSoCacheOf(std::move(data));
}

void DriverLibraryFinder::FindIn(const std::string& root, const std::vector<LdCacheEntry>& entries,
                                 absl::string_view version, ScanInputs* inputs,
                                 DriverFiles* files) {
  const std::string cache_path = absl::StrCat(root, kLdSoCachePath);
  const std::string version_suffix = absl::StrCat(".so.", version);
  for (const std::string& soname : DriverLibrarySonames(version, options_.capabilities)) {
    std::vector<std::string> refused;
    bool listed = false;
    for (const LdCacheEntry& entry : entries) {
      if (entry.name != soname || !IsNativeLdCacheEntry(entry)) continue;
      listed = true;
      if (!absl::StartsWith(entry.path, "/")) continue;
      // The cache of a driver root names paths inside that root.
      std::string file = inputs->ResolveHostPath(absl::StrCat(root, entry.path));
      absl::StatusOr<FileInfo> info = inputs->Stat(file);
      // A merged-/usr host's cache names /lib/<triplet>/... (ldconfig keeps the first directory of
      // ld.so.conf holding a file, and Debian and Ubuntu list /lib/<triplet> first), where /lib
      // is a link to usr/lib: the DaemonSet mounts the host's /usr directories, not the link.
      if (!info.ok() && (absl::StartsWith(entry.path, "/lib/") || absl::StartsWith(entry.path, "/lib64/"))) {
        file = inputs->ResolveHostPath(absl::StrCat(root, "/usr", entry.path));
        info = inputs->Stat(file);
      }
      if (!info.ok() || info->type != FileInfo::Type::kRegular) {
        refused.push_back(
            absl::StrCat(entry.path, " (listed in ", cache_path, ", not a file on the host)"));
        continue;
      }
      if (!absl::EndsWith(BaseName(file), version_suffix)) {
        refused.push_back(absl::StrCat(entry.path, " (it is ", file,
                                       ", not of the running driver ", version, ")"));
        continue;
      }
      for (const std::string& dir : container_dirs_) {
        files->mounts.push_back({file, absl::StrCat(dir, "/", soname)});
        // Build tools link against the unversioned name (-lcuda); the toolkit's stub is not the
        // driver.
        if (soname == "libcuda.so.1") files->mounts.push_back({file, absl::StrCat(dir, "/libcuda.so")});
      }
      refused.clear();
      break;
    }
    if (!listed) {
      const std::string said = absl::StrCat(soname, " is not in ", cache_path,
                                            ": left out of what containers get of the NVIDIA "
                                            "driver ", version);
      NeededForCuda(soname) && (options_.capabilities & kDriverCompute) ? log_.Warn(said)
                                                                        : log_.Info(said);
    } else if (!refused.empty()) {
      log_.Warn(absl::StrCat(soname, " left out of what containers get of the NVIDIA driver ",
                             version, ": ", absl::StrJoin(refused, "; ")));
    }
  }
}

DriverFiles DriverLibraryFinder::Find(absl::string_view version, ScanInputs* inputs) {
  DriverFiles files;
  if (version.empty()) {
    log_.Warn("the NVIDIA driver's version is unknown (/proc/driver/nvidia/version): its "
              "libraries are not mounted into containers, which then need NVIDIA's runtime to "
              "run CUDA");
    return files;
  }
  // The host's cache; where it has no libcuda.so.1, the GPU Operator's driver root's.
  std::string root;
  absl::StatusOr<std::vector<LdCacheEntry>> entries = LdCache(root, inputs);
  auto lists_libcuda = [](const absl::StatusOr<std::vector<LdCacheEntry>>& cache) {
    if (!cache.ok()) return false;
    for (const LdCacheEntry& entry : *cache) {
      if (entry.name == "libcuda.so.1" && IsNativeLdCacheEntry(entry)) return true;
    }
    return false;
  };
  if (!lists_libcuda(entries)) {
    const std::string operator_root(kGpuOperatorDriverRoot);
    absl::StatusOr<std::vector<LdCacheEntry>> operator_entries = LdCache(operator_root, inputs);
    if (lists_libcuda(operator_entries)) {
      root = operator_root;
      entries = std::move(operator_entries);
    }
  }
  if (!entries.ok()) {
    log_.Warn(absl::StrCat("cannot read the host's library cache (", entries.status().message(),
                           "), nor find the driver under ", kGpuOperatorDriverRoot,
                           ": the NVIDIA driver's libraries are not mounted into containers, "
                           "which then need NVIDIA's runtime to run CUDA"));
  } else {
    FindIn(root, *entries, version, inputs, &files);
  }

  if ((options_.capabilities & kDriverUtility) == 0) return files;
  bool smi = false;
  for (absl::string_view directory : kBinaryDirectories) {
    const std::string path = absl::StrCat(directory, "/nvidia-smi");
    absl::StatusOr<FileInfo> info = inputs->Stat(path);
    if (!info.ok() || info->type != FileInfo::Type::kRegular) continue;
    files.mounts.push_back(
        {inputs->ResolveHostPath(path), absl::StrCat(kDriverBinaryDir, "/nvidia-smi")});
    smi = true;
    break;
  }
  if (!smi) {
    // Information, not a warning: a tool, not what CUDA needs, and the DaemonSet does not mount
    // the host's binary directories.
    log_.Info(absl::StrCat("nvidia-smi is not visible to the daemon (looked in /usr/bin, "
                           "/usr/local/bin, /usr/local/nvidia/bin, /run/nvidia/driver/usr/bin, "
                           "/bin): containers get the NVIDIA driver ", version,
                           "'s libraries without it"));
  }
  return files;
}

}  // namespace edgeaccel
