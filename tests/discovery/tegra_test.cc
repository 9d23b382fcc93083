#include "edgeaccel/discovery/tegra.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "edgeaccel/discovery/driver_libraries.h"

#include "absl/strings/match.h"
#include "captured_log.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::FixtureHost;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> HostPaths(const Device& d) {
  std::vector<std::string> out;
  for (const DeviceNode& n : d.nodes) out.push_back(n.host_path);
  return out;
}

Device ScanOne(const FixtureHost& fixture, NvidiaOptions options = {}) {
  Host host(fixture.root());
  TegraGpuDiscoverer tegra(&host, options);
  std::vector<Device> devices = tegra.Scan();
  EXPECT_EQ(devices.size(), 1u);
  return devices.empty() ? Device() : devices[0];
}

TEST(TegraParseTest, ReleaseLines) {
  absl::StatusOr<TegraRelease> r = ParseTegraRelease(
      "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: Sat "
      "Feb 19 17:05:08 UTC 2022\nabc */usr/lib/x.so\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->L4t(), "32.7.1");
  EXPECT_EQ(r->board, "t210ref");
  EXPECT_EQ(ParseTegraRelease("# R36 (release), REVISION: 4.7, GCID: 42132812, BOARD: generic, "
                              "EABI: aarch64, DATE: Thu Sep 18 22:54:44 UTC 2025")
                ->L4t(),
            "36.4.7");
  for (const char* bad : {"", "garbage\n", "# R32 (release), REVISION: ", "# R32 (release)",
                          "R32 (release), REVISION: 7.1, GCID: 1, BOARD: t210ref",
                          "\x01\x02\xff"}) {
    absl::StatusOr<TegraRelease> parsed = ParseTegraRelease(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("not an L4T release line"));
  }
}

TEST(TegraParseTest, SocFromCompatible) {
  using namespace std::string_literals;
  EXPECT_EQ(TegraSocFromCompatible("nvidia,p3450-0000\0nvidia,jetson-nano\0nvidia,tegra210\0"s),
            "tegra210");
  EXPECT_EQ(TegraSocFromCompatible("nvidia,p3701-0005\0nvidia,tegra234\0nvidia,tegra23x\0"s),
            "tegra234");
  // NULs lost (a pasted copy): still found, by search.
  EXPECT_EQ(TegraSocFromCompatible("nvidia,p3450-0000nvidia,jetson-nanonvidia,tegra210"),
            "tegra210");
  EXPECT_FALSE(TegraSocFromCompatible("raspberrypi,4-model-b\0brcm,bcm2711\0"s).has_value());
  EXPECT_FALSE(TegraSocFromCompatible("").has_value());
  EXPECT_EQ(TegraGpuForSoc("tegra194")->compute_capability, "7.2");
  EXPECT_EQ(TegraGpuForSoc("tegra234")->name, "ga10b");
  EXPECT_FALSE(TegraGpuForSoc("tegra999").has_value());
}

// One row per board and L4T release in the fixtures (docs/host-facts.md §3-4): what discovery
// must report.
struct JetsonCase {
  const char* name;
  FixtureHost::Jetson board;
  const char* id;
  const char* model;
  const char* l4t_release;
  const char* l4t_board;
  const char* gpu;
  const char* compute_capability;
  const char* devfreq;
  size_t node_count;
  // Nodes the container must get; for a board whose list is complete here (node_count equal to
  // its size), exactly these, in this order.
  std::vector<std::string> nodes;
  // Nodes on the board that are not the GPU's and must not be handed out.
  std::vector<std::string> strangers;
};

const JetsonCase kJetsonCases[] = {
    {"NanoR32", FixtureHost::Jetson::kNanoR32, "tegra210-igpu0",
     "NVIDIA Jetson Nano Developer Kit", "32.7.1", "t210ref", "gm20b", "5.3", "57000000.gpu", 12,
     {"/dev/nvhost-as-gpu", "/dev/nvhost-ctrl", "/dev/nvhost-ctrl-gpu", "/dev/nvhost-dbg-gpu",
      "/dev/nvhost-gpu", "/dev/nvhost-msenc", "/dev/nvhost-nvdec", "/dev/nvhost-nvjpg",
      "/dev/nvhost-prof-gpu", "/dev/nvhost-tsg-gpu", "/dev/nvhost-vic", "/dev/nvmap"},
     {"/dev/tegra_dc_0", "/dev/tegra_dc_1", "/dev/tegra_dc_ctrl", "/dev/fb0", "/dev/ttyTHS1"}},
    {"XavierNxR35", FixtureHost::Jetson::kXavierNxR35, "tegra194-igpu0",
     "NVIDIA Jetson Xavier NX Developer Kit", "35.4.1", "t186ref", "gv11b", "7.2",
     "17000000.gv11b", 31,
     {"/dev/nvgpu/igpu0/ctrl", "/dev/nvhost-nvdla0", "/dev/nvhost-ctrl-pva1", "/dev/nvhost-nvenc1",
      "/dev/nvhost-ctrl"},
     {"/dev/fb0", "/dev/fb1", "/dev/tegra_dc_0", "/dev/tegra_dc_ctrl"}},
    {"AgxOrinR36", FixtureHost::Jetson::kAgxOrinR36, "tegra234-igpu0",
     "NVIDIA Jetson AGX Orin Developer Kit", "36.4.7", "generic", "ga10b", "8.7", "17000000.gpu",
     35,
     {"/dev/dri/renderD128", "/dev/host1x-fence", "/dev/nvgpu/igpu0/nvsched_ctrl_fifo",
      "/dev/nvsciipc", "/dev/v4l2-nvenc", "/dev/nvhost-ctrl-nvdla0"},
     {"/dev/ttyTHS1", "/dev/nvme0n1", "/dev/dri/card0", "/dev/fb0", "/dev/nvidia0",
      "/dev/nvidiactl", "/dev/nvidia-modeset"}},
};

class JetsonBoardTest : public ::testing::TestWithParam<JetsonCase> {};

TEST_P(JetsonBoardTest, FoundWithItsFactsNodesAndTelemetry) {
  const JetsonCase& c = GetParam();
  FixtureHost fixture;
  fixture.AddJetson(c.board);
  Device d = ScanOne(fixture);
  EXPECT_EQ(d.id, c.id);
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(d.facts["model"], c.model);
  EXPECT_EQ(d.facts["l4t_release"], c.l4t_release);
  EXPECT_EQ(d.facts["l4t_board"], c.l4t_board);
  EXPECT_EQ(d.facts["gpu"], c.gpu);
  EXPECT_EQ(d.facts["compute_capability"], c.compute_capability);
  EXPECT_EQ(d.facts["memory_mib"], "3871");
  EXPECT_EQ(d.facts["devfreq"], c.devfreq);
  EXPECT_DOUBLE_EQ(d.telemetry["gpu_load_permille"], 125);
  EXPECT_DOUBLE_EQ(d.telemetry["gpu_temperature_celsius"], 26.5);
  if (c.nodes.size() == c.node_count) {
    EXPECT_EQ(HostPaths(d), c.nodes);
  } else {
    EXPECT_EQ(d.nodes.size(), c.node_count);
    for (const std::string& node : c.nodes) EXPECT_THAT(HostPaths(d), Contains(node));
  }
  for (const std::string& stranger : c.strangers) {
    EXPECT_THAT(HostPaths(d), Not(Contains(stranger)));
  }
  EXPECT_EQ(d.envs["NVIDIA_VISIBLE_DEVICES"], "all");
}

INSTANTIATE_TEST_SUITE_P(Boards, JetsonBoardTest, ::testing::ValuesIn(kJetsonCases),
                         [](const ::testing::TestParamInfo<JetsonCase>& info) {
                           return std::string(info.param.name);
                         });

// What the DaemonSet's container sees: the host's /sys and /dev, no /proc/device-tree and no
// /etc/nv_tegra_release (that mount is the optional jetson-l4t component).
TEST(TegraTest, FoundFromSysfsAloneAsInTheContainer) {
  using namespace std::string_literals;
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  fixture.Remove("/proc/device-tree");
  fixture.Remove("/etc/nv_tegra_release");
  fixture.Remove("/sys/devices/soc0/family");
  fixture.WriteFile("/sys/firmware/devicetree/base/compatible",
                    "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0"s);
  fixture.WriteFile("/sys/firmware/devicetree/base/model",
                    "NVIDIA Jetson AGX Orin Developer Kit\0"s);
  Device d = ScanOne(fixture);
  EXPECT_EQ(d.id, "tegra234-igpu0");
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(d.facts["model"], "NVIDIA Jetson AGX Orin Developer Kit");
  EXPECT_EQ(d.facts["compute_capability"], "8.7");
  EXPECT_EQ(d.facts.count("l4t_release"), 0u);
}

TEST(TegraTest, NotATegraHostHasNoGpu) {
  FixtureHost fixture;
  fixture.WriteFile("/proc/device-tree/compatible", std::string("raspberrypi,4-model-b\0", 22));
  fixture.MakeCharDevice("/dev/nvmap", 10, 62);
  Host host(fixture.root());
  TegraGpuDiscoverer tegra(&host, {});
  EXPECT_TRUE(tegra.Scan().empty());
}

TEST(TegraTest, MissingPiecesAreUnhealthyWithReasons) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kNanoR32);
  fixture.Remove("/dev/nvmap");
  fixture.Remove("/dev/nvhost-ctrl-gpu");
  fixture.Remove("/sys/class/devfreq/57000000.gpu");
  Device d = ScanOne(fixture);
  EXPECT_EQ(d.health, Health::kUnhealthy);
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("/dev/nvmap is missing"));
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("GPU control node missing"));
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("devfreq device not found"));
}

