// End to end: the real edgeaccel-device-plugin binary, a fake host tree, and a test kubelet on
// real Unix sockets. What is asserted is what the kubelet (and so the user) sees.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "captured_log.h"
#include "daemon_process.h"
#include "daemon_test.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "eventually.h"
#include "fixture_host.h"
#include "neighbour_plugin.h"
#include "test_api_server.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::Occurrences;
using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::DaemonProcess;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::FullDisk;
using ::edgeaccel::testing::KubeletProfileName;
using ::edgeaccel::testing::KubeletProfileTestName;
using ::edgeaccel::testing::MetricsPort;
using ::edgeaccel::testing::DevicePluginDirFlagIn;
using ::edgeaccel::testing::KubeletRootFlagIn;
using ::edgeaccel::testing::RunCommand;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestKubelet;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTpu(kResourceEdgeTpu);
const char kDaemon[] = EDGEACCEL_DAEMON_PATH;

// Two PCIe Edge TPUs on NUMA node 0.
class E2eTest : public ::edgeaccel::testing::DaemonTest {
 protected:
  void SetUp() override {
    host_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .numa_node = 0});
    host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .numa_node = 0});
  }
  using DaemonTest::Advertised;
  bool Advertised(int capacity, int allocatable) { return Advertised(kTpu, capacity, allocatable); }
  // The kubelet started, and another vendor's plugin (built like NVIDIA's) serving coral.ai/edgetpu
  // with `ids`, its list at the kubelet before the daemon starts (a daemon quicker than the
  // kubelet's first ListAndWatch answer would register first and step back later: another case).
  std::unique_ptr<::edgeaccel::testing::NeighbourPlugin> AVendorPluginServesTheTpus(
      const std::vector<std::string>& ids) {
    kubelet_.Start();
    auto other = std::make_unique<::edgeaccel::testing::NeighbourPlugin>(
        ::edgeaccel::testing::NeighbourKind::kNvidiaLike, kubelet_.DevicePluginsDir(),
        "vendor-edgetpu.sock", kTpu, ids);
    [&] {
      ASSERT_TRUE(other->Start().ok());
      const int count = static_cast<int>(ids.size());
      ASSERT_TRUE(Advertised(count, count));
    }();
    return other;
  }
};

TEST_F(E2eTest, NodeShowsTwoEdgeTpusAndAPodGetsExactlyOne) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  EXPECT_EQ(kubelet_.RegisteredVia(kTpu), "kubelet");

  std::vector<v1beta1::Device> devices = kubelet_.Devices(kTpu);
  EXPECT_EQ(devices[0].id(), "0000:03:00.0");
  EXPECT_EQ(devices[0].topology().nodes(0).id(), 0);

  absl::StatusOr<std::vector<std::string>> preferred =
      kubelet_.GetPreferredAllocation(kTpu, {"0000:03:00.0", "0000:04:00.0"}, {}, 1);
  ASSERT_TRUE(preferred.ok());
  EXPECT_THAT(*preferred, ::testing::ElementsAre("0000:03:00.0"));

  absl::StatusOr<v1beta1::AllocateResponse> response = kubelet_.Allocate(kTpu, {"0000:03:00.0"});
  ASSERT_TRUE(response.ok()) << response.status();
  const auto& container = response->container_responses(0);
  ASSERT_EQ(container.devices_size(), 1);
  EXPECT_EQ(container.devices(0).host_path(), "/dev/apex_0");  // host path, root stripped
  EXPECT_EQ(container.devices(0).container_path(), "/dev/apex_0");
  EXPECT_EQ(container.devices(0).permissions(), "rw");
  EXPECT_EQ(container.mounts_size(), 0);
  EXPECT_TRUE(kubelet_.PreStartContainer(kTpu, {"0000:03:00.0"}).ok());
}

TEST_F(E2eTest, PluginWatcherRegistration) {
  kubelet_.Start();
  auto daemon = StartDaemon({"--registration=plugin-watcher"});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  EXPECT_EQ(kubelet_.RegisteredVia(kTpu), "plugin-watcher");
  EXPECT_TRUE(daemon->WaitForLog("registered with the kubelet through its plugin watcher"));
  kubelet_.Restart();
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Registrations(kTpu) == 2; }));
  ASSERT_TRUE(Advertised(2, 2));
}

TEST_F(E2eTest, KubeletRestartIsInvisible) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  for (int restart = 1; restart <= 3; ++restart) {
    kubelet_.Restart();
    ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Registrations(kTpu) == restart + 1; }))
        << daemon->Log();
    ASSERT_TRUE(Advertised(2, 2));
  }
  EXPECT_THAT(daemon->Log(), HasSubstr("the kubelet restarted; registering again"));
  EXPECT_TRUE(kubelet_.Allocate(kTpu, {"0000:04:00.0"}).ok());
}

TEST_F(E2eTest, HotPlugRemoveAndAdd) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();

  // The node vanishes: capacity stays, allocatable drops, Allocate refuses it.
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(Advertised(2, 1));
  absl::StatusOr<v1beta1::AllocateResponse> refused = kubelet_.Allocate(kTpu, {"0000:04:00.0"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("/dev/apex_1 is missing"));

  // Fully unplugged: gone from capacity too; Allocate says unknown.
  host_.UnplugCoralPcie(1, "0000:04:00.0");
  ASSERT_TRUE(Advertised(1, 1));
  EXPECT_EQ(kubelet_.Allocate(kTpu, {"0000:04:00.0"}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Plugged back in.
  host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .numa_node = 0});
  ASSERT_TRUE(Advertised(2, 2));
  EXPECT_TRUE(kubelet_.Allocate(kTpu, {"0000:04:00.0"}).ok());
}

TEST_F(E2eTest, OverheatTurnsUnhealthyAndRecovers) {
  kubelet_.Start();
  auto daemon = StartDaemon({"--temperature-threshold=85"});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  host_.SetApexAttribute(0, "temp", "85050\n");
  ASSERT_TRUE(Advertised(2, 1));
  EXPECT_TRUE(daemon->WaitForLog("is now Unhealthy: temperature 85.05 °C is at or above 85.00 °C"));
  host_.SetApexAttribute(0, "temp", "60050\n");
  ASSERT_TRUE(Advertised(2, 2));
  EXPECT_TRUE(daemon->WaitForLog("0000:03:00.0 is Healthy again"));
}

