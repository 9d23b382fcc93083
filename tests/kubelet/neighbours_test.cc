// Looking at the neighbours: a real kubelet double (pod-resources API, checkpoint), real
// neighbour plugins built like NVIDIA's and Intel's, real Unix sockets.
#include "edgeaccel/kubelet/neighbours.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>

#include "absl/time/clock.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "fixture_host.h"
#include "neighbour_plugin.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::HungSocket;
using ::edgeaccel::testing::NeighbourKind;
using ::edgeaccel::testing::NeighbourPlugin;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestKubelet;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kGpu[] = "nvidia.com/gpu";

class NeighboursTest : public ::testing::Test {
 protected:
  NeighbourQuery Query() {
    NeighbourQuery query;
    query.resource = kGpu;
    query.device_plugin_dir = kubelet_.DevicePluginsDir();
    query.plugins_registry_dir = kubelet_.PluginsRegistryDir();
    query.pod_resources_socket = kubelet_.root() + "/" + std::string(kPodResourcesSocket);
    query.own_socket_name = SocketFileName(kGpu);
    return query;
  }
  std::unique_ptr<NeighbourPlugin> StartNeighbour(NeighbourKind kind) {
    auto plugin = std::make_unique<NeighbourPlugin>(kind, kubelet_.DevicePluginsDir(),
                                                    "nvidia-gpu.sock", kGpu,
                                                    std::vector<std::string>{"GPU-1", "GPU-2"});
    EXPECT_TRUE(plugin->Start().ok());
    EXPECT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kGpu) == 2; }));
    return plugin;
  }

  TempDir dir_;
  TestKubelet kubelet_{dir_.path() + "/kubelet"};
};

TEST_F(NeighboursTest, NothingElseThereIsNobody) {
  kubelet_.Start();
  NeighbourView view = LookAround(Query());
  EXPECT_EQ(view.registry_claim, "");
  EXPECT_EQ(view.predecessor, "");
  EXPECT_EQ(view.live_foreign_sockets, 0);
  EXPECT_TRUE(view.holdings_read);
  EXPECT_EQ(view.holdings.source, "pod-resources");
  EXPECT_TRUE(view.holdings.healthy.empty());
}

TEST_F(NeighboursTest, WhatTheKubeletHoldsComesFromPodResources) {
  kubelet_.Start();
  auto plugin = StartNeighbour(NeighbourKind::kNvidiaLike);
  ASSERT_TRUE(kubelet_.Admit(kGpu, 1).ok());
  NeighbourView view = LookAround(Query());
  EXPECT_EQ(view.holdings.source, "pod-resources");
  EXPECT_THAT(view.holdings.healthy[kGpu], ::testing::UnorderedElementsAre("GPU-1", "GPU-2"));
  EXPECT_EQ(view.holdings.allocated[kGpu].size(), 1u);
  EXPECT_EQ(view.live_foreign_sockets, 1);
  // A disconnected plugin's devices are not healthy any more: pod-resources says so at once,
  // where the checkpoint (not rewritten on a disconnect) would still list them.
  plugin->Stop();
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kGpu) == 0; }));
  view = LookAround(Query());
  EXPECT_TRUE(view.holdings.healthy[kGpu].empty());
  EXPECT_EQ(view.holdings.known.count(kGpu), 1u);
}

TEST_F(NeighboursTest, WithoutPodResourcesTheCheckpointIsReadAndSaysWhy) {
  kubelet_.ServePodResources(false);
  kubelet_.Start();
  auto plugin = StartNeighbour(NeighbourKind::kIntelLike);
  NeighbourView view = LookAround(Query());
  EXPECT_TRUE(view.holdings_read);
  EXPECT_EQ(view.holdings.source, "checkpoint");
  EXPECT_THAT(view.holdings_note, HasSubstr("pod-resources/kubelet.sock"));
  EXPECT_THAT(view.holdings.healthy[kGpu], ::testing::UnorderedElementsAre("GPU-1", "GPU-2"));
}

// A checkpoint in a shape we do not know is said (for one warning and a metric), and what can be
// read of it still counts; a missing one is no problem (no kubelet yet, or a fresh node).
TEST_F(NeighboursTest, ACheckpointOfAnUnknownShapeIsSaidAndTheRestRead) {
  kubelet_.ServePodResources(false);
  kubelet_.Start();
  const std::string checkpoint = kubelet_.DevicePluginsDir() + "/kubelet_internal_checkpoint";
  unlink(checkpoint.c_str());
  EXPECT_EQ(LookAround(Query()).checkpoint_problem, "");
  std::ofstream(checkpoint) << R"({"Data":{"PodDeviceEntries":[{"PodUID":7,"ResourceName":"x"}],)"
                            << R"("RegisteredDevices":{"nvidia.com/gpu":["GPU-9"]}},"Checksum":0})";
  NeighbourView view = LookAround(Query());
  EXPECT_THAT(view.checkpoint_problem, HasSubstr("PodDeviceEntries of a shape we do not know"));
  EXPECT_THAT(view.holdings.healthy[kGpu], ElementsAre("GPU-9"));
  std::ofstream(checkpoint) << "{not json";
  view = LookAround(Query());
  EXPECT_THAT(view.checkpoint_problem, HasSubstr("not a JSON object"));
  EXPECT_FALSE(view.holdings_read);
}

