#include "edgeaccel/kubelet/registration_machine.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace edgeaccel {

absl::string_view RegistrationModeName(RegistrationMode mode) {
  switch (mode) {
    case RegistrationMode::kAuto:
      return "auto";
    case RegistrationMode::kPluginWatcher:
      return "plugin-watcher";
    case RegistrationMode::kKubelet:
      return "kubelet";
  }
  return "auto";
}

bool ParseRegistrationMode(absl::string_view text, RegistrationMode* mode) {
  for (RegistrationMode m :
       {RegistrationMode::kAuto, RegistrationMode::kPluginWatcher, RegistrationMode::kKubelet}) {
    if (text == RegistrationModeName(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
}

RegistrationMachine::RegistrationMachine(Options options, RegistrationPorts* ports,
                                         std::function<absl::Time()> clock)
    : options_(std::move(options)),
      ports_(ports),
      clock_(std::move(clock)),
      arbiter_(options_.resource, options_.neighbour_grace),
      backoff_(kInitialBackoff, options_.max_backoff, options_.backoff_jitter) {}

std::string RegistrationMachine::left_to() const {
  absl::MutexLock lock(&mu_);
  return left_to_;
}

std::string RegistrationMachine::holdings_source() const {
  absl::MutexLock lock(&mu_);
  return holdings_source_;
}

void RegistrationMachine::NoteLook(const NeighbourView& view) {
  absl::MutexLock lock(&mu_);
  holdings_source_ = view.holdings_read ? view.holdings.source : "";
}

void RegistrationMachine::SetLeftTo(const std::string& to) {
  absl::MutexLock lock(&mu_);
  left_to_ = to;
}

void RegistrationMachine::Complain(const std::string& message) {
  if (message == last_complaint_) return;
  last_complaint_ = message;
  LOG(WARNING) << options_.resource << ": " << message;
}

// ---- Events ----

void RegistrationMachine::KubeletSocketCreated() {
  std::optional<KubeletSocketId> now = ports_->KubeletSocket();
  if (!now.has_value() || *now == registered_kubelet_id_) return;
  need_register_ = true;
  retry_at_ = absl::InfinitePast();  // a new kubelet: try at once, whatever the backoff
  backoff_.Reset();
  // A call still going to the kubelet that went cannot succeed.
  if (call_kubelet_.has_value() && *call_kubelet_ != *now) ports_->CancelRegister();
}

void RegistrationMachine::KubeletSocketRemoved() {
  if (registered_kubelet_.exchange(false)) {
    LOG(INFO) << options_.resource << ": " << options_.kubelet_socket_path
              << " went: the kubelet has stopped; registering again when it is back";
  }
}

void RegistrationMachine::NeighbourChanged() {
  // Whoever we left the resource to may be gone or back, or, while we serve, another plugin may
  // have registered the resource.
  recheck_other_ = true;
  if (look_at_ == absl::InfiniteFuture()) look_at_ = Now() + kLookSettle;
}

void RegistrationMachine::EventsMissed() {
  std::optional<KubeletSocketId> now = ports_->KubeletSocket();
  if (now.has_value() && *now != registered_kubelet_id_) need_register_ = true;
}

void RegistrationMachine::StreamEnded() {
  // Look once the kubelet has made its next move (or, stepped back, the silenced stream we kept
  // for the kubelet ended).
  check_endpoint_at_ = std::min(check_endpoint_at_, Now() + options_.lost_endpoint_settle);
  recheck_other_ = true;
}

void RegistrationMachine::RegisterDone(const RegisterOutcome& outcome) {
  call_kubelet_.reset();
  const std::string& resource = options_.resource;
  if (handover_ == Handover::kCalling) {
    // Made once, for the handover: the plugin watcher's registration is the one that lasts, so a
    // failure is not retried.
    handover_ = Handover::kNone;
    if (outcome.ok) {
      registered_kubelet_id_ = outcome.kubelet;
      registered_kubelet_.store(true);
      registrations_.fetch_add(1);
      LOG(INFO) << resource << ": registered through kubelet.sock for the handover ("
                << absl::FormatDuration(Now() - outcome.started)
                << "); the kubelet's plugin watcher registers our socket in "
                << options_.plugins_registry_dir
                << " on its next pass, and the kubelet.sock stream stays open until we stop";
    } else if (!outcome.cancelled_by_us) {
      LOG(WARNING) << resource << ": the handover registration through kubelet.sock failed ("
                   << (outcome.deadline_exceeded ? "no answer in time" : outcome.message)
                   << "); the kubelet's plugin watcher registers our socket on its next pass";
    }
    return;
  }
  if (outcome.ok) {
    registered_kubelet_id_ = outcome.kubelet;
    registered_kubelet_.store(true);
    endpoint_lost_.store(false);
    registrations_.fetch_add(1);
    backoff_.Reset();
    last_complaint_.clear();
    // A kubelet that restarted while we were registering needs us again.
    need_register_ = ports_->KubeletSocket() != std::optional<KubeletSocketId>(outcome.kubelet);
    LOG(INFO) << resource << ": registered with the kubelet ("
              << absl::FormatDuration(Now() - outcome.started) << ")";
    return;
  }
  // Our socket vanished, or a newer kubelet appeared: the next step starts over at once.
  if (outcome.cancelled_by_us) return;
  if (ports_->KubeletSocket() != std::optional<KubeletSocketId>(outcome.kubelet)) {
    // The kubelet we called is gone (restarted under the call): its failure says nothing about
    // the new one, so no backoff. If there is no kubelet.sock yet, we wait for it.
    need_register_ = true;
    retry_at_ = absl::InfinitePast();
    VLOG(1) << resource << ": Register failed on a kubelet that has since restarted; retrying";
    return;
  }
  std::string message = outcome.message;
  if (outcome.deadline_exceeded) {
    message = absl::StrCat("no answer from ", options_.kubelet_socket_path, " within ",
                           absl::FormatDuration(options_.register_timeout),
                           " (is the kubelet running? is --device-plugin-dir right?)");
  }
  retry_at_ = Now() + backoff_.Next();
  registration_failures_.fetch_add(1);
  const std::string complaint =
      absl::StrCat("the kubelet did not accept our registration: ", message);
  if (complaint + "; retrying with backoff" != last_complaint_) {
    ports_->Warn("DevicePluginRegistrationRefused", absl::StrCat(resource, ": ", complaint));
  }
  Complain(absl::StrCat(complaint, "; retrying with backoff"));
}

void RegistrationMachine::WatcherProbeAsked() {
  if (handover_ == Handover::kAwaitLetGo) {
    handover_ = Handover::kDue;
    watcher_may_hold_ = false;
    LOG(INFO) << options_.resource << ": the kubelet's plugin watcher has let go of the earlier "
              << "edgeaccel's registration; registering through kubelet.sock until it registers "
                 "ours";
    return;
  }
  if (!probing_) return;
  EndWatcherProbe();
  watcher_may_hold_ = false;
  LOG(INFO) << options_.resource << ": the kubelet's plugin watcher has let go of our earlier "
            << "registration in " << options_.plugins_registry_dir
            << "; registering through kubelet.sock";
  RecordOurs(RegistrationMode::kKubelet);
}

// ---- Actions ----

void RegistrationMachine::CancelRegister() {
  if (call_kubelet_.has_value()) ports_->CancelRegister();
  // A handover registration not yet called is not called (one in flight ends as cancelled).
  if (handover_ != Handover::kCalling) handover_ = Handover::kNone;
}

void RegistrationMachine::StopServing() {
  CancelRegister();
  EndWatcherProbe();
  const EndpointState endpoint = ports_->Endpoint();
  if (endpoint.serving) {
    NoteServerGoing(endpoint);
    ports_->StopServing();
  }
  registered_kubelet_.store(false);
  ports_->WatcherEndpointLost();
}

void RegistrationMachine::NoteServerGoing(const EndpointState& endpoint) {
  // The plugin watcher may have registered the socket, even if it has not told us yet (it
  // records a registration before it connects and notifies).
  if (endpoint.mode == RegistrationMode::kPluginWatcher) watcher_may_hold_ = true;
}

absl::Time RegistrationMachine::WaitForTheWatcherToLetGo() {
  const std::string& resource = options_.resource;
  if (!probing_) {
    const absl::Status status = ports_->StartWatcherProbe();
    if (absl::IsNotFound(status)) {  // no plugins_registry/: nothing registered from it
      watcher_may_hold_ = false;
      return absl::InfinitePast();
    }
    if (!status.ok()) {
      Complain(absl::StrCat(status.message(), "; registering through kubelet.sock without "
                                              "waiting for the kubelet's plugin watcher"));
      watcher_may_hold_ = false;
      return absl::InfinitePast();
    }
    probing_ = true;
    probe_deadline_ = Now() + options_.watcher_probe_timeout;
    LOG(INFO) << resource << ": our socket in " << options_.plugins_registry_dir
              << " may still be registered with the kubelet's plugin watcher, which drops any "
                 "endpoint of " << resource << " when it unregisters that socket; registering "
                 "through kubelet.sock once the watcher has let go of it";
    return probe_deadline_;
  }
  if (Now() < probe_deadline_) return probe_deadline_;
  EndWatcherProbe();
  watcher_may_hold_ = false;
  LOG(WARNING) << resource << ": the kubelet's plugin watcher did not look at "
               << options_.plugins_registry_dir << " within "
               << absl::FormatDuration(options_.watcher_probe_timeout)
               << " (is the kubelet running? is --kubelet-root its --root-dir?); registering "
                  "through kubelet.sock anyway";
  return absl::InfinitePast();
}

void RegistrationMachine::PlanHandover() {
  const std::string& resource = options_.resource;
  if (!ports_->KubeletSocket().has_value()) return;  // the plugin watcher is the only way
  if (watcher_may_hold_) {
    // Its deregistration by name would drop a registration made before it.
    handover_ = Handover::kAwaitLetGo;
    handover_deadline_ = Now() + options_.watcher_probe_timeout;
    LOG(INFO) << resource << ": the kubelet's plugin watcher registers our socket a pass after "
              << "it unregisters the earlier edgeaccel's; registering through kubelet.sock "
                 "meanwhile, once it has let go of that one";
    return;
  }
  handover_ = Handover::kDue;
  LOG(INFO) << resource << ": the kubelet's plugin watcher registers our socket on its next pass; "
            << "registering through kubelet.sock meanwhile";
}

absl::Time RegistrationMachine::StepHandover() {
  const std::string& resource = options_.resource;
  if (handover_ == Handover::kNone || handover_ == Handover::kCalling) {
    return absl::InfiniteFuture();
  }
  if (ports_->WatcherRegistered()) {  // the watcher came first: nothing to bridge
    handover_ = Handover::kNone;
    return absl::InfiniteFuture();
  }
  if (handover_ == Handover::kAwaitLetGo) {
    if (Now() < handover_deadline_) return handover_deadline_;
    handover_ = Handover::kNone;
    LOG(WARNING) << resource << ": no word within "
                 << absl::FormatDuration(options_.watcher_probe_timeout)
                 << " that the kubelet's plugin watcher let go of the earlier edgeaccel's "
                    "registration; leaving our registration to the watcher";
    return absl::InfiniteFuture();
  }
  const std::optional<KubeletSocketId> kubelet = ports_->KubeletSocket();
  if (!kubelet.has_value()) {
    handover_ = Handover::kNone;
    return absl::InfiniteFuture();
  }
  if (absl::Status status = ports_->LinkForKubeletSock(); !status.ok()) {
    handover_ = Handover::kNone;
    Complain(absl::StrCat("cannot register through kubelet.sock for the handover (",
                          status.message(), "); the plugin watcher registers our socket on its "
                                            "next pass"));
    return absl::InfiniteFuture();
  }
  handover_ = Handover::kCalling;
  call_kubelet_ = *kubelet;
  ports_->StartRegister(*kubelet);
  return absl::InfiniteFuture();
}

void RegistrationMachine::EndWatcherProbe() {
  if (!probing_) return;
  ports_->StopWatcherProbe();
  probing_ = false;
  probe_deadline_ = absl::InfiniteFuture();
}

bool RegistrationMachine::RegisteredNow() {
  return registered_kubelet_.load() || ports_->WatcherRegistered();
}

ArbiterInput RegistrationMachine::InputFor(const NeighbourView& view) {
  ArbiterInput input;
  input.view = &view;
  input.own_ids = ports_->OwnIds();
  input.registered = RegisteredNow() && left_to().empty();
  input.registered_last = ports_->RecordSaysOurs();
  input.take_over = options_.take_over;
  return input;
}

void RegistrationMachine::RecordOurs(RegistrationMode via) {
  const bool watcher = via == RegistrationMode::kPluginWatcher;
  if (ports_->RecordSaysOurs() && ports_->RecordSaysWatcher() == watcher) return;
  if (absl::Status status = ports_->Record(true, via); !status.ok()) {
    Complain(absl::StrCat(status.message(), " (the registration record: after a reboot we may "
                                            "wait --neighbour-grace for our own resource)"));
  }
}

void RegistrationMachine::RecordNotOurs() {
  if (absl::Status status = ports_->Record(false, RegistrationMode::kAuto); !status.ok()) {
    Complain(std::string(status.message()));
  }
}

bool RegistrationMachine::Arbitrate() {
  last_other_look_ = Now();
  const bool was_left_to_edgeaccel = predecessor_look_.has_value();
  const std::string& resource = options_.resource;
  const bool reuse = predecessor_look_.has_value() && Now() - predecessor_look_at_ <= kHoldingsReuse;
  const NeighbourView view = ports_->Look(reuse ? &*predecessor_look_ : nullptr);
  NoteLook(view);
  // Counted once its verdict is acted on, so a test that waits for the count sees the outcome.
  absl::Cleanup counted = [this] { neighbour_looks_.fetch_add(1); };
  if (absl::ToInt64Nanoseconds(view.took) > longest_look_ns_.load()) {
    longest_look_ns_.store(absl::ToInt64Nanoseconds(view.took));
  }
  if (view.out_of_budget) {
    Complain(absl::StrCat(resource, ": looking at other plugins took its whole budget (",
                          absl::FormatDuration(options_.look_budget),
                          "); sockets that did not answer in time were not counted"));
  }
  if (!view.holdings_read) {
    holdings_unreadable_.fetch_add(1);
    holdings_warnings_.Warn(absl::StrCat(
        resource, ": cannot tell what the kubelet holds (", view.holdings_note,
        "); deciding from the other plugins' sockets alone. Mount <kubelet-root>/pod-resources "
        "into the pod so the kubelet can be asked."));
  } else if (!view.holdings_note.empty()) {
    holdings_warnings_.Warn(absl::StrCat(
        resource, ": the pod-resources API did not answer (", view.holdings_note,
        "); reading the kubelet's checkpoint instead, which is stale once a plugin disconnects"));
  }
  if (!view.checkpoint_problem.empty()) {
    checkpoint_unreadable_.fetch_add(1);
    checkpoint_warnings_.Warn(absl::StrCat(
        resource, ": the kubelet's checkpoint has a shape this edgeaccel does not know (",
        view.checkpoint_problem, "); what it could not read is left out"));
  }
  const std::string was_left_to = left_to();
  const ArbiterInput input = InputFor(view);
  const ArbiterDecision decision = arbiter_.Decide(input, Now());
  VLOG(1) << resource << ": neighbour look took " << absl::FormatDuration(view.took) << " ("
          << (view.holdings_read ? view.holdings.source : "no holdings")
          << (view.holdings_reused ? ", read by the look before" : "") << "): "
          << VerdictName(decision.verdict) << (decision.why.empty() ? "" : ": ") << decision.why;

  if (decision.to_edgeaccel) {
    // Its time is the holdings' read: reused ones are never passed on past kHoldingsReuse.
    if (!view.holdings_reused) {
      predecessor_look_ = view;
      predecessor_look_at_ = Now();
    }
  } else {
    predecessor_look_.reset();
  }

  if (decision.verdict == ArbiterDecision::kServe) {
    recheck_other_at_ = absl::InfiniteFuture();
    if (!was_left_to.empty()) {
      LOG(INFO) << resource << ": "
                << (decision.why.empty() ? "no other plugin serves it now" : decision.why)
                << "; serving and registering it";
      // A silenced server kept for its open stream goes now: the plugin we left it to is gone.
      StopServing();
      SetLeftTo("");
      predecessor_left_ = was_left_to_edgeaccel;
    } else if (options_.take_over && !decision.why.empty() &&
               (!view.registry_claim.empty() || view.live_foreign_sockets > 0)) {
      Complain("registering it even where another plugin may serve it, as --take-over asks");
    }
    ports_->WatcherSteppedBack(false);
    if (predecessor_was_watcher_) {
      // Our predecessor registered through the plugin watcher, from the path we would probe.
      predecessor_was_watcher_ = false;
      watcher_may_hold_ = true;
    }
    return false;
  }

  if (decision.verdict == ArbiterDecision::kStepBack) {
    // Another plugin registered it after us. Our stream stays open and silent: ending it would
    // make a kubelet 1.25-1.36 disconnect that plugin (runClient disconnects the current client).
    ports_->Silence();
    SetLeftTo(decision.to);
    CancelRegister();
    registered_kubelet_.store(false);
    ports_->WatcherEndpointLost();
    ports_->WatcherSteppedBack(true);
    RecordNotOurs();
    ports_->Warn("DevicePluginSteppedBack",
                 absl::StrCat(resource, ": stepped back: ", decision.why,
                              "; start with --take-over to serve it from edgeaccel"));
    LOG(WARNING) << resource << ": stepping back: " << decision.why
                 << ". edgeaccel sends nothing more for " << resource
                 << " (its stream stays open, silent) and leaves it to that plugin; to serve it "
                    "from edgeaccel instead, remove that plugin or pass --take-over="
                 << resource;
    return true;
  }

  // Leave or wait: not serving. A server left from before goes (its socket too), unless it is a
  // silenced one still holding the stream the kubelet replaced.
  const EndpointState endpoint = ports_->Endpoint();
  const bool silenced_server =
      endpoint.serving && !was_left_to.empty() && endpoint.open_streams > 0;
  SetLeftTo(decision.to);
  if (!silenced_server) StopServing();
  ports_->WatcherSteppedBack(true);
  predecessor_was_watcher_ =
      !view.predecessor.empty() && !options_.plugins_registry_dir.empty() &&
      absl::StartsWith(view.predecessor, options_.plugins_registry_dir + "/");
  recheck_other_at_ =
      decision.verdict == ArbiterDecision::kWait ? decision.until : absl::InfiniteFuture();
  if (was_left_to != decision.to) {
    if (view.predecessor.empty()) {
      RecordNotOurs();
      ports_->Warn("DevicePluginTakeoverRefused",
                   absl::StrCat(resource, ": not registered: ", decision.why,
                                "; start with --take-over to replace it"));
    }
    LOG(WARNING) << resource << ": not registering it: " << decision.why
                 << (view.predecessor.empty()
                         ? absl::StrCat(". To serve it from edgeaccel instead, remove that plugin "
                                        "or pass --take-over=",
                                        resource)
                         : "");
  }
  return true;
}

void RegistrationMachine::CheckEndpoint(RegistrationMode mode) {
  const std::string& resource = options_.resource;
  const EndpointState endpoint = ports_->Endpoint();
  if (!endpoint.serving || endpoint.open_streams > 0 || call_in_flight()) return;
  std::string where;
  if (mode == RegistrationMode::kKubelet) {
    if (!registered_kubelet_.load()) return;
    // A new kubelet.sock is a restart, handled as one.
    if (ports_->KubeletSocket() != std::optional<KubeletSocketId>(registered_kubelet_id_)) return;
    if (!ports_->KubeletAnswers()) {
      LOG(INFO) << resource << ": the kubelet ended our ListAndWatch stream and "
                << options_.kubelet_socket_path
                << " does not answer: the kubelet has stopped; registering again when it is back";
      registered_kubelet_.store(false);
      return;
    }
    where = absl::StrCat(options_.kubelet_socket_path, " is unchanged");
  } else {
    if (!ports_->WatcherRegistered()) return;
    where = "our socket is still in place";
  }
  endpoint_lost_.store(true);
  registered_kubelet_.store(false);
  ports_->WatcherEndpointLost();
  LOG(WARNING) << resource << ": the kubelet ended our ListAndWatch stream while " << where
               << ": it dropped our endpoint (another plugin registered " << resource
               << ", or the late deregistration of a plugin that served it before). Until we are "
                  "registered again the kubelet counts these devices Unhealthy.";
  if (Arbitrate()) return;
  retry_at_ = Now() + backoff_.Next();
  LOG(WARNING) << resource << ": no other plugin serves it; registering again in "
               << absl::FormatDuration(retry_at_ - Now());
  if (mode == RegistrationMode::kKubelet) {
    need_register_ = true;
  } else {
    StopServing();  // a new socket: the plugin watcher registers it again
  }
}

// ---- The loop ----

absl::Time RegistrationMachine::Step() {
  // A pass asks for another when a decision changed what the next one sees (a look left the
  // resource to another plugin, say). Each such change settles in a pass or two; the bound only
  // keeps a bug from becoming a busy loop.
  for (int pass = 0; pass < 16; ++pass) {
    const Pass result = RunOnce();
    if (!result.again) return result.wake;
  }
  LOG(WARNING) << options_.resource << ": registration did not settle in 16 passes; pausing";
  return Now() + kLookInterval;
}

RegistrationMachine::Pass RegistrationMachine::RunOnce() {
  const std::string& resource = options_.resource;
  const auto again = [] { return Pass{true, absl::InfiniteFuture()}; };
  const auto wait_until = [](absl::Time at) { return Pass{false, at}; };

  if (!record_read_) {
    record_read_ = true;
    // An earlier edgeaccel that registered through the plugin watcher (or did not say how).
    watcher_may_hold_ = ports_->RecordSaysOurs() && ports_->RecordSaysWatcher();
  }
  const RegistrationMode mode = ports_->EffectiveMode();
  if (mode != RegistrationMode::kKubelet) EndWatcherProbe();  // the path may be ours to serve
  if (mode == RegistrationMode::kAuto) {
    Complain(absl::StrCat("waiting for the kubelet: neither ", options_.device_plugin_dir,
                          " nor ", options_.plugins_registry_dir,
                          " exists yet (is the kubelet running on this node? is --kubelet-root "
                          "its --root-dir? microk8s uses /var/snap/microk8s/common/var/lib/kubelet)"));
    return wait_until(absl::InfiniteFuture());
  }
  if (Now() >= check_endpoint_at_) {
    check_endpoint_at_ = absl::InfiniteFuture();
    CheckEndpoint(mode);
  }

  bool looked_now = false;  // a look in this pass said the resource is ours to serve
  // 0. Left to another plugin (or waiting for one): look again when something changed (at most
  //    every kLookInterval, and once more a moment later, since the kubelet acts on a stream's
  //    end or a new plugin's first list a little after the socket event), and when the grace for
  //    a plugin that served it before runs out.
  if (!left_to().empty()) {
    if (recheck_other_) {
      const absl::Time now = Now();
      recheck_other_at_ =
          std::min(recheck_other_at_, std::max(now, last_other_look_ + kLookInterval));
      settle_look_at_ = now + kLookSettle;
    }
    recheck_other_ = false;
    look_at_ = absl::InfiniteFuture();
    if (Now() >= settle_look_at_) {
      settle_look_at_ = absl::InfiniteFuture();
      recheck_other_at_ = absl::InfinitePast();
    }
    // The silenced stream we kept after stepping back has ended (the kubelet restarted): nothing
    // holds the old server any more.
    const EndpointState endpoint = ports_->Endpoint();
    if (endpoint.serving && endpoint.open_streams == 0) recheck_other_at_ = absl::InfinitePast();
    if (Now() >= recheck_other_at_) {
      recheck_other_at_ = absl::InfiniteFuture();
      Arbitrate();
      // Ours now (the plugin we waited for has gone): steps 1 and 2 serve and register on this
      // look, not on one more each. During a rollout the kubelet counts every device Unhealthy
      // from the old daemon's end until our first list, and a look asks pod-resources (20 to
      // 140 ms on the lab's busy node).
      looked_now = left_to().empty();
    }
    if (!left_to().empty()) return wait_until(std::min(recheck_other_at_, settle_look_at_));
  }
  recheck_other_ = false;

  // 0b. Registered: an event that may mean another plugin registered the resource after us (a
  //     new socket, the kubelet's checkpoint rewritten) is looked into once it settles.
  if (look_at_ != absl::InfiniteFuture() && Now() >= look_at_) {
    look_at_ = absl::InfiniteFuture();
    if (RegisteredNow() && Arbitrate()) return again();
  }

  // 1. Serve on our socket; serve again whenever it vanishes (the kubelet deletes it when it
  //    restarts) or the mode changes.
  EndpointState endpoint = ports_->Endpoint();
  if (endpoint.serving && (mode != endpoint.mode || !endpoint.socket_present)) {
    if (!endpoint.socket_present) {
      LOG(INFO) << resource << ": socket " << endpoint.path
                << " was removed (kubelet restart?); serving again";
    } else {
      LOG(INFO) << resource << ": the kubelet is now reached through "
                << RegistrationModeName(mode) << " registration; moving our socket from "
                << endpoint.path;
    }
    CancelRegister();  // a Register naming the vanished socket cannot succeed
    NoteServerGoing(endpoint);
    ports_->StopServing();
    registered_kubelet_.store(false);
    ports_->WatcherEndpointLost();
    endpoint = ports_->Endpoint();
  }
  if (!endpoint.serving) {
    if (Now() < retry_at_) return wait_until(retry_at_);
    // Never take a resource another plugin serves (unless told to).
    if (!looked_now) {
      if (Arbitrate()) return again();
      looked_now = true;
    }
    if (absl::Status status = ports_->Serve(mode); !status.ok()) {
      retry_at_ = Now() + backoff_.Next();
      Complain(absl::StrCat(status.message(), "; will try again (waiting up to ",
                            absl::FormatDuration(options_.max_backoff), " between tries)"));
      return wait_until(retry_at_);
    }
    // From here the kubelet may register us at any moment (the plugin watcher) or is about to
    // (kubelet.sock): the resource is ours from now on, should we restart before it answers. The
    // record keeps saying "plugin watcher" until the watcher has let go of our path.
    RecordOurs(watcher_may_hold_ ? RegistrationMode::kPluginWatcher : mode);
    last_complaint_.clear();
    if (!endpoint_lost_.load()) backoff_.Reset();  // a lost endpoint keeps backing off
    retry_at_ = absl::InfinitePast();
    need_register_ = mode == RegistrationMode::kKubelet;
    if (mode == RegistrationMode::kPluginWatcher && predecessor_left_) PlanHandover();
    predecessor_left_ = false;
    LOG(INFO) << resource << ": serving on " << ports_->Endpoint().path << " ("
              << (mode == RegistrationMode::kKubelet
                      ? "registering with kubelet.sock"
                      : "waiting for the kubelet's plugin watcher to find it")
              << ")";
  }

  // 2. Kubelet mode: call Register whenever the kubelet is new or our socket is.
  absl::Time wake = absl::InfiniteFuture();
  if (mode == RegistrationMode::kKubelet && need_register_ && !call_in_flight()) {
    std::optional<KubeletSocketId> kubelet = ports_->KubeletSocket();
    if (!kubelet.has_value()) {
      Complain(absl::StrCat("waiting for the kubelet: ", options_.kubelet_socket_path,
                            " is not there yet; will register as soon as it appears"));
    } else if (Now() < retry_at_) {
      wake = retry_at_;
    } else if (watcher_may_hold_) {
      // The plugin watcher's late deregistration by name would drop a registration made now.
      wake = WaitForTheWatcherToLetGo();
      if (!watcher_may_hold_) return again();
    } else if (looked_now || !Arbitrate()) {
      if (registered_kubelet_id_.inode != 0 && *kubelet != registered_kubelet_id_ &&
          *kubelet != restart_counted_for_) {
        restart_counted_for_ = *kubelet;
        kubelet_restarts_.fetch_add(1);
        LOG(INFO) << resource << ": " << options_.kubelet_socket_path
                  << " was re-created: the kubelet restarted; registering again";
      }
      call_kubelet_ = *kubelet;
      ports_->StartRegister(*kubelet);
    } else {
      return again();
    }
  } else if (mode == RegistrationMode::kPluginWatcher && !call_in_flight()) {
    wake = StepHandover();
  }
  return wait_until(std::min({wake, check_endpoint_at_, look_at_}));
}

}  // namespace edgeaccel
