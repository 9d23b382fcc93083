// The neighbour arbiter's decisions, stepped through the kubelet behaviours they answer
// (docs/kubelet-behaviour.md) on an injected clock: no sockets, no sleeps.
#include "edgeaccel/kubelet/neighbour_arbiter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

constexpr char kGpu[] = "nvidia.com/gpu";
const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

class ArbiterTest : public ::testing::Test {
 protected:
  ArbiterDecision Decide(absl::Duration at) {
    ArbiterInput in = input;
    in.view = &view;
    return arbiter.Decide(in, kT0 + at);
  }
  // What the kubelet holds after a restart (or reboot), before any plugin is back: the
  // resource's name in the checkpoint, no healthy device.
  void KubeletJustRestarted() {
    view.holdings = {};
    view.holdings.source = "pod-resources";
    view.holdings.known = {kGpu};
  }
  void KubeletLists(std::vector<std::string> ids) {
    view.holdings.healthy[kGpu] = std::move(ids);
    view.holdings.known.insert(kGpu);
  }

  NeighbourArbiter arbiter{kGpu, absl::Minutes(5)};
  NeighbourView view;
  ArbiterInput input{nullptr, {"GPU-ours-0"}, false, false, false};
};

TEST_F(ArbiterTest, ANodeNobodyServedIsOurs) {
  view.holdings_read = true;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, APluginWatcherSocketNamingTheResourceIsLeftAlone) {
  view.registry_claim = "/var/lib/kubelet/plugins_registry/nvidia-gpu.sock";
  ArbiterDecision d = Decide(absl::ZeroDuration());
  EXPECT_EQ(d.verdict, ArbiterDecision::kLeave);
  EXPECT_EQ(d.to, view.registry_claim);
}

TEST_F(ArbiterTest, HealthyDevicesWeDidNotRegisterAreAnotherPlugins) {
  // Same ids as ours (NVIDIA's plugin names GPUs by UUID too): still not ours to feed, since we
  // hold no registration.
  KubeletLists({"GPU-ours-0"});
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kLeave);
}

// A rollout: an earlier edgeaccel serves our devices, and goes. Until the kubelet sees it go
// (its plugin watcher's next pass, the stream's end), it still lists that edgeaccel's devices as
// healthy: those are our own ids, not another plugin's, so we serve at once rather than leave
// them to a plugin that is not there, or wait out the grace for it (seen under load in CI).
TEST_F(ArbiterTest, OurPredecessorsDevicesStillListedAfterItWentAreNotAnotherPlugins) {
  view.predecessor = "/var/lib/kubelet/plugins_registry/edgeaccel-nvidia.com-gpu.sock";
  KubeletLists({"GPU-ours-0"});
  ArbiterDecision waiting = Decide(absl::ZeroDuration());
  EXPECT_EQ(waiting.verdict, ArbiterDecision::kLeave);
  EXPECT_TRUE(waiting.to_edgeaccel);
  view.predecessor.clear();  // its socket went; the kubelet still lists its devices
  EXPECT_EQ(Decide(absl::Milliseconds(100)).verdict, ArbiterDecision::kServe);
  view.holdings.healthy.clear();  // the kubelet has seen it go; nobody lists a healthy one
  EXPECT_EQ(Decide(absl::Milliseconds(200)).verdict, ArbiterDecision::kServe);
}

// After the predecessor, another plugin's device in the list is still that plugin's.
TEST_F(ArbiterTest, AForeignDeviceListedAfterOurPredecessorWentIsStillAnotherPlugins) {
  view.predecessor = "/var/lib/kubelet/plugins_registry/edgeaccel-nvidia.com-gpu.sock";
  KubeletLists({"GPU-ours-0"});
  ASSERT_TRUE(Decide(absl::ZeroDuration()).to_edgeaccel);
  view.predecessor.clear();
  KubeletLists({"GPU-theirs"});
  EXPECT_EQ(Decide(absl::Milliseconds(100)).verdict, ArbiterDecision::kLeave);
}

// pod-resources lists a plugin's devices in no set order: the same plugin reads the same, so the
// registrar says "not registering it" once, not on every look (seen on a real kubelet 1.36).
TEST_F(ArbiterTest, ThePluginLeftToIsNamedTheSameWhateverOrderItsDevicesCome) {
  KubeletLists({"vendor-tpu-1", "vendor-tpu-0"});
  const ArbiterDecision first = Decide(absl::ZeroDuration());
  KubeletLists({"vendor-tpu-0", "vendor-tpu-1"});
  const ArbiterDecision second = Decide(absl::Seconds(1));
  EXPECT_EQ(first.verdict, ArbiterDecision::kLeave);
  EXPECT_EQ(first.to, second.to);
  EXPECT_EQ(first.why, second.why);
}

