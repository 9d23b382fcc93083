#include "edgeaccel/dra/dra_driver.h"

#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

Device Tpu(const std::string& id, const std::string& interface) {
  Device device;
  device.id = id;
  device.facts["interface"] = interface;
  return device;
}

TEST(DraDriverTest, FamiliesGoToTheirDriver) {
  EXPECT_EQ(DraDriverForFamily("coral-pcie"), "edgetpu.edgeaccel.io");
  EXPECT_EQ(DraDriverForFamily("coral-usb"), "edgetpu.edgeaccel.io");
  EXPECT_EQ(DraDriverForFamily("tegra"), "gpu.edgeaccel.io");
  EXPECT_EQ(DraDriverForFamily("nvidia"), "gpu.edgeaccel.io");
  EXPECT_EQ(DraDriverForFamily("fpga"), "");
}

// The names of docs/dra.md's table: DNS labels made from the stable id, with the kind's prefix.
TEST(DraDriverTest, DeviceNamesAreDnsLabelsFromTheStableId) {
  EXPECT_EQ(DraDeviceName(Tpu("0000:03:00.0", "pcie")), "tpu-0000-03-00-0");
  EXPECT_EQ(DraDeviceName(Tpu("2-1.4", "usb")), "tpu-usb-2-1-4");
  Device jetson;
  jetson.id = "tegra234-igpu0";
  jetson.facts["soc"] = "tegra234";
  EXPECT_EQ(DraDeviceName(jetson), "gpu-tegra234-igpu0");
  Device gpu;
  gpu.id = "GPU-3291DFA4-fcc4-0110-615b-c894a0d7c689";
  EXPECT_EQ(DraDeviceName(gpu), "gpu-3291dfa4-fcc4-0110-615b-c894a0d7c689");
  // A replica is named after its physical device: one DRA device.
  Device replica = Tpu("0000:03:00.0::1", "pcie");
  replica.replica_of = "0000:03:00.0";
  EXPECT_EQ(DraDeviceName(replica), "tpu-0000-03-00-0");
  // Never longer than a label, never ending in '-'.
  Device long_id = Tpu(std::string(80, 'a') + ":", "pcie");
  const std::string name = DraDeviceName(long_id);
  EXPECT_LE(name.size(), 63u);
  EXPECT_TRUE(IsDnsLabel(name)) << name;
  EXPECT_TRUE(IsDnsLabel(DraDeviceName(Tpu("x--:", "pcie"))));
}

TEST(DraDriverTest, SemanticVersionsAsTheApiServerChecksThem) {
  EXPECT_EQ(SemanticVersion("1.2"), "1.2.0");
  EXPECT_EQ(SemanticVersion("8.7"), "8.7.0");
  EXPECT_EQ(SemanticVersion("36.4.7"), "36.4.7");
  EXPECT_EQ(SemanticVersion("580.159.04"), "580.159.4");  // no leading zeros in semver
  EXPECT_EQ(SemanticVersion("13"), "13.0.0");
  EXPECT_EQ(SemanticVersion(" 1.1.4\n"), "1.1.4");
  EXPECT_FALSE(SemanticVersion("").has_value());
  EXPECT_FALSE(SemanticVersion("1.2.3.4").has_value());
  EXPECT_FALSE(SemanticVersion("1.x").has_value());
  EXPECT_FALSE(SemanticVersion("1..2").has_value());
  EXPECT_FALSE(SemanticVersion("-1.2").has_value());
  EXPECT_FALSE(SemanticVersion("99999999999999999999.1").has_value());
}

TEST(DraDriverTest, DnsLabels) {
  EXPECT_TRUE(IsDnsLabel("tpu-0"));
  EXPECT_FALSE(IsDnsLabel(""));
  EXPECT_FALSE(IsDnsLabel("-tpu"));
  EXPECT_FALSE(IsDnsLabel("tpu-"));
  EXPECT_FALSE(IsDnsLabel("Tpu"));
  EXPECT_FALSE(IsDnsLabel("tpu.0"));
  EXPECT_FALSE(IsDnsLabel(std::string(64, 'a')));
}

// What kube-apiserver makes metadata.uid from (uuid.New().String(), k8s.io/apimachinery
// pkg/util/uuid), and what the test API server and the kubelet double hand out.
TEST(DraDriverTest, ClaimUidsAreUuidsAsTheApiServerWritesThem) {
  EXPECT_TRUE(IsClaimUid("0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01"));
  EXPECT_TRUE(IsClaimUid("11111111-1111-1111-1111-111111111111"));
  EXPECT_FALSE(IsClaimUid(""));
  EXPECT_FALSE(IsClaimUid("0D7AB0A2-6C3F-4B8E-9F11-2B7C1C9A0E01")) << "the API server writes lowercase";
  EXPECT_FALSE(IsClaimUid("0d7ab0a26c3f4b8e9f112b7c1c9a0e01"));
  EXPECT_FALSE(IsClaimUid("0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01-"));
  EXPECT_FALSE(IsClaimUid("0d7ab0a2-6c3f-4b8e-9f11+2b7c1c9a0e01"));
  EXPECT_FALSE(IsClaimUid("0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e0g"));
  EXPECT_FALSE(IsClaimUid("../../etc/passwd-aaaa-bbbb-cccc-dddd"));
  EXPECT_FALSE(IsClaimUid("bad uid/../x"));
  EXPECT_FALSE(IsClaimUid(std::string("0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e0\0", 36)));
}

TEST(DraDriverTest, ClaimCdiNamesCarryTheClaimUid) {
  EXPECT_EQ(DraCdiKind("edgetpu.edgeaccel.io"), "k8s.edgetpu.edgeaccel.io/claim");
  EXPECT_EQ(DraCdiSpecFileName("edgetpu.edgeaccel.io", "u-1"), "k8s.edgetpu.edgeaccel.io-claim_u-1.json");
  EXPECT_EQ(DraCdiDeviceId("edgetpu.edgeaccel.io", "u-1", "tpu-0"),
            "k8s.edgetpu.edgeaccel.io/claim=u-1-tpu-0");
}

}  // namespace
}  // namespace edgeaccel
