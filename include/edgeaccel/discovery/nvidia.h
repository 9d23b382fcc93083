// Discrete NVIDIA GPUs (PCIe), read from the driver's /proc files; no NVML dependency.
//
// Each /proc/driver/nvidia/gpus/<pci>/information names a GPU (Model, GPU UUID, Device Minor,
// Bus Location). The device id is the GPU UUID; the container gets /dev/nvidia<minor> and the
// control nodes that exist (nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset).
#ifndef EDGEACCEL_DISCOVERY_NVIDIA_H_
#define EDGEACCEL_DISCOVERY_NVIDIA_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/discovery/discoverer.h"
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
};

// "key: \t value" lines of /proc/driver/nvidia/gpus/<bus>/information.
std::map<std::string, std::string> ParseNvidiaInformation(absl::string_view text);

// The version in /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module
// 515.76 ..." or "... Open Kernel Module for x86_64  555.58.02 ...").
absl::StatusOr<std::string> ParseNvidiaDriverVersion(absl::string_view text);

class NvidiaGpuDiscoverer : public Discoverer {
 public:
  NvidiaGpuDiscoverer(const Host* host, NvidiaOptions options);

  std::string ResourceName() const override;
  std::string Family() const override { return "nvidia"; }
  std::vector<Device> Scan() override;
  std::vector<WatchSpec> WatchPaths() const override;
  std::vector<std::string> UeventSubsystems() const override;
  std::string StaleHostView() const override;
  std::string NothingFoundHint() const override;

 private:
  std::optional<Device> ScanOne(const std::string& directory, const std::string& driver_version);

  const Host* host_;
  NvidiaOptions options_;
  OnceLogger log_;
  mutable absl::Mutex stale_mu_;
  std::string stale_ ABSL_GUARDED_BY(stale_mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_NVIDIA_H_