// What 1.36 shows in the pod's status (ResourceHealthStatus): the TPU a running pod holds turns
// Unhealthy in its allocatedResourcesStatus when it overheats and Healthy after, from the
// health the daemon streams (the double follows UpdateAllocatedResourcesStatus). The other TPU's
// pod stays Healthy throughout.
TEST_F(E2eTest, ARunningPodsStatusFollowsItsTpusHealth) {
  kubelet_.Start();
  auto daemon = StartDaemon({"--temperature-threshold=85"});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  absl::StatusOr<std::string> hot = kubelet_.AdmitPod(kTpu, {"0000:03:00.0"});
  absl::StatusOr<std::string> cool = kubelet_.AdmitPod(kTpu, {"0000:04:00.0"});
  ASSERT_TRUE(hot.ok() && cool.ok()) << hot.status() << cool.status();
  EXPECT_THAT(kubelet_.AllocatedResourcesStatus(*hot), ::testing::ElementsAre("0000:03:00.0=Healthy"));
  host_.SetApexAttribute(0, "temp", "85050\n");
  ASSERT_TRUE(kubelet_.WaitFor([&] {
    return kubelet_.AllocatedResourcesStatus(*hot) == std::vector<std::string>{"0000:03:00.0=Unhealthy"};
  })) << daemon->Log();
  EXPECT_THAT(kubelet_.AllocatedResourcesStatus(*cool), ::testing::ElementsAre("0000:04:00.0=Healthy"));
  host_.SetApexAttribute(0, "temp", "60050\n");
  ASSERT_TRUE(kubelet_.WaitFor([&] {
    return kubelet_.AllocatedResourcesStatus(*hot) == std::vector<std::string>{"0000:03:00.0=Healthy"};
  })) << daemon->Log();
}

TEST_F(E2eTest, HostileAllocateIdsAreRefused) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  for (const std::string& id : {std::string("../../etc/shadow"), std::string(10000, 'x'),
                                std::string(""), std::string("0000:09:00.0"),
                                std::string("/dev/apex_0"), std::string("apex_0")}) {
    absl::StatusOr<v1beta1::AllocateResponse> response = kubelet_.Allocate(kTpu, {id});
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << id.substr(0, 40);
  }
  EXPECT_TRUE(daemon->Running());
  EXPECT_THAT(daemon->Log(), HasSubstr("unknown device id \"../../etc/shadow\""));
}

TEST_F(E2eTest, SigtermEndsStreamsRemovesSocketAndExitsZeroQuickly) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  const std::string socket = kubelet_.DevicePluginsDir() + "/" + SocketFileName(kTpu);
  ASSERT_EQ(access(socket.c_str(), F_OK), 0);
  const absl::Time start = absl::Now();
  daemon->Signal(SIGTERM);
  std::optional<int> code = daemon->Wait(absl::Seconds(5));
  ASSERT_TRUE(code.has_value()) << daemon->Log();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(*code, 0) << daemon->Log();
  EXPECT_NE(access(socket.c_str(), F_OK), 0) << "socket left behind";
  EXPECT_TRUE(kubelet_.WaitFor([&] { return !kubelet_.StreamOpen(kTpu); }));
  EXPECT_THAT(daemon->Log(), HasSubstr("stopped cleanly"));
}

TEST_F(E2eTest, SigintToo) {
  kubelet_.Start();
  auto daemon = StartDaemon({"--registration=plugin-watcher"});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  daemon->Signal(SIGINT);
  EXPECT_EQ(daemon->Wait(absl::Seconds(5)), 0);
  EXPECT_NE(access((kubelet_.PluginsRegistryDir() + "/" + SocketFileName(kTpu)).c_str(), F_OK), 0);
}

TEST_F(E2eTest, MissingAndUnreadableSysfsFilesAreReportedNotFatal) {
  host_.Remove("/sys/class/apex/apex_1/status");
  host_.MakeDirectory("/sys/class/apex/apex_1/status");  // unreadable as a file
  host_.Remove("/sys/class/apex/apex_0/temp");
  host_.Remove("/sys/class/apex/apex_0/hw_temp_warn2");
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 1)) << daemon->Log();
  EXPECT_THAT(daemon->Log(), HasSubstr("0000:04:00.0 found, Unhealthy: cannot read driver status"));
  EXPECT_TRUE(daemon->Running());
}

TEST_F(E2eTest, NoKubeletAtStartIsWaitedFor) {
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->WaitForLog("waiting for the kubelet")) << daemon->Log();
  EXPECT_TRUE(daemon->Running());
  kubelet_.Start();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
}

TEST_F(E2eTest, SocketPathTakenByAFileIsLoggedAndDaemonKeepsGoing) {
  kubelet_.Start();
  const std::string ours = kubelet_.DevicePluginsDir() + "/" + SocketFileName(kTpu);
  FILE* f = fopen(ours.c_str(), "w");
  fclose(f);
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->WaitForLog("the path is taken by a regular file")) << daemon->Log();
  EXPECT_TRUE(daemon->Running());
  unlink(ours.c_str());
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
}

TEST_F(E2eTest, SocketPathTakenByADirectoryIsLoggedAndDaemonKeepsGoing) {
  kubelet_.Start();
  const std::string ours = kubelet_.DevicePluginsDir() + "/" + SocketFileName(kTpu);
  ASSERT_EQ(mkdir(ours.c_str(), 0755), 0);
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->WaitForLog("the path is taken by a directory")) << daemon->Log();
  EXPECT_TRUE(daemon->Running());
  rmdir(ours.c_str());
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
}

TEST_F(E2eTest, PluginWatcherRefusalIsLoggedAndTheKubeletRetries) {
  kubelet_.RefuseRegistrations("node is being drained (test)");
  kubelet_.Start();
  auto daemon = StartDaemon({"--registration=plugin-watcher"});
  ASSERT_TRUE(daemon->WaitForLog(
      "the kubelet's plugin watcher refused the registration: node is being drained (test)"))
      << daemon->Log();
  EXPECT_TRUE(daemon->Running());
  kubelet_.RefuseRegistrations("");
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();  // the kubelet's own retry, with backoff
}

TEST_F(E2eTest, UnreadableSysfsFileAsNonRootIsReported) {
  // Root reads everything; run --discover as nobody to get a real EACCES. nobody must be able
  // to reach the binary: the build tree may sit under a private directory such as /root.
  TempDir bin;
  chmod(bin.path().c_str(), 0755);
  const std::string daemon = bin.path() + "/edgeaccel-device-plugin";
  {
    std::ifstream in(kDaemon, std::ios::binary);
    std::ofstream out(daemon, std::ios::binary);
    out << in.rdbuf();
  }
  chmod(daemon.c_str(), 0755);
  chmod(host_.root().c_str(), 0755);
  chmod(host_.Path("/sys/devices/pci0000:00/0000:03:00.0/apex/apex_0/status").c_str(), 0000);
  CommandResult result =
      RunCommand(daemon, {"--host-root=" + host_.root(), "--discover", KubeletRootFlagIn(host_.root()),
                          DevicePluginDirFlagIn(host_.root())},
                 absl::Seconds(30), 65534);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("0000:03:00.0  Unhealthy (cannot read driver status: cannot "
                                    "open /sys/class/apex/apex_0/status: Permission denied)"));
  EXPECT_THAT(result.out, HasSubstr("0000:04:00.0  Healthy"));
}

