#include "edgeaccel/dra/claim_preparer.h"
#include "edgeaccel/dra/resource_slice.h"

#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/tegra.h"
#include "edgeaccel/host/host.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using nlohmann::json;
using testing::FixtureHost;
using testing::TempDir;
using testing::PathExists;
using testing::ReadFileText;
using testing::CapturedLog;
using testing::TestApiServer;

constexpr char kDriver[] = "edgetpu.edgeaccel.io";
constexpr char kUid[] = "0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01";

// Two Edge TPUs on a fixture host, their device set, and claims the "API server" (a map) holds.
// A preparer's options for `driver`'s pool on node-1, writing CDI specs to `cdi_dir` and its
// checkpoint to `state_dir`, reading claims with `fetch_claim`.
ClaimPreparer::Options NodeOneOptions(const std::string& driver, const std::string& cdi_dir,
                                      const std::string& state_dir,
                                      decltype(ClaimPreparer::Options::fetch_claim) fetch_claim) {
  ClaimPreparer::Options options;
  options.fetch_claim = std::move(fetch_claim);
  options.driver = driver;
  options.pool = "node-1";
  options.cdi_dir = cdi_dir;
  options.state_dir = state_dir;
  return options;
}

// What the API server answers for claim `name`, stored under `key`: its JSON, or NotFound once
// it is gone.
absl::StatusOr<std::string> StoredClaim(const std::map<std::string, json>& claims,
                                        const std::string& key, const std::string& name) {
  auto it = claims.find(key);
  if (it == claims.end()) {
    return absl::NotFoundError("ResourceClaim " + name + " does not exist (any more)");
  }
  return it->second.dump();
}

class ClaimPreparerTest : public ::testing::Test {
 protected:
  ClaimPreparerTest() : host_(fixture_.root()), discoverer_(&host_, CoralHealthPolicy{}) {
    fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
    fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
    Rescan();
  }

  void Rescan() {
    std::vector<Device> devices = discoverer_.Scan();
    LookUpHostModes(host_, &devices);
    set_.Update(devices);
  }

  ClaimPreparer::Options Options() {
    return NodeOneOptions(kDriver, cdi_.path(), state_.path(), [this](const ClaimRef& claim) {
      absl::MutexLock lock(&api_mu_);
      ++fetches_;
      return StoredClaim(api_, claim.namespace_name + "/" + claim.name, claim.name);
    });
  }

  std::unique_ptr<ClaimPreparer> MakePreparer() { return MakePreparer(Options()); }
  std::unique_ptr<ClaimPreparer> MakePreparer(const ClaimPreparer::Options& options) {
    auto preparer = std::make_unique<ClaimPreparer>(options, &set_);
    preparer->Start().IgnoreError();
    return preparer;
  }

  void Allocate(const std::string& name, const std::string& uid, std::vector<std::string> devices) {
    json results = json::array();
    for (const std::string& device : devices) {
      results.push_back({{"request", "tpu"}, {"driver", kDriver}, {"pool", "node-1"}, {"device", device}});
    }
    api_["default/" + name] = {{"kind", "ResourceClaim"},
                               {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", uid}}},
                               {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
  }

  std::string SpecPath(const std::string& uid) const {
    return cdi_.path() + "/k8s.edgetpu.edgeaccel.io-claim_" + uid + ".json";
  }

  FixtureHost fixture_;
  Host host_;
  CoralPcieDiscoverer discoverer_;
  DeviceSet set_{kDriver};
  TempDir cdi_, state_;
  absl::Mutex api_mu_;
  std::map<std::string, json> api_;
  int fetches_ = 0;
};

TEST_F(ClaimPreparerTest, PreparesAClaimWithItsOwnCdiSpecAndAnswersItsIds) {
  Allocate("pod-tpu", kUid, {"tpu-0000-04-00-0"});
  auto preparer = MakePreparer();
  auto answer = preparer->Prepare({{"default", "pod-tpu", kUid}});
  ASSERT_EQ(answer.size(), 1u);
  const ClaimOutcome& outcome = answer[kUid];
  ASSERT_EQ(outcome.error, "");
  ASSERT_EQ(outcome.devices.size(), 1u);
  EXPECT_EQ(outcome.devices[0].device, "tpu-0000-04-00-0");
  EXPECT_EQ(outcome.devices[0].pool, "node-1");
  EXPECT_EQ(outcome.devices[0].requests, std::vector<std::string>{"tpu"});
  EXPECT_EQ(outcome.devices[0].cdi_ids,
            std::vector<std::string>{std::string("k8s.edgetpu.edgeaccel.io/claim=") + kUid + "-tpu-0000-04-00-0"});
  json spec = json::parse(ReadFileText(SpecPath(kUid)));
  EXPECT_EQ(spec["kind"], "k8s.edgetpu.edgeaccel.io/claim");
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], std::string(kUid) + "-tpu-0000-04-00-0");
  const json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0]["path"], "/dev/apex_1") << "exactly the allocated device, nothing else";
  struct stat host_node;
  ASSERT_EQ(stat(fixture_.Path("/dev/apex_1").c_str(), &host_node), 0);
  EXPECT_EQ(nodes[0]["fileMode"], host_node.st_mode & 0777) << "the host node's mode";
}

// KEP-5004 (DRAExtendedResource, beta in 1.36): for a pod with a plain resources.limits
// {coral.ai/edgetpu: 1} the scheduler makes the claim itself. Its shape, from kubernetes/
// kubernetes pkg/scheduler/framework/plugins/dynamicresources (extended resources) and
// k8s.io/api resource/v1 (ExtendedResourceClaimAnnotation): generateName "<pod>-extended-
// resources-", owned by the Pod, annotated resource.kubernetes.io/extended-resource-claim: "true"
// and without resource.kubernetes.io/pod-claim-name (no pod.spec.resourceClaims entry names it),
// one request per container and extended resource named "container-<i>-request-<j>" (the KEP's
// text says the same), and it is recorded in pod.status.extendedResourceClaimStatus. Prepare
// must treat it as any other claim: nothing is read from annotations, request names are passed on.
TEST_F(ClaimPreparerTest, TheSchedulersExtendedResourceClaimIsPreparedLikeAnyOther) {
  constexpr char kExtendedUid[] = "7f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
  const std::string name = "infer-0-extended-resources-x7k2q";
  json results = json::array();
  results.push_back({{"request", "container-0-request-0"}, {"driver", kDriver}, {"pool", "node-1"},
                     {"device", "tpu-0000-03-00-0"}});
  results.push_back({{"request", "container-1-request-0"}, {"driver", kDriver}, {"pool", "node-1"},
                     {"device", "tpu-0000-04-00-0"}});
  json requests = json::array();
  for (const char* request : {"container-0-request-0", "container-1-request-0"}) {
    requests.push_back({{"name", request},
                        {"exactly", {{"deviceClassName", "edgetpu.edgeaccel.io"},
                                     {"allocationMode", "ExactCount"}, {"count", 1}}}});
  }
  api_["default/" + name] = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata",
       {{"name", name},
        {"generateName", "infer-0-extended-resources-"},
        {"namespace", "default"},
        {"uid", kExtendedUid},
        {"annotations", {{"resource.kubernetes.io/extended-resource-claim", "true"}}},
        {"ownerReferences", json::array({{{"apiVersion", "v1"}, {"kind", "Pod"}, {"name", "infer-0"},
                                          {"uid", "5b0c6a1e-2f3d-4e5f-9a8b-7c6d5e4f3a2b"},
                                          {"controller", true}, {"blockOwnerDeletion", true}}})}}},
      {"spec", {{"devices", {{"requests", requests}}}}},
      {"status",
       {{"allocation",
         {{"devices", {{"results", results}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             json::array({{{"matchFields", json::array({{{"key", "metadata.name"},
                                                         {"operator", "In"},
                                                         {"values", json::array({"node-1"})}}})}}})}}}}},
        {"reservedFor", json::array({{{"resource", "pods"}, {"name", "infer-0"},
                                      {"uid", "5b0c6a1e-2f3d-4e5f-9a8b-7c6d5e4f3a2b"}}})}}}};
  auto preparer = MakePreparer();
  auto answer = preparer->Prepare({{"default", name, kExtendedUid}});
  const ClaimOutcome& outcome = answer[kExtendedUid];
  ASSERT_EQ(outcome.error, "");
  ASSERT_EQ(outcome.devices.size(), 2u);
  std::map<std::string, std::vector<std::string>> requests_by_device;
  for (const auto& device : outcome.devices) requests_by_device[device.device] = device.requests;
  // The kubelet hands each container the devices of the request its extendedResourceClaimStatus
  // names: the names must come back exactly as the scheduler wrote them.
  EXPECT_EQ(requests_by_device["tpu-0000-03-00-0"], std::vector<std::string>{"container-0-request-0"});
  EXPECT_EQ(requests_by_device["tpu-0000-04-00-0"], std::vector<std::string>{"container-1-request-0"});
  EXPECT_TRUE(PathExists(SpecPath(kExtendedUid)));
  EXPECT_EQ(preparer->Unprepare({{"default", name, kExtendedUid}})[kExtendedUid], "");
  EXPECT_FALSE(PathExists(SpecPath(kExtendedUid)));
}

