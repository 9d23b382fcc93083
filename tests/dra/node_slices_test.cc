#include "edgeaccel/dra/node_slices.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "edgeaccel/dra/slice_publisher.h"
#include "eventually.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using nlohmann::json;
using testing::TestApiServer;
using ::edgeaccel::testing::Eventually;

constexpr char kTpus[] = "edgetpu.edgeaccel.io";
constexpr char kGpus[] = "gpu.edgeaccel.io";

Device Tpu(const std::string& pci) {
  Device device;
  device.id = pci;
  device.facts["interface"] = "pcie";
  device.facts["pci_address"] = pci;
  return device;
}

int ThreadsCalled(const std::string& wanted) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == wanted) ++n;
  }
  return n;
}

json SliceOf(const std::string& name, const std::string& driver, const std::string& node = "node-1") {
  return json{{"metadata", {{"name", name}}},
              {"spec",
               {{"driver", driver},
                {"nodeName", node},
                {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}}}}};
}

class NodeSlicesTest : public ::testing::Test {
 protected:
  NodeSlicesTest() {
    client_ = std::make_unique<ApiClient>(api_.ClientConfig(absl::Seconds(10)));
  }

  NodeSlices::Options Options() {
    return {.node_name = "node-1", .resync = absl::Hours(1), .initial_backoff = absl::Milliseconds(20),
            .loop = &loop_};
  }

  // A subscriber that counts what it is told.
  struct Told {
    std::atomic<int> slices{0};
    std::atomic<int> renewed{0};
    std::function<void(NodeSlices::Change)> Callback() {
      return [this](NodeSlices::Change change) {
        (change == NodeSlices::Change::kSlices ? slices : renewed).fetch_add(1);
      };
    }
  };

  TestApiServer api_{"node-1"};
  std::unique_ptr<ApiClient> client_;
  PollLoop loop_{"ea-loop"};
};

// The shipped configuration on a Jetson with a Coral: two drivers' publishers on the daemon's
// loop (ea-loop), one LIST and one WATCH for the node. A delete of every slice of the node (the
// kubelet's wipe) is put back for both from that one watch, and one driver's change is published
// while the other waits. Idle, neither the view nor the publishers hold a thread but the loop's.
TEST_F(NodeSlicesTest, TwoDriversShareOneListAndOneWatch) {
  NodeSlices slices(Options(), client_.get());
  DeviceSet tpus(kTpus), gpus(kGpus);
  tpus.Update({Tpu("0000:03:00.0"), Tpu("0000:04:00.0")});
  gpus.Update({Tpu("0000:05:00.0")});
  SlicePublisher::Options options{.driver = kTpus, .node_name = "node-1", .slices = &slices,
                                  .initial_backoff = absl::Milliseconds(20), .loop = &loop_};
  SlicePublisher tpu_publisher(options, client_.get(), &tpus);
  options.driver = kGpus;
  SlicePublisher gpu_publisher(options, client_.get(), &gpus);
  tpu_publisher.Start();
  gpu_publisher.Start();
  auto both = [&](size_t tpu_devices, size_t gpu_devices) {
    return api_.WaitForResourceSlices([&](const std::vector<json>& stored) {
      size_t found = 0;
      for (const json& slice : stored) {
        const size_t devices = slice["spec"]["devices"].size();
        if (slice["spec"]["driver"] == kTpus && devices == tpu_devices) ++found;
        if (slice["spec"]["driver"] == kGpus && devices == gpu_devices) ++found;
      }
      return stored.size() == 2 && found == 2;
    });
  };
  ASSERT_TRUE(both(2, 1));
  ASSERT_TRUE(Eventually([&] { return api_.open_slice_watches() == 1; }));
  EXPECT_EQ(api_.resource_slice_lists(), 1);
  EXPECT_EQ(api_.resource_slice_watches(), 1);
  EXPECT_TRUE(Eventually([&] { return ThreadsCalled("ea-dra-slices") + ThreadsCalled("ea-dra-watch") == 0; }))
      << "idle: the workers have ended";
  EXPECT_EQ(ThreadsCalled("ea-loop"), 1);

  api_.DeleteAllResourceSlices("node-1");
  EXPECT_TRUE(both(2, 1)) << "both put back from the one watch";
  gpus.Update({Tpu("0000:05:00.0"), Tpu("0000:06:00.0")});
  EXPECT_TRUE(both(2, 2));
  EXPECT_EQ(api_.resource_slice_lists(), 1) << "no LIST after the first";
  EXPECT_EQ(api_.resource_slice_watches(), 1);
  EXPECT_EQ(tpu_publisher.status().lists, 1u);
  EXPECT_EQ(gpu_publisher.status().lists, 1u);
  EXPECT_EQ(tpu_publisher.status().conflicts + gpu_publisher.status().conflicts, 0u);

  gpu_publisher.Stop();
  EXPECT_EQ(api_.open_slice_watches(), 1) << "the other driver still reads it";
  tpus.Update({Tpu("0000:03:00.0")});
  EXPECT_TRUE(both(1, 2));
  tpu_publisher.Stop();
  EXPECT_TRUE(Eventually([&] { return api_.open_slice_watches() == 0; })) << "no subscriber: no watch";
}

