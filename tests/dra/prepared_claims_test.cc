#include "edgeaccel/dra/prepared_claims.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using testing::TempDir;

// Claim UIDs as the API server makes them.
constexpr char kU1[] = "0a000000-0000-4000-8000-000000000001";
constexpr char kU2[] = "0a000000-0000-4000-8000-000000000002";
constexpr char kU3[] = "0a000000-0000-4000-8000-000000000003";

PreparedClaim Claim(const std::string& uid) {
  PreparedClaim claim;
  claim.claim = {"default", "claim-" + uid, uid};
  claim.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_" + uid + ".json";
  claim.devices.push_back({{"tpu"}, "node-1", "tpu-0000-03-00-0", "0000:03:00.0",
                           {"k8s.edgetpu.edgeaccel.io/claim=" + uid + "-tpu-0000-03-00-0"}});
  return claim;
}

TEST(PreparedClaimsTest, ARestartedDaemonReadsWhatTheLastOneWrote) {
  TempDir dir;
  {
    PreparedClaims claims(dir.path(), "edgetpu.edgeaccel.io");
    ASSERT_TRUE(claims.Load().ok());
    EXPECT_TRUE(claims.claims().empty());
    claims.Put({Claim(kU1)});
    EXPECT_EQ(claims.version(), 1u);
    ASSERT_TRUE(claims.Save().ok());
    PreparedClaim second = Claim(kU2);
    second.boot_id = "5f1e3a2c-1d2b-4c3d-8e4f-5a6b7c8d9e0f";
    PreparedClaim pending;  // a prepare under way: what it is, not yet its devices
    pending.claim = {"default", "claim-3", kU3};
    pending.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_" + std::string(kU3) + ".json";
    pending.pending = true;
    claims.Put({second, pending});
    claims.Remove({kU1});
    EXPECT_EQ(claims.version(), 3u);
    claims.Remove({kU1, "0a000000-0000-4000-8000-00000000000f"});
    EXPECT_EQ(claims.version(), 3u) << "none recorded: no change";
    ASSERT_TRUE(claims.Save().ok());
  }
  PreparedClaims again(dir.path(), "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.Load().ok());
  ASSERT_EQ(again.claims().size(), 2u);
  const PreparedClaim* claim = again.Find(kU2);
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->claim.name, std::string("claim-") + kU2);
  EXPECT_EQ(claim->devices, Claim(kU2).devices);
  EXPECT_EQ(claim->boot_id, "5f1e3a2c-1d2b-4c3d-8e4f-5a6b7c8d9e0f");
  EXPECT_EQ(again.Find(kU1), nullptr);
  ASSERT_NE(again.Find(kU3), nullptr);
  EXPECT_TRUE(again.Find(kU3)->pending);
  EXPECT_TRUE(again.Find(kU3)->devices.empty());
  EXPECT_FALSE(claim->pending);
}

// Upgrades and rollbacks keep prepared claims: the checkpoint's "version" changes only with a
// change an older reader cannot take. Fields added since version 1 (bootId, shareID) are optional,
// so a file of an older release is read; fields a later release adds at version 1 are ignored,
// so this release reads what a newer one wrote before a rollback.
TEST(PreparedClaimsTest, OlderAndNewerCheckpointsOfVersionOneAreRead) {
  // As the first release with a checkpoint wrote it (no bootId, no shareID).
  const std::string older = std::string(R"({
  "claims": {
    ")") + kU1 + R"(": {
      "cdiSpec": "k8s.edgetpu.edgeaccel.io-claim_)" + kU1 + R"(.json",
      "devices": [{"cdiIds": ["k8s.edgetpu.edgeaccel.io/claim=)" + kU1 + R"(-tpu-0000-03-00-0"],
                   "device": "tpu-0000-03-00-0", "physicalId": "0000:03:00.0", "pool": "node-1",
                   "requests": ["tpu"]}],
      "name": "claim-)" + kU1 + R"(",
      "namespace": "default"
    }
  },
  "driver": "edgetpu.edgeaccel.io",
  "kind": "edgeaccel.io/dra-prepared-claims",
  "version": 1
})";
  absl::StatusOr<std::map<std::string, PreparedClaim>> read = ParsePreparedClaims(older, "edgetpu.edgeaccel.io");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->count(kU1), 1u);
  EXPECT_EQ(read->at(kU1).devices, Claim(kU1).devices);
  EXPECT_EQ(read->at(kU1).boot_id, "");
  // This release writes version 1, with nothing an older reader needs left out.
  const std::string written = PreparedClaimsJson("edgetpu.edgeaccel.io", *read);
  EXPECT_NE(written.find("\"version\": 1"), std::string::npos) << written;
  absl::StatusOr<std::map<std::string, PreparedClaim>> again = ParsePreparedClaims(written, "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->at(kU1).devices, read->at(kU1).devices);

  // What a later release may add beside them is ignored.
  nlohmann::json newer = nlohmann::json::parse(written);
  newer["writtenBy"] = "edgeaccel-device-plugin 0.2.0";
  newer["claims"][kU1]["preparedAt"] = "2026-11-29T01:00:00Z";
  newer["claims"][kU1]["devices"][0]["consumedCapacity"] = {{"memory", "1Gi"}};
  read = ParsePreparedClaims(newer.dump(), "edgetpu.edgeaccel.io");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->at(kU1).devices, Claim(kU1).devices);
  // A version this release does not know is refused with the reason (and kept aside by Load).
  newer["version"] = 2;
  read = ParsePreparedClaims(newer.dump(), "edgetpu.edgeaccel.io");
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("version"), std::string::npos) << read.status();
}