TEST(TegraTest, GarbageIdentityFilesNeverCrashOrInvent) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kNanoR32);
  fixture.WriteFile("/etc/nv_tegra_release", "# R3");  // truncated
  fixture.WriteFile("/proc/device-tree/compatible", "nvidia,p3450-0000nvidia,tegra210");  // no NULs
  fixture.WriteFile("/proc/device-tree/model", "NVIDIA Jetson Nano Developer Kit");      // no NUL
  fixture.WriteFile("/sys/devices/platform/gpu.0/load", "lots\n");
  fixture.WriteFile("/sys/class/thermal/thermal_zone1/temp", "-256000\n");  // sensor offline
  Device d = ScanOne(fixture);
  EXPECT_EQ(d.id, "tegra210-igpu0");
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(d.facts.count("l4t_release"), 0u);
  EXPECT_EQ(d.facts["model"], "NVIDIA Jetson Nano Developer Kit");
  EXPECT_EQ(d.telemetry.count("gpu_load_permille"), 0u);
  EXPECT_EQ(d.telemetry.count("gpu_temperature_celsius"), 0u);
}

TEST(TegraTest, RuntimeEnvsCanBeTurnedOff) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kNanoR32);
  EXPECT_TRUE(ScanOne(fixture, {.runtime_envs = false}).envs.empty());
}

