// The DRA driver end to end: the real daemon with --dra on a fixture host, the API server
// stand-in (ResourceSlices, ResourceClaims: test_api_server.h) and the DRA kubelet double
// (plugin watcher, DRAPlugin v1/v1beta1, health stream: dra_kubelet.h), beside the device
// plugin kubelet double, which must not hear of the families published through DRA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon_test.h"
#include "eventually.h"
#include "dra_kubelet.h"
#include "edgeaccel/discovery/resource_names.h"
#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::DaemonProcess;
using ::edgeaccel::testing::DraKubelet;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::BudgetedThreads;
using ::edgeaccel::testing::SettledThreads;
using ::edgeaccel::testing::Threads;
using ::edgeaccel::testing::ThreadsCalled;
using ::edgeaccel::testing::DraKubeletGeneration;
using ::edgeaccel::testing::DraKubeletOptions;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::PathExists;
using ::edgeaccel::testing::ReadFileText;
using ::edgeaccel::testing::TestApiServer;
using nlohmann::json;

constexpr char kDriver[] = "edgetpu.edgeaccel.io";

// The devices of the one slice of our driver on node-1, by name ("" when there is not exactly one).
std::string SliceDevices(const std::vector<json>& slices) {
  std::string names;
  int ours = 0;
  for (const json& slice : slices) {
    if (slice["spec"]["driver"] != kDriver || slice["spec"]["nodeName"] != "node-1") continue;
    ++ours;
    for (const json& device : slice["spec"]["devices"]) names += device["name"].get<std::string>() + " ";
  }
  return ours == 1 ? names : "";
}

// The devices of the one slice of our driver on node-1 with their taints, as
// "name[:key=value:effect...] " ("" when there is not exactly one slice).
std::string SliceTaints(const std::vector<json>& slices) {
  std::string out;
  int ours = 0;
  for (const json& slice : slices) {
    if (slice["spec"]["driver"] != kDriver || slice["spec"]["nodeName"] != "node-1") continue;
    ++ours;
    for (const json& device : slice["spec"]["devices"]) {
      out += device["name"].get<std::string>();
      for (const json& taint : device.value("taints", json::array())) {
        out += ":" + taint.value("key", "") + "=" + taint.value("value", "") + ":" + taint.value("effect", "");
      }
      out += " ";
    }
  }
  return ours == 1 ? out : "";
}

class DraE2eTest : public ::edgeaccel::testing::DaemonTest {
 protected:
  void SetUp() override {
    host_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
    host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  }

  std::unique_ptr<DaemonProcess> StartDraDaemon(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> flags = {"--dra=coral-pcie,coral-usb", "--node-name=node-1",
                                      "--api-server=" + api_.url(), "--api-token-file=" + api_.token_file(),
                                      "--api-ca-file=" + api_.ca_file(), "--cdi-dir=" + cdi_.path()};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return StartDaemon(flags);
  }

  bool SliceTaintsAre(const std::string& devices, absl::Duration timeout = absl::Seconds(10)) {
    return api_.WaitForResourceSlices(
        [&](const std::vector<json>& slices) { return SliceTaints(slices) == devices; }, timeout);
  }

  bool SliceHolds(const std::string& devices, absl::Duration timeout = absl::Seconds(10)) {
    return api_.WaitForResourceSlices(
        [&](const std::vector<json>& slices) { return SliceDevices(slices) == devices; }, timeout);
  }

  std::string ClaimUid(const std::string& name, const std::string& device) {
    json claim = api_.AddResourceClaim(
        TestApiServer::MakeAllocatedClaim("default", name, kDriver, "node-1", {{"tpu", device}}));
    return claim["metadata"]["uid"].get<std::string>();
  }

  std::string SpecPath(const std::string& uid) const {
    return cdi_.path() + "/k8s.edgetpu.edgeaccel.io-claim_" + uid + ".json";
  }

  std::string Checkpoint() const {
    return ReadFileText(kubelet_.root() + "/plugins/edgetpu.edgeaccel.io/checkpoint.json");
  }

  // The host path of the one device node in the claim's spec.
  std::string SpecDeviceNode(const std::string& uid) const {
    json spec = json::parse(ReadFileText(SpecPath(uid)), nullptr, false);
    if (spec.is_discarded() || spec["devices"].size() != 1) return "";
    const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
    return nodes.size() == 1 ? nodes[0].value("hostPath", "") : "";
  }

  // Prepares a new claim `name` of `device` through the kubelet double: its UID.
  std::string Prepared(const std::string& name, const std::string& device) {
    const std::string uid = ClaimUid(name, device);
    auto answer = dra_kubelet_->Prepare(kDriver, {{"default", name, uid}});
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (answer.ok()) EXPECT_EQ(answer->claims.at(uid).error, "");
    return uid;
  }

  static void StopDaemon(DaemonProcess* daemon) {
    daemon->Signal(SIGTERM);
    ASSERT_EQ(daemon->Wait(absl::Seconds(10)), 0) << daemon->Log();
  }

  TestApiServer api_{"node-1"};
  TempDir cdi_;
  // Every sink on: labels and Events against the API server double, CDI, an NFD feature file in
  // `nfd_dir`, the seed labels (and /metrics, on by default).
  std::vector<std::string> EverySinkFlags(const std::string& nfd_dir) {
    return {"--node-name=node-1", "--api-server=" + api_.url(), "--api-token-file=" + api_.token_file(),
            "--api-ca-file=" + api_.ca_file(), "--cdi", "--cdi-dir=" + cdi_.path(),
            "--nfd-features-dir=" + nfd_dir, "--seed-labels", "--label-node", "--node-events"};
  }
  std::unique_ptr<DraKubelet> dra_kubelet_;
  void StartDraKubelet(DraKubeletOptions options = {}) {
    dra_kubelet_ = std::make_unique<DraKubelet>(kubelet_.root(), options);
    dra_kubelet_->Start();
  }
  // Both kubelet doubles, then the daemon with every sink on and --dra=`families`.
  std::unique_ptr<DaemonProcess> StartWithEverySinkAndDra(const std::string& families) {
    kubelet_.Start();
    StartDraKubelet();
    std::vector<std::string> flags = EverySinkFlags(nfd_.path());
    flags.push_back("--dra=" + families);
    return StartDaemon(flags);
  }
  TempDir nfd_;
  // Whether the daemon comes to idle at 8 threads or fewer, main included (issue #33); `threads`:
  // what it has then, or at the end of the wait.
  static bool IdlesAtEightThreadsOrFewer(const DaemonProcess& daemon, std::string* threads) {
    return Eventually([&] {
      *threads = SettledThreads(daemon.pid());
      return BudgetedThreads(*threads) <= 7;  // and main
    });
  }
};