TEST(PreparedClaimsTest, AnUnreadableCheckpointIsKeptAsideAndSaid) {
  TempDir dir;
  { std::ofstream(dir.path() + "/checkpoint.json") << "{\"kind\": \"edgeaccel.io/dra-prepared-claims\", \"version\": 1, \"driver\": \"edgetpu.edgeaccel.io\", \"claims\": {\"0a000000-0000-4000-8000-000000000001\": {\"namespace\": 3}}}"; }
  PreparedClaims claims(dir.path(), "edgetpu.edgeaccel.io");
  absl::Status status = claims.Load();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("namespace is not a string"), std::string::npos) << status;
  EXPECT_NE(status.message().find("kept as"), std::string::npos) << status;
  EXPECT_TRUE(claims.claims().empty());
  bool aside = false;
  DIR* d = opendir(dir.path().c_str());
  while (dirent* entry = readdir(d)) {
    if (std::string(entry->d_name).rfind("checkpoint.json.unreadable-", 0) == 0) aside = true;
  }
  closedir(d);
  EXPECT_TRUE(aside);
  // And the next write starts a good file.
  claims.Put({Claim(kU3)});
  ASSERT_TRUE(claims.Save().ok());
  PreparedClaims again(dir.path(), "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.Load().ok());
  EXPECT_NE(again.Find(kU3), nullptr);
}

TEST(PreparedClaimsTest, ParseRefusesWhatWouldEscapeTheCdiDirectoryOrAnotherDriver) {
  std::map<std::string, PreparedClaim> claims{{kU1, Claim(kU1)}};
  std::string text = PreparedClaimsJson("edgetpu.edgeaccel.io", claims);
  EXPECT_TRUE(ParsePreparedClaims(text, "edgetpu.edgeaccel.io").ok());
  EXPECT_FALSE(ParsePreparedClaims(text, "gpu.edgeaccel.io").ok());
  claims[kU1].cdi_spec = "../../etc/passwd";
  EXPECT_FALSE(ParsePreparedClaims(PreparedClaimsJson("edgetpu.edgeaccel.io", claims), "edgetpu.edgeaccel.io").ok());
  EXPECT_FALSE(ParsePreparedClaims("{}", "edgetpu.edgeaccel.io").ok());
  claims[kU1] = Claim(kU1);
  claims[kU1].boot_id = "boot";
  text = PreparedClaimsJson("edgetpu.edgeaccel.io", claims);
  ASSERT_NE(text.find("\"bootId\": \"boot\""), std::string::npos) << text;
  text.replace(text.find("\"bootId\": \"boot\""), 16, "\"bootId\": 7");
  EXPECT_EQ(ParsePreparedClaims(text, "edgetpu.edgeaccel.io").status().message(),
            std::string("claim ") + kU1 + ": bootId is not a string");
}

