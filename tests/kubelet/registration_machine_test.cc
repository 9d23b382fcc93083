// The registrar's decisions, stepped through the kubelet behaviours they answer
// (docs/kubelet-behaviour.md) on an injected clock, with recorded ports: no sockets, no threads,
// no sleeps. The registrar's own tests (registrar_test.cc, neighbourhood_test.cc) run the same
// machine against real sockets and the kubelet double.
#include "edgeaccel/kubelet/registration_machine.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace edgeaccel {
namespace {

constexpr char kTpu[] = "coral.ai/edgetpu";
const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
constexpr KubeletSocketId kKubeletA{101, 1};
constexpr KubeletSocketId kKubeletB{102, 2};

// The node as the machine sees it, and what it did to it.
class ScriptedNode : public RegistrationPorts {
 public:
  RegistrationMode EffectiveMode() override { return mode; }
  std::optional<KubeletSocketId> KubeletSocket() override { return kubelet; }
  bool KubeletAnswers() override { return kubelet_answers; }
  EndpointState Endpoint() override { return endpoint; }
  absl::Status Serve(RegistrationMode serve_mode) override {
    Did(absl::StrCat("Serve(", RegistrationModeName(serve_mode), ")"));
    if (!serve_status.ok()) return serve_status;
    endpoint = EndpointState{true, true, 0, serve_mode,
                             absl::StrCat("/dp/edgeaccel-", RegistrationModeName(serve_mode))};
    return absl::OkStatus();
  }
  void StopServing() override {
    Did("StopServing");
    endpoint = EndpointState{};
  }
  void Silence() override { Did("Silence"); }
  void StartRegister(const KubeletSocketId& at) override {
    Did(absl::StrCat("Register(", at.inode, ")"));
  }
  void CancelRegister() override { Did("CancelRegister"); }
  absl::Status LinkForKubeletSock() override {
    Did("LinkForKubeletSock");
    return link_status;
  }
  NeighbourView Look(const NeighbourView* reuse_holdings_of) override {
    Did(reuse_holdings_of == nullptr ? "Look" : "Look(reusing)");
    NeighbourView seen = view;
    seen.holdings_reused = reuse_holdings_of != nullptr;
    return seen;
  }
  std::vector<std::string> OwnIds() override { return own_ids; }
  bool WatcherRegistered() override { return watcher_registered; }
  void WatcherEndpointLost() override { watcher_registered = false; }
  void WatcherSteppedBack(bool stepped_back) override { watcher_stepped_back = stepped_back; }
  bool RecordSaysOurs() override { return record_ours; }
  bool RecordSaysWatcher() override { return record_via != "kubelet"; }
  absl::Status Record(bool ours, RegistrationMode via) override {
    Did(ours ? absl::StrCat("Record(ours, ", RegistrationModeName(via), ")") : "Record(not ours)");
    record_ours = ours;
    record_via = ours ? std::string(RegistrationModeName(via)) : "";
    return absl::OkStatus();
  }
  absl::Status StartWatcherProbe() override {
    Did("StartWatcherProbe");
    return probe_status;
  }
  void StopWatcherProbe() override { Did("StopWatcherProbe"); }
  void Warn(const std::string& reason, const std::string&) override {
    Did(absl::StrCat("Warn(", reason, ")"));
  }

  // What was done since the last call, "; "-joined, Look left out unless `with_looks`.
  std::string Done(bool with_looks = false) {
    std::vector<std::string> shown;
    for (const std::string& action : actions) {
      if (with_looks || !absl::StartsWith(action, "Look")) shown.push_back(action);
    }
    actions.clear();
    return absl::StrJoin(shown, "; ");
  }

  RegistrationMode mode = RegistrationMode::kKubelet;
  std::optional<KubeletSocketId> kubelet;
  bool kubelet_answers = true;
  EndpointState endpoint;
  absl::Status serve_status;
  NeighbourView view;
  std::vector<std::string> own_ids = {"0000:03:00.0"};
  bool watcher_registered = false;
  bool watcher_stepped_back = false;
  bool record_ours = false;
  std::string record_via;
  absl::Status probe_status;
  absl::Status link_status;
  std::vector<std::string> actions;

