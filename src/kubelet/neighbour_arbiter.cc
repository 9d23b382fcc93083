#include "edgeaccel/kubelet/neighbour_arbiter.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/inventory/replicas.h"

namespace edgeaccel {

absl::string_view VerdictName(ArbiterDecision::Verdict verdict) {
  switch (verdict) {
    case ArbiterDecision::kServe:
      return "serve";
    case ArbiterDecision::kLeave:
      return "leave";
    case ArbiterDecision::kWait:
      return "wait";
    case ArbiterDecision::kStepBack:
      return "step back";
  }
  return "serve";
}

ArbiterDecision NeighbourArbiter::Decide(const ArbiterInput& input, absl::Time now) {
  const NeighbourView& view = *input.view;
  ArbiterDecision decision;
  auto leave = [&](std::string to, std::string why) {
    unserved_since_ = absl::InfinitePast();  // "gone for good" counts from when it goes
    predecessor_served_ = false;
    decision.verdict = input.registered ? ArbiterDecision::kStepBack : ArbiterDecision::kLeave;
    decision.to = std::move(to);
    decision.why = std::move(why);
    return decision;
  };
  if (input.take_over) {
    decision.why = absl::StrCat("--take-over names ", resource_);
    return decision;
  }
  if (!view.registry_claim.empty()) {
    return leave(view.registry_claim,
                 absl::StrCat("the plugin on ", view.registry_claim, " registers ", resource_,
                              " through the plugin watcher (its GetInfo names it)"));
  }

  absl::flat_hash_set<std::string> ours;
  for (const std::string& id : input.own_ids) ours.insert(PhysicalIdOf(id));
  auto held = [&](const std::map<std::string, std::vector<std::string>>& by_resource) {
    auto it = by_resource.find(resource_);
    return it == by_resource.end() ? std::vector<std::string>() : it->second;
  };
  const std::vector<std::string> healthy = held(view.holdings.healthy);
  std::string foreign_id;
  for (const std::string& id : healthy) {
    if (!ours.contains(PhysicalIdOf(id))) {
      foreign_id = id;
      break;
    }
  }
  // The checkpoint is not rewritten when a plugin disconnects: its healthy ids outlive their
  // plugin. Trust them only while some other plugin's socket is alive.
  const bool healthy_is_live =
      view.holdings.source != "checkpoint" || view.live_foreign_sockets > 0;

  if (input.registered) {
    // The kubelet's list comes from whichever stream spoke last: a device that is not ours in
    // it means another plugin registered the resource after us.
    if (!foreign_id.empty() && healthy_is_live) {
      sockets_when_served_ = std::set<std::string>(view.live_foreign.begin(), view.live_foreign.end());
      return leave("(the plugin that now feeds the kubelet's list)",
                   absl::StrCat("another device plugin registered ", resource_,
                                " after us: the kubelet now lists ", foreign_id,
                                ", which is not a device of ours"));
    }
    return decision;
  }

  if (!view.predecessor.empty()) {
    decision.to_edgeaccel = true;
    leave(view.predecessor, absl::StrCat("an earlier edgeaccel still serves ", resource_, " on ",
                                         view.predecessor, "; registering the moment it is gone"));
    predecessor_served_ = true;
    return decision;
  }
  // A list of only our devices is edgeaccel's, not another plugin's: our own stale one (without
  // pod-resources, the checkpoint after our own registration), or our predecessor's (it just
  // went, and the kubelet has not seen it go yet).
  const bool edgeaccels_list =
      foreign_id.empty() &&
      ((view.holdings.source == "checkpoint" && input.registered_last) || predecessor_served_);
  if (!healthy.empty() && healthy_is_live && !edgeaccels_list) {
    sockets_when_served_ = std::set<std::string>(view.live_foreign.begin(), view.live_foreign.end());
    // The least id names the plugin: pod-resources lists devices in no particular order, and the
    // same plugin must read the same (one log line, not one per look).
    const std::string& named = *std::min_element(healthy.begin(), healthy.end());
    return leave(absl::StrCat("(the plugin that advertises ", named, ")"),
                 absl::StrCat("the kubelet lists ", healthy.size(), " healthy device(s) of ",
                              resource_, " (", named,
                              ", ...) and we have not registered it: another plugin serves it"));
  }

  // Nobody lists a healthy device of it. While every socket that was alive when another plugin
  // served it still is, that plugin is there with every device Unhealthy: still its resource.
  if (!sockets_when_served_.empty() && view.holdings.known.count(resource_) > 0) {
    const std::set<std::string> live(view.live_foreign.begin(), view.live_foreign.end());
    if (std::includes(live.begin(), live.end(), sockets_when_served_.begin(),
                      sockets_when_served_.end())) {
      return leave("(the plugin that served it, all its devices Unhealthy)",
                   absl::StrCat("the kubelet lists no healthy device of ", resource_,
                                ", but the plugin that served it is still there (its socket "
                                "lives): its devices are Unhealthy, the resource is still its own"));
    }
    sockets_when_served_.clear();  // one went: from here the grace decides
  }
  // Nobody serves it now. Ours to take, unless the kubelet knows it from another plugin that
  // may still come back (after a kubelet restart or a reboot every plugin registers again, in
  // no particular order, and some start minutes late).
  bool ours_before = input.registered_last || edgeaccels_list;
  for (const std::string& id : held(view.holdings.allocated)) {
    if (ours.contains(PhysicalIdOf(id))) ours_before = true;
  }
  if (ours_before || view.holdings.known.count(resource_) == 0) {
    unserved_since_ = absl::InfinitePast();
    return decision;
  }
  if (unserved_since_ == absl::InfinitePast()) unserved_since_ = now;
  const absl::Time until = unserved_since_ + grace_;
  if (now < until) {
    decision.verdict = ArbiterDecision::kWait;
    decision.to = "(the plugin that served it before)";
    decision.until = until;
    decision.why = absl::StrCat(
        "the kubelet knows ", resource_,
        " from another device plugin that has not registered it again yet; leaving it to that "
        "plugin for up to ",
        absl::FormatDuration(grace_), " (--neighbour-grace) before registering ours");
    return decision;
  }
  decision.why = absl::StrCat("no plugin has served ", resource_, " for ",
                              absl::FormatDuration(now - unserved_since_),
                              " (--neighbour-grace): registering ours");
  return decision;
}

}  // namespace edgeaccel
