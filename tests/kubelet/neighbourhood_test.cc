// edgeaccel beside other device plugins, under every kubelet generation's rules
// (docs/kubelet-behaviour.md): neighbours built like NVIDIA's and Intel's lose no event and keep
// serving; a kubelet restart never hands us their resource; a foreign registration makes us step
// back; a rollout hands over from our earlier instance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "captured_log.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/registrar.h"
#include "eventually.h"
#include "fixture_host.h"
#include "neighbour_plugin.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::KubeletProfile;
using ::edgeaccel::testing::KubeletProfileTestName;
using ::edgeaccel::testing::NeighbourKind;
using ::edgeaccel::testing::NeighbourPlugin;
using ::edgeaccel::testing::RegistrarOptionsFor;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestKubelet;

constexpr char kGpu[] = "nvidia.com/gpu";
const std::string kTpu(kResourceEdgeTpu);

Device Dev(const std::string& id) {
  Device d;
  d.id = id;
  d.nodes.push_back({"/dev/null", "/dev/null", "rw"});
  return d;
}

std::vector<std::string> GpuIds() {
  std::vector<std::string> ids;
  for (int i = 1; i <= 8; ++i) ids.push_back("GPU-" + std::to_string(i));
  return ids;
}

class NeighbourhoodTest : public ::testing::TestWithParam<KubeletProfile> {
 protected:
  void SetUp() override {
    gpus_.Update({Dev("GPU-ours-0")});
    tpus_.Update({Dev("apex_0")});
  }
  std::unique_ptr<ResourceRegistrar> StartRegistrar(
      DeviceSet* set, RegistrationMode mode = RegistrationMode::kKubelet,
      const std::function<void(ResourceRegistrar::Options*)>& adjust = nullptr) {
    ResourceRegistrar::Options options = RegistrarOptionsFor(kubelet_, mode);
    if (adjust) adjust(&options);
    auto registrar = std::make_unique<ResourceRegistrar>(options, set);
    EXPECT_TRUE(registrar->Start().ok());
    return registrar;
  }
  std::unique_ptr<NeighbourPlugin> StartNeighbour(NeighbourKind kind) {
    auto plugin = std::make_unique<NeighbourPlugin>(kind, kubelet_.DevicePluginsDir(),
                                                    "vendor-gpu.sock", kGpu, GpuIds());
    EXPECT_TRUE(plugin->Start().ok());
    EXPECT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kGpu) == 8; }));
    return plugin;
  }
  int UnhealthyAtTheKubelet(const std::string& resource) {
    int unhealthy = 0;
    for (const auto& device : kubelet_.Devices(resource)) unhealthy += device.health() != "Healthy";
    return unhealthy;
  }
  // Something in device-plugins/ changed: every registrar looks at its neighbours again.
  void StirDevicePluginsDir(int i) {
    const std::string junk = kubelet_.DevicePluginsDir() + "/stir-" + std::to_string(i) + ".sock";
    ::edgeaccel::testing::MakeStaleSocket(junk);
    unlink(junk.c_str());
  }

  TempDir dir_;
  TestKubelet kubelet_{dir_.path() + "/kubelet", GetParam()};
  DeviceSet gpus_{kGpu};
  DeviceSet tpus_{kTpu};
};

INSTANTIATE_TEST_SUITE_P(Kubelets, NeighbourhoodTest,
                         ::testing::ValuesIn(::edgeaccel::testing::kAllKubeletProfiles),
                         [](const auto& info) { return KubeletProfileTestName(info.param); });