 private:
  void Did(std::string action) { actions.push_back(std::move(action)); }
};

class RegistrationMachineTest : public ::testing::Test {
 protected:
  RegistrationMachineTest() {
    node.view.holdings_read = true;
    node.view.holdings.source = "pod-resources";
  }
  RegistrationMachine& Machine() {
    if (machine_ == nullptr) {
      RegistrationMachine::Options options;
      options.resource = kTpu;
      options.kubelet_socket_path = "/dp/kubelet.sock";
      options.device_plugin_dir = "/dp";
      options.plugins_registry_dir = "/kubelet/plugins_registry";
      options.backoff_jitter = 0;  // the waits below are exact
      options.take_over = take_over;
      machine_ = std::make_unique<RegistrationMachine>(options, &node, [this] { return now; });
    }
    return *machine_;
  }
  absl::Time Step() { return Machine().Step(); }
  // The kubelet answered the call in flight.
  void KubeletAnswers(const KubeletSocketId& at, bool ok, std::string message = "") {
    RegisterOutcome outcome;
    outcome.kubelet = at;
    outcome.started = now;
    outcome.ok = ok;
    outcome.message = std::move(message);
    Machine().RegisterDone(outcome);
  }
  // Up and registered on kubelet A, actions cleared.
  void Registered() {
    node.kubelet = kKubeletA;
    Step();
    KubeletAnswers(kKubeletA, true);
    Step();
    node.Done();
    ASSERT_TRUE(Machine().registered_kubelet());
  }

  // The registration record says the resource is ours, registered `via` ("": a record that
  // does not say how), and kubelet A is there.
  void StartingAfterARecordOfOurs(const std::string& via) {
    node.record_ours = true;
    node.record_via = via;
    node.kubelet = kKubeletA;
  }

  // Serving through the plugin watcher, we wait for an earlier edgeaccel serving on
  // `predecessor`; it exits, and the look that finds it gone comes due (not yet stepped).
  void AnEarlierEdgeaccelOnThePluginWatcherSideGoes(const std::string& predecessor) {
    node.mode = RegistrationMode::kPluginWatcher;
    node.kubelet = kKubeletA;
    node.view.predecessor = predecessor;
    Step();
    EXPECT_EQ(node.Done(), "");
    node.view.predecessor.clear();
    Machine().NeighbourChanged();
    now += RegistrationMachine::kLookInterval;
  }

  ScriptedNode node;
  absl::Time now = kT0;
  bool take_over = false;

 private:
  std::unique_ptr<RegistrationMachine> machine_;
};

TEST_F(RegistrationMachineTest, NoKubeletYetMeansNothingDoneUntilAnEvent) {
  node.mode = RegistrationMode::kAuto;
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "");
}

TEST_F(RegistrationMachineTest, ServesThenRegistersOnceKubeletSockAppears) {
  // device-plugins/ is there, kubelet.sock is not yet: serve, and wait for it.
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "Look; Serve(kubelet); Record(ours, kubelet)");
  node.kubelet = kKubeletA;
  Machine().KubeletSocketCreated();
  Step();
  EXPECT_EQ(node.Done(true), "Look; Register(101)");  // a look of its own: a new kubelet.sock
  EXPECT_TRUE(Machine().call_in_flight());
  KubeletAnswers(kKubeletA, true);
  EXPECT_TRUE(Machine().registered_kubelet());
  EXPECT_EQ(Machine().registrations(), 1u);
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "");
}

TEST_F(RegistrationMachineTest, AKubeletRestartIsServedAndRegisteredAgainAtOnce) {
  Registered();
  // Every generation: the kubelet deletes the plugin sockets and re-creates kubelet.sock.
  Machine().KubeletSocketRemoved();
  EXPECT_FALSE(Machine().registered_kubelet());
  node.endpoint.socket_present = false;
  node.kubelet = kKubeletB;
  Machine().KubeletSocketCreated();
  Step();
  EXPECT_EQ(node.Done(), "StopServing; Serve(kubelet); Register(102)");
  KubeletAnswers(kKubeletB, true);
  EXPECT_EQ(Machine().kubelet_restarts(), 1u);
  EXPECT_EQ(Machine().registrations(), 2u);
}

