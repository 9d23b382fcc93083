// CDI (Container Device Interface): with --cdi, Allocate also names each device as a CDI device
// and the daemon keeps a matching spec file in the CDI directory (default /var/run/cdi), so a
// CDI-aware runtime (containerd >= 1.7, CRI-O) injects exactly the same nodes and envs.
//
// The CDI kind is ours, "edgeaccel.io/<class>" (edgeaccel.io/edgetpu, edgeaccel.io/gpu): using
// "nvidia.com/gpu" would collide with the specs nvidia-ctk generates for the same GPUs.
#ifndef EDGEACCEL_NODE_CDI_SPEC_H_
#define EDGEACCEL_NODE_CDI_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

// "coral.ai/edgetpu" -> "edgeaccel.io/edgetpu".
std::string CdiKind(absl::string_view resource_name);
// Fully qualified CDI name of a (physical) device: "edgeaccel.io/edgetpu=0000:03:00.0".
std::string CdiDeviceName(absl::string_view resource_name, absl::string_view physical_id);

// The CDI spec (JSON) for the physical devices in `snapshot`.
std::string CdiSpecJson(absl::string_view resource_name, const Snapshot& snapshot);

// Writes specs for one resource into a directory, atomically (a dot-file, then rename), and
// removes the file on Remove().
class CdiSpecFile {
 public:
  CdiSpecFile(std::string directory, std::string resource_name);
  const std::string& path() const { return path_; }
  absl::Status Write(const Snapshot& snapshot) const;
  void Remove() const;

 private:
  std::string directory_;
  std::string resource_name_;
  std::string path_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_CDI_SPEC_H_
