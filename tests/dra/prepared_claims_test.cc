#include "edgeaccel/dra/prepared_claims.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <fstream>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using testing::TempDir;

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
    ASSERT_TRUE(claims.Put(Claim("u-1")).ok());
    ASSERT_TRUE(claims.Put(Claim("u-2")).ok());
    ASSERT_TRUE(claims.Remove("u-1").ok());
    ASSERT_TRUE(claims.Remove("never-prepared").ok());
  }
  PreparedClaims again(dir.path(), "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.Load().ok());
  ASSERT_EQ(again.claims().size(), 1u);
  const PreparedClaim* claim = again.Find("u-2");
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->claim.name, "claim-u-2");
  EXPECT_EQ(claim->devices, Claim("u-2").devices);
  EXPECT_EQ(again.Find("u-1"), nullptr);
}

TEST(PreparedClaimsTest, AnUnreadableCheckpointIsKeptAsideAndSaid) {
  TempDir dir;
  { std::ofstream(dir.path() + "/checkpoint.json") << "{\"kind\": \"edgeaccel.io/dra-prepared-claims\", \"version\": 1, \"driver\": \"edgetpu.edgeaccel.io\", \"claims\": {\"u\": {\"namespace\": 3}}}"; }
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
  ASSERT_TRUE(claims.Put(Claim("u-3")).ok());
  PreparedClaims again(dir.path(), "edgetpu.edgeaccel.io");
  ASSERT_TRUE(again.Load().ok());
  EXPECT_NE(again.Find("u-3"), nullptr);
}

TEST(PreparedClaimsTest, ParseRefusesWhatWouldEscapeTheCdiDirectoryOrAnotherDriver) {
  std::map<std::string, PreparedClaim> claims{{"u", Claim("u")}};
  std::string text = PreparedClaimsJson("edgetpu.edgeaccel.io", claims);
  EXPECT_TRUE(ParsePreparedClaims(text, "edgetpu.edgeaccel.io").ok());
  EXPECT_FALSE(ParsePreparedClaims(text, "gpu.edgeaccel.io").ok());
  claims["u"].cdi_spec = "../../etc/passwd";
  EXPECT_FALSE(ParsePreparedClaims(PreparedClaimsJson("edgetpu.edgeaccel.io", claims), "edgetpu.edgeaccel.io").ok());
  EXPECT_FALSE(ParsePreparedClaims("{}", "edgetpu.edgeaccel.io").ok());
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
                           R"({"kind":"edgeaccel.io/dra-prepared-claims","version":1,"driver":"edgetpu.edgeaccel.io"})"}) {
    SCOPED_TRACE(text);
    absl::StatusOr<std::map<std::string, PreparedClaim>> parsed = ParsePreparedClaims(text, "edgetpu.edgeaccel.io");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(PreparedClaimsTest, AFailedWriteLeavesTheRecordAsItWas) {
  TempDir dir;
  PreparedClaims claims(dir.path() + "/missing/deeper", "edgetpu.edgeaccel.io");
  ASSERT_TRUE(claims.Load().ok());
  EXPECT_FALSE(claims.Put(Claim("u-1")).ok());
  EXPECT_EQ(claims.Find("u-1"), nullptr);
}

}  // namespace
}  // namespace edgeaccel