TEST_F(E2eTest, ResourceWithoutDevicesIsRegisteredWhenTheFirstAppears) {
  host_.UnplugCoralPcie(0, "0000:03:00.0");
  host_.UnplugCoralPcie(1, "0000:04:00.0");
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->WaitForLog("no PCIe Edge TPU found")) << daemon->Log();
  // The labels are refreshed once start-up is through, after registrars would have started.
  ASSERT_TRUE(daemon->WaitForLog("node labels:")) << daemon->Log();
  EXPECT_EQ(kubelet_.Registrations(kTpu), 0) << "a node without TPUs must not show coral.ai/edgetpu";
  EXPECT_THAT(daemon->Log(), ::testing::Not(HasSubstr("serving on"))) << "nothing served either";
  host_.AddCoralPcie({.index = 0});
  ASSERT_TRUE(Advertised(1, 1)) << daemon->Log();
}

TEST_F(E2eTest, MetricsHealthAndNodeLabels) {
  const std::string nfd = dir_.path() + "/features.d";
  mkdir(nfd.c_str(), 0755);
  auto daemon = StartDaemon({"--nfd-features-dir=" + nfd});  // no kubelet yet
  httplib::Client client("127.0.0.1", MetricsPort(*daemon));
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health) << daemon->Log();
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, HasSubstr("coral.ai/edgetpu is not registered with the kubelet"));

  kubelet_.Start();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  ASSERT_TRUE(kubelet_.WaitFor([&] { return client.Get("/healthz")->status == 200; }));
  ASSERT_TRUE(kubelet_.Allocate(kTpu, {"0000:03:00.0"}).ok());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("edgeaccel_edgetpu_temperature_celsius{resource=\"coral.ai/"
                                       "edgetpu\",device=\"0000:03:00.0\",api=\"device-plugin\"} 45.05"));
  EXPECT_THAT(metrics->body, HasSubstr("edgeaccel_allocations_total{resource=\"coral.ai/edgetpu\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("edgeaccel_registered{resource=\"coral.ai/edgetpu\"} 1"));

  std::ifstream in(nfd + "/edgeaccel");
  std::stringstream labels;
  labels << in.rdbuf();
  EXPECT_THAT(labels.str(), HasSubstr("coral.ai/edgetpu.count=2\n"));
  EXPECT_THAT(labels.str(), HasSubstr("coral.ai/edgetpu.interface=pcie\n"));
  // A TPU unplugged: the label follows.
  host_.UnplugCoralPcie(1, "0000:04:00.0");
  ASSERT_TRUE(Advertised(1, 1));
  ASSERT_TRUE(daemon->WaitForLog("coral.ai/edgetpu.count=1"));
  std::ifstream again(nfd + "/edgeaccel");
  std::stringstream after;
  after << again.rdbuf();
  EXPECT_THAT(after.str(), HasSubstr("coral.ai/edgetpu.count=1\n"));
}

// A container that restarts is started from the Allocate answer the kubelet cached when its pod
// was admitted; no new Allocate. What it gets when the device changed in between. The host
// starts with no TPU.
class RestartTest : public ::edgeaccel::testing::DaemonTest {
 protected:
  using DaemonTest::Advertised;
  bool Advertised(int capacity, int allocatable) { return Advertised(kTpu, capacity, allocatable); }
};

TEST_F(RestartTest, PcieTpuReplugged) {
  host_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(1, 1)) << daemon->Log();
  absl::StatusOr<std::string> pod = kubelet_.AdmitPod(kTpu, {"0000:03:00.0"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  ASSERT_TRUE(kubelet_.StartContainer(*pod).ok());

  // Replugged at the same index: the same node path, so a restart just works.
  host_.UnplugCoralPcie(0, "0000:03:00.0");
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Capacity(kTpu) == 0; })) << daemon->Log();
  host_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  ASSERT_TRUE(Advertised(1, 1)) << daemon->Log();
  absl::Status restart = kubelet_.StartContainer(*pod);
  EXPECT_TRUE(restart.ok()) << restart;

  // Back at another index (/dev/apex_1): the cached /dev/apex_0 is gone. Refused, saying so.
  host_.UnplugCoralPcie(0, "0000:03:00.0");
  host_.AddCoralPcie({.index = 1, .pci_address = "0000:03:00.0"});
  // Until the daemon has seen the unplug, the kubelet still counts the old device and a restart
  // fails in the runtime (no /dev/apex_0), not in PreStartContainer: wait for the daemon's word.
  // Where the daemon saw the TPU gone before it came back, a restart in between is refused as
  // "is gone", rightly; the next one, once it is back, gets the answer this test is about.
  ASSERT_TRUE(kubelet_.WaitFor([&] {
    if (kubelet_.Allocatable(kTpu) != 1) return false;
    restart = kubelet_.StartContainer(*pod);
    return absl::StrContains(restart.message(), "PreStartContainer") &&
           !absl::StrContains(restart.message(), "is gone");
  })) << restart << "\n" << daemon->Log();
  EXPECT_EQ(restart.code(), absl::StatusCode::kFailedPrecondition) << restart;
  EXPECT_THAT(std::string(restart.message()), HasSubstr("PreStartContainer for coral.ai/edgetpu"));
  EXPECT_THAT(std::string(restart.message()), HasSubstr("gives /dev/apex_0"));
  EXPECT_THAT(std::string(restart.message()), HasSubstr("it has /dev/apex_1 now"));
  EXPECT_THAT(std::string(restart.message()), HasSubstr("delete the pod"));
  EXPECT_TRUE(daemon->WaitForLog("PreStartContainer refused: the answer the kubelet cached for "
                                 "0000:03:00.0 gives /dev/apex_0"))
      << daemon->Log();
  // Once the pod is deleted, a pod admitted now is given the new node and starts.
  kubelet_.DeletePod(*pod);
  absl::StatusOr<std::string> fresh = kubelet_.AdmitPod(kTpu, {"0000:03:00.0"});
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(kubelet_.StartContainer(*fresh).ok());

  // Unplugged for good: refused, naming the device.
  host_.UnplugCoralPcie(1, "0000:03:00.0");
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Capacity(kTpu) == 0; }));
  restart = kubelet_.StartContainer(*fresh);
  EXPECT_THAT(std::string(restart.message()), HasSubstr("device 0000:03:00.0 is gone"));
}

