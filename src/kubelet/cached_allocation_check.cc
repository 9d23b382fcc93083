#include "edgeaccel/kubelet/cached_allocation_check.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/kubelet/kubelet_checkpoint.h"
#include "glog/logging.h"

namespace edgeaccel {

PreStartHook CachedAllocationCheck(std::string checkpoint_path, std::string resource) {
  return [checkpoint_path = std::move(checkpoint_path), resource = std::move(resource)](
             const Snapshot& snapshot, const std::vector<std::string>& ids) -> absl::Status {
    std::vector<std::string> gone;       // the pod must be admitted again
    std::vector<std::string> unhealthy;  // the kubelet retries the start
    absl::flat_hash_set<std::string> current_nodes;
    for (const std::string& id : ids) {
      const Device* device = snapshot.Find(id);
      if (device == nullptr) {
        gone.push_back(absl::StrCat("device ", id, " is gone (unplugged since the pod was admitted?)"));
        continue;
      }
      if (device->health != Health::kHealthy) {
        unhealthy.push_back(absl::StrCat("device ", id, " is Unhealthy: ", device->unhealthy_reason));
      }
      for (const DeviceNode& node : device->nodes) current_nodes.insert(node.host_path);
    }
    // A device already gone refuses the start; the cached answer matters only otherwise.
    absl::StatusOr<KubeletCheckpoint> checkpoint =
        gone.empty() ? ReadKubeletCheckpoint(checkpoint_path)
                     : absl::StatusOr<KubeletCheckpoint>(KubeletCheckpoint());
    const KubeletCheckpoint::Entry* entry =
        checkpoint.ok() ? checkpoint->FindEntry(resource, ids) : nullptr;
    if (!checkpoint.ok()) {
      VLOG(1) << resource << ": PreStartContainer cannot check the cached answer: "
              << checkpoint.status().message();
    } else if (entry != nullptr) {
      std::vector<std::string> missing;
      for (const v1beta1::DeviceSpec& spec : entry->allocate_response.devices()) {
        if (!current_nodes.contains(spec.host_path())) missing.push_back(spec.host_path());
      }
      if (!missing.empty()) {
        std::vector<std::string> now(current_nodes.begin(), current_nodes.end());
        std::sort(now.begin(), now.end());
        gone.push_back(absl::StrCat(
            "the answer the kubelet cached for ", absl::StrJoin(ids, ", "), " gives ",
            absl::StrJoin(missing, ", "), ", which the device no longer has (it has ",
            now.empty() ? "no node" : absl::StrJoin(now, ", "),
            " now: it re-enumerated or was replugged)"));
      }
    }
    if (!gone.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          absl::StrJoin(gone, "; "),
          ". A restarted container gets the answer cached when its pod was admitted, so it cannot "
          "have the device back: delete the pod to have it admitted (and allocated) again"));
    }
    if (!unhealthy.empty()) {
      return absl::UnavailableError(absl::StrCat(
          absl::StrJoin(unhealthy, "; "),
          ". The container starts once the device is Healthy again (the kubelet retries)"));
    }
    return absl::OkStatus();
  };
}

}  // namespace edgeaccel