TEST_F(RegistrationMachineTest, ARefusedRegistrationIsRetriedWithDoublingBackoff) {
  node.kubelet = kKubeletA;
  Step();
  node.Done();
  KubeletAnswers(kKubeletA, false, "wrong version");
  EXPECT_EQ(node.Done(), "Warn(DevicePluginRegistrationRefused)");
  EXPECT_EQ(Machine().registration_failures(), 1u);
  EXPECT_EQ(Step(), kT0 + absl::Milliseconds(100));
  EXPECT_EQ(node.Done(true), "");
  now += absl::Milliseconds(99);
  EXPECT_EQ(Step(), kT0 + absl::Milliseconds(100));
  EXPECT_EQ(node.Done(true), "");
  now = kT0 + absl::Milliseconds(100);
  Step();
  EXPECT_EQ(node.Done(), "Register(101)");
  KubeletAnswers(kKubeletA, false, "wrong version");
  // The same refusal again is not a second Event.
  EXPECT_EQ(node.Done(), "");
  EXPECT_EQ(Step(), now + absl::Milliseconds(200));
}

TEST_F(RegistrationMachineTest, ACallToAKubeletThatWentIsCancelledAndTheNewOneCalledAtOnce) {
  node.kubelet = kKubeletA;
  Step();
  node.Done();
  // The kubelet restarts while our call to it is in flight.
  node.kubelet = kKubeletB;
  Machine().KubeletSocketCreated();
  EXPECT_EQ(node.Done(), "CancelRegister");
  RegisterOutcome cancelled;
  cancelled.kubelet = kKubeletA;
  cancelled.cancelled_by_us = true;
  Machine().RegisterDone(cancelled);
  Step();
  EXPECT_EQ(node.Done(), "Register(102)");
  EXPECT_EQ(Machine().registration_failures(), 0u);
}

TEST_F(RegistrationMachineTest, AFailureFromAKubeletThatRestartedUnderTheCallIsNotBackedOff) {
  node.kubelet = kKubeletA;
  Step();
  node.Done();
  node.kubelet = kKubeletB;  // its inotify event still to come
  KubeletAnswers(kKubeletA, false, "connection reset");
  Step();
  EXPECT_EQ(node.Done(), "Register(102)");
  EXPECT_EQ(Machine().registration_failures(), 0u);
}

TEST_F(RegistrationMachineTest, ADroppedEndpointIsNoticedOnceTheKubeletHasSettledAndRepaired) {
  Registered();
  // A late deregistration by name stops our endpoint: our stream ends, kubelet.sock unchanged.
  node.endpoint.open_streams = 0;
  Machine().StreamEnded();
  EXPECT_EQ(Step(), kT0 + absl::Milliseconds(300));
  EXPECT_EQ(node.Done(true), "");
  now += absl::Milliseconds(300);
  const absl::Time wake = Step();
  EXPECT_TRUE(Machine().endpoint_lost());
  EXPECT_FALSE(Machine().registered_kubelet());
  EXPECT_EQ(node.Done(true), "Look");
  EXPECT_EQ(wake, now + absl::Milliseconds(100));  // with backoff
  now = wake;
  Step();
  EXPECT_EQ(node.Done(), "Register(101)");
  KubeletAnswers(kKubeletA, true);
  EXPECT_FALSE(Machine().endpoint_lost());
}

TEST_F(RegistrationMachineTest, AStoppedKubeletIsNotADroppedEndpoint) {
  Registered();
  node.endpoint.open_streams = 0;
  node.kubelet_answers = false;
  Machine().StreamEnded();
  now += absl::Milliseconds(300);
  Step();
  EXPECT_FALSE(Machine().endpoint_lost());
  EXPECT_FALSE(Machine().registered_kubelet());
  EXPECT_EQ(node.Done(true), "");
}