TEST(TegraTest, DisplayNodesOnlyWhenAskedFor) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  Device d = ScanOne(fixture, {.display_nodes = true});
  for (const char* node : {"/dev/dri/card0", "/dev/fb0", "/dev/nvidia0", "/dev/nvidiactl",
                           "/dev/nvidia-modeset", "/dev/dri/renderD128"}) {
    EXPECT_THAT(HostPaths(d), Contains(node));
  }
  EXPECT_EQ(d.nodes.size(), 40u);
}

// With L4T's container file lists the candidates are what they name and the host has: a node
// the lists leave out is not handed out, one no rule here knows but the lists name is; display
// nodes still only when asked for; the lists' libraries go with the GPU.
TEST(TegraTest, ContainerFileListsDecideTheNodesAndAddTheLibraries) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  fixture.MakeCharDevice("/dev/nvhost-ctrl-isp", 500, 0);  // a camera node, listed
  fixture.WriteFile("/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1", "cuda");
  fixture.Symlink("libcuda.so.1.1", "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1");
  fixture.WriteFile("/etc/nvidia-container-runtime/host-files-for-container.d/devices.csv",
                    "dev, /dev/nvmap\ndev, /dev/nvgpu/igpu0/ctrl\ndev, /dev/nvhost-ctrl-isp\n"
                    "dev, /dev/fb0\ndev, /dev/nvhost-vic\n");
  fixture.WriteFile("/etc/nvidia-container-runtime/host-files-for-container.d/drivers.csv",
                    "sym, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1\n");
  Device d = ScanOne(fixture);
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(HostPaths(d), (std::vector<std::string>{"/dev/nvgpu/igpu0/ctrl", "/dev/nvhost-ctrl-isp",
                                                     "/dev/nvmap"}));
  EXPECT_THAT(HostPaths(ScanOne(fixture, {.display_nodes = true})), Contains("/dev/fb0"));
  ASSERT_EQ(d.mounts.size(), 2u);
  EXPECT_EQ(d.mounts[0].host_path, "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1");
  EXPECT_EQ(d.mounts[0].container_path, "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1");
  // And where the loader looks by default: the image's LD_LIBRARY_PATH is left alone.
  EXPECT_EQ(d.mounts[1].host_path, "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1");
  EXPECT_EQ(d.mounts[1].container_path, MultiarchLibraryDir() + "/libcuda.so.1");
  EXPECT_EQ(d.envs.count("LD_LIBRARY_PATH"), 0u);
  // Turned off (NVIDIA's runtime mounts them): no libraries, the nodes this daemon knows.
  Device off = ScanOne(fixture, {.driver_libraries = false});
  EXPECT_TRUE(off.mounts.empty());
  EXPECT_EQ(off.nodes.size(), 35u);
  EXPECT_THAT(HostPaths(off), Not(Contains("/dev/nvhost-ctrl-isp")));
}

