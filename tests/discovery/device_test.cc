#include "edgeaccel/discovery/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edgeaccel/host/host.h"
#include "fixture_host.h"

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
  // The host node's mode and owner go into the CDI spec: udev changing them must rewrite it.
  other = base;
  other.nodes[0].host_mode = HostNodeMode{0660, 0, 44};
  EXPECT_TRUE(AdvertisementDiffers(base, other));
  Device chmodded = other;
  chmodded.nodes[0].host_mode->permissions = 0666;
  EXPECT_TRUE(AdvertisementDiffers(other, chmodded));
  // Why a node could not be stat'ed is for the log only.
  other = base;
  other.nodes[0].host_stat_error = "No such file or directory";
  EXPECT_FALSE(AdvertisementDiffers(base, other));
}

TEST(DeviceTest, HostModesAreTheHostNodesOwnOnesUnderTheHostRoot) {
  testing::FixtureHost host_tree;
  host_tree.MakeCharDevice("/dev/apex_0", 120, 0);
  const std::string node = host_tree.root() + "/dev/apex_0";
  ASSERT_EQ(chmod(node.c_str(), 0660), 0);
  ASSERT_EQ(chown(node.c_str(), 0, 44), 0);
  Host host(host_tree.root());
  std::vector<Device> devices = {Tpu(), Tpu()};
  devices[1].nodes[0].host_path = "/dev/apex_1";  // not there
  LookUpHostModes(host, &devices);
  ASSERT_TRUE(devices[0].nodes[0].host_mode.has_value());
  EXPECT_EQ(devices[0].nodes[0].host_mode->permissions, 0660u);
  EXPECT_EQ(devices[0].nodes[0].host_mode->uid, 0u);
  EXPECT_EQ(devices[0].nodes[0].host_mode->gid, 44u);
  EXPECT_FALSE(devices[1].nodes[0].host_mode.has_value());
  EXPECT_THAT(devices[1].nodes[0].host_stat_error, ::testing::HasSubstr("No such file or directory"));
  // Again after udev's chmod: the new mode, nothing stale.
  ASSERT_EQ(chmod(node.c_str(), 0600), 0);
  LookUpHostModes(host, &devices);
  EXPECT_EQ(devices[0].nodes[0].host_mode->permissions, 0600u);
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