TEST_F(RestartTest, UsbAcceleratorReenumerated) {
  const FixtureHost::CoralUsb before{.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true};
  host_.AddCoralUsb(before);
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(1, 1)) << daemon->Log();
  absl::StatusOr<std::string> pod = kubelet_.AdmitPod(kTpu, {"2-1"});
  ASSERT_TRUE(pod.ok()) << pod.status();
  ASSERT_TRUE(kubelet_.StartContainer(*pod).ok());

  // The Accelerator re-enumerates (a replug, a reset): same port, new device number.
  const int updates = kubelet_.Updates(kTpu);
  host_.ReenumerateCoralUsb(before, {.port = "2-1", .bus = 2, .dev = 4, .firmware_loaded = true});
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Updates(kTpu) > updates; })) << daemon->Log();
  ASSERT_TRUE(Advertised(1, 1));
  absl::Status restart = kubelet_.StartContainer(*pod);
  EXPECT_EQ(restart.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(restart.message()),
              HasSubstr("the answer the kubelet cached for 2-1 gives /dev/bus/usb/002/003, which "
                        "the device no longer has (it has /dev/bus/usb/002/004 now"));
  EXPECT_TRUE(daemon->WaitForLog("PreStartContainer refused")) << daemon->Log();
  kubelet_.DeletePod(*pod);
  absl::StatusOr<std::string> fresh = kubelet_.AdmitPod(kTpu, {"2-1"});
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(kubelet_.StartContainer(*fresh).ok());
}

// The directory a file sink writes to is unusable: one clear line, the devices served all the
// same, and the write lands by itself (the retry) once the directory can take it.
struct SinkCase {
  const char* name;
  const char* flags;   // the sink's flags; "DIR" stands for the directory
  const char* file;    // the file written in it
  const char* log;     // what the daemon says it cannot do
  const char* broken;  // how the directory is broken: "file", "missing", "read-only"
};

class SinkDirectoryTest : public E2eTest, public ::testing::WithParamInterface<SinkCase> {};

TEST_P(SinkDirectoryTest, OneClearLineDevicesServedAndTheRetryLandsTheFile) {
  const SinkCase& c = GetParam();
  const std::string dir = dir_.path() + "/sink";
  std::unique_ptr<::edgeaccel::testing::ReadOnlyDisk> read_only;
  if (std::string(c.broken) == "file") {
    std::ofstream(dir) << "a file where the directory should be";
  } else if (std::string(c.broken) == "read-only") {
    read_only = std::make_unique<::edgeaccel::testing::ReadOnlyDisk>(dir);
    if (!read_only->mounted()) GTEST_SKIP() << read_only->why();
  }
  std::vector<std::string> flags;
  for (absl::string_view flag : absl::StrSplit(c.flags, ' ')) {
    flags.push_back(absl::StrReplaceAll(flag, {{"DIR", dir}}));
  }
  kubelet_.Start();
  auto daemon = StartDaemon(flags);
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  ASSERT_TRUE(daemon->WaitForLog(c.log)) << daemon->Log();
  absl::SleepFor(absl::Milliseconds(1500));  // past the first retry
  const std::string log = daemon->Log();
  EXPECT_EQ(Occurrences(log, c.log), 1u) << "one line, not one per retry:\n" << log;
  EXPECT_TRUE(kubelet_.Allocate(kTpu, {"0000:03:00.0"}).ok());

  // Fixed: the file appears without any device change.
  if (std::string(c.broken) == "file") {
    unlink(dir.c_str());
    mkdir(dir.c_str(), 0755);
  } else if (std::string(c.broken) == "missing") {
    mkdir(dir.c_str(), 0755);
  } else {
    read_only->MakeWritable();
  }
  const std::string file = dir + "/" + c.file;
  EXPECT_TRUE(daemon->WaitForLog("on retry", absl::Seconds(10))) << daemon->Log();
  EXPECT_TRUE(Eventually([&] { return access(file.c_str(), F_OK) == 0; })) << daemon->Log();
  EXPECT_TRUE(daemon->Running());
}

INSTANTIATE_TEST_SUITE_P(
    Sinks, SinkDirectoryTest,
    ::testing::Values(
        SinkCase{"NfdDirIsAFile", "--nfd-features-dir=DIR", "edgeaccel",
                 "cannot write the NFD feature file", "file"},
        SinkCase{"NfdDirMissing", "--nfd-features-dir=DIR", "edgeaccel",
                 "cannot write the NFD feature file", "missing"},
        SinkCase{"NfdDirReadOnly", "--nfd-features-dir=DIR", "edgeaccel",
                 "cannot write the NFD feature file", "read-only"},
        SinkCase{"CdiDirIsAFile", "--cdi --cdi-dir=DIR", "edgeaccel.io-edgetpu.json",
                 "coral.ai/edgetpu: cannot write the CDI spec", "file"},
        SinkCase{"CdiDirReadOnly", "--cdi --cdi-dir=DIR", "edgeaccel.io-edgetpu.json",
                 "coral.ai/edgetpu: cannot write the CDI spec", "read-only"}),
    [](const ::testing::TestParamInfo<SinkCase>& info) { return std::string(info.param.name); });

// Another vendor's plugin already serves coral.ai/edgetpu on this node: the daemon does not take
// it over (no second registration, no war), says so in its log and in --discover, and counts
// itself healthy, since leaving it is by design.
// With API access, `kubectl describe node` tells why a device left Allocatable: Events on the
// Node, shaped like the kubelet's own (kubectl selects them by involvedObject kind, name and uid).
class NodeEventsTest : public E2eTest {
 protected:
  std::unique_ptr<DaemonProcess> StartDaemonWithApi(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--label-node", "--node-name=node-1",
                                     "--api-server=" + api_.url(),
                                     "--api-token-file=" + api_.token_file(),
                                     "--api-ca-file=" + api_.ca_file()};
    args.insert(args.end(), extra.begin(), extra.end());
    return StartDaemon(args);
  }
  ::edgeaccel::testing::TestApiServer api_;
};

TEST_F(NodeEventsTest, AnUnhealthyDeviceIsAWarningOnTheNodeAndItsRecoveryToo) {
  kubelet_.Start();
  auto daemon = StartDaemonWithApi();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(Advertised(2, 1));
  nlohmann::json event = api_.WaitForEvent("EdgeTPUUnhealthy", "0000:04:00.0: ");
  ASSERT_FALSE(event.is_null()) << daemon->Log();
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_THAT(event["message"].get<std::string>(), HasSubstr("/dev/apex_1"));
  EXPECT_EQ(event["involvedObject"]["kind"], "Node");
  EXPECT_EQ(event["involvedObject"]["name"], "node-1");
  EXPECT_EQ(event["involvedObject"]["uid"], "node-1");
  EXPECT_EQ(event["source"]["component"], "edgeaccel-device-plugin");
  host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .numa_node = 0});
  ASSERT_TRUE(Advertised(2, 2));
  event = api_.WaitForEvent("EdgeTPUHealthy", "0000:04:00.0: healthy again");
  ASSERT_FALSE(event.is_null()) << daemon->Log();
  EXPECT_EQ(event["type"], "Normal");
  // The same failure again is the same Event, counted, as the kubelet's recorder does it.
  host_.Remove("/dev/apex_1");
  ASSERT_FALSE(api_.WaitForEvent("EdgeTPUUnhealthy", "0000:04:00.0: ", 2).is_null())
      << daemon->Log();
  EXPECT_EQ(api_.Events().size(), 2u);
}