// Every health event a neighbour sends reaches the kubelet, single or in bursts, while we look
// at the neighbours as often as the directories change; and the neighbour keeps serving.
TEST_P(NeighbourhoodTest, NeighboursLoseNoHealthEventAndKeepServing) {
  for (NeighbourKind kind : {NeighbourKind::kNvidiaLike, NeighbourKind::kIntelLike}) {
    SCOPED_TRACE(kind == NeighbourKind::kNvidiaLike ? "NVIDIA-like" : "Intel-like");
    kubelet_.Start();
    auto neighbour = StartNeighbour(kind);
    auto gpu = StartRegistrar(&gpus_);  // wants the same resource: must leave it
    auto tpu = StartRegistrar(&tpus_);  // its own resource, beside it
    ASSERT_TRUE(Eventually([&] { return !gpu->left_to().empty(); }));
    ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kTpu) == 1; }));
    const int updates_before = kubelet_.Updates(kGpu);
    const std::vector<std::string> ids = GpuIds();
    int sent = 0;
    for (; sent < 4; ++sent) {  // one at a time, with looks in between
      const uint64_t looks = gpu->neighbour_looks();
      StirDevicePluginsDir(sent);
      ASSERT_TRUE(Eventually([&] { return gpu->neighbour_looks() > looks; }));
      (void)gpu->LookNow();
      ASSERT_TRUE(neighbour->MarkUnhealthy(ids[sent]));
      ASSERT_TRUE(kubelet_.WaitFor([&] { return UnhealthyAtTheKubelet(kGpu) == sent + 1; }))
          << "event " << sent << " lost";
    }
    StirDevicePluginsDir(100);
    for (; sent < 8; ++sent) ASSERT_TRUE(neighbour->MarkUnhealthy(ids[sent]));  // a burst
    // One list per event (the NVIDIA-like one reads the devices' health when it sends, so a
    // list can already show the next event's device: count the lists, not the devices).
    EXPECT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Updates(kGpu) - updates_before == 8; }))
        << "lists received: " << kubelet_.Updates(kGpu) - updates_before;
    EXPECT_EQ(UnhealthyAtTheKubelet(kGpu), 8);
    EXPECT_EQ(neighbour->failed_sends(), 0);
    EXPECT_TRUE(neighbour->serving());
    EXPECT_TRUE(kubelet_.HasEndpoint(kGpu));
    EXPECT_EQ(gpu->registrations(), 0u);
    EXPECT_GE(gpu->neighbour_looks(), 5u);
    EXPECT_LE(gpu->longest_look(), absl::Seconds(1));
    gpu.reset();
    tpu.reset();
    neighbour->Stop();
    kubelet_.Stop();
  }
}

// A neighbour built like NVIDIA's marks every device Unhealthy (a critical Xid; it never marks
// them back): the kubelet lists no healthy device of the resource, as after a restart its plugin
// has not come back from. Its socket lives on, so the resource stays its own however long it
// lasts (found on a real kubelet 1.36, where the grace ran out under it).
TEST_P(NeighbourhoodTest, ANeighbourWithEveryDeviceUnhealthyKeepsItsResource) {
  kubelet_.Start();
  auto neighbour = StartNeighbour(NeighbourKind::kNvidiaLike);
  const absl::Duration grace = absl::Milliseconds(300);
  auto gpu = StartRegistrar(&gpus_, RegistrationMode::kKubelet,
                            [&](ResourceRegistrar::Options* o) { o->neighbour_grace = grace; });
  ASSERT_TRUE(Eventually([&] { return !gpu->left_to().empty(); }));
  for (const std::string& id : GpuIds()) ASSERT_TRUE(neighbour->MarkUnhealthy(id));
  ASSERT_TRUE(kubelet_.WaitFor([&] { return UnhealthyAtTheKubelet(kGpu) == 8; }));
  const uint64_t looks = gpu->neighbour_looks();
  StirDevicePluginsDir(0);
  ASSERT_TRUE(Eventually([&] { return gpu->neighbour_looks() > looks; }));
  absl::SleepFor(3 * grace);  // a time span: what must not happen in it is a registration
  EXPECT_EQ(gpu->registrations(), 0u);
  EXPECT_FALSE(gpu->left_to().empty());
  EXPECT_TRUE(neighbour->serving());
  EXPECT_EQ(kubelet_.Devices(kGpu).size(), 8u);
  // It goes for good: the grace starts, and then the resource is ours.
  neighbour->Stop();
  ASSERT_TRUE(Eventually([&] { return gpu->registered(); }, absl::Seconds(15)));
  gpu.reset();
  kubelet_.Stop();
}

