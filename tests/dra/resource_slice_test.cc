#include "edgeaccel/dra/resource_slice.h"

#include <gtest/gtest.h>

#include <map>

#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/tegra.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/host/host.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using nlohmann::json;
using testing::FixtureHost;

Snapshot SnapshotOf(std::vector<Device> devices) {
  Snapshot snapshot;
  snapshot.version = 1;
  snapshot.devices = std::move(devices);
  return snapshot;
}

// Every attribute as the API server validates it: one type, strings and versions at most 64,
// versions semantic, names C identifiers; at most 32 attributes and capacities per device.
void ExpectValid(const json& device) {
  EXPECT_TRUE(IsDnsLabel(device["name"].get<std::string>())) << device["name"];
  size_t count = device["attributes"].size() + (device.contains("capacity") ? device["capacity"].size() : 0);
  EXPECT_LE(count, kMaxAttributesAndCapacities);
  for (const auto& [name, value] : device["attributes"].items()) {
    EXPECT_EQ(value.size(), 1u) << name;
    if (value.contains("string")) EXPECT_LE(value["string"].get<std::string>().size(), 64u) << name;
    if (value.contains("version")) {
      EXPECT_EQ(SemanticVersion(value["version"].get<std::string>()), value["version"].get<std::string>());
    }
  }
}

TEST(ResourceSliceTest, EdgeTpusCarryBusAddressModelAndVersions) {
  FixtureHost fixture;
  fixture.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .numa_node = 1});
  fixture.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  Host host(fixture.root());
  std::vector<Device> devices = CoralPcieDiscoverer(&host, {}).Scan();
  for (Device& usb : CoralUsbDiscoverer(&host).Scan()) devices.push_back(usb);
  std::vector<std::string> notes;
  json slice = SliceDevices(SnapshotOf(devices), &notes);
  ASSERT_EQ(slice.size(), 2u);
  const json& pcie = slice[0];
  EXPECT_EQ(pcie["name"], "tpu-0000-03-00-0");
  EXPECT_EQ(pcie["attributes"]["bus"], json({{"string", "pci"}}));
  EXPECT_EQ(pcie["attributes"]["pciAddress"], json({{"string", "0000:03:00.0"}}));
  EXPECT_EQ(pcie["attributes"]["numaNode"], json({{"int", 1}}));
  EXPECT_EQ(pcie["attributes"]["model"], json({{"string", "Coral M.2/PCIe Accelerator"}}));
  EXPECT_EQ(pcie["attributes"]["driverVersion"], json({{"version", "1.2.0"}}));
  EXPECT_TRUE(pcie["attributes"].contains("temperatureThresholdCelsius"));
  const json& usb = slice[1];
  EXPECT_EQ(usb["name"], "tpu-usb-2-1");
  EXPECT_EQ(usb["attributes"]["bus"], json({{"string", "usb"}}));
  EXPECT_EQ(usb["attributes"]["usbPort"], json({{"string", "2-1"}}));
  EXPECT_EQ(usb["attributes"]["model"], json({{"string", "Coral USB Accelerator"}}));
  for (const json& device : slice) ExpectValid(device);
  EXPECT_TRUE(notes.empty());
}