// Every sink at once (the node labeller and the Event recorder against the API server, CDI specs,
// an NFD feature file, the seed labels, /metrics), two resources' worth of Edge TPUs: once the
// work is done, the daemon idles at 8 threads or fewer, main included (issue #33).
TEST_F(DraE2eTest, EverySinkOnIdlesAtEightThreadsOrFewer) {
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  kubelet_.Start();
  auto daemon = StartDaemon(EverySinkFlags(nfd_.path()));
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 3, 3)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  StopDaemon(daemon.get());
}

// The same with the DRA driver on for the PCIe TPUs beside the USB one's device plugin: its
// sockets share one loop (ea-dra), and its slice watch is read on ea-loop with the registrations
// (its worker, ea-dra-slices, ends when idle), so the daemon still idles at 8 threads or fewer,
// main included, which answers /metrics.
TEST_F(DraE2eTest, EverySinkOnBesideADraDriverIdlesAtEightThreadsOrFewer) {
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  auto daemon = StartWithEverySinkAndDra("coral-pcie");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 1, 1)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra-slices"), 0) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-metrics"), 0) << threads;
  StopDaemon(daemon.get());
}

// The shipped DRA configuration (manifests/components/dra: --dra=coral-pcie,coral-usb,tegra) on a
// node with Edge TPUs on PCIe and USB and a Jetson, every sink on: two drivers (the Edge TPUs'
// and the GPU's) answered by one gRPC loop (their sockets accepted on ea-loop), their slice
// watches on ea-loop, and no device plugin resource, so no ea-grpc: 8 threads or fewer, main
// included (issue #33); 6 in fact. It idled at 7 while each driver had a gRPC server and loop.
TEST_F(DraE2eTest, TheShippedDraConfigurationWithEverySinkOnIdlesAtEightThreadsOrFewer) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  host_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  auto daemon = StartWithEverySinkAndDra("coral-pcie,coral-usb,tegra");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kGpuDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 tpu-usb-2-1 ")) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(BudgetedThreads(threads), 5) << threads << ": and main";
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads << ": one loop for both drivers";
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra-slices"), 0) << threads << ": idle, the workers ended";
  EXPECT_EQ(ThreadsCalled(threads, "ea-loop"), 1) << threads << ": both watches on it";
  EXPECT_EQ(ThreadsCalled(threads, "ea-grpc"), 0) << threads;
  StopDaemon(daemon.get());
}

// Both drivers with devices beside a device plugin resource, the most any configuration of one
// kind of node runs (a split the shipped --dra does not make: the PCIe TPUs and a Jetson through
// DRA, a Coral USB Accelerator left to the device plugin), every sink on: 8 threads or fewer,
// main included (issue #33); 7 in fact. It idled at 10 while each driver's slice publisher had a
// thread, and at 8 while each driver had a gRPC server and loop.
TEST_F(DraE2eTest, BothDriversBesideADevicePluginResourceIdleAtEightThreadsOrFewer) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  host_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  auto daemon = StartWithEverySinkAndDra("coral-pcie,tegra");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kGpuDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 1, 1)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(BudgetedThreads(threads), 6) << threads << ": and main";
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads << ": one loop for both drivers";
  EXPECT_EQ(ThreadsCalled(threads, "ea-grpc"), 1) << threads;
  StopDaemon(daemon.get());
}

// The most threads any node runs: a Jetson with a discrete GPU and Edge TPUs on PCIe and USB,
// split so that each resource has a family on either side (--dra=coral-pcie,tegra: the PCIe TPUs
// and the Jetson through DRA; the USB TPU and the discrete GPU through the device plugin), every
// sink on. Two device plugin resources, each with its ea-grpc, and both drivers on one ea-dra:
// 8 threads, main included (issue #33). It idled at 9 while each driver had a gRPC loop.
TEST_F(DraE2eTest, EveryFamilySplitBothWaysBetweenDraAndTheDevicePluginIdlesAtEightThreads) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  host_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  host_.AddNvidiaGpu({});
  auto daemon = StartWithEverySinkAndDra("coral-pcie,tegra");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kGpuDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 1, 1)) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceNvidiaGpu), 1, 1)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads << ": one loop for both drivers";
  EXPECT_EQ(ThreadsCalled(threads, "ea-grpc"), 2) << threads;
  // Each driver answers as itself on its own sockets, whichever driver's call object gRPC gave
  // the call to: the registrations name each driver and its own endpoint.
  for (const char* driver : {kDriver, kGpuDriver}) {
    auto registration = dra_kubelet_->WaitForRegistration(driver);
    ASSERT_TRUE(registration.ok()) << registration.status();
    EXPECT_EQ(registration->endpoint,
              absl::StrCat(kubelet_.root(), "/plugins/", driver, "/dra.sock"));
  }
  StopDaemon(daemon.get());
}

// Two device plugin resources (the PCIe TPUs and a Jetson) beside a driver (the USB Accelerator
// through DRA), every sink on: 8 threads or fewer, main included (issue #33).
TEST_F(DraE2eTest, TwoDevicePluginResourcesBesideADriverIdleAtEightThreadsOrFewer) {
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  host_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  auto daemon = StartWithEverySinkAndDra("coral-usb");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-usb-2-1 ")) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 2, 2)) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceNvidiaGpu), 1, 1)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-grpc"), 2) << threads;
  StopDaemon(daemon.get());
}

// The same configuration on an x86 node with a discrete GPU beside the Edge TPUs: the GPU stays
// with the device plugin (nvidia is not in --dra), so its registration loop and server run, and
// the GPU driver, with no Jetson, does not start: 8 threads or fewer, main included.
TEST_F(DraE2eTest, TheShippedDraConfigurationBesideADiscreteGpuIdlesAtEightThreadsOrFewer) {
  host_.AddNvidiaGpu({});
  auto daemon = StartWithEverySinkAndDra("coral-pcie,coral-usb,tegra");
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceNvidiaGpu), 1, 1)) << daemon->Log();
  std::string threads;
  EXPECT_TRUE(IdlesAtEightThreadsOrFewer(*daemon, &threads)) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads;
  EXPECT_TRUE(dra_kubelet_->registrations("gpu.edgeaccel.io").empty());
  StopDaemon(daemon.get());
}

