// The allocation policy as pure functions of a snapshot (the service's own tests call it over
// gRPC).
#include "edgeaccel/kubelet/allocation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/inventory/replicas.h"

namespace edgeaccel {
namespace {

using ::testing::ElementsAre;

TEST(AllocationTest, ReplicasShareNodesAndEnvsOnce) {
  Device gpu;
  gpu.id = "GPU-a";
  gpu.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}, {"/dev/nvidiactl", "/dev/nvidiactl", "rw"}};
  gpu.envs = {{"NVIDIA_VISIBLE_DEVICES", "GPU-a"}, {"NVIDIA_DRIVER_CAPABILITIES", "compute,utility"}};
  Device other = gpu;
  other.id = "GPU-b";
  other.nodes[0] = {"/dev/nvidia1", "/dev/nvidia1", "rw"};
  other.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-b";
  DeviceSet set("nvidia.com/gpu");
  set.Update(ExpandReplicas({gpu, other}, 3));
  std::shared_ptr<const Snapshot> snapshot = set.Current();
  ASSERT_EQ(snapshot->devices.size(), 6u);
  EXPECT_EQ(snapshot->devices[0].id, "GPU-a::0");

  v1beta1::ContainerAllocateRequest request;
  for (const char* id : {"GPU-a::0", "GPU-a::2", "GPU-b::1"}) request.add_devices_ids(id);
  v1beta1::ContainerAllocateResponse response;
  CdiNamer cdi_name = [](absl::string_view physical_id) -> absl::StatusOr<std::string> {
    return "edgeaccel.io/gpu=" + std::string(physical_id);
  };
  ASSERT_TRUE(
      BuildContainerAllocation(*snapshot, "nvidia.com/gpu", request, cdi_name, &response).ok());
  ASSERT_EQ(response.devices_size(), 3);  // nvidia0, nvidiactl, nvidia1: each once
  EXPECT_EQ(response.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-a,GPU-b");
  EXPECT_EQ(response.envs().at("NVIDIA_DRIVER_CAPABILITIES"), "compute,utility");
  ASSERT_EQ(response.cdi_devices_size(), 2);
  EXPECT_EQ(response.cdi_devices(0).name(), "edgeaccel.io/gpu=GPU-a");
  EXPECT_EQ(response.cdi_devices(1).name(), "edgeaccel.io/gpu=GPU-b");
}

// The kubelet hands Mounts to any runtime, CDI or not: the driver's libraries go there too,
// read-only, each once however many GPUs share them.
TEST(AllocationTest, DriverLibrariesAreReadOnlyMountsEachOnce) {
  Device gpu;
  gpu.id = "GPU-a";
  gpu.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}};
  gpu.mounts = {{"/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", "/usr/lib64/libcuda.so.1"},
                {"/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"}};
  Device other = gpu;
  other.id = "GPU-b";
  other.nodes[0] = {"/dev/nvidia1", "/dev/nvidia1", "rw"};
  Device jetson;  // another device of the resource with its own library directory
  jetson.id = "tegra234-igpu0";
  jetson.mounts = {{"/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1",
                    "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1"}};
  DeviceSet set("nvidia.com/gpu");
  set.Update({gpu, other, jetson});
  v1beta1::ContainerAllocateRequest request;
  for (const char* id : {"GPU-a", "GPU-b", "tegra234-igpu0"}) request.add_devices_ids(id);
  v1beta1::ContainerAllocateResponse response;
  ASSERT_TRUE(BuildContainerAllocation(*set.Current(), "nvidia.com/gpu", request, nullptr, &response).ok());
  ASSERT_EQ(response.mounts_size(), 3);
  EXPECT_EQ(response.mounts(0).host_path(), "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04");
  EXPECT_EQ(response.mounts(0).container_path(), "/usr/lib64/libcuda.so.1");
  EXPECT_EQ(response.mounts(1).container_path(), "/usr/local/nvidia/bin/nvidia-smi");
  EXPECT_EQ(response.mounts(2).container_path(), "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1");
  for (const v1beta1::Mount& mount : response.mounts()) EXPECT_TRUE(mount.read_only());
  EXPECT_EQ(response.envs().count("LD_LIBRARY_PATH"), 0u);
}