TEST_F(ClaimPreparerTest, APreparedClaimIsAnsweredAgainWithoutAskingTheApiServer) {
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  auto preparer = MakePreparer();
  auto first = preparer->Prepare({{"default", "pod-tpu", kUid}});
  ASSERT_EQ(first[kUid].error, "");
  api_.clear();  // the claim may be gone from the API server by now
  auto again = preparer->Prepare({{"default", "pod-tpu", kUid}});
  EXPECT_EQ(again[kUid].error, "");
  EXPECT_EQ(again[kUid].devices, first[kUid].devices);
  EXPECT_EQ(fetches_, 1);
  // A new process (the daemon stopped and started between prepare and unprepare) answers the
  // same. (One that crashed before the devices' write finds a pending record instead: see
  // APrepareUnderWayWhenTheDaemonStoppedIsFinishedOrForgottenAtStart.)
  preparer->Stop();
  auto restarted = MakePreparer();
  auto third = restarted->Prepare({{"default", "pod-tpu", kUid}});
  EXPECT_EQ(third[kUid].error, "");
  EXPECT_EQ(third[kUid].devices, first[kUid].devices);
  EXPECT_EQ(fetches_, 1);
  // And unprepares exactly what the first one wrote, with the claim gone.
  auto undone = restarted->Unprepare({{"default", "pod-tpu", kUid}});
  EXPECT_EQ(undone[kUid], "");
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_TRUE(restarted->Prepared().empty());
  restarted->Stop();
  EXPECT_TRUE(MakePreparer()->Prepared().empty());
}

TEST_F(ClaimPreparerTest, AMissingSpecIsWrittenAgainAtStart) {
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  ASSERT_EQ(MakePreparer()->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  ASSERT_EQ(unlink(SpecPath(kUid).c_str()), 0);  // /var/run is a tmpfs: a reboot empties it
  auto restarted = MakePreparer();
  EXPECT_TRUE(PathExists(SpecPath(kUid)));
  EXPECT_EQ(restarted->Prepared().size(), 1u);
}

TEST_F(ClaimPreparerTest, EachClaimFailsOnItsOwnWithTheReason) {
  const std::string ok_uid = "11111111-1111-1111-1111-111111111111";
  const std::string gone_uid = "22222222-2222-2222-2222-222222222222";
  const std::string replaced_uid = "33333333-3333-3333-3333-333333333333";
  const std::string unknown_uid = "44444444-4444-4444-4444-444444444444";
  Allocate("ok", ok_uid, {"tpu-0000-03-00-0"});
  Allocate("replaced", "some-other-uid", {"tpu-0000-03-00-0"});
  Allocate("unknown", unknown_uid, {"tpu-0000-09-00-0"});
  auto preparer = MakePreparer();
  auto answer = preparer->Prepare({{"default", "ok", ok_uid},
                                   {"default", "gone", gone_uid},
                                   {"default", "replaced", replaced_uid},
                                   {"default", "unknown", unknown_uid},
                                   {"default", "bad", "../../etc"}});
  ASSERT_EQ(answer.size(), 5u) << "every claim of the request has an entry";
  EXPECT_EQ(answer[ok_uid].error, "");
  EXPECT_NE(answer[gone_uid].error.find("does not exist"), std::string::npos) << answer[gone_uid].error;
  EXPECT_NE(answer[replaced_uid].error.find("deleted and made again"), std::string::npos);
  EXPECT_NE(answer[unknown_uid].error.find("device tpu-0000-09-00-0 is not on this node"), std::string::npos)
      << answer[unknown_uid].error;
  EXPECT_NE(answer["../../etc"].error.find("is not a UID"), std::string::npos);
  EXPECT_FALSE(PathExists(SpecPath(unknown_uid)));
}

TEST_F(ClaimPreparerTest, RefusesAnUnhealthyDeviceAndOneAnotherClaimHolds) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  const std::string third = "66666666-6666-6666-6666-666666666666";
  Allocate("first", kUid, {"tpu-0000-03-00-0"});
  Allocate("second", second, {"tpu-0000-03-00-0"});
  Allocate("third", third, {"tpu-0000-04-00-0"});
  auto preparer = MakePreparer();
  ASSERT_EQ(preparer->Prepare({{"default", "first", kUid}})[kUid].error, "");
  std::string held = preparer->Prepare({{"default", "second", second}})[second].error;
  EXPECT_NE(held.find("is prepared for claim default/first"), std::string::npos) << held;
  fixture_.SetApexAttribute(1, "status", "DEAD");
  Rescan();
  std::string unhealthy = preparer->Prepare({{"default", "third", third}})[third].error;
  EXPECT_NE(unhealthy.find("device tpu-0000-04-00-0 is Unhealthy"), std::string::npos) << unhealthy;
}