TEST_F(DraE2eTest, APodsClaimGetsExactlyItsDeviceThroughTheRealKubeletFlow) {
  kubelet_.Start();
  StartDraKubelet();
  auto daemon = StartDraDaemon({"--dra-no-execute-after=10s"});
  auto registration = dra_kubelet_->WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status() << daemon->Log();
  EXPECT_EQ(registration->service, "v1.DRAPlugin");
  EXPECT_EQ(registration->endpoint, kubelet_.root() + "/plugins/edgetpu.edgeaccel.io/dra.sock");
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();

  const std::string uid = ClaimUid("pod-tpu", "tpu-0000-04-00-0");
  auto answer = dra_kubelet_->Prepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(answer.ok()) << answer.status() << daemon->Log();
  const DraKubelet::ClaimResult& result = answer->claims.at(uid);
  ASSERT_EQ(result.error, "");
  ASSERT_EQ(result.devices.size(), 1u);
  EXPECT_EQ(result.devices[0].device, "tpu-0000-04-00-0");
  EXPECT_EQ(result.devices[0].pool, "node-1");
  EXPECT_EQ(result.devices[0].cdi_device_ids,
            std::vector<std::string>{"k8s.edgetpu.edgeaccel.io/claim=" + uid + "-tpu-0000-04-00-0"});
  json spec = json::parse(ReadFileText(SpecPath(uid)));
  ASSERT_EQ(spec["devices"].size(), 1u);
  const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0]["hostPath"], "/dev/apex_1");

  // The device plugin API never offers a family published through DRA.
  EXPECT_FALSE(kubelet_.StreamOpen(std::string(kResourceEdgeTpu)));
  EXPECT_EQ(daemon->Log().find("coral.ai/edgetpu"), std::string::npos) << daemon->Log();

  // Health reaches the kubelet's stream.
  ASSERT_TRUE(dra_kubelet_->WaitForHealth(kDriver, [](const auto& entries) {
    return entries.size() == 2 && entries[0].health == "Healthy" && entries[1].health == "Healthy";
  })) << daemon->Log();
  // A device whose node is gone (sysfs still has it) stays in the slice, tainted NoSchedule at
  // once and NoExecute (its pods evicted) once that has held for --dra-no-execute-after.
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(SliceTaintsAre(
      "tpu-0000-03-00-0 tpu-0000-04-00-0:edgeaccel.io/device-node-missing=apex_1:NoSchedule "))
      << daemon->Log();
  ASSERT_TRUE(SliceTaintsAre(
      "tpu-0000-03-00-0 tpu-0000-04-00-0:edgeaccel.io/device-node-missing=apex_1:NoExecute ",
      absl::Seconds(40)))
      << daemon->Log();
  ASSERT_TRUE(dra_kubelet_->WaitForHealth(kDriver, [](const auto& entries) {
    for (const auto& entry : entries) {
      if (entry.device == "tpu-0000-04-00-0") return entry.health == "Unhealthy" && !entry.message.empty();
    }
    return false;
  })) << daemon->Log();

  // Unprepare removes exactly that claim's spec.
  auto undone = dra_kubelet_->Unprepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(undone->claims.at(uid), "");
  EXPECT_FALSE(PathExists(SpecPath(uid)));
}

// KEP-5055 on the real daemon: a TPU over its temperature (sysfs says so only when read: the
// probe interval) stays in the slice with a NoSchedule taint, its health on the kubelet's stream
// Unhealthy, and is untainted once it cools below the threshold less the hysteresis.
TEST_F(DraE2eTest, ATpuOverItsTemperatureStaysInTheSliceTaintedAndIsUntaintedWhenItCools) {
  kubelet_.Start();
  StartDraKubelet();
  auto daemon = StartDraDaemon({"--probe-interval=100ms"});
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceTaintsAre("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  host_.SetApexAttribute(1, "temp", "100050");  // the fixture's hw_temp_warn2 is 99.8 °C
  ASSERT_TRUE(SliceTaintsAre(
      "tpu-0000-03-00-0 tpu-0000-04-00-0:edgeaccel.io/temperature=threshold-99.8C:NoSchedule "))
      << daemon->Log();
  // --discover says the same of the device.
  ::edgeaccel::testing::CommandResult discover = ::edgeaccel::testing::RunCommand(
      EDGEACCEL_DAEMON_PATH, {"--discover", "--host-root=" + host_.root(), "--dra=coral-pcie,coral-usb",
                "--node-name=node-1", "--kubelet-root=" + kubelet_.root(),
                "--device-plugin-dir=" + kubelet_.root() + "/device-plugins"});
  EXPECT_EQ(discover.exit_code, 0) << discover.err;
  EXPECT_THAT(discover.out, ::testing::HasSubstr("DRA device: tpu-0000-04-00-0\n"));
  EXPECT_THAT(discover.out, ::testing::HasSubstr(
                                "taint edgeaccel.io/temperature=threshold-99.8C:NoSchedule"));
  ASSERT_TRUE(dra_kubelet_->WaitForHealth(kDriver, [](const auto& entries) {
    for (const auto& entry : entries) {
      if (entry.device == "tpu-0000-04-00-0") return entry.health == "Unhealthy";
    }
    return false;
  })) << daemon->Log();
  host_.SetApexAttribute(1, "temp", "45050");
  ASSERT_TRUE(SliceTaintsAre("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
}

TEST_F(DraE2eTest, ADaemonRestartBetweenPrepareAndUnprepareLosesNothing) {
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  const std::string uid = ClaimUid("pod-tpu", "tpu-0000-03-00-0");
  auto first = dra_kubelet_->Prepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->claims.at(uid).error, "");
  daemon->Signal(SIGTERM);
  ASSERT_EQ(daemon->Wait(absl::Seconds(10)), 0);
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->Deregistered(kDriver); }));
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << "the slice stays while the daemon restarts";
  api_.FailNextClaimGets(503, 1000);  // the API server cannot be asked now: the record answers

  auto restarted = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->registrations(kDriver).size() == 2; }))
      << restarted->Log();
  // A kubelet that lost its own record repeats the prepare: the same answer, from the record.
  auto again = dra_kubelet_->Prepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->claims.at(uid).error, "");
  EXPECT_EQ(again->claims.at(uid).devices[0].cdi_device_ids, first->claims.at(uid).devices[0].cdi_device_ids);
  api_.DeleteResourceClaim("default", "pod-tpu");  // the pod is going: its claim may be gone
  auto undone = dra_kubelet_->Unprepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(undone->claims.at(uid), "");
  EXPECT_FALSE(PathExists(SpecPath(uid)));
}