TEST_F(ArbiterTest, AfterAKubeletRestartAnotherPluginsResourceIsLeftForTheGraceWhateverTheOrder) {
  KubeletJustRestarted();
  // We come back first: the plugin that served it is up to 120 s late, and more.
  for (absl::Duration at : {absl::ZeroDuration(), absl::Seconds(1), absl::Seconds(60),
                            absl::Seconds(120), absl::Seconds(299)}) {
    ArbiterDecision d = Decide(at);
    EXPECT_EQ(d.verdict, ArbiterDecision::kWait) << absl::FormatDuration(at);
    EXPECT_EQ(d.until, kT0 + absl::Minutes(5));
  }
  // It returns at 120 s: left to it, and the grace starts again should it go later.
  KubeletLists({"GPU-theirs"});
  EXPECT_EQ(Decide(absl::Seconds(120)).verdict, ArbiterDecision::kLeave);
  KubeletJustRestarted();
  EXPECT_EQ(Decide(absl::Seconds(400)).verdict, ArbiterDecision::kWait);
  EXPECT_EQ(Decide(absl::Seconds(400) + absl::Minutes(5)).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, AfterAKubeletRestartOurOwnResourceIsRegisteredAtOnce) {
  KubeletJustRestarted();
  input.registered_last = true;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, DevicesPodsHoldThatAreOursMakeItOursToo) {
  KubeletJustRestarted();
  view.holdings.allocated[kGpu] = {"GPU-ours-0"};
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, TakeOverServesWhateverTheKubeletHolds) {
  KubeletJustRestarted();
  input.take_over = true;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
  KubeletLists({"GPU-theirs"});
  view.registry_claim = "/x/plugins_registry/theirs.sock";
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, AForeignDeviceInTheKubeletsListWhileWeAreRegisteredMeansStepBack) {
  input.registered = true;
  KubeletLists({"GPU-ours-0"});
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
  KubeletLists({"GPU-theirs"});
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kStepBack);
}

TEST_F(ArbiterTest, AnEarlierEdgeaccelIsWaitedForThenReplaced) {
  input.registered_last = true;
  view.predecessor = "/var/lib/kubelet/device-plugins/edgeaccel-nvidia.com-gpu.sock";
  KubeletLists({"GPU-ours-0"});
  const ArbiterDecision left = Decide(absl::ZeroDuration());
  EXPECT_EQ(left.verdict, ArbiterDecision::kLeave);
  EXPECT_TRUE(left.to_edgeaccel);
  // It stopped: its stream ended (the kubelet marks the devices unhealthy), its socket went.
  view.predecessor.clear();
  view.holdings.healthy.clear();
  EXPECT_EQ(Decide(absl::Milliseconds(5)).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, AStaleCheckpointListIsNotALivePlugin) {
  // Without pod-resources the checkpoint still lists the devices of a plugin that has gone
  // (the kubelet does not write it on a disconnect): with no other plugin's socket alive, they
  // are stale; our own stale list never counts.
  view.holdings.source = "checkpoint";
  KubeletLists({"GPU-theirs"});
  view.live_foreign_sockets = 0;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kWait);
  view.live_foreign_sockets = 1;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kLeave);
  view.holdings.healthy[kGpu] = {"GPU-ours-0"};
  input.registered_last = true;
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kServe);
}

// NVIDIA's plugin marks a GPU Unhealthy on a critical Xid and never marks it back: the kubelet
// then lists no healthy device, as after a restart the plugin has not come back from. The
// plugin's socket, alive all along, tells the two apart (seen on a real kubelet 1.36: without
// this the grace ran, and would have handed us the resource of a plugin still serving it).
TEST_F(ArbiterTest, APluginWhoseDevicesAllTurnedUnhealthyKeepsItsResource) {
  view.holdings_read = true;
  view.holdings.source = "pod-resources";
  view.live_foreign_sockets = 1;
  view.live_foreign = {"/dp/vendor-gpu.sock@41"};
  KubeletLists({"GPU-1", "GPU-2"});
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kLeave);
  view.holdings.healthy[kGpu].clear();  // every device Unhealthy
  for (absl::Duration at : {absl::Seconds(1), absl::Minutes(6), absl::Hours(2)}) {
    const ArbiterDecision decision = Decide(at);
    EXPECT_EQ(decision.verdict, ArbiterDecision::kLeave);
    EXPECT_THAT(decision.why, ::testing::HasSubstr("its devices are Unhealthy"));
  }
  // Another plugin's socket coming beside it changes nothing.
  view.live_foreign = {"/dp/intel-gpu.sock@77", "/dp/vendor-gpu.sock@41"};
  EXPECT_EQ(Decide(absl::Hours(3)).verdict, ArbiterDecision::kLeave);
  // Its socket goes (a kubelet restart deletes it; the plugin exits): the grace starts now.
  view.live_foreign = {"/dp/intel-gpu.sock@77"};
  const ArbiterDecision waiting = Decide(absl::Hours(4));
  EXPECT_EQ(waiting.verdict, ArbiterDecision::kWait);
  EXPECT_EQ(waiting.until, kT0 + absl::Hours(4) + absl::Minutes(5));
  EXPECT_EQ(Decide(absl::Hours(4) + absl::Minutes(5)).verdict, ArbiterDecision::kServe);
}

TEST_F(ArbiterTest, ASocketReCreatedUnderTheSameNameIsAnotherPlugin) {
  view.holdings_read = true;
  view.holdings.source = "pod-resources";
  view.live_foreign_sockets = 1;
  view.live_foreign = {"/dp/vendor-gpu.sock@41"};
  KubeletLists({"GPU-1"});
  EXPECT_EQ(Decide(absl::ZeroDuration()).verdict, ArbiterDecision::kLeave);
  // The kubelet restarted and the plugin came back on a new socket with no healthy device yet.
  view.holdings.healthy[kGpu].clear();
  view.live_foreign = {"/dp/vendor-gpu.sock@42"};
  EXPECT_EQ(Decide(absl::Seconds(1)).verdict, ArbiterDecision::kWait);
}

}  // namespace
}  // namespace edgeaccel