// An Unhealthy device is published with taints; the scheduler gives it to a request whose
// tolerations tolerate them, or one with adminAccess. Prepare honours that, and refuses it to a
// claim that tolerates only some of them, or none.
TEST_F(ClaimPreparerTest, AnUnhealthyDeviceGoesToAClaimThatToleratesItsTaintsOrAsksAdminAccess) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  const std::string third = "66666666-6666-6666-6666-666666666666";
  const std::string fourth = "77777777-7777-7777-7777-777777777777";
  fixture_.SetApexAttribute(1, "status", "DEAD");  // tpu-0000-04-00-0: taint driver-status
  Rescan();
  Allocate("tolerates", kUid, {"tpu-0000-04-00-0"});
  api_["default/tolerates"]["status"]["allocation"]["devices"]["results"][0]["tolerations"] =
      json::array({{{"key", kTaintDriverStatus}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  Allocate("admin", second, {"tpu-0000-04-00-0"});
  api_["default/admin"]["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = true;
  Allocate("wrong-key", third, {"tpu-0000-04-00-0"});
  api_["default/wrong-key"]["status"]["allocation"]["devices"]["results"][0]["tolerations"] =
      json::array({{{"key", kTaintTemperature}, {"operator", "Exists"}}});
  Allocate("wrong-value", fourth, {"tpu-0000-04-00-0"});
  api_["default/wrong-value"]["status"]["allocation"]["devices"]["results"][0]["tolerations"] =
      json::array({{{"key", kTaintDriverStatus}, {"value", "ALIVE"}}});
  auto preparer = MakePreparer();
  EXPECT_EQ(preparer->Prepare({{"default", "tolerates", kUid}})[kUid].error, "");
  EXPECT_EQ(preparer->Unprepare({{"default", "tolerates", kUid}})[kUid], "");
  EXPECT_EQ(preparer->Prepare({{"default", "admin", second}})[second].error, "");
  for (const auto& [name, uid] : {std::pair<std::string, std::string>{"wrong-key", third}, {"wrong-value", fourth}}) {
    const std::string error = preparer->Prepare({{"default", name, uid}})[uid].error;
    EXPECT_NE(error.find("is Unhealthy"), std::string::npos) << name << ": " << error;
    EXPECT_NE(error.find("does not tolerate its taints"), std::string::npos) << name << ": " << error;
  }
}

TEST(TolerationTest, MatchesAsTheSchedulerDoes) {
  EXPECT_TRUE(Tolerates({"", "Exists", "", ""}, "k", "v", "NoExecute"));
  EXPECT_TRUE(Tolerates({"k", "Exists", "", ""}, "k", "v", "NoSchedule"));
  EXPECT_FALSE(Tolerates({"k", "Exists", "", "NoSchedule"}, "k", "v", "NoExecute"));
  EXPECT_TRUE(Tolerates({"k", "", "v", ""}, "k", "v", "NoExecute"));  // Equal by default
  EXPECT_TRUE(Tolerates({"k", "Equal", "", ""}, "k", "", "NoSchedule"));
  EXPECT_FALSE(Tolerates({"k", "Equal", "w", ""}, "k", "v", "NoSchedule"));
  EXPECT_FALSE(Tolerates({"j", "Exists", "", ""}, "k", "v", "NoSchedule"));
}

TEST_F(ClaimPreparerTest, UnprepareOfAnUnknownClaimIsDone) {
  auto preparer = MakePreparer();
  auto answer = preparer->Unprepare({{"default", "never", kUid}});
  EXPECT_EQ(answer[kUid], "");
}

TEST_F(ClaimPreparerTest, TheClaimsOfOneCallAreReadFromTheApiServerAtTheSameTime) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("first", kUid, {"tpu-0000-03-00-0"});
  Allocate("second", second, {"tpu-0000-04-00-0"});
  // Each read waits (up to 3 s) until the other one is in flight too: read one after the other,
  // the first never sees the second.
  std::atomic<int> in_flight{0}, most{0};
  ClaimPreparer::Options options = Options();
  auto read = options.fetch_claim;
  options.fetch_claim = [&, read](const ClaimRef& claim) -> absl::StatusOr<std::string> {
    const int now = ++in_flight;
    int seen = most.load();
    while (seen < now && !most.compare_exchange_weak(seen, now)) {
    }
    ::edgeaccel::testing::Eventually([&] { return most.load() >= 2; }, absl::Seconds(3));
    --in_flight;
    return read(claim);
  };
  auto preparer = MakePreparer(options);
  auto answer = preparer->Prepare({{"default", "first", kUid}, {"default", "second", second}});
  EXPECT_EQ(most.load(), 2) << "the second claim was read only after the first";
  EXPECT_EQ(answer[kUid].error, "");
  EXPECT_EQ(answer[second].error, "");
}

// How many times the checkpoint in `dir` was replaced since the last call (each write renames
// a new file over it), seen through inotify as it happens. (The creation of each write's
// temporary file is watched too: inotify merges an event into an identical one still unread, so
// renames alone, one after another, would read as one.)
class CheckpointWrites {
 public:
  explicit CheckpointWrites(const std::string& dir) : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    inotify_add_watch(fd_, dir.c_str(), IN_CREATE | IN_MOVED_TO);
  }
  ~CheckpointWrites() { close(fd_); }
  int Take() {
    int writes = 0;
    alignas(inotify_event) char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof(buf))) > 0) {
      for (char* at = buf; at < buf + n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(at);
        if ((event->mask & IN_MOVED_TO) != 0 && event->len > 0 &&
            std::string(event->name) == "checkpoint.json") {
          ++writes;
        }
        at += sizeof(inotify_event) + event->len;
      }
    }
    return writes;
  }

 private:
  const int fd_;
};

// A kubelet call's claims are recorded with at most two writes of the checkpoint however many
// claims it has (each fsync costs a pod's start tens of ms on an SD card): their pending records
// while they are read, then their devices (one write, where the read ended before the first
// began); unprepared with one. A device that an earlier claim of the same call took is held as a
// recorded one is.
TEST_F(ClaimPreparerTest, TheClaimsOfOneCallAreRecordedWithAtMostTwoWritesAndUnpreparedWithOne) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  const std::string third = "66666666-6666-6666-6666-666666666666";
  Allocate("first", kUid, {"tpu-0000-03-00-0"});
  Allocate("second", second, {"tpu-0000-04-00-0"});
  Allocate("third", third, {"tpu-0000-03-00-0"});  // the first's device, not shared
  auto preparer = MakePreparer();
  CheckpointWrites writes(state_.path());
  auto answer = preparer->Prepare(
      {{"default", "first", kUid}, {"default", "second", second}, {"default", "third", third}});
  EXPECT_EQ(answer[kUid].error, "");
  EXPECT_EQ(answer[second].error, "");
  EXPECT_NE(answer[third].error.find("is prepared for claim default/first"), std::string::npos)
      << answer[third].error;
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  const int prepare_writes = writes.Take();
  EXPECT_GE(prepare_writes, 1);
  EXPECT_LE(prepare_writes, 2) << "three claims";
  EXPECT_EQ(preparer->Prepared().size(), 2u);
  EXPECT_TRUE(PathExists(SpecPath(kUid)));
  EXPECT_FALSE(PathExists(SpecPath(third)));

  auto unprepared = preparer->Unprepare(
      {{"default", "first", kUid}, {"default", "second", second}, {"default", "third", third}});
  EXPECT_EQ(unprepared[kUid], "");
  EXPECT_EQ(unprepared[second], "");
  EXPECT_EQ(unprepared[third], "") << "never prepared: done";
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  EXPECT_EQ(writes.Take(), 1) << "two claims forgotten, one write";
  EXPECT_TRUE(preparer->Prepared().empty());
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_TRUE(preparer->Unprepare({{"default", "first", kUid}})[kUid].empty());
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  EXPECT_EQ(writes.Take(), 0) << "nothing recorded: nothing written";
}

// Where that one write fails, every claim of the call fails with the reason, and none is left
// half-prepared: no spec, no record.
TEST_F(ClaimPreparerTest, ACallWhoseCheckpointCannotBeWrittenPreparesNone) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("first", kUid, {"tpu-0000-03-00-0"});
  Allocate("second", second, {"tpu-0000-04-00-0"});
  auto preparer = MakePreparer();
  ASSERT_EQ(mkdir((state_.path() + "/.checkpoint.json.tmp").c_str(), 0755), 0);
  auto answer = preparer->Prepare({{"default", "first", kUid}, {"default", "second", second}});
  for (const std::string& uid : {std::string(kUid), second}) {
    EXPECT_NE(answer[uid].error.find("as prepared: cannot write"), std::string::npos) << answer[uid].error;
    EXPECT_TRUE(answer[uid].devices.empty());
    EXPECT_FALSE(PathExists(SpecPath(uid)));
  }
  EXPECT_TRUE(preparer->Prepared().empty());
  ASSERT_EQ(rmdir((state_.path() + "/.checkpoint.json.tmp").c_str()), 0);
  answer = preparer->Prepare({{"default", "first", kUid}, {"default", "second", second}});
  EXPECT_EQ(answer[kUid].error, "") << "the kubelet's next try";
  EXPECT_EQ(answer[second].error, "");
}