// A DaemonSet rollout with maxSurge: the new daemon starts while the old one drives the driver.
// It waits, reading nothing, while the kubelet keeps calling the old one; a claim the old one
// prepares meanwhile is in the checkpoint the new one reads once the old one has gone.
TEST_F(DraE2eTest, ARolloutWithMaxSurgeHandsTheDriverOverWithEveryPreparedClaim) {
  StartDraKubelet();
  auto old = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << old->Log();
  const std::string before = Prepared("pod-before", "tpu-0000-03-00-0");
  auto next = StartDraDaemon();
  ASSERT_TRUE(next->WaitForLog("an earlier edgeaccel still drives this DRA driver")) << next->Log();
  const std::string during = Prepared("pod-during", "tpu-0000-04-00-0");  // the old one answers
  EXPECT_EQ(dra_kubelet_->registrations(kDriver).size(), 1u) << "the new one waits";
  EXPECT_TRUE(next->Running());
  // Ready while it waits: the DaemonSet removes the old pod only once the new one is.
  httplib::Client next_client("127.0.0.1", ::edgeaccel::testing::MetricsPort(*next));
  auto ready = next_client.Get("/healthz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200) << ready->body;
  EXPECT_THAT(next_client.Get("/metrics")->body,
              ::testing::HasSubstr("edgeaccel_dra_waiting_for_earlier_daemon{driver=\"edgetpu.edgeaccel.io\"} 1\n"));

  StopDaemon(old.get());
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->registrations(kDriver).size() == 2; }))
      << next->Log();
  EXPECT_TRUE(next->WaitForLog("prepared claim(s) from")) << next->Log();
  api_.FailNextClaimGets(503, 1000);  // the checkpoint answers, not the API server
  for (const auto& [name, uid] : {std::pair{"pod-before", before}, std::pair{"pod-during", during}}) {
    auto again = dra_kubelet_->Prepare(kDriver, {{"default", name, uid}});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->claims.at(uid).error, "") << name << "\n" << next->Log();
  }
  for (const auto& [name, uid] : {std::pair{"pod-before", before}, std::pair{"pod-during", during}}) {
    api_.DeleteResourceClaim("default", name);
    auto undone = dra_kubelet_->Unprepare(kDriver, {{"default", name, uid}});
    ASSERT_TRUE(undone.ok()) << undone.status();
    EXPECT_EQ(undone->claims.at(uid), "");
    EXPECT_FALSE(PathExists(SpecPath(uid))) << name;
  }
  StopDaemon(next.get());
}

// A driver with nothing to offer stays away from the kubelet and the API server until its first
// device appears, as a device plugin resource does: the shipped --dra names every family, and a
// node without a Jetson must not run (and register) the GPU driver. Here the PCIe TPUs stay with
// the device plugin; the Edge TPU driver has only the USB family, and no Accelerator is plugged
// in at start; the GPU driver has the Jetson family, and no Jetson.
TEST_F(DraE2eTest, ADriverWithNoDeviceWaitsForItsFirstOneBeforeRegisteringOrPublishing) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  kubelet_.Start();
  StartDraKubelet();
  auto daemon = StartDaemon({"--dra=coral-usb,tegra", "--node-name=node-1", "--api-server=" + api_.url(),
                             "--api-token-file=" + api_.token_file(), "--api-ca-file=" + api_.ca_file(),
                             "--cdi-dir=" + cdi_.path()});
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 2, 2)) << daemon->Log();
  for (const char* driver : {kDriver, kGpuDriver}) {
    ASSERT_TRUE(daemon->WaitForLog(absl::StrCat(driver, ": no device yet; the DRA driver registers with "
                                                        "the kubelet and publishes its ResourceSlice when the first one appears")))
        << daemon->Log();
  }
  // Decided at start, so nothing of theirs exists by now: no socket, no registration, no slice.
  for (const char* driver : {kDriver, kGpuDriver}) {
    EXPECT_FALSE(PathExists(kubelet_.root() + "/plugins_registry/" + driver + "-reg.sock")) << driver;
    EXPECT_FALSE(PathExists(kubelet_.root() + "/plugins/" + driver + "/dra.sock")) << driver;
    EXPECT_TRUE(dra_kubelet_->registrations(driver).empty()) << driver;
  }
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(ThreadsCalled(Threads(daemon->pid()), "ea-dra"), 0) << Threads(daemon->pid());

  // The Accelerator is plugged in: the Edge TPU driver registers and publishes it; the GPU driver
  // still has nothing.
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-usb-2-1 ")) << daemon->Log();
  EXPECT_TRUE(dra_kubelet_->registrations(kGpuDriver).empty());
  EXPECT_FALSE(PathExists(kubelet_.root() + "/plugins_registry/" + kGpuDriver + "-reg.sock"));
  const std::string threads = SettledThreads(daemon->pid());
  EXPECT_EQ(ThreadsCalled(threads, "ea-dra"), 1) << threads;
  const std::string uid = Prepared("pod-tpu", "tpu-usb-2-1");
  EXPECT_TRUE(PathExists(SpecPath(uid)));
  StopDaemon(daemon.get());
}

// A driver whose devices are gone while it holds prepared claims serves at once: the kubelet must
// be able to unprepare them when their pods go.
TEST_F(DraE2eTest, ADriverHoldingPreparedClaimsServesWithoutADevice) {
  const FixtureHost::CoralUsb usb{.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true};
  host_.AddCoralUsb(usb);
  StartDraKubelet();
  const std::vector<std::string> flags = {"--dra=coral-usb", "--node-name=node-1", "--api-server=" + api_.url(),
                                          "--api-token-file=" + api_.token_file(),
                                          "--api-ca-file=" + api_.ca_file(), "--cdi-dir=" + cdi_.path()};
  auto daemon = StartDaemon(flags);
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  const std::string uid = Prepared("pod-tpu", "tpu-usb-2-1");
  StopDaemon(daemon.get());
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->Deregistered(kDriver); }));

  host_.UnplugCoralUsb(usb);  // while the daemon is away
  auto restarted = StartDaemon(flags);
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->registrations(kDriver).size() == 2; }))
      << restarted->Log();
  api_.DeleteResourceClaim("default", "pod-tpu");
  auto undone = dra_kubelet_->Unprepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(undone->claims.at(uid), "");
  EXPECT_FALSE(PathExists(SpecPath(uid)));
  StopDaemon(restarted.get());
}

// A discrete GPU published through DRA, and the NVIDIA driver reloaded under the running pod:
// its /proc/driver/nvidia mount is stale, and /healthz fails as it does for the device plugin's
// GPUs, so the liveness probe restarts the pod with a fresh mount.
TEST_F(DraE2eTest, AStaleDriverMountUnderADraFamilyFailsHealthz) {
  host_.AddNvidiaGpu({});
  kubelet_.Start();  // the Edge TPUs' device plugin registers: /healthz waits for that
  StartDraKubelet();
  auto daemon = StartDaemon({"--dra=nvidia", "--node-name=node-1", "--api-server=" + api_.url(),
                             "--api-token-file=" + api_.token_file(), "--api-ca-file=" + api_.ca_file(),
                             "--cdi-dir=" + cdi_.path()});
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration("gpu.edgeaccel.io").ok()) << daemon->Log();
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 2, 2)) << daemon->Log();
  httplib::Client client("127.0.0.1", ::edgeaccel::testing::MetricsPort(*daemon));
  // Healthy once the driver's slice is published too (after its registration, on its own
  // worker): waited for, not raced.
  std::string last_health;
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    auto health = client.Get("/healthz");
    last_health = health ? health->body : "no answer";
    return health && health->status == 200;
  })) << last_health << daemon->Log();
  ::edgeaccel::testing::StaleMount stale(host_.Path("/proc/driver/nvidia"));
  if (!stale.mounted()) GTEST_SKIP() << stale.why();
  ASSERT_TRUE(daemon->WaitForLog("restart the pod for a fresh one")) << daemon->Log();
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, ::testing::HasSubstr("nvidia: /proc/driver/nvidia is a stale mount"));
  EXPECT_EQ(client.Get("/livez")->status, 503) << "a fresh mount is what a restart cures";
  StopDaemon(daemon.get());
}

