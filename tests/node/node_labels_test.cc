#include "edgeaccel/node/node_labels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/discovery/tegra.h"
#include "fixture_host.h"
#include "edgeaccel/inventory/replicas.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::TempDir;
using ::testing::Contains;
using ::testing::IsSupersetOf;
using ::testing::Key;
using ::testing::Not;
using ::testing::Pair;

// Scans a fixture host with every family, as the daemon does, and derives its labels.
LabelSet LabelsOf(const FixtureHost& fixture, LabelOptions options = {}, int gpu_replicas = 1) {
  Host host(fixture.root());
  CoralPcieDiscoverer pcie(&host, {});
  CoralUsbDiscoverer usb(&host);
  TegraGpuDiscoverer tegra(&host, {});
  NvidiaGpuDiscoverer nvidia(&host, {});
  DeviceSet tpus{std::string(kResourceEdgeTpu)}, gpus{std::string(kResourceNvidiaGpu)};
  std::vector<Device> tpu_devices = pcie.Scan(), usb_devices = usb.Scan();
  tpu_devices.insert(tpu_devices.end(), usb_devices.begin(), usb_devices.end());
  std::vector<Device> gpu_devices = tegra.Scan(), discrete = nvidia.Scan();
  gpu_devices.insert(gpu_devices.end(), discrete.begin(), discrete.end());
  tpus.Update(tpu_devices);
  gpus.Update(ExpandReplicas(gpu_devices, gpu_replicas));
  return DeriveLabels({{tpus.resource_name(), tpus.Current()}, {gpus.resource_name(), gpus.Current()}},
                      options);
}

TEST(LabelsTest, Sanitize) {
  EXPECT_EQ(SanitizeLabelValue("NVIDIA Jetson Nano Developer Kit"), "NVIDIA-Jetson-Nano-Developer-Kit");
  EXPECT_EQ(SanitizeLabelValue("  NVIDIA A100-SXM4-40GB (rev a1)  "), "NVIDIA-A100-SXM4-40GB-rev-a1");
  EXPECT_EQ(SanitizeLabelValue("--x--"), "x");
  EXPECT_EQ(SanitizeLabelValue("\x01\xff"), "");
  EXPECT_EQ(SanitizeLabelValue(std::string(100, 'a')).size(), 63u);
  EXPECT_EQ(SanitizeLabelValue(std::string(62, 'a') + "-b"), std::string(62, 'a'));
}

// One row per Jetson board and L4T release in the fixtures: the labels its node gets.
struct JetsonCase {
  const char* name;
  FixtureHost::Jetson board;
  const char* model;  // as a label value
  const char* soc;
  const char* family;
  const char* compute_major;
  const char* compute_minor;
  const char* l4t_release;
  const char* l4t_major;
};

const JetsonCase kJetsonCases[] = {
    {"NanoR32", FixtureHost::Jetson::kNanoR32, "NVIDIA-Jetson-Nano-Developer-Kit", "tegra210",
     "maxwell", "5", "3", "32.7.1", "32"},
    {"XavierNxR35", FixtureHost::Jetson::kXavierNxR35, "NVIDIA-Jetson-Xavier-NX-Developer-Kit",
     "tegra194", "volta", "7", "2", "35.4.1", "35"},
    {"AgxOrinR36", FixtureHost::Jetson::kAgxOrinR36, "NVIDIA-Jetson-AGX-Orin-Developer-Kit",
     "tegra234", "ampere", "8", "7", "36.4.7", "36"},
};

class JetsonLabelsTest : public ::testing::TestWithParam<JetsonCase> {};

TEST_P(JetsonLabelsTest, BoardGpuAndL4tLabels) {
  const JetsonCase& c = GetParam();
  FixtureHost fixture;
  fixture.AddJetson(c.board);
  EXPECT_THAT(LabelsOf(fixture), IsSupersetOf({
      Pair("nvidia.com/gpu.present", "true"),
      Pair("nvidia.com/gpu.count", "1"),
      Pair("nvidia.com/gpu.replicas", "1"),
      Pair("nvidia.com/gpu.product", c.model),
      Pair("nvidia.com/gpu.memory", "3871"),
      Pair("nvidia.com/gpu.family", c.family),
      Pair("nvidia.com/gpu.compute.major", c.compute_major),
      Pair("nvidia.com/gpu.compute.minor", c.compute_minor),
      Pair("nvidia.com/jetson.board", c.model),
      Pair("nvidia.com/jetson.soc", c.soc),
      Pair("nvidia.com/jetson.l4t.release", c.l4t_release),
      Pair("nvidia.com/jetson.l4t.major", c.l4t_major)}));
}