// The look that finds an earlier edgeaccel gone may stand on the holdings of the one made while it
// served (the kubelet is busiest then): only while no other socket came, since another plugin can
// take the resource only through one of its own.
TEST_F(NeighboursTest, ALookBeforeStandsForTheKubeletsHoldingsWhileNoOtherSocketCame) {
  kubelet_.Start();
  auto plugin = StartNeighbour(NeighbourKind::kNvidiaLike);
  const NeighbourView before = LookAround(Query());
  ASSERT_TRUE(before.holdings_read);
  EXPECT_FALSE(before.holdings_reused);
  ASSERT_TRUE(kubelet_.Admit(kGpu, 1).ok());  // what a fresh read would see

  NeighbourQuery reusing = Query();
  reusing.reuse_holdings_of = &before;
  NeighbourView view = LookAround(reusing);
  EXPECT_TRUE(view.holdings_reused);
  EXPECT_TRUE(view.holdings_read);
  EXPECT_TRUE(view.holdings.allocated[kGpu].empty());
  EXPECT_THAT(view.holdings.healthy[kGpu], ::testing::UnorderedElementsAre("GPU-1", "GPU-2"));

  // Another plugin's socket came: the kubelet is asked again.
  NeighbourPlugin other(NeighbourKind::kIntelLike, kubelet_.DevicePluginsDir(), "other.sock",
                        "example.com/other", std::vector<std::string>{"X-1"});
  ASSERT_TRUE(other.Start().ok());
  view = LookAround(reusing);
  EXPECT_FALSE(view.holdings_reused);
  EXPECT_EQ(view.live_foreign_sockets, 2);
  EXPECT_EQ(view.holdings.allocated[kGpu].size(), 1u);
  other.Stop();
}

TEST_F(NeighboursTest, APluginWatcherSocketSaysWhatItServes) {
  kubelet_.Start();
  DeviceSet set(kGpu);
  PluginCounters counters;
  PluginWatcherService watcher(kGpu, nullptr);
  PluginServer server(kubelet_.PluginsRegistryDir() + "/vendor-gpu.sock", &set, &counters,
                      &watcher);
  ASSERT_TRUE(server.Start().ok());
  EXPECT_EQ(LookAround(Query()).registry_claim, kubelet_.PluginsRegistryDir() + "/vendor-gpu.sock");
  server.Stop();
}

TEST_F(NeighboursTest, OurOwnSocketHeldByAnotherProcessIsAPredecessor) {
  kubelet_.Start();
  DeviceSet set(kGpu);
  PluginCounters counters;
  const std::string ours = kubelet_.DevicePluginsDir() + "/" + SocketFileName(kGpu);
  PluginServer earlier(ours, &set, &counters, nullptr);
  ASSERT_TRUE(earlier.Start().ok());
  EXPECT_EQ(LookAround(Query()).predecessor, ours);
  NeighbourQuery serving = Query();
  serving.serving_on = ours;  // the one we serve ourselves is nobody's predecessor
  EXPECT_EQ(LookAround(serving).predecessor, "");
  earlier.Stop();
  ::edgeaccel::testing::MakeStaleSocket(ours);  // a stale file is nobody
  EXPECT_EQ(LookAround(Query()).predecessor, "");
}

TEST_F(NeighboursTest, HungSocketsCostTheBudgetAtMost) {
  ASSERT_EQ(mkdir(kubelet_.root().c_str(), 0755), 0);
  ASSERT_EQ(mkdir(kubelet_.DevicePluginsDir().c_str(), 0755), 0);
  ASSERT_EQ(mkdir(kubelet_.PluginsRegistryDir().c_str(), 0755), 0);
  std::vector<std::unique_ptr<HungSocket>> hung;
  for (int i = 0; i < 16; ++i) {
    hung.push_back(std::make_unique<HungSocket>(kubelet_.PluginsRegistryDir() + "/hung-" +
                                                std::to_string(i) + ".sock"));
  }
  NeighbourQuery query = Query();
  query.budget = absl::Milliseconds(400);
  query.call_timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  NeighbourView view = LookAround(query);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "the budget, not half the 16 s sum";
  EXPECT_TRUE(view.out_of_budget);
  EXPECT_EQ(view.registry_claim, "");
}

}  // namespace
}  // namespace edgeaccel