TEST_F(DraE2eTest, AKubeletThatDeletesTheSlicesAtItsStartGetsThemBack) {
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  // What kubelet 1.36 does when it starts (dra_plugin_manager.go: DeleteCollection of the node's
  // slices), then its plugin watcher registers us again.
  dra_kubelet_->Stop();
  ASSERT_GE(api_.DeleteAllResourceSlices("node-1"), 1);
  dra_kubelet_->Start();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ", absl::Seconds(15))) << daemon->Log();
}

TEST_F(DraE2eTest, AKubelet133UsesV1beta1AndGetsPerClaimErrors) {
  DraKubeletOptions options;
  options.generation = DraKubeletGeneration::kV1_33;
  StartDraKubelet(options);
  auto daemon = StartDraDaemon();
  auto registration = dra_kubelet_->WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status() << daemon->Log();
  EXPECT_EQ(registration->service, "v1beta1.DRAPlugin");
  const std::string good = ClaimUid("good", "tpu-0000-03-00-0");
  const std::string elsewhere = api_.AddResourceClaim(TestApiServer::MakeAllocatedClaim(
      "default", "elsewhere", kDriver, "node-2", {{"tpu", "tpu-0000-04-00-0"}}))["metadata"]["uid"];
  const std::string missing = "99999999-9999-9999-9999-999999999999";
  const std::vector<DraKubelet::Claim> claims = {
      {"default", "good", good}, {"default", "elsewhere", elsewhere}, {"default", "missing", missing}};
  // The kubelet fails the pod's preparation with the first claim's error, in its words...
  auto failed = dra_kubelet_->Prepare(kDriver, claims);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("NodePrepareResources failed for ResourceClaim"), std::string::npos)
      << failed.status();
  // ...and the plugin's answer has one entry per claim, each with its own reason.
  auto answer = dra_kubelet_->CallNodePrepareResources(kDriver, claims);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->claims.size(), 3u);
  EXPECT_EQ(answer->service, "v1beta1.DRAPlugin");
  EXPECT_EQ(answer->claims.at(good).error, "");
  EXPECT_NE(answer->claims.at(elsewhere).error.find("not this node's"), std::string::npos)
      << answer->claims.at(elsewhere).error;
  EXPECT_NE(answer->claims.at(missing).error.find("does not exist"), std::string::npos)
      << answer->claims.at(missing).error;
}

// A pod force-deleted, or a kubelet that lost its state, never unprepares: the driver finds its
// claims gone (or made again under the same name) on the API server and unprepares them itself,
// at its start and every few minutes, so the device is not refused to the next claim for good.
TEST_F(DraE2eTest, AClaimGoneFromTheApiServerIsUnpreparedByTheDriverAndItsDeviceFreed) {
  StartDraKubelet();
  const std::vector<std::string> events = {"--label-node"};
  auto daemon = StartDraDaemon(events);
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  const std::string gone = Prepared("pod-gone", "tpu-0000-03-00-0");
  const std::string replaced = Prepared("pod-replaced", "tpu-0000-04-00-0");
  ASSERT_TRUE(PathExists(SpecPath(gone)) && PathExists(SpecPath(replaced))) << daemon->Log();
  StopDaemon(daemon.get());
  // While the daemon is away: one pod is force-deleted with its claim, and the other claim is
  // deleted and made again under its name; the kubelet never calls NodeUnprepareResources.
  ASSERT_TRUE(api_.DeleteResourceClaim("default", "pod-gone"));
  ASSERT_FALSE(api_.ReplaceResourceClaim("default", "pod-replaced").is_null());

  auto restarted = StartDraDaemon(events);
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    const std::string checkpoint = Checkpoint();
    return !PathExists(SpecPath(gone)) && !PathExists(SpecPath(replaced)) &&
           checkpoint.find(gone) == std::string::npos && checkpoint.find(replaced) == std::string::npos;
  })) << restarted->Log() << Checkpoint();
  json event = api_.WaitForEvent("DRAClaimCleanedUp", "default/pod-gone");
  ASSERT_FALSE(event.is_null()) << restarted->Log();
  EXPECT_NE(event["message"].get<std::string>().find("tpu-0000-03-00-0"), std::string::npos) << event.dump();
  EXPECT_FALSE(api_.WaitForEvent("DRAClaimCleanedUp", "default/pod-replaced").is_null());
  // The device is free again for the next claim.
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->registrations(kDriver).size() == 2; }));
  const std::string next = ClaimUid("pod-next", "tpu-0000-03-00-0");
  auto answer = dra_kubelet_->Prepare(kDriver, {{"default", "pod-next", next}});
  ASSERT_TRUE(answer.ok()) << answer.status() << restarted->Log();
  EXPECT_EQ(answer->claims.at(next).error, "");
}

// After a reboot the kubelet does not prepare its claims again (its own record says they are
// prepared), yet /dev numbering may have changed: the driver writes every spec of a claim
// prepared in another boot again, from the devices found now, before it serves the kubelet.
TEST_F(DraE2eTest, AfterARebootEverySpecIsWrittenAgainFromTheDevicesFoundNow) {
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  const std::string uid = Prepared("pod-tpu", "tpu-0000-04-00-0");
  ASSERT_EQ(SpecDeviceNode(uid), "/dev/apex_1");
  StopDaemon(daemon.get());
  // The reboot: a new boot id, and the apex driver probed the two cards in the other order.
  host_.UnplugCoralPcie(0, "0000:03:00.0");
  host_.UnplugCoralPcie(1, "0000:04:00.0");
  host_.AddCoralPcie({.index = 0, .pci_address = "0000:04:00.0"});
  host_.AddCoralPcie({.index = 1, .pci_address = "0000:03:00.0"});
  const std::string boot_id = "6a1e3f0c-2b7d-4c55-9e0a-1f2d3c4b5a69";
  host_.WriteFile("/proc/sys/kernel/random/boot_id", boot_id + "\n");

  auto restarted = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitFor([&] { return dra_kubelet_->registrations(kDriver).size() == 2; }))
      << restarted->Log();
  EXPECT_EQ(SpecDeviceNode(uid), "/dev/apex_0") << "the claim's device is apex_0 since the reboot";
  json checkpoint = json::parse(Checkpoint(), nullptr, false);
  EXPECT_EQ(checkpoint["claims"][uid].value("bootId", ""), boot_id) << Checkpoint();
}