TEST(AllocationTest, PreferredReplicasSpreadOverDevices) {
  Device a, b;
  a.id = "A";
  b.id = "B";
  DeviceSet set("nvidia.com/gpu");
  set.Update(ExpandReplicas({a, b}, 4));
  std::shared_ptr<const Snapshot> snapshot = set.Current();
  v1beta1::ContainerPreferredAllocationRequest request;
  for (const Device& d : snapshot->devices) request.add_available_deviceids(d.id);
  request.set_allocation_size(2);
  EXPECT_THAT(PreferredDevices(*snapshot, request), ElementsAre("A::0", "B::0"));
  // B is busier (two of its replicas taken by other pods): A goes first.
  request.clear_available_deviceids();
  for (const char* id : {"A::0", "A::1", "A::2", "B::2", "B::3"}) request.add_available_deviceids(id);
  request.set_allocation_size(1);
  EXPECT_THAT(PreferredDevices(*snapshot, request), ElementsAre("A::0"));
  request.set_allocation_size(3);
  EXPECT_THAT(PreferredDevices(*snapshot, request), ElementsAre("A::0", "A::1", "B::2"));
}

TEST(AllocationTest, CdiNamesComeAllOrNone) {
  Device a, b;
  a.id = "GPU-a";
  a.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}};
  b.id = "GPU-b";
  b.nodes = {{"/dev/nvidia1", "/dev/nvidia1", "rw"}};
  DeviceSet set("nvidia.com/gpu");
  set.Update({a, b});
  CdiNamer only_a = [](absl::string_view id) -> absl::StatusOr<std::string> {
    if (id == "GPU-a") return std::string("edgeaccel.io/gpu=GPU-a");
    return absl::UnavailableError("the CDI spec does not hold GPU-b yet");
  };
  v1beta1::ContainerAllocateRequest request;
  request.add_devices_ids("GPU-a");
  request.add_devices_ids("GPU-b");
  v1beta1::ContainerAllocateResponse response;
  std::string fallback;
  ASSERT_TRUE(BuildContainerAllocation(*set.Current(), "nvidia.com/gpu", request, only_a,
                                       &response, &fallback)
                  .ok());
  EXPECT_EQ(response.devices_size(), 2) << "device nodes for both";
  EXPECT_EQ(response.cdi_devices_size(), 0) << "no half set of names";
  EXPECT_EQ(fallback, "the CDI spec does not hold GPU-b yet");

  request.clear_devices_ids();
  request.add_devices_ids("GPU-a");
  response.Clear();
  fallback.clear();
  ASSERT_TRUE(BuildContainerAllocation(*set.Current(), "nvidia.com/gpu", request, only_a,
                                       &response, &fallback)
                  .ok());
  ASSERT_EQ(response.cdi_devices_size(), 1);
  EXPECT_EQ(fallback, "");
}

TEST(AllocationTest, NoCdiNamesWithoutANamer) {
  Device gpu;
  gpu.id = "GPU-a";
  gpu.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}};
  DeviceSet set("nvidia.com/gpu");
  set.Update({gpu});
  v1beta1::ContainerAllocateRequest request;
  request.add_devices_ids("GPU-a");
  v1beta1::ContainerAllocateResponse response;
  ASSERT_TRUE(
      BuildContainerAllocation(*set.Current(), "nvidia.com/gpu", request, nullptr, &response).ok());
  EXPECT_EQ(response.devices_size(), 1);
  EXPECT_EQ(response.cdi_devices_size(), 0);
}

}  // namespace
}  // namespace edgeaccel
