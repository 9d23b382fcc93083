// NeighbourArbiter: whether we may serve a resource now, or must leave it to another plugin.
//
// Never two plugins feeding one resource. The kubelet keeps one device list per resource name,
// rebuilt from whichever plugin's stream spoke last, and (1.25-1.36) disconnects the current
// plugin when a replaced one's stream ends. So:
//  * a resource another plugin serves is left to it (--take-over aside);
//  * if another plugin registers a resource we serve, we step back;
//  * a resource another plugin served before a kubelet restart or reboot is left to it while it
//    comes back, whatever order the plugins return in, until it has been gone for `grace`;
//  * an earlier edgeaccel still serving the resource (a rollout) is waited for.
// Pure decisions over what LookAround saw and what we know of ourselves, on an injected clock:
// its tests step through kubelet behaviours instead of sleeping.
#ifndef EDGEACCEL_KUBELET_NEIGHBOUR_ARBITER_H_
#define EDGEACCEL_KUBELET_NEIGHBOUR_ARBITER_H_

#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "edgeaccel/kubelet/neighbours.h"

namespace edgeaccel {

struct ArbiterInput {
  const NeighbourView* view = nullptr;
  // The ids we advertise (or would) for the resource, and every id we had since we started: the
  // kubelet's list may still hold a device we unplugged a moment ago.
  std::vector<std::string> own_ids;
  // We hold a live, current registration of the resource now.
  bool registered = false;
  // Our registration record: this node's last registration of the resource was ours.
  bool registered_last = false;
  bool take_over = false;
};

struct ArbiterDecision {
  enum Verdict {
    kServe,     // serve and register
    kLeave,     // not registered: leave it to `to`, look again on the next event
    kWait,      // not registered: wait until `until` (or the next event) and decide again
    kStepBack,  // registered, but another plugin took the resource: stop feeding it
  };
  Verdict verdict = kServe;
  std::string to;   // who the resource is left to, for logs, /healthz and --discover
  std::string why;  // one sentence for the log and the Node Event
  // Left to another edgeaccel process holding our socket name (`to`): during a rollout an
  // earlier daemon; for `--discover` beside a running daemon, that daemon.
  bool to_edgeaccel = false;
  absl::Time until = absl::InfiniteFuture();
};

absl::string_view VerdictName(ArbiterDecision::Verdict verdict);

class NeighbourArbiter {
 public:
  NeighbourArbiter(std::string resource, absl::Duration grace)
      : resource_(std::move(resource)), grace_(grace) {}

  ArbiterDecision Decide(const ArbiterInput& input, absl::Time now);

 private:
  const std::string resource_;
  const absl::Duration grace_;
  // Since when the kubelet has known the resource from another plugin with nobody serving it.
  absl::Time unserved_since_ = absl::InfinitePast();
  // The foreign sockets alive when the kubelet last listed another plugin's healthy devices of
  // the resource. While every one of them lives on, an empty healthy list means that plugin's
  // devices are all Unhealthy (NVIDIA's never recover), not that it is gone: the resource stays
  // its own. A kubelet restart deletes them (and the plugin makes a new one), which starts the
  // grace.
  std::set<std::string> sockets_when_served_;
  // The last look found an earlier edgeaccel serving the resource (a rollout). Once it goes, the
  // kubelet lists its devices as healthy until it sees it go (its plugin watcher's next pass, the
  // stream's end): our own ids, served by us before, not another plugin's.
  bool predecessor_served_ = false;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_NEIGHBOUR_ARBITER_H_
