// Discrete NVIDIA GPUs (PCIe), read from the driver's /proc files; no NVML dependency.
//
// Each /proc/driver/nvidia/gpus/<pci>/information names a GPU (Model, GPU UUID, Device Minor,
// Bus Location). The device id is the GPU UUID; the container gets /dev/nvidia<minor> and the
// control nodes that exist (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset), and the
// driver's libraries of the running version (driver_libraries.h).
#ifndef EDGEACCEL_DISCOVERY_NVIDIA_H_
#define EDGEACCEL_DISCOVERY_NVIDIA_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/discovery/driver_libraries.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

// Options shared by the NVIDIA families (discrete and Jetson).
struct NvidiaOptions {
  // Answer the envs the NVIDIA container runtime understands (NVIDIA_VISIBLE_DEVICES,
  // NVIDIA_DRIVER_CAPABILITIES). Off when the runtime is not installed, or CDI is used instead.
  bool runtime_envs = true;
  // Hand out a Jetson's display nodes with its iGPU (/dev/dri/card*, /dev/fb*, /dev/tegra_dc_*,
  // Orin's /dev/nvidia*): for containers that drive a display. Off: compute and media only.
  bool display_nodes = false;
  // Hand out the driver's user-space libraries with the GPU (read-only mounts where the
  // container's loader looks by default: discrete GPUs from the host's ld.so cache, Jetson from
  // L4T's container file lists), so that a runtime without NVIDIA's hook runs CUDA. Off for
  // nodes whose NVIDIA runtime mounts them itself; then a Jetson is served with the nodes this
  // daemon knows.
  bool driver_libraries = true;
  // Which of a discrete GPU's driver library sets (DriverLibrarySonames), and the
  // NVIDIA_DRIVER_CAPABILITIES answered for NVIDIA's runtime.
  unsigned driver_capabilities = kDefaultDriverCapabilities;
  // One more container directory a discrete GPU's libraries go in ("" none).
  std::string driver_library_dir;
};

// "key: \t value" lines of /proc/driver/nvidia/gpus/<bus>/information.
std::map<std::string, std::string> ParseNvidiaInformation(absl::string_view text);

// The version in /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
// 515.76 ..." or "... Open Kernel Module for x86_64  555.58.02 ...").
absl::StatusOr<std::string> ParseNvidiaDriverVersion(absl::string_view text);

// What NVML knows about discrete GPUs beyond the driver's /proc files (nvml/nvml_supervisor.h):
// memory, compute capability, MIG and ECC mode as facts, Xid errors and unanswered calls as
// health. The discoverer hands it every scan; it never blocks (it answers from what it has).
class GpuFactSource {
 public:
  virtual ~GpuFactSource() = default;
  // Adds facts to, and sets the health of, the GPUs it knows (by uuid); removes the GPUs that
  // are not allocatable as a whole (MIG mode on). Called with the discoverer's scan, on its
  // thread; a non-empty list is what starts NVML.
  virtual void Amend(std::vector<Device>* devices) = 0;
  // What --discover says about NVML and the GPUs it left out. Any thread.
  virtual std::vector<std::string> Remarks() const = 0;
};

class NvidiaGpuDiscoverer : public Discoverer {
 public:
  // `facts` (may be null: no NVML) must outlive the discoverer.
  NvidiaGpuDiscoverer(const Host* host, NvidiaOptions options, GpuFactSource* facts = nullptr);

  std::string ResourceName() const override;
  std::string Family() const override { return "nvidia"; }
  std::vector<Device> Scan() override;
  std::vector<WatchSpec> WatchPaths() const override;
  std::vector<std::string> UeventSubsystems() const override;
  std::string StaleHostView() const override;
  std::string NothingFoundHint() const override;
  std::vector<std::string> Remarks() const override;
  // Reads again the driver's /proc files, the GPUs' NUMA nodes and the driver's files on the
  // host. What NVML says comes with a rescan of its own (GpuFactSource's owner asks for it), but
  // a critical Xid's text counts down to the GPU's recovery: while one is shown, false.
  bool InputsUnchanged() override;
  ScanInputs* ProbeInputs() override { return &inputs_; }

 private:
  std::optional<Device> ScanOne(const std::string& directory, const std::string& driver_version);

  const Host* host_;
  NvidiaOptions options_;
  GpuFactSource* facts_;
  ScanInputs inputs_;
  bool counting_down_ = false;  // the last scan gave a GPU a critical Xid
  DriverLibraryFinder libraries_;
  OnceLogger log_;
  mutable absl::Mutex stale_mu_;
  std::string stale_ ABSL_GUARDED_BY(stale_mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_NVIDIA_H_