TEST_F(NodeEventsTest, ARefusedRegistrationIsAWarningOnTheNode) {
  kubelet_.RefuseRegistrations("plugin version mismatch");
  kubelet_.Start();
  auto daemon = StartDaemonWithApi();
  nlohmann::json event = api_.WaitForEvent("DevicePluginRegistrationRefused", "coral.ai/edgetpu");
  ASSERT_FALSE(event.is_null()) << daemon->Log();
  EXPECT_THAT(event["message"].get<std::string>(), HasSubstr("plugin version mismatch"));
}

TEST_F(NodeEventsTest, LeavingAResourceToAnotherPluginIsAWarningOnTheNode) {
  auto other = AVendorPluginServesTheTpus({"vendor-tpu-0", "vendor-tpu-1"});
  ASSERT_FALSE(HasFatalFailure());
  auto daemon = StartDaemonWithApi();
  nlohmann::json event = api_.WaitForEvent("DevicePluginTakeoverRefused", "vendor-tpu-0");
  ASSERT_FALSE(event.is_null()) << daemon->Log();
  EXPECT_THAT(event["message"].get<std::string>(), HasSubstr("--take-over"));
}

TEST_F(NodeEventsTest, AnApiServerThatRefusesEventsNeverHoldsUpServing) {
  api_.RefuseEventsWith(403);
  kubelet_.Start();
  auto daemon = StartDaemonWithApi();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(Advertised(2, 1));
  ASSERT_TRUE(daemon->WaitForLog("cannot record events on node node-1: HTTP 403"))
      << daemon->Log();
  host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .numa_node = 0});
  ASSERT_TRUE(Advertised(2, 2));
  host_.Remove("/dev/apex_0");
  ASSERT_TRUE(Advertised(2, 1));
  const std::vector<std::string> parts = absl::StrSplit(daemon->Log(), "cannot record events");
  EXPECT_EQ(parts.size(), 2u) << "one log line per refusal reason";
}

// `kubectl exec ... --discover` beside the running daemon: the daemon's own socket is not "another
// plugin", nor a reason to wait.
TEST_F(E2eTest, DiscoverBesideTheRunningDaemonSaysItServes) {
  kubelet_.Start();
  auto daemon = StartDaemon();
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  CommandResult discover = RunCommand(
      kDaemon, {"--discover", "--host-root=" + host_.root(), "--kubelet-root=" + kubelet_.root(),
                "--device-plugin-dir=" + kubelet_.DevicePluginsDir()});
  EXPECT_EQ(discover.exit_code, 0) << discover.err;
  EXPECT_THAT(discover.out, HasSubstr("registration: served by the edgeaccel-device-plugin "
                                      "already running on this node (" +
                                      kubelet_.DevicePluginsDir() + "/" +
                                      SocketFileName(kTpu) + ")"));
}

TEST_F(E2eTest, AResourceAnotherPluginServesIsLeftToItAndSaidSo) {
  auto other = AVendorPluginServesTheTpus({"vendor-tpu-0", "vendor-tpu-1"});
  ASSERT_FALSE(HasFatalFailure());
  auto daemon = StartDaemon();
  ASSERT_TRUE(daemon->WaitForLog("coral.ai/edgetpu: not registering it: the kubelet lists 2 "
                                 "healthy device(s) of coral.ai/edgetpu (vendor-tpu-0, ...) and "
                                 "we have not registered it: another plugin serves it"))
      << daemon->Log();
  httplib::Client client("127.0.0.1", MetricsPort(*daemon));
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;
  EXPECT_EQ(kubelet_.Registrations(kTpu), 1);
  EXPECT_EQ(kubelet_.Devices(kTpu)[0].id(), "vendor-tpu-0");

  CommandResult discover = RunCommand(
      kDaemon, {"--discover", "--host-root=" + host_.root(), "--kubelet-root=" + kubelet_.root(),
                "--device-plugin-dir=" + kubelet_.DevicePluginsDir()});
  EXPECT_EQ(discover.exit_code, 0) << discover.err;
  EXPECT_THAT(discover.out,
              HasSubstr("registration: left to (the plugin that advertises vendor-tpu-0): the "
                        "kubelet lists 2 healthy device(s) of coral.ai/edgetpu"));
  EXPECT_THAT(discover.out, HasSubstr("(--take-over=coral.ai/edgetpu to take it)"));
  EXPECT_THAT(discover.out, HasSubstr("what the kubelet holds comes from its pod-resources"));

  // --take-over: registered on purpose, and said so.
  daemon.reset();
  daemon = StartDaemon({"--take-over=coral.ai/edgetpu"});
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Registrations(kTpu) == 2; })) << daemon->Log();
  EXPECT_TRUE(kubelet_.WaitFor([&] {
    return kubelet_.StreamOpen(kTpu) && kubelet_.Devices(kTpu).size() == 2 &&
           kubelet_.Devices(kTpu)[0].id() == "0000:03:00.0";
  }));
  EXPECT_TRUE(daemon->WaitForLog("registering it even where another plugin may serve it, as "
                                 "--take-over asks"))
      << daemon->Log();
}

// The kubelet can drop our endpoint without restarting: here a kubelet 1.25-1.36, where the end
// of a replaced client's stream disconnects the client that holds the name now (the plugin the
// daemon took the resource from, with --take-over, exits). While the daemon cannot register
// again (the kubelet refuses, here) /healthz fails, so a liveness probe would act; then it
// recovers.
TEST_F(E2eTest, ALostEndpointFailsHealthzUntilRegisteredAgain) {
  auto other = AVendorPluginServesTheTpus({"vendor-tpu-0"});
  ASSERT_FALSE(HasFatalFailure());
  auto daemon = StartDaemon({"--take-over=coral.ai/edgetpu"});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  kubelet_.RefuseRegistrations("registrations paused for this test");
  other->Stop();
  ASSERT_TRUE(daemon->WaitForLog("it dropped our endpoint")) << daemon->Log();
  httplib::Client client("127.0.0.1", MetricsPort(*daemon));
  EXPECT_TRUE(Eventually([&] {
    auto health = client.Get("/healthz");
    return health && health->status == 503 &&
           health->body.find("coral.ai/edgetpu: the kubelet dropped our endpoint") != std::string::npos;
  })) << daemon->Log();
  EXPECT_EQ(kubelet_.Allocatable(kTpu), 0) << "the kubelet counts them Unhealthy meanwhile";

  kubelet_.RefuseRegistrations("");
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  EXPECT_TRUE(Eventually([&] {
    auto health = client.Get("/healthz");
    return health && health->status == 200;
  }));
}