// After a kubelet restart (or a reboot) the neighbour comes back after us: its resource is left
// to it while it does (the arbiter's test steps through 0-299 s on a clock), and taken only with
// --take-over.
TEST_P(NeighbourhoodTest, AfterAKubeletRestartTheNeighboursResourceIsNeverTaken) {
  for (bool take_over : {false, true}) {
    SCOPED_TRACE(take_over ? "--take-over" : "default");
    CapturedLog log;
    kubelet_.Start();
    auto neighbour = StartNeighbour(NeighbourKind::kNvidiaLike);
    auto gpu = StartRegistrar(&gpus_, RegistrationMode::kKubelet,
                              [&](ResourceRegistrar::Options* o) { o->take_over = take_over; });
    if (!take_over) {
      ASSERT_TRUE(Eventually([&] { return !gpu->left_to().empty(); }));
    } else {
      ASSERT_TRUE(Eventually([&] { return gpu->registered(); }));
    }
    // The node restarts its kubelet; the neighbour's pod comes back after ours.
    neighbour->Stop();
    kubelet_.Restart();
    if (take_over) {
      ASSERT_TRUE(Eventually([&] { return gpu->registrations() >= 2u && gpu->registered(); }));
    } else {
      ASSERT_TRUE(Eventually([&] {
        return log.Contains("from another device plugin that has not registered it again yet");
      }));
      EXPECT_FALSE(gpu->registered());
      neighbour = StartNeighbour(NeighbourKind::kNvidiaLike);
      ASSERT_TRUE(Eventually([&] {
        return log.Contains("the kubelet lists 8 healthy device(s) of nvidia.com/gpu");
      }));
      EXPECT_EQ(gpu->registrations(), 0u) << "never registered the neighbour's resource";
      EXPECT_EQ(kubelet_.Allocatable(kGpu), 8);
    }
    gpu.reset();
    neighbour->Stop();
    kubelet_.Stop();
    unlink((kubelet_.DevicePluginsDir() + "/" + std::string(kKubeletCheckpointName)).c_str());
  }
}

// A foreign plugin registers a resource we serve: we step back without ending our stream (on a
// kubelet 1.25-1.36 that would disconnect the neighbour), and our later changes reach nobody.
TEST_P(NeighbourhoodTest, AForeignRegistrationMakesUsStepBackQuietly) {
  CapturedLog log;
  kubelet_.Start();
  auto gpu = StartRegistrar(&gpus_);
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kGpu) == 1; }));
  ASSERT_TRUE(Eventually([&] { return gpu->registered(); }));
  auto neighbour = StartNeighbour(NeighbourKind::kIntelLike);
  ASSERT_TRUE(Eventually([&] { return log.Contains("stepping back"); }));
  EXPECT_FALSE(gpu->registered());
  EXPECT_FALSE(gpu->left_to().empty());
  gpus_.Update({Dev("GPU-ours-0"), Dev("GPU-ours-1")});  // says nothing to the kubelet now
  ASSERT_TRUE(neighbour->MarkUnhealthy("GPU-1"));
  ASSERT_TRUE(kubelet_.WaitFor([&] { return UnhealthyAtTheKubelet(kGpu) == 1; }));
  EXPECT_EQ(kubelet_.Allocatable(kGpu), 7);
  EXPECT_EQ(kubelet_.Devices(kGpu).size(), 8u) << "the neighbour's list, not ours";
  EXPECT_TRUE(kubelet_.HasEndpoint(kGpu)) << "the neighbour was never disconnected";
  EXPECT_TRUE(neighbour->serving());
}