// What the driver did is on /metrics: calls and claim errors by method, their durations, calls
// in flight, what is prepared now.
TEST_F(DraE2eTest, TheDriversCallsAndWhatItHoldsAreOnMetrics) {
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  const std::string uid = Prepared("pod-tpu", "tpu-0000-03-00-0");
  const std::string missing = "99999999-9999-9999-9999-999999999999";
  auto refused = dra_kubelet_->CallNodePrepareResources(kDriver, {{"default", "missing", missing}});
  ASSERT_TRUE(refused.ok()) << refused.status();
  httplib::Client client("127.0.0.1", ::edgeaccel::testing::MetricsPort(*daemon));
  auto scrape = [&] {
    auto answer = client.Get("/metrics");
    return answer ? answer->body : std::string();
  };
  const std::string labels = "{driver=\"edgetpu.edgeaccel.io\",method=\"NodePrepareResources\"}";
  std::string body = scrape();
  for (const std::string& line :
       {"edgeaccel_dra_requests_total" + labels + " 2", "edgeaccel_dra_claim_errors_total" + labels + " 1",
        "edgeaccel_dra_request_duration_seconds_count" + labels + " 2",
        "edgeaccel_dra_requests_inflight" + labels + " 0",
        std::string("edgeaccel_dra_prepared_claims{driver=\"edgetpu.edgeaccel.io\"} 1"),
        std::string("edgeaccel_dra_prepared_devices{driver=\"edgetpu.edgeaccel.io\"} 1")}) {
    EXPECT_NE(body.find(line + "\n"), std::string::npos) << line << "\n" << body;
  }
  auto undone = dra_kubelet_->Unprepare(kDriver, {{"default", "pod-tpu", uid}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  body = scrape();
  EXPECT_NE(body.find("edgeaccel_dra_requests_total{driver=\"edgetpu.edgeaccel.io\",method=\"NodeUnprepareResources\"} 1\n"),
            std::string::npos) << body;
  EXPECT_NE(body.find("edgeaccel_dra_prepared_claims{driver=\"edgetpu.edgeaccel.io\"} 0\n"), std::string::npos) << body;
}

// A node on DRA is as visible as one on the device plugin (#42): both TPUs on /metrics with
// health and temperature (api="dra"), the hot one Unhealthy; /healthz 503 while no kubelet
// registers the driver, 200 once one does; 503 (and /livez 200) while the API server refuses the
// slice.
TEST_F(DraE2eTest, ADraNodeIsOnMetricsAndHealthzAsADevicePluginNodeIs) {
  // The kubelet's root is there, its plugin watcher not yet.
  ASSERT_EQ(mkdir(kubelet_.root().c_str(), 0750), 0);
  ASSERT_EQ(mkdir((kubelet_.root() + "/plugins_registry").c_str(), 0750), 0);
  auto daemon = StartDraDaemon();
  httplib::Client client("127.0.0.1", ::edgeaccel::testing::MetricsPort(*daemon));
  auto status_of = [&](const char* path) {
    auto answer = client.Get(path);
    return answer ? answer->status : -1;
  };
  ASSERT_TRUE(daemon->WaitForLog("DRA driver serving")) << daemon->Log();
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, ::testing::HasSubstr("DRA driver edgetpu.edgeaccel.io is not registered with the kubelet"));
  EXPECT_EQ(status_of("/livez"), 503);
  StartDraKubelet();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  EXPECT_TRUE(Eventually([&] { return status_of("/healthz") == 200; })) << client.Get("/healthz")->body;

  host_.SetApexAttribute(0, "temp", "101300");  // over the 99.8 °C threshold
  const std::string hot = "{resource=\"coral.ai/edgetpu\",device=\"0000:03:00.0\",api=\"dra\"}";
  const std::string cool = "{resource=\"coral.ai/edgetpu\",device=\"0000:04:00.0\",api=\"dra\"}";
  std::string body;
  EXPECT_TRUE(Eventually([&] {
    auto answer = client.Get("/metrics");
    body = answer ? answer->body : "";
    return absl::StrContains(body, "edgeaccel_device_healthy" + hot + " 0\n");
  })) << body;
  for (const std::string& line :
       {"edgeaccel_device_healthy" + cool + " 1", "edgeaccel_edgetpu_temperature_celsius" + hot + " 101.3",
        "edgeaccel_edgetpu_temperature_celsius" + cool + " 45.05",
        std::string("edgeaccel_dra_registered{driver=\"edgetpu.edgeaccel.io\"} 1"),
        std::string("edgeaccel_dra_serving{driver=\"edgetpu.edgeaccel.io\"} 1")}) {
    EXPECT_NE(body.find(line + "\n"), std::string::npos) << line << "\n" << body;
  }

  // The API server refuses every slice write from now: not ready, still live.
  api_.FailNextSliceRequests(403, 1000);
  host_.SetApexAttribute(0, "temp", "45050");  // a change to publish
  EXPECT_TRUE(Eventually([&] { return status_of("/healthz") == 503; }, absl::Seconds(20)))
      << client.Get("/healthz")->body << daemon->Log();
  EXPECT_THAT(client.Get("/healthz")->body,
              ::testing::HasSubstr("DRA driver edgetpu.edgeaccel.io cannot publish its ResourceSlice"));
  EXPECT_EQ(status_of("/livez"), 200);
  EXPECT_NE(client.Get("/metrics")->body.find("edgeaccel_dra_slice_publish_failing{driver=\"edgetpu.edgeaccel.io\"} 1\n"),
            std::string::npos);
  api_.FailNextSliceRequests(403, 0);
  EXPECT_TRUE(Eventually([&] { return status_of("/healthz") == 200; }, absl::Seconds(30)))
      << client.Get("/healthz")->body;
  StopDaemon(daemon.get());
}

// A pod's allocatedResourcesStatus on 1.36 shows a device's health only while it is fresh: the
// kubelet turns a device whose last report is older than its health_check_timeout_seconds (30 s
// by default) Unknown. The driver reports on every change only, so it says how long a report
// holds; a claimed TPU that stays healthy (or hot) for minutes must not turn Unknown (seen on the
// real 1.36.2 before: Healthy at 60 s, Unknown from 80 s on).
TEST_F(DraE2eTest, AClaimedDevicesHealthDoesNotGoStaleInThePodsStatus) {
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  Prepared("pod-tpu", "tpu-0000-03-00-0");
  host_.SetApexAttribute(1, "temp", "101300");  // the other TPU, over its threshold
  ASSERT_TRUE(dra_kubelet_->WaitForHealth(kDriver, [](const auto& entries) {
    for (const auto& entry : entries) {
      if (entry.device == "tpu-0000-04-00-0" && entry.health == "Unhealthy") return true;
    }
    return false;
  })) << daemon->Log();
  for (const absl::Duration later : {absl::ZeroDuration(), absl::Seconds(31), absl::Hours(24)}) {
    const absl::Time at = absl::Now() + later;
    auto claimed = dra_kubelet_->HealthAt(kDriver, "node-1", "tpu-0000-03-00-0", at);
    EXPECT_EQ(claimed.health, "Healthy") << later;
    auto hot = dra_kubelet_->HealthAt(kDriver, "node-1", "tpu-0000-04-00-0", at);
    EXPECT_EQ(hot.health, "Unhealthy") << later;
    EXPECT_THAT(hot.message, ::testing::HasSubstr("temperature 101.30")) << later;
  }
}

// Without the boot id (its file not mounted under --host-root) the driver still serves; it says
// what it cannot do and how to give it the file.
TEST_F(DraE2eTest, WithoutTheBootIdTheDriverServesAndSaysSo) {
  host_.Remove("/proc/sys/kernel/random/boot_id");
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  EXPECT_TRUE(daemon->WaitForLog("cannot read the node's boot id")) << daemon->Log();
  EXPECT_TRUE(daemon->WaitForLog("mount /proc/sys/kernel/random/boot_id under --host-root")) << daemon->Log();
  const std::string uid = Prepared("pod-tpu", "tpu-0000-03-00-0");
  json checkpoint = json::parse(Checkpoint(), nullptr, false);
  EXPECT_FALSE(checkpoint["claims"][uid].contains("bootId")) << Checkpoint();
}

// --dra-shared on the real daemon: a Jetson GPU in the slice offered to several claims (its
// memory the shared capacity), and two claims the scheduler gave shares of it (each result with
// its shareID) both prepared, each with its own CDI spec and share_id; unpreparing one leaves the
// other prepared; a claim that would hold the GPU alone is refused while shares are out.
TEST_F(DraE2eTest, TwoClaimsGetSharesOfOneSharedJetsonGpu) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  constexpr char kGpu[] = "gpu-tegra234-igpu0";
  host_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  StartDraKubelet();
  auto daemon = StartDaemon({"--dra=tegra", "--dra-shared=tegra", "--node-name=node-1",
                             "--api-server=" + api_.url(), "--api-token-file=" + api_.token_file(),
                             "--api-ca-file=" + api_.ca_file(), "--cdi-dir=" + cdi_.path()});
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kGpuDriver).ok()) << daemon->Log();
  json published;
  ASSERT_TRUE(api_.WaitForResourceSlices([&](const std::vector<json>& slices) {
    for (const json& slice : slices) {
      if (slice["spec"]["driver"] == kGpuDriver && slice["spec"]["devices"].size() == 1) {
        published = slice["spec"]["devices"][0];
        return true;
      }
    }
    return false;
  }, absl::Seconds(10))) << daemon->Log();
  EXPECT_EQ(published["name"], kGpu);
  EXPECT_EQ(published["allowMultipleAllocations"], true) << published.dump();
  EXPECT_EQ(published["capacity"]["memory"], json::parse(R"({"value": "3871Mi",
      "requestPolicy": {"default": "3871Mi", "validRange": {"min": "1Mi"}}})")) << published.dump();

  // Claims as the scheduler leaves them for a device offered shared: a shareID (a UUID) and the
  // capacity consumed in each result.
  auto shared_claim = [&](const std::string& name, const std::string& share) {
    json claim = TestApiServer::MakeAllocatedClaim("default", name, kGpuDriver, "node-1", {{"gpu", kGpu}});
    json& result = claim["status"]["allocation"]["devices"]["results"][0];
    if (!share.empty()) {
      claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {{"requests", {{"memory", "1Gi"}}}};
      result["shareID"] = share;
      result["consumedCapacity"] = {{"memory", "1Gi"}};
    }
    return api_.AddResourceClaim(claim)["metadata"]["uid"].get<std::string>();
  };
  const std::string share_a = "5a5a5a5a-0000-4000-8000-00000000000a";
  const std::string share_b = "5b5b5b5b-0000-4000-8000-00000000000b";
  const std::string a = shared_claim("infer-a", share_a);
  const std::string b = shared_claim("infer-b", share_b);
  auto answer = dra_kubelet_->Prepare(kGpuDriver, {{"default", "infer-a", a}, {"default", "infer-b", b}});
  ASSERT_TRUE(answer.ok()) << answer.status() << daemon->Log();
  for (const auto& [uid, share] : {std::pair{a, share_a}, std::pair{b, share_b}}) {
    const DraKubelet::ClaimResult& result = answer->claims.at(uid);
    ASSERT_EQ(result.error, "") << daemon->Log();
    ASSERT_EQ(result.devices.size(), 1u);
    EXPECT_EQ(result.devices[0].device, kGpu);
    EXPECT_EQ(result.devices[0].share_id, share);
    EXPECT_EQ(result.devices[0].cdi_device_ids,
              std::vector<std::string>{"k8s.gpu.edgeaccel.io/claim=" + uid + "-" + kGpu});
    EXPECT_TRUE(PathExists(cdi_.path() + "/k8s.gpu.edgeaccel.io-claim_" + uid + ".json"));
  }

  // One pod goes: its claim's spec only; the other claim stays prepared.
  auto undone = dra_kubelet_->Unprepare(kGpuDriver, {{"default", "infer-a", a}});
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(undone->claims.at(a), "");
  EXPECT_FALSE(PathExists(cdi_.path() + "/k8s.gpu.edgeaccel.io-claim_" + a + ".json"));
  EXPECT_TRUE(PathExists(cdi_.path() + "/k8s.gpu.edgeaccel.io-claim_" + b + ".json"));
  auto again = dra_kubelet_->CallNodePrepareResources(kGpuDriver, {{"default", "infer-b", b}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->claims.at(b).error, "");

  // A claim allocated while the GPU was offered unshared (no shareID: the scheduler gives one to
  // every allocation of a device offered shared) holds it alone: refused while a share is out.
  const std::string alone = shared_claim("whole", "");
  auto refused = dra_kubelet_->CallNodePrepareResources(kGpuDriver, {{"default", "whole", alone}});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_NE(refused->claims.at(alone).error.find("is prepared for claim default/infer-b"), std::string::npos)
      << refused->claims.at(alone).error;
}

}  // namespace
}  // namespace edgeaccel

