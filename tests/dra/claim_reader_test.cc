#include "edgeaccel/dra/claim_reader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace edgeaccel {
namespace {

using nlohmann::json;

const ClaimRef kClaim{"default", "pod-tpu-x7k2p", "0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01"};

// The shape kube-apiserver 1.36 answers a GET of an allocated claim with (trimmed).
json Allocated() {
  return json::parse(R"({
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "pod-tpu-x7k2p", "namespace": "default",
                 "uid": "0d7ab0a2-6c3f-4b8e-9f11-2b7c1c9a0e01", "resourceVersion": "812"},
    "spec": {"devices": {"requests": [{"name": "tpu", "exactly": {"deviceClassName": "edgetpu.edgeaccel.io",
             "allocationMode": "ExactCount", "count": 1}}]}},
    "status": {"allocation": {"devices": {"results": [
        {"request": "tpu", "driver": "edgetpu.edgeaccel.io", "pool": "node-1", "device": "tpu-0000-03-00-0"},
        {"request": "gpu/any", "driver": "gpu.edgeaccel.io", "pool": "node-1", "device": "gpu-tegra234-igpu0"}]},
      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]}},
      "reservedFor": [{"resource": "pods", "name": "pod", "uid": "p-1"}]}})");
}

TEST(ClaimReaderTest, TakesOnlyOurDriversResults) {
  auto allocation = ReadClaimAllocation(Allocated().dump(), kClaim, "edgetpu.edgeaccel.io", "node-1");
  ASSERT_TRUE(allocation.ok()) << allocation.status();
  ASSERT_EQ(allocation->results.size(), 1u);
  EXPECT_EQ(allocation->results[0].request, "tpu");
  EXPECT_EQ(allocation->results[0].device, "tpu-0000-03-00-0");
  auto gpu = ReadClaimAllocation(Allocated().dump(), kClaim, "gpu.edgeaccel.io", "node-1");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_EQ(gpu->results.size(), 1u);
  EXPECT_EQ(gpu->results[0].request, "gpu") << "a sub-request is named by its main request";
}

TEST(ClaimReaderTest, AClaimMadeAgainUnderTheSameNameIsRefused) {
  json claim = Allocated();
  claim["metadata"]["uid"] = "another-uid";
  auto allocation = ReadClaimAllocation(claim.dump(), kClaim, "edgetpu.edgeaccel.io", "node-1");
  ASSERT_FALSE(allocation.ok());
  EXPECT_EQ(allocation.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(allocation.status().message().find("deleted and made again"), std::string::npos)
      << allocation.status();
}

TEST(ClaimReaderTest, UnallocatedAndOtherPoolAreErrors) {
  json claim = Allocated();
  claim["status"].erase("allocation");
  auto unallocated = ReadClaimAllocation(claim.dump(), kClaim, "edgetpu.edgeaccel.io", "node-1");
  ASSERT_FALSE(unallocated.ok());
  EXPECT_NE(unallocated.status().message().find("not allocated"), std::string::npos);
  auto other = ReadClaimAllocation(Allocated().dump(), kClaim, "edgetpu.edgeaccel.io", "node-2");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("pool node-1, not this node's (node-2)"), std::string::npos)
      << other.status();
}

TEST(ClaimReaderTest, MalformedClaimsAreErrorsThatSayWhere) {
  const std::string driver = "edgetpu.edgeaccel.io";
  EXPECT_FALSE(ReadClaimAllocation("not json", kClaim, driver, "node-1").ok());
  EXPECT_FALSE(ReadClaimAllocation("[]", kClaim, driver, "node-1").ok());
  json wrong_kind = Allocated();
  wrong_kind["kind"] = "Pod";
  EXPECT_FALSE(ReadClaimAllocation(wrong_kind.dump(), kClaim, driver, "node-1").ok());
  json no_device = Allocated();
  no_device["status"]["allocation"]["devices"]["results"][0].erase("device");
  auto missing = ReadClaimAllocation(no_device.dump(), kClaim, driver, "node-1");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("results[0].device is missing"), std::string::npos)
      << missing.status();
  json number = Allocated();
  number["status"]["allocation"]["devices"]["results"][0]["device"] = 7;
  EXPECT_FALSE(ReadClaimAllocation(number.dump(), kClaim, driver, "node-1").ok());
  json too_many = Allocated();
  auto& results = too_many["status"]["allocation"]["devices"]["results"];
  while (results.size() <= kMaxAllocationResults) results.push_back(results[0]);
  EXPECT_FALSE(ReadClaimAllocation(too_many.dump(), kClaim, driver, "node-1").ok());
  json no_results = Allocated();
  no_results["status"]["allocation"]["devices"].erase("results");
  auto none = ReadClaimAllocation(no_results.dump(), kClaim, driver, "node-1");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->results.empty());
}

TEST(ClaimReaderTest, LivenessTellsTheCurrentClaimFromOneMadeAgainOrDeallocated) {
  EXPECT_EQ(ReadClaimLiveness(Allocated().dump(), kClaim).value(), ClaimLiveness::kCurrent);
  json replaced = Allocated();
  replaced["metadata"]["uid"] = "6a1e3f0c-2b7d-4c55-9e0a-1f2d3c4b5a69";
  EXPECT_EQ(ReadClaimLiveness(replaced.dump(), kClaim).value(), ClaimLiveness::kReplaced);
  json deallocated = Allocated();
  deallocated["status"].erase("allocation");
  EXPECT_EQ(ReadClaimLiveness(deallocated.dump(), kClaim).value(), ClaimLiveness::kDeallocated);
  deallocated.erase("status");
  EXPECT_EQ(ReadClaimLiveness(deallocated.dump(), kClaim).value(), ClaimLiveness::kDeallocated);
  // Nothing is concluded from an answer that is not a claim.
  for (const std::string& body : {std::string("not json"), std::string(R"({"kind": "Status"})"),
                                  std::string(R"({"kind": "ResourceClaim", "metadata": {}})"),
                                  std::string(R"({"metadata": {"uid": 7}})")}) {
    EXPECT_EQ(ReadClaimLiveness(body, kClaim).status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

}  // namespace
}  // namespace edgeaccel