TEST_F(ClaimPreparerTest, AClaimWithNoneOfOurDevicesGetsNeitherASpecNorARecord) {
  // Allocated, but only another driver's device: the kubelet still asks every driver it names.
  api_["default/other"] = {
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", "other"}, {"namespace", "default"}, {"uid", kUid}}},
      {"status",
       {{"allocation",
         {{"devices",
           {{"results", json::array({{{"request", "gpu"}, {"driver", "gpu.example.com"},
                                       {"pool", "node-1"}, {"device", "gpu-0"}}})}}}}}}}};
  auto preparer = MakePreparer();
  auto answer = preparer->Prepare({{"default", "other", kUid}});
  EXPECT_EQ(answer[kUid].error, "");
  EXPECT_TRUE(answer[kUid].devices.empty());
  EXPECT_TRUE(preparer->Prepared().empty()) << "nothing of ours to remember";
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  // Nor does the next start write one (CDI refuses a spec without devices).
  preparer->Stop();
  auto restarted = MakePreparer();
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_TRUE(restarted->Prepared().empty());
  EXPECT_EQ(restarted->Unprepare({{"default", "other", kUid}})[kUid], "");
}

TEST_F(ClaimPreparerTest, ARecordWithoutDevicesAndItsEmptySpecAreRemovedAtStart) {
  // What an earlier version left: a record with no devices, and the spec it wrote for it at a
  // later start, with "devices": [] (which CDI refuses: containerd then loads no spec of the dir).
  PreparedClaim empty;
  empty.claim = {"default", "other", kUid};
  empty.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_" + std::string(kUid) + ".json";
  std::ofstream(state_.path() + "/checkpoint.json") << PreparedClaimsJson(kDriver, {{kUid, empty}});
  std::ofstream(SpecPath(kUid)) << "{\"cdiVersion\": \"0.5.0\", \"kind\": \"k8s.edgetpu.edgeaccel.io/claim\", "
                                   "\"devices\": [\n  ]\n}\n";
  auto preparer = MakePreparer();
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_TRUE(preparer->Prepared().empty());
  EXPECT_EQ(ReadFileText(state_.path() + "/checkpoint.json").find(kUid), std::string::npos);
}

TEST_F(ClaimPreparerTest, ACheckpointKeyThatIsNotAClaimUidNeverBecomesAPath) {
  // A key that would climb out of the CDI directory once the directories it names exist.
  const std::string cdi = cdi_.path() + "/run/cdi";
  const std::string key = "a/../../escaped";
  for (const std::string& dir : {cdi_.path() + "/run", cdi, cdi + "/k8s.edgetpu.edgeaccel.io-claim_a",
                                 cdi + "/.k8s.edgetpu.edgeaccel.io-claim_a"}) {
    mkdir(dir.c_str(), 0755);
  }
  PreparedClaim bad;
  bad.claim = {"default", "bad", key};
  bad.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_a.json";
  bad.devices.push_back({{"tpu"}, "node-1", "tpu-0000-03-00-0", "0000:03:00.0", {"x/y=z"}});
  std::ofstream(state_.path() + "/checkpoint.json") << PreparedClaimsJson(kDriver, {{key, bad}});
  ClaimPreparer::Options options = Options();
  options.cdi_dir = cdi;
  auto preparer = MakePreparer(options);
  EXPECT_FALSE(PathExists(cdi_.path() + "/run/escaped.json")) << "a spec was written outside the CDI directory";
  EXPECT_TRUE(preparer->Prepared().empty());
}

TEST_F(ClaimPreparerTest, AClaimTheApiServerDoesNotAnswerInTimeFailsAloneAtTheReadTimeout) {
  const std::string slow_uid = "55555555-5555-5555-5555-555555555555";
  Allocate("ok", kUid, {"tpu-0000-03-00-0"});
  Allocate("slow", slow_uid, {"tpu-0000-04-00-0"});
  absl::Notification release;
  ClaimPreparer::Options options = Options();
  auto read = options.fetch_claim;
  options.fetch_claim = [&, read](const ClaimRef& claim) -> absl::StatusOr<std::string> {
    if (claim.name == "slow") release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return read(claim);
  };
  options.read_timeout = absl::Milliseconds(200);
  auto preparer = MakePreparer(options);
  const absl::Time start = absl::Now();
  auto answer = preparer->Prepare({{"default", "ok", kUid}, {"default", "slow", slow_uid}});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "half the slow read's 10 s: its timeout ended it";
  EXPECT_EQ(answer[kUid].error, "");
  EXPECT_EQ(answer[slow_uid].error,
            "the API server did not answer the read of ResourceClaim default/slow within 200ms");
  EXPECT_FALSE(PathExists(SpecPath(slow_uid)));
  release.Notify();  // the late answer goes nowhere; the preparer joins its thread when it goes
  preparer.reset();
}

TEST_F(ClaimPreparerTest, AStoppingDriverReadsNothingAndSaysNoErrors) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  Allocate("other", second, {"tpu-0000-04-00-0"});
  ASSERT_EQ(MakePreparer()->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  const int fetched = fetches_;
  CapturedLog log;
  // The API client cancelled (the daemon's stop begins with it): every read ends with CANCELLED.
  ClaimPreparer::Options options = Options();
  options.fetch_claim = [](const ClaimRef&) -> absl::StatusOr<std::string> {
    return absl::CancelledError("the API client was cancelled");
  };
  auto cancelled = MakePreparer(options);  // the same checkpoint
  EXPECT_NE(cancelled->Prepare({{"default", "other", second}})[second].error.find("stopping"), std::string::npos);
  EXPECT_TRUE(absl::IsCancelled(cancelled->Cleanup().error));
  EXPECT_EQ(cancelled->Prepared().size(), 1u);
  cancelled.reset();
  // Stopped: nothing is read at all.
  auto stopped = MakePreparer();
  stopped->Stop();
  EXPECT_NE(stopped->Prepare({{"default", "other", second}})[second].error.find("stopping"), std::string::npos);
  EXPECT_TRUE(absl::IsCancelled(stopped->Cleanup().error));
  EXPECT_EQ(stopped->Prepared().size(), 1u);
  EXPECT_EQ(fetches_, fetched);
  EXPECT_FALSE(log.Contains("cannot prepare")) << log.Text();
  EXPECT_FALSE(log.Contains("cannot tell")) << log.Text();
}