// Found by fuzz_dra_claim in CI: a field of another type than the checkpoint writes made
// json::value throw out of ParsePreparedClaims, which aborted the daemon at start.
TEST(PreparedClaimsTest, FieldsOfAnotherTypeAreRefusedNotThrown) {
  for (const char* text : {R"({"kind":{"kind":6666666666666666666666666666}})",
                           R"({"kind":7})",
                           R"({"kind":["edgeaccel.io/dra-prepared-claims"]})",
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":1,"driver":17,"claims":{}})",
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":1,"driver":null,"claims":{}})",
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":"1","driver":"edgetpu.edgeaccel.io"})",
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":1,"driver":"edgetpu.edgeaccel.io"})",
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":1,"driver":"edgetpu.edgeaccel.io","claims":{"0a000000-0000-4000-8000-000000000001":{"namespace":"default","name":"c","cdiSpec":"c.json","devices":[],"pending":"yes"}}})"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::map<std::string, PreparedClaim>> parsed = ParsePreparedClaims(text, "edgetpu.edgeaccel.io");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  }
}

// A shared device's share is recorded (the kubelet is answered it again after a restart); a
// checkpoint without shares (written before sharing, or of unshared devices) reads as unshared.
TEST(PreparedClaimsTest, ASharesIdIsKeptAndOnlyAUidIsTakenForOne) {
  PreparedClaim shared = Claim(kU1);
  shared.devices[0].share_id = "5a5a5a5a-0000-4000-8000-00000000000a";
  std::map<std::string, PreparedClaim> claims{{kU1, shared}, {kU2, Claim(kU2)}};
  const std::string text = PreparedClaimsJson("edgetpu.edgeaccel.io", claims);
  EXPECT_EQ(text.find("shareID", text.find(kU2)), std::string::npos) << "no share, no field: " << text;
  absl::StatusOr<std::map<std::string, PreparedClaim>> parsed = ParsePreparedClaims(text, "edgetpu.edgeaccel.io");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->at(kU1).devices, shared.devices);
  EXPECT_EQ(parsed->at(kU2).devices[0].share_id, "");

  std::string odd = text;
  odd.replace(odd.find("5a5a5a5a-0000-4000-8000-00000000000a"), 36, "../../../../etc/passwd");
  parsed = ParsePreparedClaims(odd, "edgetpu.edgeaccel.io");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("device shareID is not a UID"), std::string::npos) << parsed.status();
}

// A write that fails says why; what is recorded in memory stays for the next write (its owner,
// ClaimPreparer, decides what to undo).
TEST(PreparedClaimsTest, AFailedWriteSaysWhyAndTheNextOneWritesEverything) {
  TempDir dir;
  PreparedClaims claims(dir.path() + "/missing", "edgetpu.edgeaccel.io");
  ASSERT_TRUE(claims.Load().ok());
  ASSERT_EQ(mkdir((dir.path() + "/missing").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((dir.path() + "/missing/.checkpoint.json.tmp").c_str(), 0755), 0);
  claims.Put({Claim(kU1)});
  absl::Status failed = claims.Save();
  EXPECT_NE(failed.message().find("cannot write"), std::string::npos) << failed;
  EXPECT_NE(claims.Find(kU1), nullptr);
  ASSERT_EQ(rmdir((dir.path() + "/missing/.checkpoint.json.tmp").c_str()), 0);
  ASSERT_TRUE(claims.Save().ok());
  PreparedClaims again(dir.path() + "/missing", "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.Load().ok());
  EXPECT_NE(again.Find(kU1), nullptr);
}

TEST(PreparedClaimsTest, AKeyThatIsNotAClaimUidIsRefusedAndTheCheckpointKeptAside) {
  TempDir dir;
  const std::string good = kU1;
  PreparedClaim bad = Claim("bad uid/../x");
  bad.cdi_spec = "k8s.edgetpu.edgeaccel.io-claim_x.json";  // a file name: only the key is wrong
  std::map<std::string, PreparedClaim> claims{{good, Claim(good)}, {"bad uid/../x", bad}};
  { std::ofstream(dir.path() + "/checkpoint.json") << PreparedClaimsJson("edgetpu.edgeaccel.io", claims); }
  PreparedClaims loaded(dir.path(), "edgetpu.edgeaccel.io");
  absl::Status status = loaded.Load();
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("\"bad uid/../x\" is not a claim UID"), std::string::npos) << status;
  EXPECT_NE(status.message().find("kept as"), std::string::npos) << status;
  EXPECT_TRUE(loaded.claims().empty());
}

}  // namespace
}  // namespace edgeaccel
