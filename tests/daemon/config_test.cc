#include "edgeaccel/daemon/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DefaultsAreValid) { EXPECT_TRUE(ValidateConfig(DaemonConfig()).ok()); }

TEST(ConfigTest, RegistrationModesParse) {
  RegistrationMode mode;
  EXPECT_TRUE(ParseRegistrationMode("auto", &mode));
  EXPECT_EQ(mode, RegistrationMode::kAuto);
  EXPECT_TRUE(ParseRegistrationMode("plugin-watcher", &mode));
  EXPECT_EQ(mode, RegistrationMode::kPluginWatcher);
  EXPECT_TRUE(ParseRegistrationMode("kubelet", &mode));
  EXPECT_EQ(mode, RegistrationMode::kKubelet);
  EXPECT_FALSE(ParseRegistrationMode("Kubelet", &mode));
  EXPECT_FALSE(ParseRegistrationMode("", &mode));
}

TEST(ConfigTest, RejectsBadValuesNamingTheFlag) {
  struct Case {
    std::function<void(DaemonConfig&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](DaemonConfig& c) { c.host_root = "relative"; }, "--host-root must be an absolute path"},
      {[](DaemonConfig& c) { c.host_root = "/no/such/dir"; }, "--host-root /no/such/dir is not a directory"},
      {[](DaemonConfig& c) { c.kubelet_root = ""; }, "--kubelet-root must be an absolute path"},
      {[](DaemonConfig& c) { c.kubelet_root = "/" + std::string(100, 'k'); }, "Unix socket limit"},
      {[](DaemonConfig& c) { c.device_plugin_dir = "var/lib/kubelet/device-plugins"; },
       "--device-plugin-dir must be an absolute path"},
      {[](DaemonConfig& c) { c.device_plugin_dir = "/" + std::string(100, 'd'); },
       "--device-plugin-dir /ddd"},
      {[](DaemonConfig& c) { c.probe_interval = absl::Milliseconds(5); }, "--probe-interval"},
      {[](DaemonConfig& c) { c.probe_interval = -absl::Seconds(1); }, "--probe-interval"},
      {[](DaemonConfig& c) { c.temperature_threshold_celsius = 500; }, "--temperature-threshold"},
      {[](DaemonConfig& c) { c.temperature_threshold_celsius = -3; }, "--temperature-threshold"},
      {[](DaemonConfig& c) { c.temperature_hysteresis_celsius = -1; }, "--temperature-hysteresis"},
      {[](DaemonConfig& c) { c.register_timeout = absl::ZeroDuration(); }, "--register-timeout"},
      {[](DaemonConfig& c) { c.nvidia_driver_libraries_dir = "usr/local/nvidia/lib64"; },
       "--nvidia-driver-libraries-dir must be an absolute directory path"},
      {[](DaemonConfig& c) { c.nvidia_driver_libraries_dir = "/usr/local/nvidia/../lib"; },
       "--nvidia-driver-libraries-dir"},
      {[](DaemonConfig& c) { c.nvidia_driver_libraries_dir = "/opt/a:/opt/b"; },
       "--nvidia-driver-libraries-dir"},
      {[](DaemonConfig& c) { c.nvidia_driver_libraries_dir = "/dev/nvidia"; },
       "outside /dev, /proc and /sys"},
      {[](DaemonConfig& c) { c.nvidia_driver_capabilities = "compute,display"; },
       "--nvidia-driver-capabilities: \"display\" is not a driver capability"},
  };
  for (const Case& test : cases) {
    DaemonConfig config;
    test.change(config);
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << test.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(test.message));
  }
  DaemonConfig off;
  off.probe_interval = absl::ZeroDuration();
  EXPECT_TRUE(ValidateConfig(off).ok());
  // Without driver libraries their directory is not used, and not judged.
  DaemonConfig no_libraries;
  no_libraries.nvidia_driver_libraries = false;
  no_libraries.nvidia_driver_libraries_dir = "";
  EXPECT_TRUE(ValidateConfig(no_libraries).ok());
}

