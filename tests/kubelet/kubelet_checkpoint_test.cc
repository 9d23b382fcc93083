// The kubelet's checkpoint as kubelets write it: v2 (1.20 and later: ids per NUMA node) and v1.
#include "edgeaccel/kubelet/kubelet_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint_checksum.h"
#include "fixture_host.h"
#include "neighbour_plugin.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string CachedAnswer(const std::string& node) {
  v1beta1::ContainerAllocateResponse response;
  auto* spec = response.add_devices();
  spec->set_host_path(node);
  spec->set_container_path(node);
  spec->set_permissions("rw");
  return absl::Base64Escape(response.SerializeAsString());
}

TEST(KubeletCheckpointTest, ReadsTheV2Layout) {
  const std::string json = absl::StrCat(
      R"({"Data":{"PodDeviceEntries":[)",
      R"({"PodUID":"u1","ContainerName":"c","ResourceName":"coral.ai/edgetpu",)",
      R"("DeviceIDs":{"-1":["2-1"]},"AllocResp":")", CachedAnswer("/dev/bus/usb/002/003"), R"("},)",
      R"({"PodUID":"u2","ContainerName":"c","ResourceName":"nvidia.com/gpu",)",
      R"("DeviceIDs":{"0":["GPU-a"],"1":["GPU-b"]},"AllocResp":")", CachedAnswer("/dev/nvidia0"),
      R"("}],"RegisteredDevices":{"coral.ai/edgetpu":["2-1","0000:03:00.0"],"nvidia.com/gpu":[]}},)",
      R"("Checksum":2387421})");
  absl::StatusOr<KubeletCheckpoint> checkpoint = ParseKubeletCheckpoint(json);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT(checkpoint->registered_devices.at("coral.ai/edgetpu"),
              ElementsAre("2-1", "0000:03:00.0"));
  EXPECT_TRUE(checkpoint->registered_devices.at("nvidia.com/gpu").empty());
  ASSERT_EQ(checkpoint->entries.size(), 2u);
  EXPECT_EQ(checkpoint->entries[0].pod_uid, "u1");
  EXPECT_EQ(checkpoint->entries[0].allocate_response.devices(0).host_path(), "/dev/bus/usb/002/003");
  EXPECT_THAT(checkpoint->entries[1].device_ids, UnorderedElementsAre("GPU-a", "GPU-b"));

  const KubeletCheckpoint::Entry* entry = checkpoint->FindEntry("nvidia.com/gpu", {"GPU-b", "GPU-a"});
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->pod_uid, "u2");
  EXPECT_EQ(checkpoint->FindEntry("nvidia.com/gpu", {"GPU-a"}), nullptr) << "exactly the ids";
  EXPECT_EQ(checkpoint->FindEntry("coral.ai/edgetpu", {"GPU-a", "GPU-b"}), nullptr);
}

TEST(KubeletCheckpointTest, ReadsTheV1LayoutAndAnEmptyOne) {
  const std::string v1 = absl::StrCat(
      R"({"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c",)",
      R"("ResourceName":"coral.ai/edgetpu","DeviceIDs":["0000:03:00.0"],"AllocResp":")",
      CachedAnswer("/dev/apex_0"), R"("}],"RegisteredDevices":{}},"Checksum":1})");
  absl::StatusOr<KubeletCheckpoint> checkpoint = ParseKubeletCheckpoint(v1);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_NE(checkpoint->FindEntry("coral.ai/edgetpu", {"0000:03:00.0"}), nullptr);

  // What a kubelet writes before any pod: "PodDeviceEntries": null.
  checkpoint = ParseKubeletCheckpoint(
      R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":0})");
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_TRUE(checkpoint->entries.empty());
}

TEST(KubeletCheckpointTest, BadInputIsAClearErrorOrSkipped) {
  for (const char* bad : {"", "{", "[]", "null", R"({"Checksum":1})", R"({"Data":[]})"}) {
    EXPECT_FALSE(ParseKubeletCheckpoint(bad).ok()) << bad;
  }
  // An entry whose answer is not base64 protobuf is skipped; the rest still reads.
  absl::StatusOr<KubeletCheckpoint> checkpoint = ParseKubeletCheckpoint(
      R"({"Data":{"PodDeviceEntries":[{"ResourceName":"r","DeviceIDs":["a"],"AllocResp":"!!"},)"
      R"(7,{"ResourceName":"r","DeviceIDs":[1,"b"],"AllocResp":""}],)"
      R"("RegisteredDevices":{"r":["a",2]}},"Checksum":0})");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_EQ(checkpoint->entries.size(), 1u);
  EXPECT_THAT(checkpoint->entries[0].device_ids, ElementsAre("b"));
  EXPECT_THAT(checkpoint->registered_devices.at("r"), ElementsAre("a"));
  EXPECT_EQ(checkpoint->unreadable_entries, 2);
}

