// CDI (Container Device Interface): with --cdi, Allocate also names each device as a CDI device
// and the daemon keeps a matching spec file in the CDI directory (default /var/run/cdi), so a
// CDI-aware runtime (containerd >= 1.7, CRI-O) injects exactly the same nodes and envs.
//
// The CDI kind is ours, "edgeaccel.io/<class>" (edgeaccel.io/edgetpu, edgeaccel.io/gpu): using
// "nvidia.com/gpu" would collide with the specs nvidia-ctk generates for the same GPUs.
#ifndef EDGEACCEL_NODE_CDI_SPEC_H_
#define EDGEACCEL_NODE_CDI_SPEC_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

// "coral.ai/edgetpu" -> "edgeaccel.io/edgetpu".
std::string CdiKind(absl::string_view resource_name);
// Fully qualified CDI name of a (physical) device: "edgeaccel.io/edgetpu=0000:03:00.0".
std::string CdiDeviceName(absl::string_view resource_name, absl::string_view physical_id);

// The CDI containerEdits (a JSON object: deviceNodes, env, and the read-only mounts when the
// device has any) that give a container `device`.
// Shared by the device plugin's spec and the DRA driver's claim specs.
std::string CdiContainerEditsJson(const Device& device);

// The CDI spec (JSON) for the physical devices in `snapshot`. Each device node carries the host
// node's mode bits and owner (fileMode, uid, gid) where they are known (DeviceNode::host_mode).
std::string CdiSpecJson(absl::string_view resource_name, const Snapshot& snapshot);

// The spec file of one resource in the CDI directory, written atomically (a dot-file, then
// rename). It also knows what it last put on disk, so Allocate names only devices a runtime can
// resolve right now.
//
// A resource with no devices has no spec file: containerd refuses a spec whose device list is
// empty ("invalid spec, no devices") and says so on every reload of the directory. Write() of
// a snapshot without devices removes ours.
//
// The file is left in place when the daemon stops: the kubelet replays a cached Allocate answer,
// CDI names included, whenever a container restarts, also while the daemon is down or being
// rolled out, and the devices are still there. The next daemon rewrites it from what it finds.
class CdiSpecFile {
 public:
  CdiSpecFile(std::string directory, std::string resource_name);
  const std::string& path() const { return path_; }
  // Writes the spec for the physical devices in `snapshot` (the directory is made if missing);
  // with none, removes the spec file instead. Writes of one file never overlap.
  absl::Status Write(const Snapshot& snapshot);
  // The CDI name of `physical_id` when the spec this object last wrote is on disk and holds it;
  // otherwise why not (never written, removed or replaced since, device not in it). Never waits
  // for a Write() in progress: until its rename lands, the spec before it is the one on disk.
  absl::StatusOr<std::string> NameOnDisk(absl::string_view physical_id) const;

 private:
  // One version of the file: its identity on disk and the devices it holds.
  struct OnDisk {
    dev_t device = 0;
    ino_t inode = 0;
    absl::flat_hash_set<std::string> ids;
  };

  const std::string directory_;
  const std::string resource_name_;
  std::string path_;
  absl::Mutex write_mu_;  // one Write() at a time; NameOnDisk never takes it
  mutable absl::Mutex mu_;  // never held across a write
  std::optional<OnDisk> written_ ABSL_GUARDED_BY(mu_);  // the last spec that landed
  // The spec being written, from the moment its content is on disk until its rename's outcome
  // is known: NameOnDisk may already see it in place.
  std::optional<OnDisk> incoming_ ABSL_GUARDED_BY(mu_);
  bool removed_ ABSL_GUARDED_BY(mu_) = false;  // removed: the resource had no devices
  OnceLogger unstatted_ ABSL_GUARDED_BY(write_mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_CDI_SPEC_H_