TEST(ConfigTest, FamiliesParse) {
  EXPECT_TRUE(ParseFamilies("all")->empty());
  EXPECT_EQ(*ParseFamilies("coral-pcie,tegra"), (std::set<std::string>{"coral-pcie", "tegra"}));
  absl::StatusOr<std::set<std::string>> bad = ParseFamilies("coral-pcie,cuda");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown family \"cuda\""));
}

TEST(ConfigTest, DraFamiliesParseAndNeedWhatDraNeeds) {
  EXPECT_TRUE(ParseDraFamilies("")->empty());
  EXPECT_TRUE(ParseDraFamilies("none")->empty());
  EXPECT_EQ(ParseDraFamilies("all")->size(), 4u);
  EXPECT_EQ(*ParseDraFamilies("coral-pcie, tegra"), (std::set<std::string>{"coral-pcie", "tegra"}));
  absl::StatusOr<std::set<std::string>> bad = ParseDraFamilies("coral-pcie,cuda");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--dra: unknown family \"cuda\""), std::string::npos) << bad.status();

  DaemonConfig config;
  config.dra_families = {"coral-pcie"};
  absl::Status no_node = ValidateConfig(config);
  ASSERT_FALSE(no_node.ok());
  EXPECT_NE(no_node.message().find("--dra needs this node's name"), std::string::npos) << no_node;
  config.node_name = "node-1";
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.dra_resync = absl::Milliseconds(10);
  EXPECT_NE(ValidateConfig(config).message().find("--dra-resync must be at least 1s"), std::string::npos);
  config.dra_resync = absl::Seconds(30);
  config.families = {"tegra"};
  EXPECT_NE(ValidateConfig(config).message().find("which --families does not look for"), std::string::npos);
  config.families.clear();
  config.dra_families = {"coral-pcie", "coral-usb"};
  config.replicas = {{"coral.ai/edgetpu", 2}};
  EXPECT_NE(ValidateConfig(config).message().find("is published through DRA"), std::string::npos)
      << ValidateConfig(config);
  config.dra_families = {"coral-pcie"};  // coral-usb still goes through the device plugin
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
}

// What the chart and the overlays render must start: --dra, --dra-shared, --take-over and
// --replicas that --families (or DRA) makes moot are settled with a note, never refused.
TEST(ConfigTest, ResolveSettlesFlagsThatAreMootTogetherWithANoteEach) {
  DaemonConfig config;
  config.node_name = "node-1";
  // The chart's DRA default beside a Coral-only --families (helm --set dra.enabled=true
  // --set 'families={coral-pcie,coral-usb}').
  config.families = {"coral-pcie", "coral-usb"};
  config.dra_families = {"coral-pcie", "coral-usb", "tegra"};
  config.dra_shared = {"tegra"};
  std::vector<std::string> notes = ResolveConfig(&config);
  EXPECT_EQ(config.dra_families, (std::set<std::string>{"coral-pcie", "coral-usb"}));
  EXPECT_TRUE(config.dra_shared.empty());
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_THAT(notes[0], ::testing::HasSubstr("--dra names tegra, which --families does not look for"));
  EXPECT_THAT(notes[1], ::testing::HasSubstr("--dra-shared names tegra"));
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);

  // --families=all: every --dra family stays.
  config = DaemonConfig();
  config.node_name = "node-1";
  config.dra_families = {"coral-pcie", "coral-usb", "tegra"};
  EXPECT_TRUE(ResolveConfig(&config).empty());
  EXPECT_EQ(config.dra_families.size(), 3u);

  // Replicas and take-over of a resource only DRA serves go; of one the device plugin still
  // serves (discrete GPUs beside Jetson's on DRA), they stay.
  config = DaemonConfig();
  config.node_name = "node-1";
  config.families = {"coral-pcie", "tegra"};
  config.dra_families = {"coral-pcie", "tegra", "nvidia"};
  config.replicas = {{"nvidia.com/gpu", 4}, {"coral.ai/edgetpu", 2}};
  config.take_over = {"nvidia.com/gpu"};
  notes = ResolveConfig(&config);
  EXPECT_EQ(config.dra_families, (std::set<std::string>{"coral-pcie", "tegra"}));
  EXPECT_TRUE(config.replicas.empty());
  EXPECT_TRUE(config.take_over.empty());
  EXPECT_EQ(notes.size(), 4u);
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
  config = DaemonConfig();
  config.node_name = "node-1";
  config.dra_families = {"tegra"};
  config.replicas = {{"nvidia.com/gpu", 4}};
  config.take_over = {"nvidia.com/gpu"};
  EXPECT_TRUE(ResolveConfig(&config).empty());
  EXPECT_EQ(config.replicas.size(), 1u);
  EXPECT_EQ(config.take_over.size(), 1u);
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
}