// A field of another type than the kubelet writes is an entry we cannot read, never an exception:
// the reader runs on gRPC's thread (PreStartContainer) and on the registrar's, which catch none.
TEST(KubeletCheckpointTest, FieldsOfAnotherTypeAreSkippedNotThrown) {
  for (const char* field : {"PodUID", "ContainerName", "ResourceName", "AllocResp"}) {
    for (const char* value : {"7", "null", "[]", "{}", "true"}) {
      // The first entry as the kubelet writes it, but for `field`, which is `value`.
      std::string entry;
      for (const auto& [key, written] :
           std::vector<std::pair<std::string, std::string>>{
               {"PodUID", R"("u")"},
               {"ContainerName", R"("c")"},
               {"ResourceName", R"("coral.ai/edgetpu")"},
               {"AllocResp", absl::StrCat("\"", CachedAnswer("/dev/apex_0"), "\"")}}) {
        absl::StrAppend(&entry, "\"", key, "\":", key == field ? value : written, ",");
      }
      const std::string json = absl::StrCat(
          R"({"Data":{"PodDeviceEntries":[{)", entry, R"("DeviceIDs":["a"]},)",
          R"({"PodUID":"u2","ContainerName":"c","ResourceName":"coral.ai/edgetpu",)",
          R"("DeviceIDs":["b"],"AllocResp":")", CachedAnswer("/dev/apex_1"),
          R"("}],"RegisteredDevices":{}},"Checksum":0})");
      absl::StatusOr<KubeletCheckpoint> checkpoint;
      ASSERT_NO_THROW(checkpoint = ParseKubeletCheckpoint(json)) << field << "=" << value;
      ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
      ASSERT_EQ(checkpoint->entries.size(), 1u) << field << "=" << value;
      EXPECT_EQ(checkpoint->entries[0].pod_uid, "u2");
      EXPECT_EQ(checkpoint->unreadable_entries, 1);
    }
  }
}

TEST(KubeletCheckpointTest, ReadingAFileSaysWhichFile) {
  TempDir dir;
  const std::string path = dir.path() + "/kubelet_internal_checkpoint";
  EXPECT_THAT(std::string(ReadKubeletCheckpoint(path).status().message()), HasSubstr(path));
  std::ofstream(path) << "not json";
  absl::Status status = ReadKubeletCheckpoint(path).status();
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a JSON object"));
  std::ofstream(path) << R"({"Data":{"RegisteredDevices":{"r":["x"]}},"Checksum":0})";
  ASSERT_TRUE(ReadKubeletCheckpoint(path).ok());
}

// The kubelet double's checkpoint carries the checksum a real kubelet writes and checks
// (docs/kubelet-behaviour.md §8), so a reader that trusted it, or a kubelet reading the file
// back, sees what it would see on a node.
TEST(KubeletCheckpointChecksumTest, IsTheKubeletsOverGoSpewText) {
  const nlohmann::json example = nlohmann::json::parse(R"({
      "PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"c0","ResourceName":"example.com/dev",
                           "DeviceIDs":{"-1":["d0"]},"AllocResp":"CgYKAUESATE="}],
      "RegisteredDevices":{"example.com/dev":["d0","d1"]}})");
  EXPECT_EQ(testing::SpewCheckpointData(example),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
            "[{PodUID:(string)uid-1 ContainerName:(string)c0 ResourceName:(string)example.com/dev "
            "DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[d0]] AllocResp:([]uint8)[10 6 10 1 65 "
            "18 1 49]}] RegisteredDevices:(map[string][]string)map[example.com/dev:[d0 d1]]}");
  EXPECT_EQ(testing::CheckpointChecksum(example), 1610629251u);
  const nlohmann::json empty = nlohmann::json::parse(
      R"({"PodDeviceEntries":null,"RegisteredDevices":{}})");
  EXPECT_EQ(testing::CheckpointChecksum(empty), 3467439661u);
  // Keys sorted as Go's spew sorts them: NUMA ids numerically, resource names bytewise.
  const nlohmann::json sorted = nlohmann::json::parse(R"({"PodDeviceEntries":[
      {"PodUID":"p","ContainerName":"c","ResourceName":"r","DeviceIDs":{"10":["b"],"2":["a"]},
       "AllocResp":""}],"RegisteredDevices":{"b":[],"a":null}})");
  EXPECT_THAT(testing::SpewCheckpointData(sorted),
              ::testing::HasSubstr("map[2:[a] 10:[b]] AllocResp:([]uint8)[]}] "
                                   "RegisteredDevices:(map[string][]string)map[a:<nil> b:[]]}"));
}

TEST(KubeletCheckpointChecksumTest, TheDoubleWritesTheChecksumOfWhatItWrites) {
  TempDir dir;
  testing::TestKubelet kubelet(dir.path() + "/kubelet");
  kubelet.Start();
  const std::string path = kubelet.DevicePluginsDir() + "/kubelet_internal_checkpoint";
  auto checked = [&] {
    std::ifstream in(path);
    const nlohmann::json written = nlohmann::json::parse(in);
    return written["Checksum"].get<uint64_t>() == testing::CheckpointChecksum(written["Data"]);
  };
  EXPECT_TRUE(checked());  // an empty kubelet's
  // With a plugin's devices and a pod's cached Allocate answer in it.
  testing::NeighbourPlugin plugin(testing::NeighbourKind::kNvidiaLike, kubelet.DevicePluginsDir(),
                                  "vendor-gpu.sock", "nvidia.com/gpu", {"GPU-1", "GPU-2"});
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitFor([&] { return kubelet.Allocatable("nvidia.com/gpu") == 2; }));
  ASSERT_TRUE(kubelet.AdmitPod("nvidia.com/gpu", {"GPU-2"}).ok());
  std::ifstream in(path);
  const nlohmann::json written = nlohmann::json::parse(in);
  ASSERT_EQ(written["Data"]["PodDeviceEntries"].size(), 1u);
  EXPECT_EQ(written["Data"]["RegisteredDevices"]["nvidia.com/gpu"].size(), 2u);
  EXPECT_TRUE(checked());
  plugin.Stop();
  kubelet.Stop();
}

}  // namespace
}  // namespace edgeaccel