TEST_F(RegistrationMachineTest, AStreamEndedWhileANewOneIsOpenIsNotADroppedEndpoint) {
  Registered();
  node.endpoint.open_streams = 1;  // the kubelet re-dialled us: the old stream's end is no loss
  Machine().StreamEnded();
  now += absl::Milliseconds(300);
  Step();
  EXPECT_FALSE(Machine().endpoint_lost());
  EXPECT_TRUE(Machine().registered_kubelet());
}

TEST_F(RegistrationMachineTest, AForeignRegistrationMakesUsStepBackSilently) {
  Registered();
  node.endpoint.open_streams = 1;
  // Another plugin registers the resource: its socket appears, and the kubelet lists its devices.
  node.view.holdings.healthy[kTpu] = {"0000:09:00.0"};
  node.view.live_foreign_sockets = 1;
  Machine().NeighbourChanged();
  EXPECT_EQ(Step(), kT0 + RegistrationMachine::kLookSettle);
  EXPECT_EQ(node.Done(true), "");
  now += RegistrationMachine::kLookSettle;
  Step();
  // The stream stays open and silent (ending it would make a kubelet 1.25-1.36 disconnect the
  // other plugin); our socket stays too.
  EXPECT_EQ(node.Done(), "Silence; Record(not ours); Warn(DevicePluginSteppedBack)");
  EXPECT_FALSE(Machine().registered_kubelet());
  EXPECT_EQ(Machine().left_to(), "(the plugin that now feeds the kubelet's list)");
  EXPECT_TRUE(node.watcher_stepped_back);
  // Nothing more happens while the other plugin serves it.
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "");
}

TEST_F(RegistrationMachineTest, ADeviceWeHadAMomentAgoIsNotAForeignRegistration) {
  Registered();
  node.own_ids = {"0000:03:00.0", "0000:09:00.0"};  // the history holds the unplugged one
  node.view.holdings.healthy[kTpu] = {"0000:09:00.0"};
  node.view.live_foreign_sockets = 1;
  Machine().NeighbourChanged();
  now += RegistrationMachine::kLookSettle;
  Step();
  EXPECT_EQ(node.Done(), "");
  EXPECT_TRUE(Machine().registered_kubelet());
}

TEST_F(RegistrationMachineTest, AfterAKubeletRestartANeighboursResourceIsLeftToItThroughTheGrace) {
  // The kubelet knows the resource from another plugin that has not come back yet.
  node.kubelet = kKubeletA;
  node.view.holdings.known = {kTpu};
  const absl::Time wake = Step();
  EXPECT_EQ(wake, kT0 + absl::Minutes(5));
  EXPECT_EQ(node.Done(), "Record(not ours); Warn(DevicePluginTakeoverRefused)");
  EXPECT_EQ(Machine().left_to(), "(the plugin that served it before)");
  // The neighbour is back 120 s later: left to it, for good.
  now += absl::Seconds(120);
  node.view.holdings.healthy[kTpu] = {"GPU-neighbour-0"};
  Machine().NeighbourChanged();
  Step();
  // Whom it is left to changed: said once more.
  EXPECT_EQ(node.Done(), "Record(not ours); Warn(DevicePluginTakeoverRefused)");
  EXPECT_EQ(Machine().left_to(), "(the plugin that advertises GPU-neighbour-0)");
  // And looked at once more when the kubelet has settled; the same answer says nothing new.
  now += RegistrationMachine::kLookSettle;
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "Look");
  // Past the grace nothing changes: it serves the resource.
  now += absl::Minutes(10);
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(true), "");
}

TEST_F(RegistrationMachineTest, ANeighbourGoneForGoodIsReplacedOnceTheGraceRunsOut) {
  node.kubelet = kKubeletA;
  node.view.holdings.known = {kTpu};
  Step();
  node.Done();
  now += absl::Minutes(5);
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); Record(ours, kubelet); Register(101)");
  EXPECT_EQ(Machine().left_to(), "");
}

