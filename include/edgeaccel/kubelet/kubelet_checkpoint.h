// The kubelet's device manager checkpoint, <device-plugin-dir>/kubelet_internal_checkpoint: what
// the kubelet itself says about device plugins, as far as this node's plugins can read it.
//
//  * RegisteredDevices: the healthy device ids per resource as of the kubelet's last write (after
//    a ListAndWatch update or an allocation). Stale once a plugin disconnects (the kubelet does
//    not rewrite it then), and emptied for every resource when the kubelet restarts, until its
//    plugin registers again. The pod-resources API is the live answer; this is the fallback.
//  * PodDeviceEntries: the Allocate answer the kubelet cached for each container. It replays this
//    answer, not a new Allocate, whenever the container restarts.
// It is JSON ({"Data": {...}, "Checksum": N}); the kubelet checks the checksum, we only read.
#ifndef EDGEACCEL_KUBELET_KUBELET_CHECKPOINT_H_
#define EDGEACCEL_KUBELET_KUBELET_CHECKPOINT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "deviceplugin_v1beta1.pb.h"

namespace edgeaccel {

struct KubeletCheckpoint {
  struct Entry {
    std::string pod_uid;
    std::string container_name;
    std::string resource_name;
    std::vector<std::string> device_ids;  // every NUMA node's, in file order
    v1beta1::ContainerAllocateResponse allocate_response;  // the cached answer
  };
  std::vector<Entry> entries;
  std::map<std::string, std::vector<std::string>> registered_devices;  // resource -> ids
  // PodDeviceEntries left out because a field was missing, of another type, or unreadable.
  int unreadable_entries = 0;

  // The cached answer for the container that holds exactly `ids` of `resource` (ids are never
  // shared between containers, so they name one), or nullptr.
  const Entry* FindEntry(absl::string_view resource, const std::vector<std::string>& ids) const;
};

// Parses the checkpoint's JSON. Both layouts are read: DeviceIDs as a list (kubelets before
// 1.20) or per NUMA node ({"0": [...], "-1": [...]}).
absl::StatusOr<KubeletCheckpoint> ParseKubeletCheckpoint(absl::string_view json);

// Reads and parses the file (at most 16 MiB).
absl::StatusOr<KubeletCheckpoint> ReadKubeletCheckpoint(const std::string& path);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_KUBELET_CHECKPOINT_H_