INSTANTIATE_TEST_SUITE_P(Boards, JetsonLabelsTest, ::testing::ValuesIn(kJetsonCases),
                         [](const ::testing::TestParamInfo<JetsonCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(LabelsTest, ReplicasCountOnceAsAGpuAndAreLabelledApart) {
  FixtureHost orin;
  orin.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  LabelSet o = LabelsOf(orin, {}, 4);
  EXPECT_EQ(o["nvidia.com/gpu.count"], "1");
  EXPECT_EQ(o["nvidia.com/gpu.replicas"], "4");
}

TEST(LabelsTest, DiscreteServer) {
  FixtureHost fixture;
  fixture.AddNvidiaGpu({.pci_address = "0000:01:00.0", .minor = 0});
  fixture.AddNvidiaGpu({.pci_address = "0000:81:00.0", .minor = 1,
                        .uuid = "GPU-8c1c4a2e-59a7-4c3e-9f2f-0a1b2c3d4e5f"});
  LabelSet labels = LabelsOf(fixture);
  EXPECT_THAT(labels, IsSupersetOf({Pair("nvidia.com/gpu.count", "2"),
                                    Pair("nvidia.com/gpu.product", "NVIDIA-L4"),
                                    Pair("nvidia.com/cuda.driver.major", "515"),
                                    Pair("nvidia.com/cuda.driver.minor", "76")}));
  EXPECT_THAT(labels, Not(Contains(Key("nvidia.com/jetson.board"))));
  EXPECT_THAT(labels, Not(Contains(Key("coral.ai/edgetpu.present"))));
}

TEST(LabelsTest, EdgeTpusPcieUsbAndBoth) {
  FixtureHost pcie, usb, both;
  pcie.AddCoralPcie({.index = 0});
  pcie.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  usb.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  both.AddCoralPcie({.index = 0});
  both.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  EXPECT_THAT(LabelsOf(pcie), IsSupersetOf({Pair("coral.ai/edgetpu.present", "true"),
                                            Pair("coral.ai/edgetpu.count", "2"),
                                            Pair("coral.ai/edgetpu.interface", "pcie"),
                                            Pair("coral.ai/edgetpu.driver-version", "1.2"),
                                            Pair("coral.ai/edgetpu.vendor-id", "1ac1"),
                                            Pair("coral.ai/edgetpu.product-id", "089a")}));
  EXPECT_THAT(LabelsOf(usb), IsSupersetOf({Pair("coral.ai/edgetpu.interface", "usb"),
                                           Pair("coral.ai/edgetpu.vendor-id", "18d1"),
                                           Pair("coral.ai/edgetpu.product-id", "9302")}));
  EXPECT_EQ(LabelsOf(both)["coral.ai/edgetpu.interface"], "pcie-usb");
  EXPECT_EQ(LabelsOf(both)["coral.ai/edgetpu.count"], "2");
}

TEST(LabelsTest, SeedLabelsAreOptInAndNotSwapped) {
  FixtureHost nano, server, coral;
  nano.AddJetson(FixtureHost::Jetson::kNanoR32);
  server.AddNvidiaGpu({});
  coral.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  EXPECT_THAT(LabelsOf(nano), Not(Contains(Key("gpu.model"))));
  EXPECT_THAT(LabelsOf(nano, {.seed_labels = true}),
              IsSupersetOf({Pair("gpu.model", "NVIDIA-Jetson-Nano-Developer-Kit"),
                            Pair("gpu.driver", "32.7.1"), Pair("gpu.resource", "tegrastats")}));
  EXPECT_THAT(LabelsOf(server, {.seed_labels = true}),
              IsSupersetOf({Pair("gpu.model", "NVIDIA-L4"), Pair("gpu.driver", "515.76"),
                            Pair("gpu.resource", "nvidia-smi")}));
  EXPECT_THAT(LabelsOf(coral, {.seed_labels = true}),
              IsSupersetOf({Pair("gpu.model", "Google-Coral-TPU"), Pair("gpu.vendor.id", "18d1"),
                            Pair("gpu.product.id", "9302")}));
}

// A compute capability the integer parser takes but a label cannot hold (found by fuzz_labels):
// the labels carry the numbers as parsed, and a negative one makes none.
TEST(LabelsTest, ComputeCapabilityLabelsAreTheParsedNumbers) {
  auto labels_for = [](const std::string& cc) {
    auto snapshot = std::make_shared<Snapshot>();
    Device gpu;
    gpu.id = "gpu0";
    gpu.facts["compute_capability"] = cc;
    snapshot->devices.push_back(gpu);
    return DeriveLabels({{std::string(kResourceNvidiaGpu), snapshot}}, {});
  };
  LabelSet padded = labels_for("8 .7 ");
  EXPECT_EQ(padded["nvidia.com/gpu.compute.major"], "8");
  EXPECT_EQ(padded["nvidia.com/gpu.compute.minor"], "7");
  EXPECT_THAT(labels_for("-1.2"), Not(Contains(Key("nvidia.com/gpu.compute.major"))));
  EXPECT_THAT(labels_for("8.-7"), Not(Contains(Key("nvidia.com/gpu.compute.minor"))));
}

// Discrete GPUs as NVML's facts make them (nvml/nvml_supervisor.h): GFD's labels, ours for ECC
// and MIG mode, and each product's own where the GPUs differ.
TEST(LabelsTest, NvmlFactsGiveGfdLabelsAndDifferentProductsAreLabelledApart) {
  auto gpu = [](const std::string& id, const std::string& model, const std::string& memory,
                const std::string& cc) {
    Device d;
    d.id = id;
    d.facts = {{"model", model}, {"memory_mib", memory}, {"compute_capability", cc},
               {"cuda_version", "13.0"}, {"ecc_enabled", "true"}};
    return d;
  };
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->devices = {gpu("GPU-1", "NVIDIA H100 80GB HBM3", "81559", "9.0"),
                       gpu("GPU-2", "NVIDIA L4", "22491", "8.9"),
                       gpu("GPU-3", "NVIDIA L4", "22491", "8.9"),
                       gpu("GPU-4", std::string(60, 'X'), "1", "7.5")};  // a name too long
  LabelOptions options;
  options.nvml_gpus = {{{"uuid", "GPU-1"}, {"mig_capable", "true"}, {"mig_mode", "disabled"}},
                       {{"uuid", "GPU-5"}, {"mig_capable", "true"}, {"mig_mode", "enabled"}},
                       {{"uuid", "GPU-2"}, {"mig_capable", "false"}}};
  LabelSet labels = DeriveLabels({{std::string(kResourceNvidiaGpu), snapshot}}, options);
  EXPECT_THAT(labels, IsSupersetOf({
                          Pair("nvidia.com/gpu.count", "4"),
                          Pair("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                          Pair("nvidia.com/gpu.memory", "81559"),
                          Pair("nvidia.com/gpu.family", "hopper"),
                          Pair("nvidia.com/cuda.runtime.major", "13"),
                          Pair("nvidia.com/cuda.runtime.minor", "0"),
                          Pair("nvidia.com/gpu.ecc", "enabled"),
                          Pair("nvidia.com/mig.capable", "true"),
                          Pair("nvidia.com/mig.mode", "mixed"),
                          Pair("nvidia.com/gpu-NVIDIA-H100-80GB-HBM3.count", "1"),
                          Pair("nvidia.com/gpu-NVIDIA-H100-80GB-HBM3.compute.major", "9"),
                          Pair("nvidia.com/gpu-NVIDIA-L4.count", "2"),
                          Pair("nvidia.com/gpu-NVIDIA-L4.memory", "22491"),
                          Pair("nvidia.com/gpu-NVIDIA-L4.compute.minor", "9"),
                          Pair("nvidia.com/gpu-NVIDIA-L4.family", "ada-lovelace"),
                      }));
  // No key whose name part would pass 63 characters.
  for (const auto& [key, value] : labels) {
    EXPECT_LE(key.size() - key.find('/') - 1, 63u) << key;
  }
  // One product: no product-keyed labels; every GPU in MIG mode: enabled.
  snapshot->devices.resize(1);
  options.nvml_gpus = {{{"uuid", "GPU-1"}, {"mig_capable", "true"}, {"mig_mode", "enabled"}}};
  labels = DeriveLabels({{std::string(kResourceNvidiaGpu), snapshot}}, options);
  EXPECT_THAT(labels, Not(Contains(Key("nvidia.com/gpu-NVIDIA-H100-80GB-HBM3.count"))));
  EXPECT_EQ(labels["nvidia.com/mig.mode"], "enabled");
}

TEST(LabelsTest, NoDevicesNoLabels) {
  FixtureHost empty;
  EXPECT_TRUE(LabelsOf(empty, {.seed_labels = true}).empty());
}

}  // namespace
}  // namespace edgeaccel