TEST_F(RegistrationMachineTest, TakeOverRegistersWhereAnotherPluginServes) {
  take_over = true;
  node.kubelet = kKubeletA;
  node.view.holdings.healthy[kTpu] = {"GPU-neighbour-0"};
  node.view.live_foreign_sockets = 1;
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); Record(ours, kubelet); Register(101)");
}

TEST_F(RegistrationMachineTest, FromThePluginWatcherToKubeletSockWaitsForTheWatcherToLetGo) {
  // Registered through the plugin watcher; then device-plugins/ appears (a switch of mode).
  node.mode = RegistrationMode::kPluginWatcher;
  Step();
  EXPECT_EQ(node.Done(), "Serve(plugin-watcher); Record(ours, plugin-watcher)");
  node.watcher_registered = true;
  node.endpoint.open_streams = 1;
  node.mode = RegistrationMode::kKubelet;
  node.kubelet = kKubeletA;
  // The watcher deregisters the old socket by name when it unregisters it (up to a 1 s loop
  // later): a registration made before would be dropped. A probe on the path tells when.
  EXPECT_EQ(Step(), kT0 + absl::Seconds(5));
  EXPECT_EQ(node.Done(), "StopServing; Serve(kubelet); StartWatcherProbe");
  EXPECT_FALSE(node.watcher_registered);
  now += absl::Milliseconds(1700);
  EXPECT_EQ(Step(), kT0 + absl::Seconds(5));
  EXPECT_EQ(node.Done(true), "");
  Machine().WatcherProbeAsked();
  EXPECT_EQ(node.Done(), "StopWatcherProbe; Record(ours, kubelet)");
  Step();
  EXPECT_EQ(node.Done(), "Register(101)");
}

TEST_F(RegistrationMachineTest, AfterAnEdgeaccelThatUsedThePluginWatcherTheWatcherIsWaitedFor) {
  // The record an earlier edgeaccel left: ours, through the plugin watcher.
  StartingAfterARecordOfOurs("plugin-watcher");
  Step();
  // The record keeps saying "plugin watcher" until the watcher has let go (a restart meanwhile
  // must wait too).
  EXPECT_EQ(node.Done(), "Serve(kubelet); StartWatcherProbe");
  Machine().WatcherProbeAsked();
  Step();
  EXPECT_EQ(node.Done(), "StopWatcherProbe; Record(ours, kubelet); Register(101)");
  KubeletAnswers(kKubeletA, true);
  EXPECT_TRUE(Machine().registered_kubelet());
}

TEST_F(RegistrationMachineTest, ARecordThatDoesNotSayHowIsTakenForThePluginWatcher) {
  StartingAfterARecordOfOurs("");  // written by an edgeaccel that did not say how it registered
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); StartWatcherProbe");
}

TEST_F(RegistrationMachineTest, AfterAnEdgeaccelThatUsedKubeletSockRegistersAtOnce) {
  StartingAfterARecordOfOurs("kubelet");
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); Register(101)");
}

TEST_F(RegistrationMachineTest, AWatcherThatNeverLooksIsWaitedForAtMostTheProbeTimeout) {
  StartingAfterARecordOfOurs("plugin-watcher");
  EXPECT_EQ(Step(), kT0 + absl::Seconds(5));
  node.Done();
  now = kT0 + absl::Seconds(5);
  Step();
  EXPECT_EQ(node.Done(), "StopWatcherProbe; Register(101)");
}

TEST_F(RegistrationMachineTest, NoPluginsRegistryMeansNothingToWaitFor) {
  node.record_ours = true;
  node.record_via = "plugin-watcher";
  node.probe_status = absl::NotFoundError("/kubelet/plugins_registry is not there");
  node.kubelet = kKubeletA;
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); StartWatcherProbe; Register(101)");
}