TEST(ResourceSliceTest, JetsonAndDiscreteGpus) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  Host host(fixture.root());
  std::vector<Device> jetson = TegraGpuDiscoverer(&host, NvidiaOptions{}).Scan();
  ASSERT_EQ(jetson.size(), 1u);
  json device = SliceDevice(jetson[0], nullptr);
  EXPECT_EQ(device["attributes"]["integrated"], json({{"bool", true}}));
  EXPECT_EQ(device["attributes"]["soc"], json({{"string", "tegra234"}}));
  EXPECT_EQ(device["attributes"]["computeCapability"], json({{"version", "8.7.0"}}));
  EXPECT_EQ(device["attributes"]["l4tVersion"], json({{"version", "36.4.7"}}));
  EXPECT_EQ(device["capacity"]["memory"], json({{"value", "3871Mi"}}));
  ExpectValid(device);

  FixtureHost discrete_host;
  discrete_host.AddNvidiaGpu({});
  Host host2(discrete_host.root());
  std::vector<Device> gpus = NvidiaGpuDiscoverer(&host2, NvidiaOptions{}, nullptr).Scan();
  ASSERT_EQ(gpus.size(), 1u);
  gpus[0].facts["driver_version"] = "580.159.04";
  json gpu = SliceDevice(gpus[0], nullptr);
  EXPECT_EQ(gpu["name"], "gpu-3291dfa4-fcc4-0110-615b-c894a0d7c689");
  EXPECT_EQ(gpu["attributes"]["integrated"], json({{"bool", false}}));
  EXPECT_EQ(gpu["attributes"]["productName"], json({{"string", "NVIDIA L4"}}));
  EXPECT_EQ(gpu["attributes"]["driverVersion"], json({{"version", "580.159.4"}}));
  EXPECT_FALSE(gpu.contains("capacity")) << "no memory without NVML";
  ExpectValid(gpu);
}

TEST(ResourceSliceTest, MemoryIsWrittenAsTheApiServerWritesIt) {
  EXPECT_EQ(MebibyteQuantity(3871), "3871Mi");
  EXPECT_EQ(MebibyteQuantity(1), "1Mi");
  EXPECT_EQ(MebibyteQuantity(8192), "8Gi");
  EXPECT_EQ(MebibyteQuantity(1536), "1536Mi");
  EXPECT_EQ(MebibyteQuantity(int64_t{1} << 30), "1Pi");
  EXPECT_EQ(MebibyteQuantity(int64_t{1} << 50), "1024Ei") << "no suffix beyond Ei";
}

// --dra-shared: a marked GPU may go to several claims; its memory is what they share, a claim
// that asks for none taking all of it. Unmarked devices and Edge TPUs are as before.
TEST(ResourceSliceTest, ASharedGpuAllowsMultipleAllocationsAndSharesItsMemory) {
  FixtureHost fixture;
  fixture.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
  Host host(fixture.root());
  std::vector<Device> jetson = TegraGpuDiscoverer(&host, NvidiaOptions{}).Scan();
  ASSERT_EQ(jetson.size(), 1u);
  json exclusive = SliceDevice(jetson[0], nullptr);
  EXPECT_FALSE(exclusive.contains("allowMultipleAllocations"));
  EXPECT_EQ(exclusive["capacity"]["memory"], json({{"value", "3871Mi"}}));

  const GpuSharing all{.integrated = true, .discrete = true};
  std::vector<std::string> notes;
  EXPECT_FALSE(SliceDevice(jetson[0], &notes, {.discrete = true}).contains("allowMultipleAllocations"))
      << "sharing discrete GPUs leaves Jetsons alone";
  json shared = SliceDevice(jetson[0], &notes, {.integrated = true});
  EXPECT_EQ(shared["allowMultipleAllocations"], true);
  EXPECT_EQ(shared["capacity"]["memory"], json::parse(R"({"value": "3871Mi",
      "requestPolicy": {"default": "3871Mi", "validRange": {"min": "1Mi"}}})"));
  EXPECT_EQ(shared["attributes"], exclusive["attributes"]) << "sharing changes no attribute";
  EXPECT_TRUE(notes.empty());
  ExpectValid(shared);

  // Without its memory (a discrete GPU without NVML) there is nothing to count shares in.
  FixtureHost discrete_host;
  discrete_host.AddNvidiaGpu({});
  Host host2(discrete_host.root());
  std::vector<Device> gpus = NvidiaGpuDiscoverer(&host2, NvidiaOptions{}, nullptr).Scan();
  ASSERT_EQ(gpus.size(), 1u);
  json unknown = SliceDevice(gpus[0], &notes, all);
  EXPECT_FALSE(unknown.contains("allowMultipleAllocations"));
  EXPECT_FALSE(unknown.contains("capacity"));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("gpu-3291dfa4-fcc4-0110-615b-c894a0d7c689: not shared (--dra-shared): its "
                          "memory is not known"),
            std::string::npos)
      << notes[0];
  // With NVML's memory it is shared; a memory of whole GiB is written as the API server keeps it.
  gpus[0].facts["memory_mib"] = "24576";
  json known = SliceDevice(gpus[0], nullptr, all);
  EXPECT_EQ(known["allowMultipleAllocations"], true);
  EXPECT_EQ(known["capacity"]["memory"]["value"], "24Gi");
  EXPECT_EQ(known["capacity"]["memory"]["requestPolicy"]["default"], "24Gi");

  // An Edge TPU is never shared.
  Device tpu;
  tpu.id = "0000:03:00.0";
  tpu.facts["interface"] = "pcie";
  json tpu_entry = SliceDevice(tpu, nullptr, all);
  EXPECT_FALSE(tpu_entry.contains("allowMultipleAllocations"));
  EXPECT_FALSE(tpu_entry.contains("capacity"));
}

