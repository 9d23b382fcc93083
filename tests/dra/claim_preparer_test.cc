#include "edgeaccel/dra/claim_preparer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/host/host.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using nlohmann::json;
using testing::FixtureHost;
using testing::TempDir;
using testing::PathExists;
using testing::ReadFileText;

constexpr char kDriver[] = "edgetpu.edgeaccel.io";
constexpr char kUid[] = "0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01";

// Two Edge TPUs on a fixture host, their device set, and claims the "API server" (a map) holds.
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

  std::unique_ptr<ClaimPreparer> MakePreparer() {
    ClaimPreparer::Options options;
    options.driver = kDriver;
    options.pool = "node-1";
    options.cdi_dir = cdi_.path();
    options.state_dir = state_.path();
    options.fetch_claim = [this](const ClaimRef& claim) -> absl::StatusOr<std::string> {
      ++fetches_;
      auto it = api_.find(claim.namespace_name + "/" + claim.name);
      if (it == api_.end()) return absl::NotFoundError("ResourceClaim " + claim.name + " does not exist (any more)");
      return it->second.dump();
    };
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
  // A new process (daemon restart between prepare and unprepare) answers the same.
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

TEST_F(ClaimPreparerTest, UnprepareOfAnUnknownClaimIsDone) {
  auto preparer = MakePreparer();
  auto answer = preparer->Unprepare({{"default", "never", kUid}});
  EXPECT_EQ(answer[kUid], "");
}

}  // namespace
}  // namespace edgeaccel