// A rollout: the earlier edgeaccel still serves on our plugins_registry/ path; once it goes, the
// watcher is waited for before kubelet.sock.
TEST_F(RegistrationMachineTest, AnEarlierEdgeaccelOnThePluginWatcherIsWaitedForThenItsWatcher) {
  node.kubelet = kKubeletA;
  node.view.predecessor = "/kubelet/plugins_registry/edgeaccel-coral.ai-edgetpu.sock";
  Step();
  EXPECT_EQ(node.Done(), "");
  EXPECT_EQ(Machine().left_to(), node.view.predecessor);
  node.view.predecessor.clear();  // it exits
  Machine().NeighbourChanged();
  now += RegistrationMachine::kLookInterval;
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); Record(ours, plugin-watcher); StartWatcherProbe");
  Machine().WatcherProbeAsked();
  Step();
  EXPECT_EQ(node.Done(), "StopWatcherProbe; Record(ours, kubelet); Register(101)");
}

// A rollout towards the plugin watcher: the earlier edgeaccel registered through kubelet.sock.
// Once it is gone the new one serves in plugins_registry/ and, since the watcher registers that
// socket only on its next pass (up to 1 s, every device Unhealthy at the kubelet meanwhile),
// registers through kubelet.sock at once too, naming a link to the same server.
TEST_F(RegistrationMachineTest, AfterAnEarlierEdgeaccelOnKubeletSockThePluginWatcherIsBridged) {
  AnEarlierEdgeaccelOnThePluginWatcherSideGoes("/dp/edgeaccel-coral.ai-edgetpu.sock");
  Step();
  EXPECT_EQ(node.Done(),
            "Serve(plugin-watcher); Record(ours, plugin-watcher); LinkForKubeletSock; "
            "Register(101)");
  KubeletAnswers(kKubeletA, true);
  EXPECT_TRUE(Machine().registered_kubelet());
  EXPECT_EQ(Machine().registrations(), 1u);
  // The watcher's registration comes a pass later; nothing more is called, and the kubelet.sock
  // stream is left open (its end would disconnect the watcher's client on 1.25-1.36).
  node.watcher_registered = true;
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(), "");
}

// From the plugin watcher to the plugin watcher (a rollout on the same path): the earlier
// registration's deregistration by name would drop a kubelet.sock registration made before it,
// so the bridge waits for the earlier edgeaccel's word that it is done.
TEST_F(RegistrationMachineTest, AfterAnEarlierEdgeaccelOnThePluginWatcherTheBridgeWaitsForItsWord) {
  AnEarlierEdgeaccelOnThePluginWatcherSideGoes(
      "/kubelet/plugins_registry/edgeaccel-coral.ai-edgetpu.sock");
  EXPECT_EQ(Step(), now + absl::Seconds(5));
  EXPECT_EQ(node.Done(), "Serve(plugin-watcher); Record(ours, plugin-watcher)");
  now += absl::Milliseconds(300);
  Machine().WatcherProbeAsked();  // the earlier edgeaccel's GetInfo: the watcher let go
  Step();
  EXPECT_EQ(node.Done(), "LinkForKubeletSock; Register(101)");
}

TEST_F(RegistrationMachineTest, ABridgeWithoutWordIsLeftToThePluginWatcher) {
  AnEarlierEdgeaccelOnThePluginWatcherSideGoes(
      "/kubelet/plugins_registry/edgeaccel-coral.ai-edgetpu.sock");
  Step();
  node.Done();
  now += absl::Seconds(5);
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(), "");
  Machine().WatcherProbeAsked();  // too late: the watcher registers us itself
  Step();
  EXPECT_EQ(node.Done(), "");
}

// No bridge where none is needed or possible: a first start (no earlier edgeaccel), the watcher
// already registered us, no kubelet.sock, or a link that cannot be made (the watcher still
// registers us; the failure is said once).
TEST_F(RegistrationMachineTest, TheBridgeIsOnlyForAHandover) {
  node.mode = RegistrationMode::kPluginWatcher;
  node.kubelet = kKubeletA;
  Step();
  EXPECT_EQ(node.Done(), "Serve(plugin-watcher); Record(ours, plugin-watcher)");
}

TEST_F(RegistrationMachineTest, ABridgeThatCannotLinkIsLeftToThePluginWatcher) {
  node.link_status = absl::AlreadyExistsError("/dp/edgeaccel-coral.ai-edgetpu.sock is a directory");
  AnEarlierEdgeaccelOnThePluginWatcherSideGoes("/dp/edgeaccel-coral.ai-edgetpu.sock");
  EXPECT_EQ(Step(), absl::InfiniteFuture());
  EXPECT_EQ(node.Done(), "Serve(plugin-watcher); Record(ours, plugin-watcher); LinkForKubeletSock");
  EXPECT_FALSE(Machine().call_in_flight());
}