// Each subscriber is told of what someone else did to its own driver's slices, and only of that:
// a slice of another driver on the node (NVIDIA's, say) is kept in the view and tells nobody.
TEST_F(NodeSlicesTest, OnlyTheDriverWhoseSlicesChangedIsTold) {
  NodeSlices slices(Options(), client_.get());
  Told tpu, gpu;
  const uint64_t tpu_id = slices.Subscribe(kTpus, tpu.Callback());
  const uint64_t gpu_id = slices.Subscribe(kGpus, gpu.Callback());
  ASSERT_TRUE(Eventually([&] { return api_.open_slice_watches() == 1; }));
  const int tpu_before = tpu.slices.load();
  const int gpu_before = gpu.slices.load();

  api_.AddResourceSlice(SliceOf("a-gpu-slice", kGpus));
  ASSERT_TRUE(Eventually([&] { return gpu.slices.load() == gpu_before + 1; }));
  api_.AddResourceSlice(SliceOf("nvidias", "gpu.nvidia.com"));
  api_.AddResourceSlice(SliceOf("a-tpu-slice", kTpus));  // after NVIDIA's, on the same watch
  ASSERT_TRUE(Eventually([&] { return tpu.slices.load() == tpu_before + 1; }));
  EXPECT_EQ(gpu.slices.load(), gpu_before + 1) << "NVIDIA's slice and the TPU's tell the GPU driver nothing";

  absl::StatusOr<NodeSlices::View> view = slices.Slices(kGpus);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->slices.size(), 1u);
  EXPECT_EQ(view->slices.begin()->first, "a-gpu-slice");
  view = slices.Slices("gpu.nvidia.com");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->slices.size(), 1u) << "the view holds every driver's slices of the node";
  EXPECT_EQ(api_.resource_slice_lists(), 1);

  api_.DeleteAllResourceSlices("node-1", kTpus);
  ASSERT_TRUE(Eventually([&] { return tpu.slices.load() == tpu_before + 2; }));
  EXPECT_EQ(gpu.slices.load(), gpu_before + 1);
  slices.Unsubscribe(tpu_id);
  slices.Unsubscribe(gpu_id);
}

