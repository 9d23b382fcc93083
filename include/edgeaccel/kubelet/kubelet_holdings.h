// What the kubelet holds for each resource, asked of the kubelet itself, never of another plugin.
//
//  * The pod-resources API (<kubelet-root>/pod-resources/kubelet.sock, service
//    v1.PodResourcesLister) is the supported way: GetAllocatableResources lists the healthy
//    devices of every resource (GA in 1.28, beta from 1.23), List the devices each pod holds
//    (1.20+). Its path follows the kubelet's --root-dir.
//  * Where that socket is missing (not mounted, a kubelet before 1.20) or does not answer, the
//    device manager's checkpoint is read instead: RegisteredDevices is the healthy ids as of the
//    kubelet's last write (stale once a plugin disconnects: the kubelet does not write then),
//    PodDeviceEntries the devices pods hold.
//  * Either way the checkpoint's RegisteredDevices keys say which resources a plugin has served
//    on this node: after a kubelet restart they stay, with empty lists, until the plugin returns.
#ifndef EDGEACCEL_KUBELET_KUBELET_HOLDINGS_H_
#define EDGEACCEL_KUBELET_KUBELET_HOLDINGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "edgeaccel/kubelet/kubelet_checkpoint.h"

namespace edgeaccel {

struct KubeletHoldings {
  // Where the device lists came from: "pod-resources" or "checkpoint".
  std::string source;
  // Healthy (allocatable) device ids per resource.
  std::map<std::string, std::vector<std::string>> healthy;
  // Device ids held by pods, per resource.
  std::map<std::string, std::vector<std::string>> allocated;
  // The same, with the pod that holds each, per resource and device id: its namespace and name
  // (pod-resources), or only its UID as the name (checkpoint).
  struct Pod {
    std::string namespace_name;  // empty from the checkpoint
    std::string name;
  };
  std::map<std::string, std::map<std::string, Pod>> holders;
  // Per DRA driver, the ResourceClaims ("namespace/name") the kubelet lists for its active pods
  // (List's dynamic_resources: KubeletPodResourcesDynamicResources, on by default from 1.34, GA
  // in 1.36). Empty from the checkpoint.
  std::map<std::string, std::set<std::string>> claims_in_use;
  // Resources some plugin has registered on this node (the checkpoint's RegisteredDevices keys,
  // and any resource with devices above). Empty when the checkpoint could not be read.
  std::set<std::string> known;
};

// Asks the pod-resources API on `socket` (GetAllocatableResources, then List), each call within
// `timeout`. Unimplemented (a kubelet before 1.23 without the feature gate) is an error: the
// caller falls back to the checkpoint.
absl::StatusOr<KubeletHoldings> AskPodResources(const std::string& socket, absl::Duration timeout);

// The same facts from the device manager checkpoint.
KubeletHoldings HoldingsFromCheckpoint(const KubeletCheckpoint& checkpoint);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_KUBELET_HOLDINGS_H_
