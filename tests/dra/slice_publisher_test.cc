#include "edgeaccel/dra/slice_publisher.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "captured_log.h"
#include "eventually.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using nlohmann::json;
using testing::Occurrences;
using testing::TestApiServer;

constexpr char kDriver[] = "edgetpu.edgeaccel.io";

Device Tpu(const std::string& pci, Health health = Health::kHealthy) {
  Device device;
  device.id = pci;
  device.health = health;
  device.facts["interface"] = "pcie";
  device.facts["pci_address"] = pci;
  return device;
}

}  // namespace

// Outside the anonymous namespace: SlicePublisher names it a friend, for ReconcileOnce.
class SlicePublisherTest : public ::testing::Test {
 protected:
  SlicePublisherTest() {
    client_ = std::make_unique<ApiClient>(api_.ClientConfig(absl::Seconds(10)));
    set_.Update({Tpu("0000:03:00.0"), Tpu("0000:04:00.0")});
  }

  SlicePublisher::Options Options() {
    SlicePublisher::Options options;
    options.driver = kDriver;
    options.node_name = "node-1";
    options.initial_backoff = absl::Milliseconds(20);
    return options;
  }

  std::vector<json> Ours() {
    std::vector<json> ours;
    for (const json& slice : api_.ResourceSlices()) {
      if (slice["spec"]["driver"] == kDriver && slice["spec"]["nodeName"] == "node-1") ours.push_back(slice);
    }
    return ours;
  }

  // A publisher whose resync is an hour away (only changes, retries and its watch write),
  // started: its slice published and its watch open (a failure of either is the test's).
  std::unique_ptr<SlicePublisher> PublishingWithItsWatchOpen() {
    SlicePublisher::Options options = Options();
    options.resync = absl::Hours(1);
    auto publisher = std::make_unique<SlicePublisher>(options, client_.get(), &set_);
    publisher->Start();
    [&] {
      ASSERT_TRUE(
          api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }));
      ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
    }();
    return publisher;
  }

  // One reconcile from a fresh LIST on this thread (the worker's step), before Start().
  static absl::Status ReconcileOnce(SlicePublisher& publisher) {
    publisher.slices_->MarkStale();
    return publisher.Reconcile();
  }

  TestApiServer api_{"node-1"};
  std::unique_ptr<ApiClient> client_;
  DeviceSet set_{kDriver};
};

namespace {

TEST_F(SlicePublisherTest, CreatesOneSliceOwnedByTheNodeAndWritesOnlyOnChange) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  std::vector<json> ours = Ours();
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0]["spec"]["pool"]["name"], "node-1");
  EXPECT_EQ(ours[0]["spec"]["pool"]["generation"], 1);
  EXPECT_EQ(ours[0]["spec"]["devices"].size(), 2u);
  EXPECT_EQ(ours[0]["metadata"]["ownerReferences"][0]["uid"], api_.node_uid());
  const int writes = api_.resource_slice_writes();
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  EXPECT_EQ(api_.resource_slice_writes(), writes) << "nothing changed: nothing written";
  set_.Update({Tpu("0000:03:00.0"), Tpu("0000:04:00.0", Health::kUnhealthy)});
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  ours = Ours();
  ASSERT_EQ(ours.size(), 1u);
  ASSERT_EQ(ours[0]["spec"]["devices"].size(), 2u) << "an Unhealthy device stays, tainted";
  EXPECT_TRUE(ours[0]["spec"]["devices"][1].contains("taints"));
  EXPECT_EQ(ours[0]["spec"]["pool"]["generation"], 2) << "a new pool generation on every change";
}

Device HotTpu(const std::string& pci) {
  Device device = Tpu(pci, Health::kUnhealthy);
  device.unhealthy_reason = "temperature 95.05 °C is at or above 85.05 °C";
  device.problems = {{ProblemKind::kTemperature, "threshold-85C"}};
  return device;
}