// A rollout with maxSurge: the new daemon starts while the old one serves. It waits, and takes
// over the moment the old one's socket goes; pods admitted while both run all get a device.
TEST_P(NeighbourhoodTest, ARolloutWithMaxSurgeHandsOverWithoutAFailedAdmission) {
  CapturedLog log;
  kubelet_.Start();
  tpus_.Update({Dev("apex_0"), Dev("apex_1"), Dev("apex_2"), Dev("apex_3")});
  auto old = StartRegistrar(&tpus_);
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kTpu) == 4; }));
  DeviceSet next_tpus(kTpu);
  next_tpus.Update({Dev("apex_0"), Dev("apex_1"), Dev("apex_2"), Dev("apex_3")});
  // Its backoff as in production: no retry timer comes due within the handover's bound, so
  // only the old socket's removal can start the takeover that quickly.
  auto next = StartRegistrar(&next_tpus, RegistrationMode::kKubelet,
                             [](ResourceRegistrar::Options* o) { o->max_backoff = absl::Seconds(30); });
  ASSERT_TRUE(Eventually([&] { return log.Contains("an earlier edgeaccel still serves"); }));
  for (int i = 0; i < 6; ++i) {  // pods arrive while both run
    absl::StatusOr<std::string> pod = kubelet_.Admit(kTpu, 1);
    ASSERT_TRUE(pod.ok()) << pod.status();
    kubelet_.DeletePod(*pod);
  }
  EXPECT_EQ(kubelet_.Registrations(kTpu), 1) << "the new one waits";
  old->Stop();  // its socket is gone when this returns
  const absl::Time gone = absl::Now();
  ASSERT_TRUE(kubelet_.WaitFor([&] {
    return kubelet_.Registrations(kTpu) == 2 && kubelet_.Allocatable(kTpu) == 4;
  }));
  const absl::Duration handover = absl::Now() - gone;
  RecordProperty("handover_ms", std::to_string(absl::ToDoubleMilliseconds(handover)));
  EXPECT_LT(handover, absl::Seconds(1));  // tens of ms here; slack for a sanitizer build
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::string> pod = kubelet_.Admit(kTpu, 1);
    ASSERT_TRUE(pod.ok()) << pod.status();
    kubelet_.DeletePod(*pod);
  }
  EXPECT_TRUE(Eventually([&] { return next->registered(); }));
}

// The same rollout switching registration mode (plugin watcher -> kubelet.sock): the new daemon
// registers only once the watcher has unregistered the old socket (it asks the new daemon's probe
// on that path only after), so the deregistration by name never disconnects it.
TEST_P(NeighbourhoodTest, ARolloutThatSwitchesRegistrationModeIsNeverDisconnected) {
  CapturedLog log;
  kubelet_.Start();
  auto old = StartRegistrar(&tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kTpu) == 1; }));
  DeviceSet next_tpus(kTpu);
  next_tpus.Update({Dev("apex_0")});
  auto next = StartRegistrar(&next_tpus, RegistrationMode::kKubelet);
  ASSERT_TRUE(Eventually([&] { return log.Contains("an earlier edgeaccel still serves"); }));
  absl::StatusOr<std::string> pod = kubelet_.Admit(kTpu, 1);
  ASSERT_TRUE(pod.ok()) << pod.status();
  kubelet_.DeletePod(*pod);
  old->Stop();
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.RegisteredVia(kTpu) == "kubelet"; },
                               absl::Seconds(15)));
  const std::vector<std::string> calls = kubelet_.CallLog();
  auto deregistered = std::find(calls.begin(), calls.end(), "DeRegisterPlugin " + kTpu);
  auto registered = std::find(calls.rbegin(), calls.rend(), "Register " + kTpu);
  ASSERT_NE(deregistered, calls.end());
  ASSERT_NE(registered, calls.rend());
  EXPECT_LT(deregistered - calls.begin(), calls.rend() - registered - 1)
      << "registered before the watcher's deregistration by name";
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(kTpu) == 1; }));
  pod = kubelet_.Admit(kTpu, 1);
  EXPECT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(Eventually([&] { return next->registered(); }));
  EXPECT_FALSE(log.Contains("it dropped our endpoint"));
  EXPECT_EQ(next->registrations(), 1u);
}

}  // namespace
}  // namespace edgeaccel