TEST_F(ClaimPreparerTest, CleanupUnpreparesClaimsGoneMadeAgainOrDeallocatedAndKeepsTheRest) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("gone", kUid, {"tpu-0000-03-00-0"});
  Allocate("replaced", second, {"tpu-0000-04-00-0"});
  DraCounters counters;
  std::vector<std::string> events;
  ClaimPreparer::Options options = Options();
  options.counters = &counters;
  options.on_event = [&](const std::string& reason, const std::string& message) {
    events.push_back(reason + ": " + message);
  };
  auto preparer = MakePreparer(options);
  ASSERT_EQ(preparer->Prepare({{"default", "gone", kUid}})[kUid].error, "");
  ASSERT_EQ(preparer->Prepare({{"default", "replaced", second}})[second].error, "");
  ClaimPreparer::CleanupReport report = preparer->Cleanup();
  EXPECT_EQ(report.checked, 2);
  EXPECT_EQ(report.unprepared, 0) << "both still in use";
  EXPECT_TRUE(report.error.ok()) << report.error;

  api_.erase("default/gone");  // the pod was force-deleted; the kubelet never unprepares
  api_["default/replaced"]["metadata"]["uid"] = "66666666-6666-6666-6666-666666666666";
  report = preparer->Cleanup();
  EXPECT_EQ(report.unprepared, 2);
  EXPECT_TRUE(preparer->Prepared().empty());
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_FALSE(PathExists(SpecPath(second)));
  EXPECT_EQ(counters.cleaned_up_for(CleanupReason::kGone).load(), 1u);
  EXPECT_EQ(counters.cleaned_up_for(CleanupReason::kReplaced).load(), 1u);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[0].find("DRAClaimCleanedUp: ResourceClaim default/gone (" + std::string(kUid) +
                           ") is gone from the API server"), std::string::npos) << events[0];
  EXPECT_NE(events[0].find("tpu-0000-03-00-0 free again"), std::string::npos) << events[0];
  EXPECT_NE(events[1].find("was deleted and made again under its name"), std::string::npos) << events[1];
  // The kubelet's unprepare that may still come is done at once.
  EXPECT_EQ(preparer->Unprepare({{"default", "gone", kUid}})[kUid], "");

  // A claim that stays but is no longer allocated (no pod has it reserved any more).
  Allocate("kept", kUid, {"tpu-0000-03-00-0"});
  ASSERT_EQ(preparer->Prepare({{"default", "kept", kUid}})[kUid].error, "");
  api_["default/kept"]["status"].erase("allocation");
  EXPECT_EQ(preparer->Cleanup().unprepared, 1);
  EXPECT_EQ(counters.cleaned_up_for(CleanupReason::kDeallocated).load(), 1u);
  // And its device goes to the next claim.
  Allocate("next", second, {"tpu-0000-03-00-0"});
  EXPECT_EQ(preparer->Prepare({{"default", "next", second}})[second].error, "");
}

// The kubelet's pod-resources API names the claims its pods use: Cleanup reads only the others,
// so an idle node sends the API server nothing for the claims its pods hold. A listing that fails
// leaves every claim to be read, as before.
TEST_F(ClaimPreparerTest, CleanupReadsOnlyTheClaimsNoPodOfTheKubeletUses) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("used", kUid, {"tpu-0000-03-00-0"});
  Allocate("gone", second, {"tpu-0000-04-00-0"});
  absl::Mutex listed_mu;
  absl::StatusOr<std::set<std::string>> listed = std::set<std::string>{"default/used", "other/x"};
  ClaimPreparer::Options options = Options();
  options.claims_in_use = [&]() -> absl::StatusOr<std::set<std::string>> {
    absl::MutexLock lock(&listed_mu);
    return listed;
  };
  auto preparer = MakePreparer(options);
  ASSERT_EQ(preparer->Prepare({{"default", "used", kUid}})[kUid].error, "");
  ASSERT_EQ(preparer->Prepare({{"default", "gone", second}})[second].error, "");
  auto fetched = [&] {
    absl::MutexLock lock(&api_mu_);
    return fetches_;
  };
  int before = fetched();
  ClaimPreparer::CleanupReport report = preparer->Cleanup();
  EXPECT_EQ(report.in_use, 1);
  EXPECT_EQ(report.checked, 1);
  EXPECT_EQ(fetched(), before + 1) << "only the claim no pod uses is read";
  {
    absl::MutexLock lock(&api_mu_);
    api_.erase("default/gone");  // its pod was force-deleted; the kubelet never unprepares
  }
  EXPECT_EQ(preparer->Cleanup().unprepared, 1);
  ASSERT_EQ(preparer->Prepared().size(), 1u);
  EXPECT_EQ(preparer->Prepared()[0].claim.uid, kUid);

  before = fetched();
  report = preparer->Cleanup();
  EXPECT_EQ(report.checked, 0);
  EXPECT_EQ(fetched(), before) << "every prepared claim in use: nothing asked";
  {
    absl::MutexLock lock(&listed_mu);
    listed = absl::UnavailableError("nothing answers on pod-resources/kubelet.sock");
  }
  report = preparer->Cleanup();
  EXPECT_EQ(report.in_use, 0);
  EXPECT_EQ(report.checked, 1);
  EXPECT_EQ(fetched(), before + 1) << "no listing: read from the API server";
  EXPECT_EQ(report.unprepared, 0);
}

// Cleanup reads the records, asks the API server, then removes: a claim the kubelet unprepared
// and prepared again while the API server was asked (its pod deleted, the claim allocated anew to
// the next pod) is a new record, and stays.
TEST_F(ClaimPreparerTest, CleanupLeavesARecordPreparedAgainWhileItAskedTheApiServer) {
  Allocate("kept", kUid, {"tpu-0000-03-00-0"});
  absl::Notification cleanup_reading, release;
  std::atomic<bool> hold_next_read{false};
  ClaimPreparer::Options options = Options();
  auto read = options.fetch_claim;
  options.fetch_claim = [&, read](const ClaimRef& claim) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> body = read(claim);  // what the API server says now
    if (hold_next_read.exchange(false)) {
      cleanup_reading.Notify();
      release.WaitForNotification();
    }
    return body;
  };
  auto preparer = MakePreparer(options);
  ASSERT_EQ(preparer->Prepare({{"default", "kept", kUid}})[kUid].error, "");
  {
    absl::MutexLock lock(&api_mu_);
    api_["default/kept"]["status"].erase("allocation");  // its pod went: deallocated
  }
  hold_next_read = true;
  ClaimPreparer::CleanupReport report;
  std::thread cleanup([&] { report = preparer->Cleanup(); });
  cleanup_reading.WaitForNotification();
  // Meanwhile the kubelet unprepares it, the scheduler allocates it to the next pod, and the
  // kubelet prepares it again.
  EXPECT_EQ(preparer->Unprepare({{"default", "kept", kUid}})[kUid], "");
  {
    absl::MutexLock lock(&api_mu_);
    Allocate("kept", kUid, {"tpu-0000-03-00-0"});
  }
  ASSERT_EQ(preparer->Prepare({{"default", "kept", kUid}})[kUid].error, "");
  release.Notify();
  cleanup.join();
  EXPECT_EQ(report.unprepared, 0) << "the record judged stale is gone; this one is new";
  ASSERT_EQ(preparer->Prepared().size(), 1u);
  EXPECT_TRUE(PathExists(SpecPath(kUid)));
  // The next cleanup judges the new record on what the API server says of it now.
  EXPECT_EQ(preparer->Cleanup().unprepared, 0);
}