// One daemon replacing another, from the plugin watcher to kubelet.sock, on every kubelet
// generation: measured on real kubelets 1.20.2 and 1.36, the plugin watcher's late deregistration
// of the old socket (by resource name) dropped the new registration, and a pod admitted then
// failed. Once the new daemon is registered every pod must be admitted, and the kubelet must
// never drop it.
class HandoverE2eTest : public E2eTest,
                        public ::testing::WithParamInterface<::edgeaccel::testing::KubeletProfile> {
 protected:
  std::unique_ptr<DaemonProcess> StartDaemonRegisteringVia(const std::string& registration) {
    return StartDaemon({"--kubelet-root=" + kubelet_of_profile_.root(),
                        "--device-plugin-dir=" + kubelet_of_profile_.DevicePluginsDir(),
                        "--metrics-address=", "--registration=" + registration});
  }
  bool Served(const std::string& via) {
    return kubelet_of_profile_.WaitFor([&] {
      return kubelet_of_profile_.RegisteredVia(kTpu) == via &&
             kubelet_of_profile_.StreamOpen(kTpu) && kubelet_of_profile_.Allocatable(kTpu) == 2;
    });
  }
  // The old daemon (plugin watcher) ends with `signal` just after a pass of the watcher's
  // reconciler (its next pass, the late deregistration, is a whole period away); the next one
  // (kubelet.sock) starts at once.
  void Handover(int signal) {
    kubelet_of_profile_.Start();
    auto old = StartDaemonRegisteringVia("plugin-watcher");
    ASSERT_TRUE(Served("plugin-watcher")) << old->Log();
    const uint64_t passes = kubelet_of_profile_.ReconcilerPasses();
    ASSERT_TRUE(kubelet_of_profile_.WaitFor(
        [&] { return kubelet_of_profile_.ReconcilerPasses() > passes; }));
    old->Signal(signal);
    ASSERT_TRUE(old->Wait(absl::Seconds(5)).has_value());
    auto next = StartDaemonRegisteringVia("kubelet");
    ASSERT_TRUE(Served("kubelet")) << next->Log();
    // Pods keep arriving until the watcher has passed twice more.
    const int drops = kubelet_of_profile_.Disconnections(kTpu);
    const uint64_t until = kubelet_of_profile_.ReconcilerPasses() + 2;
    int admitted = 0;
    while (kubelet_of_profile_.ReconcilerPasses() < until) {
      absl::StatusOr<std::string> pod = kubelet_of_profile_.Admit(kTpu, 1);
      ASSERT_TRUE(pod.ok()) << "pod " << admitted + 1 << ": " << pod.status() << "\n"
                            << next->Log();
      kubelet_of_profile_.DeletePod(*pod);
      ++admitted;
      absl::SleepFor(absl::Milliseconds(5));  // the next pod's arrival
    }
    EXPECT_EQ(kubelet_of_profile_.Disconnections(kTpu), drops) << next->Log();
    EXPECT_THAT(next->Log(), Not(HasSubstr("it dropped our endpoint")));
    EXPECT_THAT(next->Log(), HasSubstr("the kubelet's plugin watcher has let go of our earlier "
                                       "registration"));
    RecordProperty("pods_admitted", std::to_string(admitted));
  }

  // A kubelet of the generation under test (E2eTest's kubelet_, of the default one, stays unused).
  TestKubelet kubelet_of_profile_{dir_.path() + "/kubelet-" + KubeletProfileName(GetParam()),
                                  GetParam()};
};

INSTANTIATE_TEST_SUITE_P(Kubelets, HandoverE2eTest,
                         ::testing::ValuesIn(::edgeaccel::testing::kAllKubeletProfiles),
                         [](const auto& info) { return KubeletProfileTestName(info.param); });

TEST_P(HandoverE2eTest, FromAStoppedPluginWatcherDaemonToKubeletSockNoPodFails) {
  Handover(SIGTERM);  // at the kubelet's own pace: a reconciler pass a second
}

// SIGKILL leaves the old socket on disk, dead (the kubelet's stream to it ended); the next daemon
// replaces it, and so the watcher unregisters the old registration before the new one is made.
TEST_P(HandoverE2eTest, FromAKilledPluginWatcherDaemonToKubeletSockNoPodFails) {
  kubelet_of_profile_.SetReconcilePeriod(absl::Milliseconds(250));
  Handover(SIGKILL);
}

