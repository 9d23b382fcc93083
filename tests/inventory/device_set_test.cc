#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/inventory/replicas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

namespace edgeaccel {
namespace {

Device MakeDevice(const std::string& id, Health health = Health::kHealthy) {
  Device d;
  d.id = id;
  d.health = health;
  d.nodes.push_back({"/dev/" + id, "/dev/" + id, "rw"});
  return d;
}

TEST(InventoryTest, VersionsOnlyWhatTheKubeletSees) {
  DeviceSet set("coral.ai/edgetpu");
  EXPECT_EQ(set.Current()->version, 0u);
  EXPECT_TRUE(set.Update({MakeDevice("b"), MakeDevice("a")}));
  EXPECT_EQ(set.Current()->version, 1u);
  // Sorted by id.
  EXPECT_EQ(set.Current()->devices[0].id, "a");

  // Telemetry only: no new version, but the snapshot carries the new reading.
  Device hot = MakeDevice("a");
  hot.telemetry["temperature_celsius"] = 50;
  EXPECT_FALSE(set.Update({hot, MakeDevice("b")}));
  EXPECT_EQ(set.Current()->version, 1u);
  EXPECT_EQ(set.Current()->Find("a")->telemetry.at("temperature_celsius"), 50);

  EXPECT_TRUE(set.Update({MakeDevice("a", Health::kUnhealthy), MakeDevice("b")}));
  EXPECT_EQ(set.Current()->version, 2u);
  EXPECT_EQ(set.Current()->HealthyCount(), 1);
  EXPECT_TRUE(set.Update({MakeDevice("a", Health::kUnhealthy)}));
  EXPECT_EQ(set.Current()->version, 3u);
  EXPECT_EQ(set.Current()->Find("b"), nullptr);
}

TEST(InventoryTest, ReplicasChangeTogether) {
  DeviceSet set("nvidia.com/gpu");
  Device gpu = MakeDevice("GPU-a");
  EXPECT_TRUE(set.Update(ExpandReplicas({gpu}, 128)));
  gpu.health = Health::kUnhealthy;
  EXPECT_TRUE(set.Update(ExpandReplicas({gpu}, 128)));
  EXPECT_EQ(set.Current()->HealthyCount(), 0);
  EXPECT_EQ(set.Current()->devices.size(), 128u);
}

// A device the other API holds is published Unhealthy with a kHeldElsewhere problem naming the
// holder, over whatever discovery says and across rescans, and Healthy again once released;
// replicas of a held device are held with it.
TEST(InventoryTest, ADeviceHeldElsewhereIsUnhealthyUntilReleased) {
  DeviceSet set("coral.ai/edgetpu");
  std::atomic<int> heard{0};
  set.Subscribe([&](std::shared_ptr<const Snapshot>) { ++heard; });
  set.SetHeldElsewhere({{"a", {"infer-0", "pod default/infer-0 (coral.ai/edgetpu, device plugin)"}}});  // before any scan
  set.Update({MakeDevice("a"), MakeDevice("b")});
  std::shared_ptr<const Snapshot> now = set.Current();
  ASSERT_EQ(now->devices.size(), 2u);
  EXPECT_EQ(now->devices[0].health, Health::kUnhealthy);
  EXPECT_EQ(now->devices[0].unhealthy_reason, "held by pod default/infer-0 (coral.ai/edgetpu, device plugin)");
  ASSERT_EQ(now->devices[0].problems.size(), 1u);
  EXPECT_EQ(now->devices[0].problems[0].kind, ProblemKind::kHeldElsewhere);
  EXPECT_EQ(now->devices[0].problems[0].detail, "infer-0");
  EXPECT_EQ(now->devices[1].health, Health::kHealthy);
  set.Update({MakeDevice("a"), MakeDevice("b")});  // a rescan keeps it held
  EXPECT_EQ(set.Current()->devices[0].health, Health::kUnhealthy);
  const int before = heard.load();
  set.SetHeldElsewhere({});
  EXPECT_EQ(set.Current()->devices[0].health, Health::kHealthy);
  EXPECT_TRUE(set.Current()->devices[0].problems.empty());
  EXPECT_EQ(heard.load(), before + 1) << "a release is a change the kubelet sees";
  set.SetHeldElsewhere({});  // no change, no news
  EXPECT_EQ(heard.load(), before + 1);
  // Replicas: the physical id holds them all.
  DeviceSet shared("nvidia.com/gpu");
  shared.Update(ExpandReplicas({MakeDevice("GPU-a")}, 2));
  shared.SetHeldElsewhere({{"GPU-a", {"train", "ResourceClaim default/train (gpu.edgeaccel.io, DRA)"}}});
  for (const Device& replica : shared.Current()->devices) {
    EXPECT_EQ(replica.health, Health::kUnhealthy) << replica.id;
    EXPECT_EQ(replica.problems.back().detail, "train");
  }
}

TEST(InventoryTest, DuplicateIdsKeepOne) {
  DeviceSet set("x/y");
  set.Update({MakeDevice("a"), MakeDevice("a")});
  EXPECT_EQ(set.Current()->devices.size(), 1u);
}

TEST(InventoryTest, ListenersHearChangesUntilUnsubscribed) {
  DeviceSet set("x/y");
  std::atomic<int> heard{0};
  uint64_t id = set.Subscribe([&](std::shared_ptr<const Snapshot> s) {
    heard++;
    EXPECT_GT(s->version, 0u);
  });
  set.Update({MakeDevice("a")});
  set.Update({MakeDevice("a")});  // no change
  set.Update({MakeDevice("a", Health::kUnhealthy)});
  EXPECT_EQ(heard.load(), 2);
  set.Unsubscribe(id);
  set.Update({});
  EXPECT_EQ(heard.load(), 2);
}

// NVML answering after the first scan changes a GPU's facts alone: the labels and the DRA slice
// (kAdvertisedOrFacts) hear of it at once, under the same version; ListAndWatch (kAdvertised)
// does not, so the kubelet gets no new list for it.
TEST(InventoryTest, AChangeOfFactsAloneReachesOnlyTheListenersOfFacts) {
  DeviceSet set("nvidia.com/gpu");
  std::vector<std::shared_ptr<const Snapshot>> advertised, described;
  set.Subscribe([&](std::shared_ptr<const Snapshot> s) { advertised.push_back(s); });
  set.Subscribe([&](std::shared_ptr<const Snapshot> s) { described.push_back(s); },
                DeviceSet::Changes::kAdvertisedOrFacts);
  Device gpu = MakeDevice("GPU-a");
  gpu.facts["model"] = "NVIDIA H100 80GB HBM3";
  EXPECT_TRUE(set.Update({gpu}));
  ASSERT_EQ(advertised.size(), 1u);
  ASSERT_EQ(described.size(), 1u);

  gpu.facts["memory_mib"] = "81559";
  gpu.facts["compute_capability"] = "9.0";
  EXPECT_FALSE(set.Update({gpu})) << "the kubelet sees nothing new";
  EXPECT_EQ(set.Current()->version, 1u);
  EXPECT_EQ(advertised.size(), 1u);
  ASSERT_EQ(described.size(), 2u);
  EXPECT_EQ(described.back()->version, 1u);
  EXPECT_EQ(described.back()->Find("GPU-a")->facts.at("memory_mib"), "81559");
  EXPECT_EQ(set.Current(), described.back());

  // The same facts again, new telemetry, a new reading of the temperature fact: nobody is told,
  // and the snapshot carries them.
  gpu.telemetry["temperature_celsius"] = 34;
  gpu.facts[std::string(kTemperatureFact)] = "34.00 °C";
  EXPECT_FALSE(set.Update({gpu}));
  gpu.facts[std::string(kTemperatureFact)] = "35.00 °C";
  EXPECT_FALSE(set.Update({gpu}));
  EXPECT_EQ(advertised.size(), 1u);
  EXPECT_EQ(described.size(), 2u);
  EXPECT_EQ(set.Current()->Find("GPU-a")->facts.at(std::string(kTemperatureFact)), "35.00 °C");

  // What the kubelet sees (here with new facts too): everyone, once, under a new version.
  gpu.health = Health::kUnhealthy;
  gpu.facts["xid_events"] = "registered";
  EXPECT_TRUE(set.Update({gpu}));
  ASSERT_EQ(advertised.size(), 2u);
  ASSERT_EQ(described.size(), 3u);
  EXPECT_EQ(advertised.back()->version, 2u);
  EXPECT_EQ(described.back(), advertised.back());
}

TEST(InventoryTest, ListenerMayCallBackIntoTheSet) {
  DeviceSet set("x/y");
  uint64_t seen = 0;
  set.Subscribe([&](std::shared_ptr<const Snapshot>) { seen = set.Current()->version; });
  set.Update({MakeDevice("a")});
  EXPECT_EQ(seen, 1u);
}

}  // namespace
}  // namespace edgeaccel