TEST_F(ClaimPreparerTest, CleanupKeepsWhatItCannotJudgeAndSaysEachReasonOnce) {
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  auto preparer = MakePreparer();
  ASSERT_EQ(preparer->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  CapturedLog log;
  {
    absl::MutexLock lock(&api_mu_);
    api_["default/pod-tpu"] = json::array();  // not a claim: nothing is concluded from it
  }
  for (int pass = 0; pass < 2; ++pass) {
    ClaimPreparer::CleanupReport report = preparer->Cleanup();
    EXPECT_EQ(report.unprepared, 0);
    EXPECT_EQ(report.error.code(), absl::StatusCode::kInvalidArgument) << report.error;
  }
  EXPECT_EQ(log.Count("cannot tell whether every prepared claim is still in use"), 1) << log.Text();
  ClaimPreparer::Options options = Options();
  options.fetch_claim = [](const ClaimRef&) -> absl::StatusOr<std::string> {
    return absl::UnavailableError("the API server answered 503");
  };
  preparer->Stop();
  auto away = MakePreparer(options);  // the same checkpoint
  ClaimPreparer::CleanupReport report = away->Cleanup();
  EXPECT_EQ(report.checked, 1);
  EXPECT_EQ(report.unprepared, 0);
  EXPECT_EQ(report.error.message(), "the API server answered 503");
  EXPECT_EQ(away->Prepared().size(), 1u);
  EXPECT_TRUE(PathExists(SpecPath(kUid)));
}

TEST_F(ClaimPreparerTest, CleanupThatCannotRemoveASpecKeepsTheRecordAndSaysWhy) {
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  auto preparer = MakePreparer();
  ASSERT_EQ(preparer->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  api_.clear();
  // What unlink(2) refuses whoever runs it: a directory (with something in it) at the spec's path.
  ASSERT_EQ(unlink(SpecPath(kUid).c_str()), 0);
  ASSERT_EQ(mkdir(SpecPath(kUid).c_str(), 0755), 0);
  std::ofstream(SpecPath(kUid) + "/x") << "x";
  ClaimPreparer::CleanupReport report = preparer->Cleanup();
  EXPECT_EQ(report.unprepared, 0);
  EXPECT_NE(report.error.message().find("cannot remove " + SpecPath(kUid)), std::string::npos) << report.error;
  EXPECT_EQ(preparer->Prepared().size(), 1u) << "looked at again next time";
}

TEST_F(ClaimPreparerTest, AClaimOfAnotherBootHasItsSpecWrittenAgainFromTheDevicesFoundNow) {
  Allocate("pod-tpu", kUid, {"tpu-0000-04-00-0"});
  ClaimPreparer::Options options = Options();
  options.boot_id = "a1111111-1111-4111-8111-111111111111";
  ASSERT_EQ(MakePreparer(options)->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  std::ofstream(SpecPath(kUid)) << "stale";
  // The same boot: a spec on disk is left as it is.
  MakePreparer(options);
  EXPECT_EQ(ReadFileText(SpecPath(kUid)), "stale");
  // Another boot: written again, and the record says so.
  options.boot_id = "b2222222-2222-4222-8222-222222222222";
  auto rebooted = MakePreparer(options);
  json spec = json::parse(ReadFileText(SpecPath(kUid)), nullptr, false);
  ASSERT_FALSE(spec.is_discarded()) << ReadFileText(SpecPath(kUid));
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"], "/dev/apex_1");
  ASSERT_EQ(rebooted->Prepared().size(), 1u);
  EXPECT_EQ(rebooted->Prepared()[0].boot_id, "b2222222-2222-4222-8222-222222222222");
}

TEST_F(ClaimPreparerTest, AClaimOfAnotherBootWhoseDeviceIsGoneLosesItsStaleSpec) {
  Allocate("pod-tpu", kUid, {"tpu-0000-04-00-0"});
  ClaimPreparer::Options options = Options();
  options.boot_id = "a1111111-1111-4111-8111-111111111111";
  ASSERT_EQ(MakePreparer(options)->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  fixture_.UnplugCoralPcie(1, "0000:04:00.0");  // not there after the reboot
  Rescan();
  CapturedLog log;
  options.boot_id = "b2222222-2222-4222-8222-222222222222";
  auto rebooted = MakePreparer(options);
  EXPECT_FALSE(PathExists(SpecPath(kUid))) << "its /dev/apex_1 may be another device now";
  EXPECT_EQ(rebooted->Prepared().size(), 1u) << "the kubelet still unprepares it";
  EXPECT_TRUE(log.Contains("cannot be written again: device tpu-0000-04-00-0 is not on this node any more"))
      << log.Text();
}

// A checkpoint that cannot be written (here: its temporary file's name taken by a directory,
// which open(2) refuses whoever runs it): each step says so and the record stays as it was.
TEST_F(ClaimPreparerTest, ACheckpointThatCannotBeWrittenKeepsEveryRecordAndSaysWhy) {
  const std::string second = "55555555-5555-5555-5555-555555555555";
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  ClaimPreparer::Options options = Options();
  options.boot_id = "a1111111-1111-4111-8111-111111111111";
  ASSERT_EQ(MakePreparer(options)->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  PreparedClaim empty;  // what an earlier version recorded for a claim with none of our devices
  empty.claim = {"default", "other", second};
  empty.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_" + second + ".json";
  PreparedClaims claims(state_.path(), kDriver);
  ASSERT_TRUE(claims.Load().ok());
  claims.Put({empty});
  ASSERT_TRUE(claims.Save().ok());
  ASSERT_EQ(mkdir((state_.path() + "/.checkpoint.json.tmp").c_str(), 0755), 0);
  CapturedLog log;
  options.boot_id = "b2222222-2222-4222-8222-222222222222";
  auto preparer = MakePreparer(options);
  EXPECT_TRUE(log.Contains("holds none of our devices: its record cannot be removed: cannot write")) << log.Text();
  EXPECT_TRUE(log.Contains("written again from the devices found now (the record keeps its old boot: cannot write"))
      << log.Text();
  EXPECT_EQ(preparer->Prepared().size(), 2u);
  // The cleanup of a claim gone: its spec goes, its record cannot, and the pass says why.
  api_.clear();
  ClaimPreparer::CleanupReport report = preparer->Cleanup();
  EXPECT_EQ(report.unprepared, 0);
  EXPECT_NE(report.error.message().find("cannot write"), std::string::npos) << report.error;
  EXPECT_EQ(preparer->Prepared().size(), 2u);
}

// A claim's record is written while the API server is asked for it, so the fsync costs the
// call nothing: the read sees its claim recorded as pending on disk before it answers. The
// record with the devices follows the answer.
TEST_F(ClaimPreparerTest, AClaimIsRecordedPendingWhileItIsRead) {
  Allocate("pod-tpu", kUid, {"tpu-0000-04-00-0"});
  ClaimPreparer::Options options = Options();
  const std::string checkpoint = state_.path() + "/checkpoint.json";
  absl::Mutex mu;
  std::set<std::string> recorded_while_read;  // claim UIDs
  auto read = options.fetch_claim;
  options.fetch_claim = [&](const ClaimRef& claim) {
    if (::edgeaccel::testing::Eventually([&] {
          json on_disk = json::parse(ReadFileText(checkpoint), nullptr, false);
          return on_disk.is_object() && on_disk["claims"].contains(claim.uid) &&
                 on_disk["claims"][claim.uid].value("pending", false);
        })) {
      absl::MutexLock lock(&mu);
      recorded_while_read.insert(claim.uid);
    }
    return read(claim);
  };
  auto preparer = MakePreparer(options);
  auto answer = preparer->Prepare({{"default", "pod-tpu", kUid}});
  EXPECT_EQ(answer[kUid].error, "");
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(recorded_while_read.count(kUid), 1u) << ReadFileText(checkpoint);
  }
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  json on_disk = json::parse(ReadFileText(checkpoint));
  EXPECT_FALSE(on_disk["claims"][kUid].contains("pending")) << on_disk.dump();
  EXPECT_EQ(on_disk["claims"][kUid]["devices"][0]["device"], "tpu-0000-04-00-0");
  // A claim the read refuses leaves no record behind.
  const std::string gone = "55555555-5555-5555-5555-555555555555";
  EXPECT_NE(preparer->Prepare({{"default", "pod-gone", gone}})[gone].error, "");
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  EXPECT_EQ(ReadFileText(checkpoint).find(gone), std::string::npos);
}

// A daemon that stopped (a crash, a power loss) after answering a prepare but before the claim's
// devices were written leaves its pending record: the next one reads the claim and prepares it
// at its first cleanup, even where the kubelet lists it in use (it may never ask again), and
// forgets one whose claim is gone.
TEST_F(ClaimPreparerTest, APrepareUnderWayWhenTheDaemonStoppedIsFinishedOrForgottenAtStart) {
  const std::string gone = "55555555-5555-5555-5555-555555555555";
  Allocate("pod-tpu", kUid, {"tpu-0000-04-00-0"});
  {
    PreparedClaims claims(state_.path(), kDriver);
    ASSERT_TRUE(claims.Load().ok());
    std::vector<PreparedClaim> pending;
    for (const auto& [name, uid] : {std::pair{"pod-tpu", std::string(kUid)}, std::pair{"pod-gone", gone}}) {
      PreparedClaim& record = pending.emplace_back();
      record.claim = {"default", name, uid};
      record.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_" + uid + ".json";
      record.pending = true;
    }
    claims.Put(std::move(pending));
    ASSERT_TRUE(claims.Save().ok());
  }
  ClaimPreparer::Options options = Options();
  options.claims_in_use = []() -> absl::StatusOr<std::set<std::string>> {
    return std::set<std::string>{"default/pod-tpu", "default/pod-gone"};
  };
  CapturedLog log;
  auto preparer = MakePreparer(options);
  EXPECT_TRUE(preparer->Prepared().empty()) << "nothing prepared yet";
  EXPECT_TRUE(log.Contains("was under way when the last daemon stopped")) << log.Text();
  ClaimPreparer::CleanupReport report = preparer->Cleanup();
  EXPECT_EQ(report.checked, 2) << "pending: read though in use";
  EXPECT_EQ(report.unprepared, 1);
  std::vector<PreparedClaim> prepared = preparer->Prepared();
  ASSERT_EQ(prepared.size(), 1u);
  EXPECT_EQ(prepared[0].claim.uid, kUid);
  ASSERT_EQ(prepared[0].devices.size(), 1u);
  EXPECT_EQ(prepared[0].devices[0].device, "tpu-0000-04-00-0");
  EXPECT_TRUE(PathExists(SpecPath(kUid)));
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  const std::string on_disk = ReadFileText(state_.path() + "/checkpoint.json");
  EXPECT_EQ(on_disk.find(gone), std::string::npos) << on_disk;
  EXPECT_EQ(on_disk.find("pending"), std::string::npos) << on_disk;
  // The kubelet's repeated prepare is answered from the record.
  const int fetched = fetches_;
  EXPECT_EQ(preparer->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  EXPECT_EQ(fetches_, fetched);
}

// An unprepare is answered once the spec is gone and the claim forgotten in memory; the
// checkpoint's write follows, and one that fails is tried again until the disk takes it. A
// daemon that stops writes what it has not yet written.
TEST_F(ClaimPreparerTest, AnUnprepareIsAnsweredBeforeItsWriteWhichIsTriedAgainUntilItIsDone) {
  Allocate("pod-tpu", kUid, {"tpu-0000-03-00-0"});
  auto preparer = MakePreparer();
  ASSERT_EQ(preparer->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  ASSERT_TRUE(preparer->FlushCheckpoint(absl::Seconds(10)).ok());
  const std::string checkpoint = state_.path() + "/checkpoint.json";
  const std::string blocker = state_.path() + "/.checkpoint.json.tmp";
  ASSERT_EQ(mkdir(blocker.c_str(), 0755), 0);
  CapturedLog log;
  EXPECT_EQ(preparer->Unprepare({{"default", "pod-tpu", kUid}})[kUid], "");
  EXPECT_FALSE(PathExists(SpecPath(kUid)));
  EXPECT_TRUE(preparer->Prepared().empty());
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return log.Contains("cannot write"); })) << log.Text();
  EXPECT_NE(ReadFileText(checkpoint).find(kUid), std::string::npos) << "not written yet";
  ASSERT_EQ(rmdir(blocker.c_str()), 0);
  EXPECT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return ReadFileText(checkpoint).find(kUid) == std::string::npos; }, absl::Seconds(10)))
      << "the retry writes it";
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return log.Contains("is written again"); })) << log.Text();

  // Stopping writes what waits.
  ASSERT_EQ(preparer->Prepare({{"default", "pod-tpu", kUid}})[kUid].error, "");
  EXPECT_EQ(preparer->Unprepare({{"default", "pod-tpu", kUid}})[kUid], "");
  preparer->Stop();
  EXPECT_EQ(ReadFileText(checkpoint).find(kUid), std::string::npos);
}