TEST(ResourceSliceTest, PhysicalDevicesAreOfferedAndUnhealthyOnesTaintedOrLeftOut) {
  Device healthy;
  healthy.id = "0000:03:00.0";
  healthy.facts["interface"] = "pcie";
  Device sick = healthy;
  sick.id = "0000:04:00.0";
  sick.health = Health::kUnhealthy;
  Device replica = healthy;
  replica.id = "0000:03:00.0::1";
  replica.replica_of = "0000:03:00.0";
  json slice = SliceDevices(SnapshotOf({healthy, sick, replica}), nullptr);
  ASSERT_EQ(slice.size(), 2u);
  EXPECT_EQ(slice[0]["name"], "tpu-0000-03-00-0");
  EXPECT_FALSE(slice[0].contains("taints")) << "a Healthy device has no taints";
  EXPECT_EQ(slice[1]["name"], "tpu-0000-04-00-0");
  // Unhealthy with no classified problem: still never offered untainted.
  EXPECT_EQ(slice[1]["taints"], json::parse(R"([{"key":"edgeaccel.io/unhealthy","effect":"NoSchedule"}])"));
  // Where the API server does not keep taints: as before, only the Healthy ones.
  json left_out = SliceDevices(SnapshotOf({healthy, sick, replica}), nullptr, UnhealthyDevices::kLeftOut);
  ASSERT_EQ(left_out.size(), 1u);
  EXPECT_EQ(left_out[0]["name"], "tpu-0000-03-00-0");
}

// The taint of each kind, from what the discoverers find on a fixture host (not hand-made
// problems): the kind comes from Device::problems, never from parsing unhealthy_reason.
TEST(ResourceSliceTest, UnhealthyEdgeTpusCarryATaintPerKindOfProblem) {
  FixtureHost fixture;
  fixture.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .temp_mc = 100050});
  fixture.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .status = "DEAD"});
  fixture.AddCoralPcie({.index = 2, .pci_address = "0000:05:00.0"});
  fixture.Remove("/dev/apex_2");
  fixture.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = false});
  Host host(fixture.root());
  std::vector<Device> devices = CoralPcieDiscoverer(&host, {}).Scan();
  for (Device& usb : CoralUsbDiscoverer(&host).Scan()) devices.push_back(usb);
  json slice = SliceDevices(SnapshotOf(devices), nullptr);
  ASSERT_EQ(slice.size(), 4u) << slice.dump();
  std::map<std::string, json> taints;
  for (const json& device : slice) taints[device["name"]] = device.value("taints", json());
  // Over its threshold: NoSchedule, it may cool down; the value is the threshold, which does not
  // change from scan to scan as the reading does.
  ASSERT_EQ(taints["tpu-0000-03-00-0"].size(), 1u) << slice.dump();
  EXPECT_EQ(taints["tpu-0000-03-00-0"][0]["key"], "edgeaccel.io/temperature");
  EXPECT_EQ(taints["tpu-0000-03-00-0"][0]["effect"], "NoSchedule");
  EXPECT_EQ(taints["tpu-0000-03-00-0"][0]["value"].get<std::string>().rfind("threshold-", 0), 0u);
  EXPECT_EQ(taints["tpu-0000-04-00-0"],
            json::parse(R"([{"key":"edgeaccel.io/driver-status","value":"DEAD","effect":"NoSchedule"}])"));
  EXPECT_EQ(taints["tpu-0000-05-00-0"],
            json::parse(R"([{"key":"edgeaccel.io/device-node-missing","value":"apex_2","effect":"NoExecute"}])"));
  EXPECT_EQ(taints["tpu-usb-2-1"],
            json::parse(R"([{"key":"edgeaccel.io/driver-status","value":"firmware-not-loaded","effect":"NoSchedule"}])"));
}

