// NVIDIA Jetson (Tegra) integrated GPUs.
//
// A Tegra host is recognised from /etc/nv_tegra_release, /sys/devices/soc0/family or
// /proc/device-tree/compatible ("nvidia,tegra210" ...). Its one integrated GPU is a device whose
// nodes are the ones this host has of those the GPU and its engines need (the set differs between
// L4T R32, R35 and R36): /dev/nvmap, the GPU's own nodes (/dev/nvhost-*-gpu, /dev/nvgpu/igpu0/*),
// /dev/nvhost-ctrl and the engines' nodes (VIC, NVDEC, NVENC, NVJPG, OFA, DLA, PVA),
// /dev/host1x-fence, /dev/nvsciipc, /dev/dri/renderD*, and JetPack 6's /dev/v4l2-nv{enc,dec}
// stand-ins. Each is lstat'ed (a symlink is never followed) and must be what the kernel says it
// is: its major registered by the right driver in /proc/devices, and /sys/dev/char/M:m naming it.
// Display nodes (/dev/dri/card*, /dev/fb*, /dev/tegra_dc_*, Orin's display driver /dev/nvidia*)
// only with --tegra_display_nodes. Where L4T ships its container file lists (tegra_host_files.h),
// the candidates are the `dev` entries the lists name instead of what /dev holds (a node the
// lists name and no rule here knows is taken as a character device the vendor vouches for), and
// the lists' libraries go with the GPU as read-only mounts. Healthy while /dev/nvmap, the GPU control node
// (/dev/nvhost-ctrl-gpu or /dev/nvgpu/*/ctrl) and the GPU's devfreq device exist.
#ifndef EDGEACCEL_DISCOVERY_TEGRA_H_
#define EDGEACCEL_DISCOVERY_TEGRA_H_

#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/discovery/tegra_host_files.h"
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
  // Reads again everything the last scan read but the device tree (fixed while the system runs):
  // the release file, the device nodes the GPU is given (many are not under a watched name),
  // /proc/devices, devfreq, the GPU's load and temperature, MemTotal, the container file lists
  // and what they name.
  bool InputsUnchanged() override { return inputs_.Unchanged(); }
  ScanInputs* ProbeInputs() override { return &inputs_; }

 private:
  // The device nodes the iGPU and its engines need, each checked against what the kernel says
  // it is; display nodes only with NvidiaOptions::display_nodes; nothing of a discrete GPU.
  // `listed` (may be null): the nodes the container file lists name, the only candidates then.
  std::vector<DeviceNode> GpuNodes(absl::string_view soc, const std::optional<std::string>& devfreq,
                                   bool discrete_gpu, const std::vector<std::string>* listed);
  // /sys/class/devfreq entry of the GPU ("57000000.gpu"), if any.
  std::optional<std::string> FindDevfreq();
  // A device-tree property (compatible, model) and the path it was read from.
  std::optional<std::pair<std::string, std::string>> ReadDeviceTree(absl::string_view name);

  const Host* host_;
  NvidiaOptions options_;
  ScanInputs inputs_;
  TegraHostFilesReader host_files_;
  OnceLogger log_;
  // Nodes GpuNodes found to be what they claim, by name, major:minor, inode and what the checks
  // depended on; valid for one /proc/devices content.
  absl::flat_hash_set<std::string> verdicts_;
  std::string verdicts_registered_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_TEGRA_H_