// NFD's worker runs as uid 65534 with every capability dropped (its Helm chart: runAsNonRoot),
// and the daemon runs with umask 0077: the feature file must still be readable to it.
TEST_F(E2eTest, NfdFeatureFileIsReadableByNfdsUnprivilegedWorker) {
  constexpr uid_t kNobody = 65534;
  chmod(dir_.path().c_str(), 0755);  // a hostPath directory as kubelet makes it
  const std::string nfd = dir_.path() + "/features.d";
  mkdir(nfd.c_str(), 0755);
  kubelet_.Start();
  auto daemon = StartDaemon({"--nfd-features-dir=" + nfd});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  ASSERT_TRUE(daemon->WaitForLog("coral.ai/edgetpu.count=2")) << daemon->Log();

  CommandResult caps = RunCommand("/bin/grep", {"^CapEff:", "/proc/self/status"},
                                  absl::Seconds(10), kNobody);
  ASSERT_EQ(caps.exit_code, 0) << caps.err;
  EXPECT_EQ(caps.out, "CapEff:\t0000000000000000\n") << "the reader must hold no capability";
  CommandResult read = RunCommand("/bin/cat", {nfd + "/edgeaccel"}, absl::Seconds(10), kNobody);
  EXPECT_EQ(read.exit_code, 0) << read.err;
  EXPECT_THAT(read.out, HasSubstr("coral.ai/edgetpu.count=2\n"));
  struct stat st;
  ASSERT_EQ(stat((nfd + "/edgeaccel").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644);
}

// NFD's features.d on a full disk: one clear error line, the devices are served all the same,
// and the write is retried until there is room again, with no device change needed.
TEST_F(E2eTest, NfdFileOnAFullDiskIsLoggedAndRetriedUntilThereIsRoom) {
  const std::string nfd = dir_.path() + "/features.d";
  // Two pages: once the filler is gone there is room for the file and its replacement (the
  // atomic rename needs both at once).
  FullDisk disk(nfd, "8k");
  if (!disk.mounted()) GTEST_SKIP() << disk.why();
  kubelet_.Start();
  auto daemon = StartDaemon({"--nfd-features-dir=" + nfd});
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  ASSERT_TRUE(daemon->WaitForLog("cannot write the NFD feature file")) << daemon->Log();
  EXPECT_THAT(daemon->Log(), HasSubstr("No space left on device"));
  EXPECT_TRUE(kubelet_.Allocate(kTpu, {"0000:03:00.0"}).ok());
  EXPECT_NE(access((nfd + "/edgeaccel").c_str(), F_OK), 0) << "no half-written file is left";

  auto content = [&] {
    std::ifstream file(nfd + "/edgeaccel");
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  };
  // Room again, and no device changes: the daemon's retry (first after 1 s) writes the file.
  disk.MakeRoom();
  EXPECT_TRUE(Eventually([&] { return content().find("coral.ai/edgetpu.count=2\n") != std::string::npos; }))
      << content() << daemon->Log();
  EXPECT_TRUE(daemon->WaitForLog("wrote the NFD feature file in " + nfd + " on retry")) << daemon->Log();
  // And it follows the devices from then on.
  host_.UnplugCoralPcie(1, "0000:04:00.0");
  ASSERT_TRUE(Advertised(1, 1)) << daemon->Log();
  EXPECT_TRUE(Eventually([&] { return content().find("coral.ai/edgetpu.count=1\n") != std::string::npos; }))
      << content() << daemon->Log();
  EXPECT_TRUE(daemon->Running());
  daemon->Signal(SIGTERM);
  daemon->Wait(absl::Seconds(5));
}

TEST_F(E2eTest, MetricsPortTakenIsLoggedAndDevicesAreStillServed) {
  kubelet_.Start();
  auto first = StartDaemon();
  const int port = MetricsPort(*first);
  ASSERT_TRUE(Advertised(2, 2)) << first->Log();
  first->Signal(SIGTERM);
  first->Wait(absl::Seconds(5));
  // Hold the port with a listener of our own.
  httplib::Server blocker;
  blocker.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  ASSERT_TRUE(blocker.bind_to_port("127.0.0.1", port));
  auto second = StartDaemon({"--metrics-address=127.0.0.1:" + std::to_string(port)});
  ASSERT_TRUE(second->WaitForLog("cannot listen on 127.0.0.1:")) << second->Log();
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Registrations(kTpu) == 2; })) << second->Log();
  EXPECT_TRUE(second->Running());
}

TEST(CliTest, HelpListsEveryFlagWithDefaults) {
  CommandResult result = RunCommand(kDaemon, {"--help"});
  EXPECT_EQ(result.exit_code, 1);  // absl's --help exit code
  const std::string help = result.out + result.err;
  for (const char* flag :
       {"--host_root", "--kubelet_root", "--device_plugin_dir", "--registration", "--probe_interval",
        "--metrics_address", "--nfd_features_dir", "--seed_labels",
        "--temperature_threshold", "--temperature_hysteresis", "--register_timeout", "--discover",
        "--verbosity", "--nvidia_driver_libraries", "--nvidia_driver_libraries_dir",
        "--nvidia_driver_capabilities"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  EXPECT_THAT(help, HasSubstr("default: \"/var/lib/kubelet\""));
  EXPECT_THAT(help, HasSubstr("default: auto"));
  EXPECT_THAT(help, HasSubstr("default: 5s"));
}

TEST(CliTest, DiscoverPrintsWhatWouldBeAdvertised) {
  FixtureHost host;
  host.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .numa_node = 0});
  host.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .status = "DEAD"});
  CommandResult result = RunCommand(kDaemon, {"--host-root=" + host.root(), "--discover", KubeletRootFlagIn(host.root()),
                                              DevicePluginDirFlagIn(host.root())});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("coral.ai/edgetpu: 2 device(s), 1 healthy"));
  EXPECT_THAT(result.out, HasSubstr("0000:03:00.0  Healthy"));
  EXPECT_THAT(result.out, HasSubstr("0000:04:00.0  Unhealthy (driver reports status DEAD)"));
  EXPECT_THAT(result.out, HasSubstr("device node: /dev/apex_0 -> /dev/apex_0 (rw)"));
  EXPECT_THAT(result.out, HasSubstr("temperature: 45.05 °C"));
  EXPECT_THAT(result.out, Not(HasSubstr(host.root())));
  EXPECT_THAT(result.out, HasSubstr("node labels:\n  coral.ai/edgetpu.count=2\n"));

  FixtureHost empty;
  result = RunCommand(kDaemon, {"--host-root=" + empty.root(), "--discover", KubeletRootFlagIn(empty.root()),
                               DevicePluginDirFlagIn(empty.root())});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.out, HasSubstr("0 device(s)"));
  EXPECT_THAT(result.out, HasSubstr("is the gasket/apex driver loaded?"));
}