// FetchClaim against the API server stand-in.
// A Jetson GPU offered shared (--dra-shared): the scheduler hands each claim that gets a share
// a result with its own shareID (resource.k8s.io/v1 DeviceRequestAllocationResult.shareID,
// KEP-5075). The preparer follows the allocation: two shares of one device are two claims' own
// business; a claim that holds the device alone (no shareID) excludes every other.
class SharedGpuClaimPreparerTest : public ::testing::Test {
 protected:
  static constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  static constexpr char kGpu[] = "gpu-tegra234-igpu0";
  static constexpr char kShareA[] = "a1a1a1a1-0000-4000-8000-000000000001";
  static constexpr char kShareB[] = "b2b2b2b2-0000-4000-8000-000000000002";

  SharedGpuClaimPreparerTest() : host_(fixture_.root()) {
    fixture_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
    std::vector<Device> devices = TegraGpuDiscoverer(&host_, NvidiaOptions{}).Scan();
    LookUpHostModes(host_, &devices);
    set_.Update(devices);
  }

  ClaimPreparer::Options Options() {
    return NodeOneOptions(kGpuDriver, cdi_.path(), state_.path(), [this](const ClaimRef& claim) {
      absl::MutexLock lock(&api_mu_);
      return StoredClaim(api_, claim.name, claim.name);
    });
  }
  std::unique_ptr<ClaimPreparer> MakePreparer() {
    auto preparer = std::make_unique<ClaimPreparer>(Options(), &set_);
    preparer->Start().IgnoreError();
    return preparer;
  }