TEST(TegraTest, WithoutListsTheNodesAreServedAsBeforeAndTheLogSaysSoOnce) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  Host host(fixture.root());
  TegraGpuDiscoverer tegra(&host, {});
  CapturedLog log;
  std::vector<Device> first = tegra.Scan();
  std::vector<Device> second = tegra.Scan();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].nodes.size(), 35u);
  EXPECT_TRUE(first[0].mounts.empty());
  EXPECT_EQ(log.Count("no container file lists"), 1) << log.Text();
}

// An IGX Orin in dGPU mode: the Orin iGPU beside a discrete GPU (/dev/nvidia0, nvidiactl,
// nvidia-uvm, /proc/driver/nvidia/gpus/...). Nothing of the discrete GPU goes with the iGPU.
TEST(TegraTest, IgxBoardKeepsTheDiscreteGpuOutOfTheIgpusAnswer) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kIgxOrinR36);
  fixture.AddNvidiaGpu({.pci_address = "0005:01:00.0", .model = "NVIDIA RTX A6000"});
  for (bool display : {false, true}) {
    Device d = ScanOne(fixture, {.display_nodes = display});
    EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
    for (const std::string& path : HostPaths(d)) {
      EXPECT_FALSE(absl::StartsWith(path, "/dev/nvidia")) << path;
    }
    EXPECT_THAT(HostPaths(d), Contains("/dev/nvgpu/igpu0/ctrl"));
    EXPECT_EQ(d.envs.count("NVIDIA_VISIBLE_DEVICES"), 0u);
  }
}

// Nodes whose names match but that are not what the kernel made for the GPU.
TEST(TegraTest, HostileNodesAreNotHandedOut) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  fixture.RegisterCharMajor(4, "tty");
  // A symlink to a disk, under a GPU node's name.
  fixture.MakeBlockDevice("/dev/sda", 8, 0);
  fixture.Remove("/dev/nvhost-gpu");
  fixture.Symlink("/dev/sda", "/dev/nvhost-gpu");
  // A symlink to a genuine GPU node: still a symlink, never followed.
  fixture.Symlink("/dev/nvmap", "/dev/nvhost-ctrl-pva1");
  // The right name, a major that belongs to another driver.
  fixture.Remove("/dev/nvhost-ctrl-nvdla1");
  fixture.MakeCharDevice("/dev/nvhost-ctrl-nvdla1", 238, 1);  // ttyTHS
  fixture.MakeCharDevice("/dev/nvhost-vic", 4, 0);           // a tty
  // The right driver (misc), but the kernel's device 10:200 is another one.
  fixture.MakeKernelCharDevice("net/tun", 10, 200);
  fixture.Remove("/dev/nvmap");
  fixture.MakeCharDevice("/dev/nvmap", 10, 200);
  // A stand-in that is not /dev/null's numbers.
  fixture.Remove("/dev/v4l2-nvenc");
  fixture.MakeCharDevice("/dev/v4l2-nvenc", 8, 0);
  // A GPU node's name on a major unknown to the kernel.
  fixture.MakeCharDevice("/dev/nvhost-ofa", 777, 0);

  Device d = ScanOne(fixture);
  for (const char* node : {"/dev/nvhost-gpu", "/dev/nvhost-ctrl-pva1", "/dev/nvhost-ctrl-nvdla1",
                           "/dev/nvhost-vic", "/dev/nvmap", "/dev/v4l2-nvenc", "/dev/nvhost-ofa",
                           "/dev/sda", "/dev/net/tun"}) {
    EXPECT_THAT(HostPaths(d), Not(Contains(node)));
  }
  // What is left is still the GPU, and still served, minus what was refused.
  EXPECT_THAT(HostPaths(d), Contains("/dev/nvgpu/igpu0/ctrl"));
  EXPECT_THAT(HostPaths(d), Contains("/dev/nvhost-ctrl-nvdla0"));
  // Without its /dev/nvmap the GPU is not usable: it says so.
  EXPECT_EQ(d.health, Health::kUnhealthy);
  EXPECT_THAT(d.unhealthy_reason, HasSubstr("/dev/nvmap"));
}

TEST(TegraTest, RefusalsSayWhy) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kNanoR32);
  fixture.MakeCharDevice("/dev/nvhost-vic2", 238, 1);
  CapturedLog log;
  ScanOne(fixture);
  EXPECT_TRUE(log.Contains("not handing out /dev/nvhost-vic2 with the integrated GPU: its major "
                           "238 belongs to \"ttyTHS\""));
}

}  // namespace
}  // namespace edgeaccel