TEST(CliTest, BadFlagsAreRefusedWithTheReason) {
  CommandResult result = RunCommand(kDaemon, {"--registration=sometimes"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("must be one of auto, plugin-watcher, kubelet"));
  result = RunCommand(kDaemon, {"--host-root=/no/such/root"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.err, HasSubstr("--host-root /no/such/root is not a directory"));
  result = RunCommand(kDaemon, {"--probe-interval=banana"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_THAT(result.err, HasSubstr("probe_interval"));
}

// ---------------------------------------------------------------------------------------------
// A slow disk, made real: the daemon runs under strace, which holds every fsync and fdatasync
// for a while before the kernel sees it, as an SD card near the end of its life does.

class SlowDiskTest : public E2eTest {
 protected:
  std::unique_ptr<DaemonProcess> StartDaemonOnASlowDisk(absl::Duration fsync_delay,
                                                        const std::vector<std::string>& extra) {
    if (access("/usr/bin/strace", X_OK) != 0) return nullptr;
    std::vector<std::string> args = {
        "-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e",
        absl::StrCat("inject=fsync,fdatasync:delay_enter=", absl::ToInt64Microseconds(fsync_delay)),
        kDaemon, "--host-root=" + host_.root(), "--kubelet-root=" + kubelet_.root(),
        "--device-plugin-dir=" + kubelet_.DevicePluginsDir(), "--probe-interval=100ms"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto daemon = std::make_unique<DaemonProcess>("/usr/bin/strace", args);
    // strace 6.1 leaves its tracee running when it is killed, and the test body's DaemonProcess
    // kills strace before TearDown runs: remember the daemon's own pid while it is still
    // strace's child, once it runs the daemon (strace forks more than one child at start).
    const std::string children =
        absl::StrCat("/proc/", daemon->pid(), "/task/", daemon->pid(), "/children");
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (tracee_pid_ <= 0 && absl::Now() < deadline) {
      std::ifstream list(children);
      for (pid_t child; list >> child;) {
        if (RunsTheDaemon(child)) tracee_pid_ = child;
      }
      if (tracee_pid_ <= 0) absl::SleepFor(absl::Milliseconds(2));  // no event for an exec
    }
    return daemon;
  }
  static bool RunsTheDaemon(pid_t pid) {
    std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string command;
    std::getline(cmdline, command, '\0');
    return command == kDaemon;
  }
  // Only if that pid still runs our daemon (not a reused pid).
  void TearDown() override {
    if (tracee_pid_ > 0 && RunsTheDaemon(tracee_pid_)) kill(tracee_pid_, SIGKILL);
  }
  pid_t tracee_pid_ = -1;
  TempDir sinks_;
};

TEST_F(SlowDiskTest, ASlowDiskNeverDelaysListAndWatchOrTheNextRescan) {
  kubelet_.Start();
  auto daemon = StartDaemonOnASlowDisk(
      absl::Seconds(4), {"--cdi", "--cdi-dir=" + sinks_.path() + "/cdi",
                         "--nfd-features-dir=" + sinks_.path() + "/features.d"});
  if (daemon == nullptr) GTEST_SKIP() << "no strace here";
  if (!Advertised(2, 2)) {
    if (daemon->Log().find("ptrace") != std::string::npos) GTEST_SKIP() << daemon->Log();
    FAIL() << daemon->Log();
  }
  ASSERT_TRUE(daemon->WaitForLog("node labels:", absl::Seconds(30)));
  // Each change below starts a CDI and an NFD write that take 4 s each to reach the disk. The
  // bounds are half that: room for a traced, sanitized daemon, none for a wait on the disk.
  absl::Time start = absl::Now();
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(Advertised(2, 1));
  const absl::Duration first = absl::Now() - start;
  start = absl::Now();
  host_.Remove("/dev/apex_0");
  ASSERT_TRUE(Advertised(2, 0));
  const absl::Duration second = absl::Now() - start;
  EXPECT_LT(first, absl::Seconds(2));
  EXPECT_LT(second, absl::Seconds(2)) << "the rescan waited for the disk";
}

// With CDI, the kubelet hears of a device only once the spec naming it is on disk, whatever the
// disk's speed: checked the moment each ListAndWatch message arrives.
TEST_F(SlowDiskTest, TheCdiSpecIsOnDiskBeforeTheKubeletHearsOfADevice) {
  const std::string spec = sinks_.path() + "/cdi/edgeaccel.io-edgetpu.json";
  absl::Mutex mu;
  std::vector<std::string> early;  // ids the kubelet heard of before the spec held them
  kubelet_.OnListAndWatch([&](const std::string& resource, const std::vector<std::string>& ids) {
    if (resource != kTpu) return;
    std::ifstream in(spec);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const std::string& id : ids) {
      if (text.find(absl::StrCat("\"", id, "\"")) == std::string::npos) {
        absl::MutexLock lock(&mu);
        early.push_back(id);
      }
    }
  });
  kubelet_.Start();
  auto daemon = StartDaemonOnASlowDisk(absl::Milliseconds(200),
                                       {"--cdi", "--cdi-dir=" + sinks_.path() + "/cdi"});
  if (daemon == nullptr) GTEST_SKIP() << "no strace here";
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  for (int i = 2; i < 6; ++i) {
    host_.AddCoralPcie({.index = static_cast<unsigned>(i),
                        .pci_address = absl::StrFormat("0000:%02x:00.0", 0x10 + i)});
    ASSERT_TRUE(Advertised(i + 1, i + 1)) << daemon->Log();
  }
  absl::MutexLock lock(&mu);
  EXPECT_THAT(early, ::testing::IsEmpty());
}

// SIGTERM while a spec's fsync is held: Daemon::Stop, and with it the sockets' removal, does not
// wait for the disk; only the process's exit does (the writer's destructor joins the write).
TEST_F(SlowDiskTest, StopDoesNotWaitForAHeldFsync) {
  kubelet_.Start();
  auto daemon = StartDaemonOnASlowDisk(
      absl::Seconds(4), {"--cdi", "--cdi-dir=" + sinks_.path() + "/cdi",
                         "--nfd-features-dir=" + sinks_.path() + "/features.d"});
  if (daemon == nullptr) GTEST_SKIP() << "no strace here";
  if (!Advertised(2, 2)) {
    if (daemon->Log().find("ptrace") != std::string::npos) GTEST_SKIP() << daemon->Log();
    FAIL() << daemon->Log();
  }
  ASSERT_TRUE(daemon->WaitForLog("node labels:", absl::Seconds(30)));
  // A change starts a CDI write whose fsync is held for 4 s; the kubelet hears of the removal
  // at once, while the write is still in flight.
  host_.Remove("/dev/apex_1");
  ASSERT_TRUE(Advertised(2, 1));
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(tracee_pid_, SIGTERM), 0);
  ASSERT_TRUE(daemon->WaitForLog("stopped cleanly in", absl::Seconds(10))) << daemon->Log();
  const absl::Duration stopped = absl::Now() - start;
  EXPECT_LT(stopped, absl::Seconds(1)) << daemon->Log();
  EXPECT_NE(access((kubelet_.DevicePluginsDir() + "/" + SocketFileName(kTpu)).c_str(), F_OK), 0) << "our socket is still there";
}

// The first ListAndWatch message already names every device present at start, however slow the
// disk the CDI spec goes to: registration starts only once the first specs are written.
TEST_F(SlowDiskTest, TheFirstListAndWatchNamesEveryDeviceWithCdi) {
  absl::Mutex mu;
  std::vector<std::vector<std::string>> messages;
  kubelet_.OnListAndWatch([&](const std::string& resource, const std::vector<std::string>& ids) {
    absl::MutexLock lock(&mu);
    if (resource == kTpu) messages.push_back(ids);
  });
  kubelet_.Start();
  auto daemon = StartDaemonOnASlowDisk(absl::Milliseconds(500),
                                       {"--cdi", "--cdi-dir=" + sinks_.path() + "/cdi"});
  if (daemon == nullptr) GTEST_SKIP() << "no strace here";
  ASSERT_TRUE(Advertised(2, 2)) << daemon->Log();
  absl::MutexLock lock(&mu);
  ASSERT_FALSE(messages.empty());
  EXPECT_EQ(messages.front().size(), 2u) << "the first message held devices back";
}

}  // namespace
}  // namespace edgeaccel
