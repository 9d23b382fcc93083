#include "edgeaccel/inventory/replicas.h"

#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

TEST(ReplicasTest, EachDeviceBecomesItsReplicasSharingEverythingButTheId) {
  Device gpu;
  gpu.id = "GPU-a";
  gpu.health = Health::kUnhealthy;
  gpu.unhealthy_reason = "XID 79";
  gpu.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}};
  gpu.envs = {{"NVIDIA_VISIBLE_DEVICES", "GPU-a"}};
  std::vector<Device> replicas = ExpandReplicas({gpu}, 3);
  ASSERT_EQ(replicas.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(replicas[k].id, "GPU-a::" + std::to_string(k));
    EXPECT_EQ(replicas[k].replica_of, "GPU-a");
    EXPECT_EQ(replicas[k].health, Health::kUnhealthy);
    EXPECT_EQ(replicas[k].unhealthy_reason, "XID 79");
    EXPECT_EQ(replicas[k].nodes, gpu.nodes);
    EXPECT_EQ(replicas[k].envs, gpu.envs);
  }
}

TEST(ReplicasTest, OneOrFewerLeavesDevicesAsTheyAre) {
  Device gpu;
  gpu.id = "GPU-a";
  for (int replicas : {-1, 0, 1}) {
    std::vector<Device> out = ExpandReplicas({gpu}, replicas);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].id, "GPU-a");
    EXPECT_EQ(out[0].replica_of, "");
  }
}

TEST(ReplicasTest, PhysicalIdOfAnAdvertisedId) {
  EXPECT_EQ(PhysicalIdOf("GPU-a::3"), "GPU-a");
  EXPECT_EQ(PhysicalIdOf("GPU-a"), "GPU-a");
  EXPECT_EQ(PhysicalIdOf("0000:03:00.0"), "0000:03:00.0") << "one colon is part of the id";
  EXPECT_EQ(PhysicalIdOf(""), "");
}

}  // namespace
}  // namespace edgeaccel