// KEP-5055: a TPU over its temperature stays in the slice with a taint the API server keeps (and
// stamps with timeAdded); an unchanged taint is not written again; the taint goes when it cools.
TEST_F(SlicePublisherTest, AnUnhealthyDeviceStaysTaintedAndIsUntaintedWhenItRecovers) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  set_.Update({Tpu("0000:03:00.0"), HotTpu("0000:04:00.0")});
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  std::vector<json> ours = Ours();
  ASSERT_EQ(ours.size(), 1u);
  ASSERT_EQ(ours[0]["spec"]["devices"].size(), 2u);
  json hot = ours[0]["spec"]["devices"][1];
  EXPECT_EQ(hot["name"], "tpu-0000-04-00-0");
  ASSERT_EQ(hot["taints"].size(), 1u) << hot.dump();
  EXPECT_EQ(hot["taints"][0]["key"], "edgeaccel.io/temperature");
  EXPECT_EQ(hot["taints"][0]["value"], "threshold-85C");
  EXPECT_EQ(hot["taints"][0]["effect"], "NoSchedule");
  EXPECT_TRUE(hot["taints"][0].contains("timeAdded")) << "the API server stamps it";
  EXPECT_EQ(publisher.status().tainted, 1u);
  // The stored taint carries timeAdded, ours does not: that is no difference, and no write.
  const int writes = api_.resource_slice_writes();
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  EXPECT_EQ(api_.resource_slice_writes(), writes) << "an unchanged taint is not written again";
  EXPECT_EQ(Ours()[0]["spec"]["devices"][1]["taints"][0]["timeAdded"], hot["taints"][0]["timeAdded"]);
  set_.Update({Tpu("0000:03:00.0"), Tpu("0000:04:00.0")});  // it cooled down
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  ours = Ours();
  ASSERT_EQ(ours[0]["spec"]["devices"].size(), 2u);
  EXPECT_FALSE(ours[0]["spec"]["devices"][1].contains("taints")) << ours[0].dump();
  EXPECT_EQ(publisher.status().tainted, 0u);
}

// An API server with DRADeviceTaints off drops the taints and answers 200: a device the
// scheduler would then allocate. The publisher sees it in the answer, leaves Unhealthy devices
// out instead, and says so once.
TEST_F(SlicePublisherTest, WhereTheApiServerDropsTaintsUnhealthyDevicesAreLeftOutAndSaidOnce) {
  ::edgeaccel::testing::CapturedLog log;
  api_.DisableDeviceTaints();
  SlicePublisher publisher(Options(), client_.get(), &set_);
  set_.Update({Tpu("0000:03:00.0"), HotTpu("0000:04:00.0")});
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  std::vector<json> ours = Ours();
  ASSERT_EQ(ours.size(), 1u);
  ASSERT_EQ(ours[0]["spec"]["devices"].size(), 1u) << ours[0].dump();
  EXPECT_EQ(ours[0]["spec"]["devices"][0]["name"], "tpu-0000-03-00-0");
  EXPECT_TRUE(publisher.status().taints_dropped);
  const int writes = api_.resource_slice_writes();
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  EXPECT_EQ(api_.resource_slice_writes(), writes) << "nothing changed: nothing written";
  set_.Update({HotTpu("0000:03:00.0"), HotTpu("0000:04:00.0")});
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  EXPECT_TRUE(Ours()[0]["spec"]["devices"].empty());
  EXPECT_EQ(Occurrences(log.Text(), "does not keep device taints"), 1u) << log.Text();
}

// Taints are tried again as the watch is renewed: an API server whose gate is turned on later gets
// them without a restart of the daemon.
TEST_F(SlicePublisherTest, DroppedTaintsAreTriedAgainAsTheWatchIsRenewed) {
  api_.DisableDeviceTaints();
  SlicePublisher::Options options = Options();
  options.resync = absl::Hours(1);
  set_.Update({Tpu("0000:03:00.0"), HotTpu("0000:04:00.0")});
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) {
    return slices.size() == 1 && slices[0]["spec"]["devices"].size() == 1;
  }));
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  EXPECT_TRUE(publisher.status().taints_dropped);
  const int writes = api_.resource_slice_writes();
  api_.EndSliceWatches();  // renewed while the gate is still off: tried, dropped, left out again
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.resource_slice_watches() == 2; }));
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  // The publisher is told of the renewal and writes on its own worker, after the view's.
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.resource_slice_writes() >= writes + 2; }));
  EXPECT_EQ(Ours()[0]["spec"]["devices"].size(), 1u);
  EXPECT_EQ(api_.resource_slice_writes(), writes + 2) << "one try with taints, one without";
  api_.EnableDeviceTaints();
  api_.EndSliceWatches();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) {
    return slices.size() == 1 && slices[0]["spec"]["devices"].size() == 2 &&
           slices[0]["spec"]["devices"][1].contains("taints");
  }));
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return !publisher.status().taints_dropped; }));
  publisher.Stop();
}

