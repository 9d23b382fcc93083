#include "edgeaccel/discovery/nvidia.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;
using ::testing::HasSubstr;

constexpr char kUuid0[] = "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689";
constexpr char kUuid1[] = "GPU-8c1c4a2e-59a7-4c3e-9f2f-0a1b2c3d4e5f";

TEST(NvidiaParseTest, VersionFromBothDriverFlavours) {
  EXPECT_EQ(*ParseNvidiaDriverVersion(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC "
                "2022\nGCC version:  gcc version 7.5.0\n"),
            "515.76");
  EXPECT_EQ(*ParseNvidiaDriverVersion(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.58.02  Release Build  "
                "(dvs-builder@U16-I3-B03-4-3)  Tue Jun 25 01:26:03 UTC 2024\n"),
            "555.58.02");
  EXPECT_EQ(*ParseNvidiaDriverVersion(
                "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  Release Build"),
            "550.54.15");
  EXPECT_FALSE(ParseNvidiaDriverVersion("").ok());
  EXPECT_FALSE(ParseNvidiaDriverVersion("NVRM version: garbage\n").ok());
}

TEST(NvidiaParseTest, InformationFields) {
  auto info = ParseNvidiaInformation(
      "Model: \t\t NVIDIA L4\nGPU UUID: \t GPU-x\nBus Location: \t 0000:70:00.0\nDevice Minor: \t "
      "0\nGPU Excluded:\t No\nno colon here\n");
  EXPECT_EQ(info["Model"], "NVIDIA L4");
  EXPECT_EQ(info["Bus Location"], "0000:70:00.0");
  EXPECT_EQ(info["Device Minor"], "0");
  EXPECT_EQ(info["GPU Excluded"], "No");
}

class NvidiaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_.AddNvidiaGpu({.pci_address = "0000:01:00.0", .minor = 1, .uuid = kUuid0, .numa_node = 0});
    fixture_.AddNvidiaGpu({.pci_address = "0000:81:00.0", .minor = 0, .uuid = kUuid1,
                           .model = "NVIDIA A100-SXM4-40GB", .numa_node = 1});
  }
  std::vector<Device> Scan() { return discoverer_.Scan(); }

  FixtureHost fixture_;
  Host host_{fixture_.root()};
  NvidiaGpuDiscoverer discoverer_{&host_, {}};
};

TEST_F(NvidiaTest, TwoGpuServer) {
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  const Device& d = devices[0];  // scanned in PCI order
  EXPECT_EQ(d.id, kUuid0);
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(d.numa_node, 0);
  EXPECT_EQ(d.facts.at("model"), "NVIDIA L4");
  EXPECT_EQ(d.facts.at("driver_version"), "515.76");
  EXPECT_EQ(d.facts.at("pci_address"), "0000:01:00.0");
  // Device Minor, not PCI order, names the node.
  ASSERT_EQ(d.nodes.size(), 5u);
  EXPECT_EQ(d.nodes[0].host_path, "/dev/nvidia1");
  EXPECT_EQ(d.nodes[1].host_path, "/dev/nvidiactl");
  EXPECT_EQ(d.nodes[2].host_path, "/dev/nvidia-uvm");
  EXPECT_EQ(d.nodes[3].host_path, "/dev/nvidia-uvm-tools");
  EXPECT_EQ(d.nodes[4].host_path, "/dev/nvidia-modeset");
  EXPECT_EQ(d.envs.at("NVIDIA_VISIBLE_DEVICES"), kUuid0);
  EXPECT_EQ(devices[1].nodes[0].host_path, "/dev/nvidia0");
  EXPECT_EQ(devices[1].numa_node, 1);
}

TEST_F(NvidiaTest, MissingNodeOrExcludedGpuIsUnhealthy) {
  fixture_.Remove("/dev/nvidia1");
  fixture_.WriteFile("/proc/driver/nvidia/gpus/0000:81:00.0/information",
                     std::string("GPU UUID: \t ") + kUuid1 + "\nDevice Minor: \t 0\nGPU Excluded:\t Yes\n");
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_THAT(devices[0].unhealthy_reason, HasSubstr("/dev/nvidia1 is missing"));
  EXPECT_THAT(devices[1].unhealthy_reason, HasSubstr("excluded"));
}

// Reading a GPU's `information` asks the driver's resource manager (the GSP on recent GPUs) for
// its UUID, VBIOS and firmware versions and takes a power reference that wakes a GPU in runtime
// D3 (nv_procfs_read_gpu_info, kernel-open/nvidia/nv-procfs.c). What it says is fixed while the
// GPU stays bound, the exclusion included (NV_FLAG_EXCLUDE is set in the driver's PCI probe), so
// the probe does not read it: it looks at the GPU's entry, which the driver makes anew when it
// binds the GPU again.
TEST_F(NvidiaTest, TheProbeLooksAtTheGpusEntryNotItsInformation) {
  const std::string entry = "/proc/driver/nvidia/gpus/0000:81:00.0";
  ASSERT_EQ(Scan().size(), 2u);
  EXPECT_TRUE(discoverer_.InputsUnchanged());
  // Not a thing the driver does while the GPU is bound: the probe does not see it.
  fixture_.OverwriteInPlace(entry + "/information",
                            std::string("GPU UUID: \t ") + kUuid1 + "\nDevice Minor: \t 0\nGPU Excluded:\t Yes\n",
                            {1, 0});
  EXPECT_TRUE(discoverer_.InputsUnchanged());
  EXPECT_TRUE(discoverer_.InputsUnchanged());
  // Unbound and bound again, excluded: a new entry.
  const std::string text = ::edgeaccel::testing::ReadFileText(fixture_.Path(entry + "/information"));
  fixture_.Remove(entry);
  fixture_.WriteFile(entry + "/information", text);
  EXPECT_FALSE(discoverer_.InputsUnchanged());
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_THAT(devices[1].unhealthy_reason, HasSubstr("excluded"));
  EXPECT_TRUE(discoverer_.InputsUnchanged());
}