TEST(ConfigTest, FlagsOnlyLeavesTheHostOut) {
  DaemonConfig config;
  config.host_root = "/no/such/host/root";
  EXPECT_FALSE(ValidateConfig(config).ok());
  EXPECT_TRUE(ValidateConfig(config, ConfigCheck::kFlagsOnly).ok());
  config.host_root = "host";  // still a flag error
  EXPECT_FALSE(ValidateConfig(config, ConfigCheck::kFlagsOnly).ok());
}

TEST(ConfigTest, DraSharedIsOffByDefaultForGpuFamiliesOnlyAndNeedsDra) {
  EXPECT_TRUE(DaemonConfig().dra_shared.empty());
  EXPECT_TRUE(ParseDraShared("")->empty());
  EXPECT_TRUE(ParseDraShared("none")->empty());
  EXPECT_EQ(*ParseDraShared("tegra, nvidia"), (std::set<std::string>{"nvidia", "tegra"}));
  absl::StatusOr<std::set<std::string>> tpu = ParseDraShared("tegra,coral-pcie");
  ASSERT_FALSE(tpu.ok());
  EXPECT_NE(tpu.status().message().find("--dra-shared: coral-pcie is an Edge TPU family"), std::string::npos)
      << tpu.status();
  EXPECT_FALSE(ParseDraShared("coral-usb").ok());
  absl::StatusOr<std::set<std::string>> unknown = ParseDraShared("jetson");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--dra-shared: unknown family \"jetson\""), std::string::npos)
      << unknown.status();
  // "all" is not a word of this flag: sharing is named family by family.
  EXPECT_FALSE(ParseDraShared("all").ok());

  DaemonConfig config;
  config.node_name = "node-1";
  config.dra_families = {"coral-pcie", "tegra"};
  config.dra_shared = {"tegra"};
  EXPECT_TRUE(ValidateConfig(config).ok()) << ValidateConfig(config);
  config.dra_shared = {"tegra", "nvidia"};  // nvidia goes through the device plugin
  absl::Status not_dra = ValidateConfig(config);
  EXPECT_NE(not_dra.message().find("--dra-shared names nvidia, which is not published through DRA"),
            std::string::npos)
      << not_dra;
  config.dra_shared = {"coral-pcie"};  // set without the parser
  EXPECT_NE(ValidateConfig(config).message().find("--dra-shared: coral-pcie is not a GPU family"),
            std::string::npos);
}

TEST(ConfigTest, TakeOverParses) {
  EXPECT_TRUE(ParseTakeOver("")->empty());
  EXPECT_EQ(*ParseTakeOver("nvidia.com/gpu, coral.ai/edgetpu"),
            (std::set<std::string>{"coral.ai/edgetpu", "nvidia.com/gpu"}));
  for (const char* bad : {"nvidia.com/gpu,", "all", "amd.com/gpu", "\x01"}) {
    absl::StatusOr<std::set<std::string>> parsed = ParseTakeOver(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), ::testing::HasSubstr("--take-over"));
  }
}

TEST(ConfigTest, ReplicasParse) {
  EXPECT_TRUE(ParseReplicas("")->empty());
  EXPECT_EQ(*ParseReplicas("nvidia.com/gpu=4,coral.ai/edgetpu=2"),
            (std::map<std::string, int>{{"nvidia.com/gpu", 4}, {"coral.ai/edgetpu", 2}}));
  for (const char* bad : {"nvidia.com/gpu", "nvidia.com/gpu=0", "nvidia.com/gpu=65",
                          "nvidia.com/gpu=x", "amd.com/gpu=2", "nvidia.com/gpu=2,nvidia.com/gpu=3",
                          "=3"}) {
    absl::StatusOr<std::map<std::string, int>> parsed = ParseReplicas(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--replicas")) << bad;
  }
}

}  // namespace
}  // namespace edgeaccel