TEST_F(SlicePublisherTest, AConflictIsReadAgainAndRetried) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  api_.ConflictNextSliceUpdates(2);
  set_.Update({Tpu("0000:03:00.0")});
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  EXPECT_EQ(publisher.status().conflicts, 2u);
  EXPECT_EQ(Ours()[0]["spec"]["devices"].size(), 1u);
}

TEST_F(SlicePublisherTest, ASecondSliceOfOursOnThisNodeIsDeleted) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  ASSERT_TRUE(ReconcileOnce(publisher).ok());
  json stray = Ours()[0];
  stray["metadata"].erase("name");
  stray["metadata"].erase("uid");
  stray["metadata"].erase("resourceVersion");
  stray["metadata"]["generateName"] = "node-1-edgetpu.edgeaccel.io-";
  stray["spec"]["pool"]["name"] = "node-1/old";  // a pool a former version published
  api_.AddResourceSlice(stray);
  ASSERT_EQ(Ours().size(), 2u);
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  ASSERT_EQ(Ours().size(), 1u);
  EXPECT_EQ(Ours()[0]["spec"]["pool"]["name"], "node-1");
}

// What the API server lists is another program's output: a slice of our pool whose fields have
// other types than the API gives them (another writer, a broken proxy) is answered, never thrown
// (json::value throws on a type mismatch, which would abort the daemon from the publisher's thread).
TEST_F(SlicePublisherTest, ListedSlicesWithFieldsOfOtherTypesAreAnsweredNotThrown) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  json odd = Ours()[0];
  api_.DeleteAllResourceSlices("node-1", kDriver);
  odd["metadata"].erase("uid");
  odd["metadata"].erase("resourceVersion");
  odd["spec"]["pool"]["generation"] = "7";
  odd["spec"]["pool"]["resourceSliceCount"] = json::array({1});
  api_.AddResourceSlice(odd);
  json stray = odd;
  stray["metadata"].erase("name");
  stray["metadata"]["generateName"] = "node-1-edgetpu.edgeaccel.io-";
  stray["spec"]["pool"] = "node-1/old";  // not even an object
  api_.AddResourceSlice(stray);
  ASSERT_EQ(Ours().size(), 2u);
  EXPECT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  std::vector<json> ours = Ours();
  ASSERT_EQ(ours.size(), 1u) << "the slice whose pool is not an object is not ours: it goes";
  EXPECT_TRUE(ours[0]["spec"]["pool"]["generation"].is_number_integer()) << "rewritten with a number";
  EXPECT_EQ(ours[0]["spec"]["pool"]["resourceSliceCount"], 1);
}

// The same for a listed device's taints: the stored side of the timeAdded comparison.
TEST_F(SlicePublisherTest, ListedTaintsOfOtherTypesAreAnsweredNotThrown) {
  SlicePublisher publisher(Options(), client_.get(), &set_);
  set_.Update({Tpu("0000:03:00.0"), HotTpu("0000:04:00.0")});
  ASSERT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  json odd = Ours()[0];
  api_.DeleteAllResourceSlices("node-1", kDriver);
  odd["metadata"].erase("uid");
  odd["metadata"].erase("resourceVersion");
  odd["spec"]["devices"][1]["taints"][0]["key"] = 7;
  odd["spec"]["devices"][1]["taints"][0]["value"] = json::array({"threshold-85C"});
  api_.AddResourceSlice(odd);
  EXPECT_TRUE(ReconcileOnce(publisher).ok()) << publisher.status().last_error;
  std::vector<json> ours = Ours();
  ASSERT_EQ(ours.size(), 1u);
  EXPECT_EQ(ours[0]["spec"]["devices"][1]["taints"][0]["key"], "edgeaccel.io/temperature")
      << "rewritten as it should be";
}

TEST_F(SlicePublisherTest, TheThreadPublishesChangesAtOnceAndRetriesFailures) {
  SlicePublisher::Options options = Options();
  options.resync = absl::Hours(1);  // only changes and retries may write
  SlicePublisher publisher(options, client_.get(), &set_);
  api_.FailNextSliceRequests(500, 3);
  publisher.Start();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }))
      << publisher.status().last_error;
  set_.Update({Tpu("0000:04:00.0")});
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) {
    return slices.size() == 1 && slices[0]["spec"]["devices"].size() == 1 &&
           slices[0]["spec"]["devices"][0]["name"] == "tpu-0000-04-00-0";
  }));
  // Someone deletes it (the kubelet at its start): a Resync (registration) puts it back.
  api_.DeleteAllResourceSlices("node-1");
  publisher.Resync();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }));
  publisher.Stop();
  EXPECT_EQ(Ours().size(), 1u) << "stopping leaves the slice";
}