namespace edgeaccel {
namespace {

// A node moved from the device plugin to DRA while a pod still holds a TPU it got from the device
// plugin: the DRA driver publishes that TPU tainted (in use by the device plugin, the pod named),
// refuses a claim of it, and offers it untainted once the pod has ended (the kubelet's
// pod-resources API no longer lists it). The other TPU is offered at once.
TEST_F(DraE2eTest, AMoveToDraKeepsATpuADevicePluginPodHoldsOutUntilThePodEnds) {
  kubelet_.Start();
  auto plugin = StartDaemon({});
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 2, 2)) << plugin->Log();
  absl::StatusOr<std::string> pod = kubelet_.AdmitPod(std::string(kResourceEdgeTpu), {"0000:03:00.0"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  StopDaemon(plugin.get());

  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(SliceTaintsAre("tpu-0000-03-00-0:edgeaccel.io/in-use-by-device-plugin=" + *pod +
                             ":NoSchedule tpu-0000-04-00-0 "))
      << daemon->Log();
  // A claim of the held TPU (a scheduler that ignored the taint) is refused, with the holder.
  const std::string held = ClaimUid("held", "tpu-0000-03-00-0");
  auto refused = dra_kubelet_->Prepare(kDriver, {{"default", "held", held}});
  ASSERT_FALSE(refused.ok()) << "the kubelet fails the pod's start with the claim's error";
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("held by pod default/" + *pod))
      << daemon->Log();
  Prepared("free", "tpu-0000-04-00-0");

  // The pod ends: the TPU is offered again (looked at every 10 s while held).
  kubelet_.DeletePod(*pod);
  ASSERT_TRUE(SliceTaintsAre("tpu-0000-03-00-0 tpu-0000-04-00-0 ", absl::Seconds(40))) << daemon->Log();
  auto prepared = dra_kubelet_->Prepare(kDriver, {{"default", "held", held}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->claims.at(held).error, "");
  StopDaemon(daemon.get());
}

// The other way: a node moved from DRA back to the device plugin while a claim is still prepared.
// The device plugin advertises that TPU Unhealthy (held by the claim) until the driver's
// checkpoint no longer lists it, so the kubelet gives it to no pod meanwhile.
TEST_F(DraE2eTest, AMoveToTheDevicePluginKeepsATpuAPreparedClaimHoldsOut) {
  kubelet_.Start();
  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  Prepared("pod-tpu", "tpu-0000-04-00-0");
  const std::string checkpoint = Checkpoint();
  StopDaemon(daemon.get());

  auto plugin = StartDaemon({});
  ASSERT_TRUE(Advertised(std::string(kResourceEdgeTpu), 2, 1)) << plugin->Log();
  for (const v1beta1::Device& device : kubelet_.Devices(std::string(kResourceEdgeTpu))) {
    EXPECT_EQ(device.health(), device.id() == "0000:04:00.0" ? "Unhealthy" : "Healthy") << device.id();
  }
  EXPECT_TRUE(plugin->WaitForLog("0000:04:00.0 is held by ResourceClaim default/pod-tpu")) << plugin->Log();
  EXPECT_FALSE(kubelet_.Admit(std::string(kResourceEdgeTpu), 2).ok());
  // The claim unprepared (its checkpoint without it): the TPU is free again.
  json emptied = json::parse(checkpoint);
  emptied["claims"] = json::object();
  const std::string path = kubelet_.root() + "/plugins/edgetpu.edgeaccel.io/checkpoint.json";
  std::ofstream(path + ".new") << emptied.dump();
  ASSERT_EQ(rename((path + ".new").c_str(), path.c_str()), 0);
  // Looked at every 10 s while held.
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Allocatable(std::string(kResourceEdgeTpu)) == 2; },
                               absl::Seconds(40)))
      << plugin->Log();
  StopDaemon(plugin.get());
}

