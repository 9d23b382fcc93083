#include "edgeaccel/discovery/device.h"

#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

Device Tpu() {
  Device d;
  d.id = "0000:03:00.0";
  d.nodes = {{"/dev/apex_0", "/dev/apex_0", "rw"}};
  return d;
}

TEST(DeviceTest, HealthNamesAreTheKubelets) {
  EXPECT_EQ(HealthName(Health::kHealthy), "Healthy");
  EXPECT_EQ(HealthName(Health::kUnhealthy), "Unhealthy");
}

TEST(DeviceTest, HealthFromProblemsJoinsEveryReason) {
  Device d = Tpu();
  SetHealthFromProblems({"device node /dev/apex_0 is missing", "driver status is DEAD"}, &d);
  EXPECT_EQ(d.health, Health::kUnhealthy);
  EXPECT_EQ(d.unhealthy_reason, "device node /dev/apex_0 is missing; driver status is DEAD");
  SetHealthFromProblems({}, &d);
  EXPECT_EQ(d.health, Health::kHealthy);
  EXPECT_EQ(d.unhealthy_reason, "");
}

TEST(DeviceTest, OnlyWhatTheKubeletSeesIsAnAdvertisementChange) {
  const Device base = Tpu();
  Device other = base;
  other.facts["driver_version"] = "1.2";
  other.telemetry["temperature_celsius"] = 51.3;
  EXPECT_FALSE(AdvertisementDiffers(base, other));

  other = base;
  other.health = Health::kUnhealthy;
  EXPECT_TRUE(AdvertisementDiffers(base, other));
  other = base;
  other.numa_node = 1;
  EXPECT_TRUE(AdvertisementDiffers(base, other));
  other = base;
  other.nodes[0].host_path = "/dev/apex_1";
  EXPECT_TRUE(AdvertisementDiffers(base, other));
  other = base;
  other.envs["NVIDIA_VISIBLE_DEVICES"] = "0";
  EXPECT_TRUE(AdvertisementDiffers(base, other));
}

TEST(DeviceTest, PhysicalIdOfAReplicaIsItsDevice) {
  Device d = Tpu();
  EXPECT_EQ(PhysicalId(d), "0000:03:00.0");
  d.id = "0000:03:00.0::1";
  d.replica_of = "0000:03:00.0";
  EXPECT_EQ(PhysicalId(d), "0000:03:00.0");
}

}  // namespace
}  // namespace edgeaccel