// The driver's periodic chore (the claims cleanup) rides on the publisher's thread: first right
// after the first reconcile, then after the reconciles that come once chore_interval has passed.
TEST_F(SlicePublisherTest, TheChoreRunsAfterTheFirstReconcileAndThenEveryInterval) {
  SlicePublisher::Options options = Options();
  options.resync = absl::Milliseconds(25);
  absl::Mutex mu;
  std::vector<int> writes_seen;  // the slice writes each chore run saw
  options.chore = [&] {
    absl::MutexLock lock(&mu);
    writes_seen.push_back(api_.resource_slice_writes());
  };
  options.chore_interval = absl::Milliseconds(50);
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    absl::MutexLock lock(&mu);
    return writes_seen.size() >= 3;
  }));
  publisher.Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(writes_seen[0], 1) << "the slice was created before the first chore";
}

// The daemon cancels the API client first when it stops: what is cancelled is neither retried
// nor said as an error.
TEST_F(SlicePublisherTest, ACancelledClientIsNeitherRetriedNorSaid) {
  ::edgeaccel::testing::CapturedLog log;
  int chores = 0;
  SlicePublisher::Options options = Options();
  options.chore = [&] { ++chores; };
  client_->Cancel();
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  publisher.Resync();
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return !publisher.status().last_error.empty(); }));
  publisher.Stop();
  EXPECT_EQ(api_.resource_slice_writes(), 0);
  EXPECT_FALSE(log.Contains("cannot publish")) << log.Text();
  EXPECT_FALSE(log.Contains("owner reference")) << log.Text();
  EXPECT_EQ(chores, 0) << "no chore once stopping";
}

// Idle, the publisher holds one watch and sends nothing else; a slice someone else deletes or
// changes comes back from the watch's event, with no Resync and no second LIST.
TEST_F(SlicePublisherTest, AWatchKeepsTheViewAndPutsBackWhatOthersDeleteOrChange) {
  std::unique_ptr<SlicePublisher> publisher = PublishingWithItsWatchOpen();
  ASSERT_FALSE(HasFatalFailure());
  const int requests = api_.requests_received();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(api_.requests_received(), requests) << "idle: no request but the open watch";

  // Put back from the watch's events: no Resync, no LIST, and the resync is an hour away. (How
  // fast is the lab's and the bench's to say, not a unit test's.)
  api_.DeleteAllResourceSlices("node-1");
  EXPECT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }))
      << "a deleted slice is put back";

  json changed = Ours()[0];
  changed["spec"]["devices"] = json::array();
  api_.AddResourceSlice(changed);  // another writer's update of the same slice
  EXPECT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) {
    return slices.size() == 1 && slices[0]["spec"]["devices"].size() == 2;
  })) << "a changed slice is put back";
  EXPECT_EQ(publisher->status().lists, 1u) << "the view came from one LIST and the watch";
  EXPECT_EQ(publisher->status().conflicts, 0u);
  publisher->Stop();
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 0; }))
      << "Stop ends the watch";
}

// A watch the server ends is renewed from where the view is, without a LIST; only a 410 (the
// version compacted away) lists again. A bookmark moves the view on where nothing of ours changed.
TEST_F(SlicePublisherTest, AWatchIsRenewedFromItsVersionAndListedAgainOnlyOn410) {
  std::unique_ptr<SlicePublisher> publisher = PublishingWithItsWatchOpen();
  ASSERT_FALSE(HasFatalFailure());
  const int writes = api_.resource_slice_writes();

  api_.EndSliceWatches();  // timeoutSeconds
  ASSERT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return api_.resource_slice_watches() == 2 && api_.open_slice_watches() == 1; }));
  EXPECT_EQ(publisher->status().lists, 1u);

  // That a bookmark tells no publisher is NodeSlicesTest's to say: here the renewal's own sync may
  // still be on its way, so a count of syncs read now would not be the bookmark's.
  const std::string before = publisher->status().resource_version;
  api_.BookmarkSliceWatches();
  ASSERT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return publisher->status().resource_version != before; }));
  api_.CompactSliceHistory();  // the bookmark's version is the oldest kept: still good
  api_.EndSliceWatches();
  ASSERT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return api_.resource_slice_watches() == 3 && api_.open_slice_watches() == 1; }));
  EXPECT_EQ(publisher->status().lists, 1u) << "a bookmark spares a LIST";

  set_.Update({Tpu("0000:03:00.0")});  // our own write: a new version the watch shows us
  ASSERT_TRUE(api_.WaitForResourceSlices(
      [](const std::vector<json>& slices) { return slices.size() == 1 && slices[0]["spec"]["devices"].size() == 1; }));
  // Changes the node's watch does not see (another node's slices; the slices of another driver
  // on this node it does see, and they move the view on).
  api_.AddResourceSlice(json{{"metadata", {{"name", "unrelated"}}},
                             {"spec", {{"driver", "other.example.com"}, {"nodeName", "node-2"}}}});
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  api_.CompactSliceHistory();
  api_.AddResourceSlice(json{{"metadata", {{"name", "unrelated-2"}}},
                             {"spec", {{"driver", "other.example.com"}, {"nodeName", "node-2"}}}});
  api_.CompactSliceHistory();  // the view's version is older than the history now
  api_.EndSliceWatches();
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return publisher->status().lists == 2; }))
      << "410 Expired: listed again";
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  EXPECT_EQ(api_.resource_slice_writes(), writes + 1) << "only the device change was written";
  EXPECT_TRUE(publisher->status().last_error.empty()) << publisher->status().last_error;
}