// One look decides a start: serving and registering in the same pass ask nothing more (each look
// asks pod-resources: 20 to 140 ms on a busy node).
TEST_F(RegistrationMachineTest, AStartWithTheKubeletThereLooksOnceBeforeServingAndRegistering) {
  node.kubelet = kKubeletA;
  Step();
  EXPECT_EQ(node.Done(true), "Look; Serve(kubelet); Record(ours, kubelet); Register(101)");
}

// A rollout with maxSurge: the look that finds the earlier edgeaccel gone is the one the new
// daemon serves and registers on. Every device is Unhealthy at the kubelet from the old one's
// end until our first list; two more looks made that window 20 to 140 ms longer in the lab.
TEST_F(RegistrationMachineTest, TheLookThatFindsTheEarlierEdgeaccelGoneIsTheOneItServesAndRegistersOn) {
  node.kubelet = kKubeletA;
  node.view.predecessor = "/dp/edgeaccel-coral.ai-edgetpu.sock";
  Step();
  EXPECT_EQ(node.Done(true), "Look");
  EXPECT_EQ(Machine().left_to(), node.view.predecessor);
  node.view.predecessor.clear();  // it exits
  Machine().NeighbourChanged();
  now += RegistrationMachine::kLookInterval;
  Step();
  // It stands on the holdings the look before read (NeighbourQuery::reuse_holdings_of).
  EXPECT_EQ(node.Done(true), "Look(reusing); Serve(kubelet); Record(ours, kubelet); Register(101)");
}

// The holdings of a look made while the earlier edgeaccel served are reused for kHoldingsReuse
// from when they were read, never passed on from one reusing look to the next.
TEST_F(RegistrationMachineTest, AWaitingLooksHoldingsAreReusedOnlyWhileFresh) {
  node.kubelet = kKubeletA;
  node.view.predecessor = "/dp/edgeaccel-coral.ai-edgetpu.sock";
  Step();
  EXPECT_EQ(node.Done(true), "Look");
  for (int i = 0; i < 3; ++i) {  // a busy node: the kubelet's checkpoint written again and again
    Machine().NeighbourChanged();
    now += RegistrationMachine::kLookSettle;
    Step();
  }
  EXPECT_EQ(node.Done(true), "Look(reusing); Look(reusing); Look(reusing)");
  Machine().NeighbourChanged();
  now += RegistrationMachine::kHoldingsReuse;
  Step();
  EXPECT_EQ(node.Done(true), "Look");
  node.view.predecessor.clear();  // it exits
  Machine().NeighbourChanged();
  now += RegistrationMachine::kHoldingsReuse + absl::Milliseconds(1);
  Step();
  EXPECT_EQ(node.Done(true), "Look; Serve(kubelet); Record(ours, kubelet); Register(101)");
}

TEST_F(RegistrationMachineTest, ASocketPathThatCannotBeServedIsRetriedWithBackoff) {
  node.serve_status = absl::AlreadyExistsError("/dp/edgeaccel.sock is a regular file");
  EXPECT_EQ(Step(), kT0 + absl::Milliseconds(100));
  EXPECT_EQ(node.Done(), "Serve(kubelet)");
  now += absl::Milliseconds(100);
  node.serve_status = absl::OkStatus();
  Step();
  EXPECT_EQ(node.Done(), "Serve(kubelet); Record(ours, kubelet)");
}

TEST_F(RegistrationMachineTest, MissedEventsAreMadeUpByComparingKubeletSock) {
  Registered();
  // inotify overflowed while the kubelet restarted: no event for the new kubelet.sock.
  node.kubelet = kKubeletB;
  Machine().EventsMissed();
  Step();
  EXPECT_EQ(node.Done(), "Register(102)");
}

}  // namespace
}  // namespace edgeaccel