// A 410 (the view's version compacted away) lists once for every driver and tells each; a renewal
// the server asked for tells each too (a publisher whose taints were dropped tries them again); a
// bookmark tells no one.
TEST_F(NodeSlicesTest, A410ListsOnceForEveryDriverAndARenewalTellsEach) {
  NodeSlices slices(Options(), client_.get());
  Told tpu, gpu;
  const uint64_t tpu_id = slices.Subscribe(kTpus, tpu.Callback());
  const uint64_t gpu_id = slices.Subscribe(kGpus, gpu.Callback());
  ASSERT_TRUE(Eventually([&] { return api_.open_slice_watches() == 1; }));

  api_.EndSliceWatches();  // timeoutSeconds
  ASSERT_TRUE(Eventually([&] { return tpu.renewed.load() == 1 && gpu.renewed.load() == 1; }));
  ASSERT_TRUE(Eventually([&] { return api_.resource_slice_watches() == 2 && api_.open_slice_watches() == 1; }));
  EXPECT_EQ(api_.resource_slice_lists(), 1);

  const int tpu_before = tpu.slices.load();
  const int gpu_before = gpu.slices.load();
  // A bookmark moves the view on and tells no one: the loop keeps it, no publisher syncs. (The
  // renewal's news went out before the renewed watch was asked for, so the counts are final.)
  const std::string before = slices.status().resource_version;
  api_.BookmarkSliceWatches();
  ASSERT_TRUE(Eventually([&] { return slices.status().resource_version != before; }));
  EXPECT_EQ(tpu.slices.load(), tpu_before) << "a bookmark tells no one";
  EXPECT_EQ(gpu.slices.load(), gpu_before) << "a bookmark tells no one";
  EXPECT_EQ(tpu.renewed.load(), 1);
  EXPECT_EQ(gpu.renewed.load(), 1);
  EXPECT_EQ(api_.resource_slice_lists(), 1) << "nor lists";
  // Changes this node's watch does not see: another node's slices.
  api_.AddResourceSlice(SliceOf("unrelated", "other.example.com", "node-2"));
  api_.CompactSliceHistory();
  api_.AddResourceSlice(SliceOf("unrelated-2", "other.example.com", "node-2"));
  api_.CompactSliceHistory();  // the watch's version is older than the history now
  api_.EndSliceWatches();
  ASSERT_TRUE(Eventually([&] { return api_.resource_slice_lists() == 2; })) << "410 Expired: listed again";
  ASSERT_TRUE(Eventually([&] { return tpu.slices.load() > tpu_before && gpu.slices.load() > gpu_before; }));
  ASSERT_TRUE(Eventually([&] { return api_.open_slice_watches() == 1; }));
  EXPECT_EQ(api_.resource_slice_lists(), 2) << "one LIST for both";
  EXPECT_TRUE(slices.status().last_error.empty()) << slices.status().last_error;
  slices.Unsubscribe(tpu_id);
  slices.Unsubscribe(gpu_id);
}

// MarkStale (a publisher's 409): the next Slices() lists; two callers after it list once.
TEST_F(NodeSlicesTest, AStaleViewIsListedOnceByTheFirstWhoAsks) {
  NodeSlices slices(Options(), client_.get());
  ASSERT_TRUE(slices.Slices(kTpus).ok());
  EXPECT_EQ(api_.resource_slice_lists(), 1);
  ASSERT_TRUE(slices.Slices(kGpus).ok());
  EXPECT_EQ(api_.resource_slice_lists(), 1) << "synced: from the view";
  api_.AddResourceSlice(SliceOf("made-meanwhile", kTpus));
  slices.MarkStale();
  absl::StatusOr<NodeSlices::View> view = slices.Slices(kTpus);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->slices.count("made-meanwhile"), 1u);
  ASSERT_TRUE(slices.Slices(kGpus).ok());
  EXPECT_EQ(api_.resource_slice_lists(), 2);
  api_.FailNextSliceRequests(500, 1);
  slices.MarkStale();
  view = slices.Slices(kTpus);
  EXPECT_FALSE(view.ok()) << "the list's error is the answer";
  EXPECT_FALSE(slices.status().last_error.empty());
  EXPECT_TRUE(slices.Slices(kTpus).ok()) << "and the next call lists again";
}

}  // namespace
}  // namespace edgeaccel