// A device change is published while the watch stays open: one watch for the publisher's life
// while the server does not end it, however often the devices change.
TEST_F(SlicePublisherTest, ADeviceChangeIsPublishedWithTheWatchLeftOpen) {
  SlicePublisher::Options options = Options();
  options.resync = absl::Hours(1);
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  for (size_t devices : {1u, 2u, 1u}) {
    set_.Update(devices == 1 ? std::vector<Device>{Tpu("0000:03:00.0")}
                             : std::vector<Device>{Tpu("0000:03:00.0"), Tpu("0000:04:00.0")});
    ASSERT_TRUE(api_.WaitForResourceSlices([&](const std::vector<json>& slices) {
      return slices.size() == 1 && slices[0]["spec"]["devices"].size() == devices;
    }));
  }
  // Our own writes' events came back on the watch and changed nothing.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(api_.resource_slice_watches(), 1);
  EXPECT_EQ(api_.open_slice_watches(), 1);
  EXPECT_EQ(publisher.status().lists, 1u);
  EXPECT_EQ(publisher.status().generation, 4) << "created, then three changes";
  publisher.Stop();
}

// A watch the server ends at once with nothing in it (a proxy that cuts long requests) is asked
// again after a backoff, not at once: without it, every node would open one TLS connection after
// another as fast as it could. Said once.
TEST_F(SlicePublisherTest, AWatchEndedAtOnceIsRetriedAfterTheBackoffNotAtOnce) {
  ::edgeaccel::testing::CapturedLog log;
  api_.EndSliceWatchesAtOnce(true);
  SlicePublisher::Options options = Options();
  options.resync = absl::Hours(1);
  options.initial_backoff = absl::Milliseconds(100);
  options.max_backoff = absl::Milliseconds(400);
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }));
  absl::SleepFor(absl::Seconds(1));
  // 100, 200, 400, 400 ms: at most 5 in the second (jitter 20%); at once, hundreds.
  EXPECT_LE(api_.resource_slice_watches(), 6);
  EXPECT_GE(api_.resource_slice_watches(), 2);
  api_.EndSliceWatchesAtOnce(false);
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 1; }));
  EXPECT_EQ(publisher.status().lists, 1u) << "the view stays: only the watch is asked again";
  publisher.Stop();
  EXPECT_EQ(log.Count("watch at once"), 1) << log.Text();
}

// A role without `watch` (an install from before watches): the publisher says so once and lists
// every resync instead, still putting back what others delete.
TEST_F(SlicePublisherTest, AWatchRefusedFallsBackToListingEveryResync) {
  ::edgeaccel::testing::CapturedLog log;
  api_.RefuseSliceWatches(403);
  SlicePublisher::Options options = Options();
  options.resync = absl::Milliseconds(50);
  SlicePublisher publisher(options, client_.get(), &set_);
  publisher.Start();
  ASSERT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }));
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return publisher.status().lists >= 3; }));
  EXPECT_TRUE(publisher.status().watch_refused);
  EXPECT_EQ(api_.resource_slice_watches(), 1) << "refused once, not asked again";
  api_.DeleteAllResourceSlices("node-1");
  EXPECT_TRUE(api_.WaitForResourceSlices([](const std::vector<json>& slices) { return slices.size() == 1; }));
  publisher.Stop();
  EXPECT_EQ(log.Count("refuses to watch ResourceSlices"), 1) << log.Text();
}

}  // namespace
}  // namespace edgeaccel
