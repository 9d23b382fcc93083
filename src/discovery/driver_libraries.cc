#include "edgeaccel/discovery/driver_libraries.h"

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

// The first kCudaNeeds of DriverLibrarySonames: without any of them a CUDA program fails, or (the
// JIT compilers) silently does nothing.
constexpr size_t kCudaNeeds = 4;

}  // namespace

std::vector<std::string> DriverLibrarySonames(absl::string_view version) {
  return {
      "libcuda.so.1",                   // the CUDA driver API
      "libnvidia-ml.so.1",              // NVML: nvidia-smi, and CUDA's device queries
      "libnvidia-ptxjitcompiler.so.1",  // PTX to SASS (libcuda loads it for PTX-only kernels)
      "libnvidia-nvvm.so.4",            // NVVM IR to PTX (JIT LTO, libNVVM programs)
      absl::StrCat("libnvidia-gpucomp.so.", version),  // the compiler the JIT libraries share
      "libcudadebugger.so.1",           // cuda-gdb's in-driver debugger
  };
}

DriverLibraryFinder::DriverLibraryFinder(const Host* host, std::string container_directory)
    : host_(host), container_directory_(std::move(container_directory)) {}

DriverFiles DriverLibraryFinder::Find(absl::string_view version) {
  ScanInputs inputs(host_);
  return Find(version, &inputs);
}

absl::StatusOr<std::vector<LdCacheEntry>> DriverLibraryFinder::LdCache(ScanInputs* inputs) {
  absl::StatusOr<FileInfo> file = inputs->Stat(kLdSoCachePath);
  if (file.ok() && ld_cache_file_ == *file) return ld_cache_;
  // Looked at before it is read: a file replaced in between is parsed again at the next scan.
  absl::StatusOr<std::string> data =
      inputs->ReadFile(kLdSoCachePath, kMaxLdSoCacheBytes, ScanInputs::Reread::kUntilRead);
  if (file.ok() && data.ok()) {
    ld_cache_file_ = *file;
    ld_cache_ = LdSoCacheOf(std::move(data));
    return ld_cache_;
  }
  ld_cache_file_.reset();
  return LdSoCacheOf(std::move(data));
}

DriverFiles DriverLibraryFinder::Find(absl::string_view version, ScanInputs* inputs) {
  DriverFiles files;
  if (version.empty()) {
    log_.Warn("the NVIDIA driver's version is unknown (/proc/driver/nvidia/version): its "
              "libraries are not mounted into containers, which then need NVIDIA's runtime to "
              "run CUDA");
    return files;
  }
  absl::StatusOr<std::vector<LdCacheEntry>> entries = LdCache(inputs);
  if (!entries.ok()) {
    log_.Warn(absl::StrCat("cannot read the host's library cache (", entries.status().message(),
                           "): the NVIDIA driver's libraries are not mounted into containers, "
                           "which then need NVIDIA's runtime to run CUDA"));
  } else {
    const std::string version_suffix = absl::StrCat(".so.", version);
    const std::vector<std::string> sonames = DriverLibrarySonames(version);
    for (size_t i = 0; i < sonames.size(); ++i) {
      const std::string& soname = sonames[i];
      const bool required = i < kCudaNeeds;
      std::vector<std::string> refused;
      bool listed = false;
      for (const LdCacheEntry& entry : *entries) {
        if (entry.name != soname || !IsNativeLdCacheEntry(entry)) continue;
        listed = true;
        if (!absl::StartsWith(entry.path, "/")) continue;
        const std::string file = inputs->ResolveHostPath(entry.path);
        absl::StatusOr<FileInfo> info = inputs->Stat(file);
        if (!info.ok() || info->type != FileInfo::Type::kRegular) {
          refused.push_back(absl::StrCat(entry.path, " (listed in ", kLdSoCachePath,
                                         ", not a file on the host)"));
          continue;
        }
        if (!absl::EndsWith(BaseName(file), version_suffix)) {
          refused.push_back(absl::StrCat(entry.path, " (it is ", file, ", not of the running driver ",
                                         version, ")"));
          continue;
        }
        files.mounts.push_back({file, absl::StrCat(container_directory_, "/", soname)});
        refused.clear();
        break;
      }
      if (!listed) {
        // The four CUDA cannot run without are a warning; the others (a debugger, and a
        // compiler library older drivers do not have) are information.
        const std::string said = absl::StrCat(soname, " is not in the host's ", kLdSoCachePath,
                                              ": left out of what containers get of the NVIDIA driver ",
                                              version);
        required ? log_.Warn(said) : log_.Info(said);
      } else if (!refused.empty()) {
        log_.Warn(absl::StrCat(soname, " left out of what containers get of the NVIDIA driver ",
                               version, ": ", absl::StrJoin(refused, "; ")));
      }
    }
  }
  if (!files.mounts.empty()) files.envs["LD_LIBRARY_PATH"] = container_directory_;

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