// A node whose TPUs the device plugin served before, moved to DRA: kubelet 1.36 still holds the
// old endpoint, whose options asked for PreStartContainer, and so fails every container that DRA
// gave coral.ai/edgetpu to (the double models its device manager). The DRA daemon registers the
// resource with no devices and without PreStartContainer: the container starts, and nothing is
// offered through the device plugin (capacity 0).
TEST_F(DraE2eTest, AMoveToDraLetsAPodGivenTheExtendedResourceThroughDraStart) {
  const std::string tpu(kResourceEdgeTpu);
  kubelet_.Start();
  auto plugin = StartDaemon({});
  ASSERT_TRUE(Advertised(tpu, 2, 2)) << plugin->Log();
  StopDaemon(plugin.get());
  EXPECT_THAT(std::string(kubelet_.StartDraExtendedResourceContainer(tpu).message()),
              ::testing::HasSubstr("no devices found allocated in local cache"))
      << "the kubelet double no longer models 1.36's device manager";
  const int registrations = kubelet_.Registrations(tpu);

  StartDraKubelet();
  auto daemon = StartDraDaemon();
  ASSERT_TRUE(dra_kubelet_->WaitForRegistration(kDriver).ok()) << daemon->Log();
  ASSERT_TRUE(kubelet_.WaitFor([&] {
    return kubelet_.Registrations(tpu) > registrations && kubelet_.StreamOpen(tpu) && kubelet_.Capacity(tpu) == 0;
  })) << daemon->Log();
  EXPECT_TRUE(kubelet_.StartDraExtendedResourceContainer(tpu).ok()) << daemon->Log();
  ASSERT_TRUE(SliceTaintsAre("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  EXPECT_FALSE(kubelet_.Admit(tpu, 1).ok()) << "no TPU through the device plugin";
  StopDaemon(daemon.get());
}

// One resource name both ways on a node: the PCIe TPUs through DRA, the USB Accelerator through
// the device plugin. The scheduler hands coral.ai/edgetpu to DRA whenever the node's allocatable
// of it is 0 (the USB TPU busy), and kubelet 1.36 then fails the container while the device
// plugin's endpoint asks for PreStartContainer (seen on the lab): the device plugin does not ask.
TEST_F(DraE2eTest, ADevicePluginResourceSharingItsNameWithDraNeverAsksForPreStart) {
  const std::string tpu(kResourceEdgeTpu);
  host_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  kubelet_.Start();
  StartDraKubelet();
  auto daemon = StartDraDaemon({"--dra=coral-pcie"});
  ASSERT_TRUE(Advertised(tpu, 1, 1)) << daemon->Log();
  ASSERT_TRUE(SliceHolds("tpu-0000-03-00-0 tpu-0000-04-00-0 ")) << daemon->Log();
  EXPECT_TRUE(kubelet_.StartDraExtendedResourceContainer(tpu).ok()) << daemon->Log();
  // The device plugin's own pods still start.
  absl::StatusOr<std::string> pod = kubelet_.AdmitPod(tpu, {"2-1"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_TRUE(kubelet_.StartContainer(*pod).ok()) << daemon->Log();
  StopDaemon(daemon.get());
}

}  // namespace
}  // namespace edgeaccel