  // Claim `name` allocated the GPU once per entry of `shares` ({request, shareID}; an empty
  // shareID: the device alone, as for an unshared device).
  void Allocate(const std::string& name, const std::string& uid,
                const std::vector<std::pair<std::string, std::string>>& shares) {
    json results = json::array();
    for (const auto& [request, share] : shares) {
      json result = {{"request", request}, {"driver", kGpuDriver}, {"pool", "node-1"}, {"device", kGpu}};
      if (!share.empty()) {
        result["shareID"] = share;
        result["consumedCapacity"] = {{"memory", "1Gi"}};
      }
      results.push_back(result);
    }
    absl::MutexLock lock(&api_mu_);
    api_[name] = {{"kind", "ResourceClaim"},
                  {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", uid}}},
                  {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
  }

  std::string SpecPath(const std::string& uid) const {
    return cdi_.path() + "/k8s.gpu.edgeaccel.io-claim_" + uid + ".json";
  }
  // The names of the devices in the claim's CDI spec.
  std::vector<std::string> SpecDevices(const std::string& uid) const {
    json spec = json::parse(ReadFileText(SpecPath(uid)), nullptr, false);
    std::vector<std::string> names;
    if (spec.is_discarded()) return names;
    for (const json& device : spec["devices"]) names.push_back(device["name"].get<std::string>());
    return names;
  }

  FixtureHost fixture_;
  Host host_;
  DeviceSet set_{kGpuDriver};
  TempDir cdi_, state_;
  absl::Mutex api_mu_;
  std::map<std::string, json> api_;
};

TEST_F(SharedGpuClaimPreparerTest, TwoClaimsShareTheGpuEachWithItsOwnSpecAndOneUnpreparedLeavesTheOther) {
  const std::string a = "aaaaaaaa-1111-4111-8111-111111111111";
  const std::string b = "bbbbbbbb-2222-4222-8222-222222222222";
  Allocate("infer-a", a, {{"gpu", kShareA}});
  Allocate("infer-b", b, {{"gpu", kShareB}});
  auto preparer = MakePreparer();
  auto first = preparer->Prepare({{"default", "infer-a", a}});
  ASSERT_EQ(first[a].error, "");
  auto second = preparer->Prepare({{"default", "infer-b", b}});
  ASSERT_EQ(second[b].error, "");
  ASSERT_EQ(first[a].devices.size(), 1u);
  ASSERT_EQ(second[b].devices.size(), 1u);
  EXPECT_EQ(first[a].devices[0].device, kGpu);
  EXPECT_EQ(second[b].devices[0].device, kGpu);
  EXPECT_EQ(first[a].devices[0].share_id, kShareA);
  EXPECT_EQ(second[b].devices[0].share_id, kShareB);
  // Each claim its own CDI name and spec: the same device nodes under names no other claim uses.
  EXPECT_EQ(first[a].devices[0].cdi_ids, std::vector<std::string>{"k8s.gpu.edgeaccel.io/claim=" + a + "-" + kGpu});
  EXPECT_EQ(second[b].devices[0].cdi_ids, std::vector<std::string>{"k8s.gpu.edgeaccel.io/claim=" + b + "-" + kGpu});
  EXPECT_EQ(SpecDevices(a), std::vector<std::string>{a + "-" + kGpu});
  EXPECT_EQ(SpecDevices(b), std::vector<std::string>{b + "-" + kGpu});
  json spec_a = json::parse(ReadFileText(SpecPath(a)));
  json spec_b = json::parse(ReadFileText(SpecPath(b)));
  EXPECT_EQ(spec_a["devices"][0]["containerEdits"], spec_b["devices"][0]["containerEdits"]);

  // A restarted daemon knows both shares from its checkpoint, without the API server.
  {
    absl::MutexLock lock(&api_mu_);
    api_.clear();
  }
  preparer->Stop();
  auto restarted = MakePreparer();
  EXPECT_EQ(restarted->Prepare({{"default", "infer-a", a}})[a].devices, first[a].devices);
  EXPECT_EQ(restarted->Prepare({{"default", "infer-b", b}})[b].devices, second[b].devices);

  // The pod of claim a goes: its spec and record only.
  EXPECT_EQ(restarted->Unprepare({{"default", "infer-a", a}})[a], "");
  EXPECT_FALSE(PathExists(SpecPath(a)));
  EXPECT_EQ(SpecDevices(b), std::vector<std::string>{b + "-" + kGpu});
  ASSERT_EQ(restarted->Prepared().size(), 1u);
  EXPECT_EQ(restarted->Prepared()[0].claim.uid, b);
  EXPECT_EQ(restarted->Prepare({{"default", "infer-b", b}})[b].devices, second[b].devices);
}

TEST_F(SharedGpuClaimPreparerTest, AClaimThatHoldsTheGpuAloneExcludesSharesAndTheOtherWayRound) {
  const std::string alone = "cccccccc-3333-4333-8333-333333333333";
  const std::string shared = "dddddddd-4444-4444-8444-444444444444";
  const std::string again = "eeeeeeee-5555-4555-8555-555555555555";
  Allocate("alone", alone, {{"gpu", ""}});
  Allocate("shared", shared, {{"gpu", kShareA}});
  Allocate("again", again, {{"gpu", kShareA}});  // a share another claim already holds
  auto preparer = MakePreparer();
  ASSERT_EQ(preparer->Prepare({{"default", "alone", alone}})[alone].error, "");
  const std::string excluded = preparer->Prepare({{"default", "shared", shared}})[shared].error;
  EXPECT_NE(excluded.find("is prepared for claim default/alone (" + alone + "), which holds it alone"),
            std::string::npos)
      << excluded;
  EXPECT_FALSE(PathExists(SpecPath(shared)));

  ASSERT_EQ(preparer->Unprepare({{"default", "alone", alone}})[alone], "");
  ASSERT_EQ(preparer->Prepare({{"default", "shared", shared}})[shared].error, "");
  const std::string not_shared = preparer->Prepare({{"default", "alone", alone}})[alone].error;
  EXPECT_NE(not_shared.find("is prepared for claim default/shared (" + shared + ") and is not shared"),
            std::string::npos)
      << not_shared;
  const std::string same_share = preparer->Prepare({{"default", "again", again}})[again].error;
  EXPECT_NE(same_share.find(std::string("share ") + kShareA + " of device " + kGpu +
                            " is prepared for claim default/shared"),
            std::string::npos)
      << same_share;
}

// Two requests of one claim may each get a share of the same GPU: two devices for the kubelet,
// each with its request and share, and one device in the claim's CDI spec (names are unique in
// a spec).
TEST_F(SharedGpuClaimPreparerTest, TwoSharesInOneClaimAreTwoDevicesOfOneSpecEntry) {
  const std::string uid = "ffffffff-6666-4666-8666-666666666666";
  Allocate("pair", uid, {{"encoder", kShareA}, {"decoder", kShareB}});
  auto preparer = MakePreparer();
  auto answer = preparer->Prepare({{"default", "pair", uid}});
  ASSERT_EQ(answer[uid].error, "");
  ASSERT_EQ(answer[uid].devices.size(), 2u);
  EXPECT_EQ(answer[uid].devices[0].requests, std::vector<std::string>{"encoder"});
  EXPECT_EQ(answer[uid].devices[0].share_id, kShareA);
  EXPECT_EQ(answer[uid].devices[1].requests, std::vector<std::string>{"decoder"});
  EXPECT_EQ(answer[uid].devices[1].share_id, kShareB);
  EXPECT_EQ(answer[uid].devices[0].cdi_ids, answer[uid].devices[1].cdi_ids);
  EXPECT_EQ(SpecDevices(uid), std::vector<std::string>{uid + "-" + kGpu});
  // Written again at a start (a missing spec) the same way.
  ASSERT_EQ(unlink(SpecPath(uid).c_str()), 0);
  preparer->Stop();
  auto restarted = MakePreparer();
  EXPECT_EQ(SpecDevices(uid), std::vector<std::string>{uid + "-" + kGpu});
}

TEST_F(SharedGpuClaimPreparerTest, AShareIdThatIsNotAUidFailsTheClaim) {
  const std::string uid = "abababab-7777-4777-8777-777777777777";
  Allocate("odd", uid, {{"gpu", "share-1"}});
  const std::string error = MakePreparer()->Prepare({{"default", "odd", uid}})[uid].error;
  EXPECT_NE(error.find("status.allocation.devices.results[0].shareID \"share-1\" is not a UID"),
            std::string::npos)
      << error;
  EXPECT_FALSE(PathExists(SpecPath(uid)));
}

TEST(FetchClaimTest, TellsAClaimNotFoundFromAPathNotServedAndKeepsCancelled) {
  TestApiServer api("node-1");
  ApiClient client(api.ClientConfig());
  json claim = api.AddResourceClaim(
      TestApiServer::MakeAllocatedClaim("default", "pod-tpu", kDriver, "node-1", {{"tpu", "tpu-0000-03-00-0"}}));
  const ClaimRef ref{"default", "pod-tpu", claim["metadata"]["uid"]};
  absl::StatusOr<std::string> body = FetchClaim(client, ref);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(json::parse(*body)["metadata"]["uid"], ref.uid);
  EXPECT_EQ(FetchClaim(client, {"default", "other", ref.uid}).status().code(), absl::StatusCode::kNotFound);
  // A 404 that names no claim (resource.k8s.io/v1 not served) says nothing about the claim.
  api.FailNextClaimGets(404, 1);
  absl::Status unserved = FetchClaim(client, ref).status();
  EXPECT_EQ(unserved.code(), absl::StatusCode::kUnavailable) << unserved;
  EXPECT_NE(unserved.message().find("the server could not find the requested resource"), std::string::npos);
  EXPECT_EQ(FetchClaim(client, {"default", "Bad/Name", ref.uid}).status().code(),
            absl::StatusCode::kInvalidArgument);
  client.Cancel();
  EXPECT_EQ(FetchClaim(client, ref).status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace edgeaccel