TEST_F(NvidiaTest, InformationWithMissingFieldsMakesNoDevice) {
  fixture_.WriteFile("/proc/driver/nvidia/gpus/0000:01:00.0/information", "Model: \t\t NVIDIA L4\n");
  fixture_.WriteFile("/proc/driver/nvidia/gpus/0000:81:00.0/information",
                     std::string("GPU UUID: \t ") + kUuid1 + "\nDevice Minor: \t banana\n");
  EXPECT_TRUE(Scan().empty());
  fixture_.WriteFile("/proc/driver/nvidia/gpus/0000:81:00.0/information",
                     "GPU UUID: \t ../../etc\nDevice Minor: \t 0\n");
  EXPECT_TRUE(Scan().empty());
}

TEST_F(NvidiaTest, NoDriverNoDevices) {
  fixture_.Remove("/proc/driver/nvidia");
  EXPECT_TRUE(Scan().empty());
  EXPECT_EQ(discoverer_.StaleHostView(), "");  // no driver is not a stale view
}

// After a driver reload the pod's bind mount of /proc/driver/nvidia shows the removed
// directory: empty, or deleted outright. Only a fresh pod sees the driver again.
TEST_F(NvidiaTest, AStaleDriverMountIsCalledStale) {
  ASSERT_EQ(Scan().size(), 2u);
  {
    ::edgeaccel::testing::StaleMount stale(fixture_.Path("/proc/driver/nvidia"));
    if (!stale.mounted()) GTEST_SKIP() << stale.why();
    EXPECT_TRUE(Scan().empty());
    EXPECT_THAT(discoverer_.StaleHostView(), HasSubstr("/proc/driver/nvidia is a stale mount"));
  }
  ASSERT_EQ(Scan().size(), 2u);  // the mount gone (a fresh pod): seen again
  EXPECT_EQ(discoverer_.StaleHostView(), "");
  // The same when the directory is there but empty (procfs keeps the removed entry).
  fixture_.Remove("/proc/driver/nvidia");
  fixture_.MakeDirectory("/proc/driver/nvidia");
  EXPECT_TRUE(Scan().empty());
  EXPECT_THAT(discoverer_.StaleHostView(), HasSubstr("stale mount"));
}

// Every GPU gets the running driver's libraries under their sonames where the container's loader
// looks by default, so a runtime without NVIDIA's hook runs CUDA, and no LD_LIBRARY_PATH replaces
// the image's; off, the answer is the device nodes alone.
TEST_F(NvidiaTest, EachGpuGetsTheRunningDriversLibraries) {
  fixture_.AddNvidiaDriverFiles({});
  for (const Device& d : Scan()) {
    std::vector<std::string> containers;
    for (const Mount& m : d.mounts) containers.push_back(m.container_path);
    EXPECT_THAT(containers, ::testing::IsSupersetOf({"/usr/lib64/libcuda.so.1",
                                                    "/usr/lib64/libcuda.so",
                                                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                                    "/usr/lib64/libnvidia-ptxjitcompiler.so.1",
                                                    "/usr/lib64/libnvidia-nvvm.so.4",
                                                    "/usr/local/nvidia/bin/nvidia-smi"}));
    EXPECT_EQ(d.mounts[0].host_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.515.76");
    EXPECT_EQ(d.envs.count("LD_LIBRARY_PATH"), 0u);
    EXPECT_EQ(d.envs.at("NVIDIA_VISIBLE_DEVICES"), d.id);  // NVIDIA's runtime's envs stay
    EXPECT_EQ(d.envs.at("NVIDIA_DRIVER_CAPABILITIES"), "compute,utility");
  }
  NvidiaOptions elsewhere;
  elsewhere.driver_library_dir = "/opt/nvidia/lib";
  elsewhere.driver_capabilities = kDriverCompute | kDriverUtility | kDriverVideo;
  NvidiaGpuDiscoverer moved(&host_, elsewhere);
  const Device also = moved.Scan()[0];
  EXPECT_EQ(also.mounts[0].host_path, "/usr/lib/x86_64-linux-gnu/libcuda.so.515.76");
  EXPECT_TRUE(std::any_of(also.mounts.begin(), also.mounts.end(), [](const Mount& m) {
    return m.container_path == "/opt/nvidia/lib/libcuda.so.1";
  }));
  EXPECT_EQ(also.envs.count("LD_LIBRARY_PATH"), 0u);
  EXPECT_EQ(also.envs.at("NVIDIA_DRIVER_CAPABILITIES"), "compute,utility,video");
  NvidiaOptions off;
  off.driver_libraries = false;
  NvidiaGpuDiscoverer without(&host_, off);
  for (const Device& d : without.Scan()) {
    EXPECT_TRUE(d.mounts.empty());
    EXPECT_EQ(d.envs.count("LD_LIBRARY_PATH"), 0u);
  }
}

}  // namespace
}  // namespace edgeaccel