TEST(ResourceSliceTest, NvmlProblemsAreTaintedXidNoExecuteUnresponsiveNoSchedule) {
  Device gpu;
  gpu.id = "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689";
  gpu.health = Health::kUnhealthy;
  gpu.problems = {{ProblemKind::kNvmlXid, "79"}, {ProblemKind::kNvmlUnresponsive, "no-answer"},
                  {ProblemKind::kNvmlXid, "48"}};
  EXPECT_EQ(DeviceTaints(gpu), json::parse(R"([
      {"key":"edgeaccel.io/nvml-unresponsive","value":"no-answer","effect":"NoSchedule"},
      {"key":"edgeaccel.io/nvml-xid","value":"79","effect":"NoExecute"}])"))
      << "one taint per kind (the first problem's detail), sorted by key";
  gpu.health = Health::kHealthy;
  EXPECT_TRUE(DeviceTaints(gpu).empty()) << "the taint goes when the device recovers";
}

// What the API server accepts as a taint value (IsValidLabelValue: at most 63 characters,
// [A-Za-z0-9-_.], alphanumeric at both ends).
TEST(ResourceSliceTest, TaintValuesAreLabelValues) {
  EXPECT_EQ(TaintValue("/dev/apex_0"), "apex_0");
  EXPECT_EQ(TaintValue("/dev/bus/usb/002/003"), "bus-usb-002-003");
  EXPECT_EQ(TaintValue("DRIVER_EXITING\\n"), "DRIVER_EXITING-n");
  EXPECT_EQ(TaintValue("--"), "");
  EXPECT_EQ(TaintValue(std::string(70, 'x') + "-"), std::string(63, 'x'));
  EXPECT_EQ(TaintValue(std::string(62, 'x') + "-y"), std::string(62, 'x'));
}

TEST(ResourceSliceTest, WhatDraCannotCarryIsLeftOutAndSaid) {
  Device gpu;
  gpu.id = "tegra234-igpu0";
  gpu.facts["soc"] = "tegra234";
  gpu.facts["model"] = std::string(80, 'M');
  gpu.facts["l4t_release"] = "36.4.7-rc1";
  std::vector<std::string> notes;
  json device = SliceDevice(gpu, &notes);
  EXPECT_EQ(device["attributes"]["model"]["string"].get<std::string>().size(), 64u);
  EXPECT_FALSE(device["attributes"].contains("l4tVersion"));
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[1].find("not a semantic version"), std::string::npos) << notes[1];
}

TEST(ResourceSliceTest, TheObjectHasOnePoolNamedAfterTheNodeAndTheNodeAsOwner) {
  json slice = ResourceSliceObject("edgetpu.edgeaccel.io", "node-1", "uid-n", 4, json::array());
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["metadata"]["generateName"], "node-1-edgetpu.edgeaccel.io-");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "uid-n");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(slice["spec"]["nodeName"], "node-1");
  EXPECT_EQ(slice["spec"]["pool"], json({{"name", "node-1"}, {"generation", 4}, {"resourceSliceCount", 1}}));
  EXPECT_FALSE(ResourceSliceObject("d", "n", "", 1, json::array())["metadata"].contains("ownerReferences"));
}

}  // namespace
}  // namespace edgeaccel
