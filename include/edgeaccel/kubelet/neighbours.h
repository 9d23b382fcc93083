// Who else serves a resource on this node, learnt without disturbing anyone.
//
// Neighbours are not ours to read. Device plugins built like NVIDIA's hand each health event to
// whichever of their ListAndWatch streams takes it first; plugins built like Intel's read one
// update channel for all their streams and stop serving when a send fails. A ListAndWatch stream
// opened on such a plugin takes events meant for the kubelet, or stops the plugin. So nothing
// here opens a stream, or calls a method that could take an event, on a socket we did not create:
//  * plugins_registry/ sockets are asked GetInfo (unary, with a deadline): it names the resource.
//  * What the kubelet holds per resource comes from the kubelet (kubelet_holdings.h): the
//    pod-resources API, or its checkpoint where that socket is missing.
//  * Whether a socket in device-plugins/ is alive is a connect(), nothing more.
// The whole look is bounded (Query::budget): it never holds the registrar for longer.
#ifndef EDGEACCEL_KUBELET_NEIGHBOURS_H_
#define EDGEACCEL_KUBELET_NEIGHBOURS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "edgeaccel/kubelet/kubelet_holdings.h"

namespace edgeaccel {

struct NeighbourView;

struct NeighbourQuery {
  std::string resource;
  std::string device_plugin_dir;
  std::string plugins_registry_dir;
  // <kubelet-root>/pod-resources/kubelet.sock
  std::string pod_resources_socket;
  // Our socket's file name (the same in both directories).
  std::string own_socket_name;
  // The socket this process serves on now ("" when none): never counted as a predecessor.
  std::string serving_on;
  // Its second link in device-plugins/ during a handover registration ("" when none): the same.
  std::string also_serving_on;
  // Each call's deadline, and the whole look's.
  absl::Duration call_timeout = absl::Milliseconds(250);
  absl::Duration budget = absl::Seconds(1);
  // A look made moments ago while an earlier edgeaccel served the resource (not owned). Its
  // holdings stand for this look's where no plugins_registry/ socket claims the resource and the
  // live device-plugins/ sockets are the same: another plugin can only take the resource through
  // a socket of its own, so nothing but our predecessor's going has changed what the kubelet
  // lists, and the pod-resources call is spared at the moment it costs most (every device
  // Unhealthy at the kubelet until we register; 20 to 190 ms on a busy node).
  const NeighbourView* reuse_holdings_of = nullptr;
};

struct NeighbourView {
  // A plugins_registry/ socket other than ours whose GetInfo names the resource.
  std::string registry_claim;
  // Our socket's name held by a live process other than this one: an earlier edgeaccel still
  // serving (a rollout with maxSurge, a restart with another --registration).
  std::string predecessor;
  // Live sockets in device-plugins/ other than kubelet.sock and ours, and each one's identity
  // ("path@inode": a socket re-created by a restarted plugin is another).
  int live_foreign_sockets = 0;
  std::vector<std::string> live_foreign;
  // What the kubelet holds. `holdings_read` is false when neither the pod-resources API nor the
  // checkpoint could be read; `holdings_note` says why pod-resources was not used, if it was not.
  KubeletHoldings holdings;
  bool holdings_read = false;
  std::string holdings_note;
  // The holdings are NeighbourQuery::reuse_holdings_of's, not read in this look.
  bool holdings_reused = false;
  // The checkpoint is there but has a shape we do not know (not JSON, no Data, entries with
  // fields of other types): what was left out, for one warning and a metric. "" when fine.
  std::string checkpoint_problem;
  // How long the look took, and whether it ran out of budget (sockets left unasked).
  absl::Duration took;
  bool out_of_budget = false;
};

NeighbourView LookAround(const NeighbourQuery& query);

// The resource a plugin-watcher socket says it serves, or "" if it does not answer GetInfo as a
// device plugin within `timeout`. GetInfo is unary and takes nothing from the plugin.
std::string WatcherResource(const std::string& socket, absl::Duration timeout);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_NEIGHBOURS_H_
