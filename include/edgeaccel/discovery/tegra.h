// NVIDIA Jetson (Tegra) integrated GPUs.
//
// A Tegra host is recognised from /etc/nv_tegra_release, /sys/devices/soc0/family or
// /proc/device-tree/compatible ("nvidia,tegra210" ...). Its one integrated GPU is a device whose
// nodes are derived from what this host has: every /dev/nvhost-*, /dev/nvmap, /dev/nvgpu/*/*,
// /dev/dri/{card,renderD}*, /dev/host1x-fence, /dev/nvidia* and /dev/nvsciipc character device
// (the set differs between L4T R32, R35 and R36, so no fixed list). Healthy while /dev/nvmap, the
// GPU control node (/dev/nvhost-ctrl-gpu or /dev/nvgpu/*/ctrl) and the GPU's devfreq device exist.
#ifndef EDGEACCEL_DISCOVERY_TEGRA_H_
#define EDGEACCEL_DISCOVERY_TEGRA_H_

#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

struct TegraRelease {
  std::string major;     // "32"
  std::string revision;  // "7.1"
  std::string board;     // "t210ref", "t186ref", "generic"
  std::string L4t() const { return major + "." + revision; }  // "32.7.1"
};

// First line of /etc/nv_tegra_release:
// "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: ...".
absl::StatusOr<TegraRelease> ParseTegraRelease(absl::string_view text);

// The SoC ("tegra210") named in /proc/device-tree/compatible, a NUL-separated list.
std::optional<std::string> TegraSocFromCompatible(absl::string_view compatible);

// What the SoC's GPU is: name and CUDA compute capability ("gm20b", "5.3" for tegra210).
struct TegraGpuModel {
  std::string name;
  std::string compute_capability;
};
std::optional<TegraGpuModel> TegraGpuForSoc(absl::string_view soc);

class TegraGpuDiscoverer : public Discoverer {
 public:
  TegraGpuDiscoverer(const Host* host, NvidiaOptions options);

  std::string ResourceName() const override;
  std::string Family() const override { return "tegra"; }
  std::vector<Device> Scan() override;
  std::vector<WatchSpec> WatchPaths() const override;
  std::string NothingFoundHint() const override;

 private:
  std::vector<DeviceNode> GpuNodes() const;
  // /sys/class/devfreq entry of the GPU ("57000000.gpu"), if any.
  std::optional<std::string> FindDevfreq() const;
  // A device-tree property (compatible, model) and the path it was read from.
  std::optional<std::pair<std::string, std::string>> ReadDeviceTree(absl::string_view name) const;

  const Host* host_;
  NvidiaOptions options_;
  OnceLogger log_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_TEGRA_H_
