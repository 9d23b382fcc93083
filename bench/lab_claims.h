// What the lab benchmarks (bench/dra_compare_main.cc, bench/dra_churn_main.cc) share: a
// ResourceClaim made through the API server and allocated as the scheduler leaves it for the
// kubelet.
#ifndef EDGEACCEL_BENCH_LAB_CLAIMS_H_
#define EDGEACCEL_BENCH_LAB_CLAIMS_H_

#include <string>

#include "absl/status/statusor.h"
#include "dra_kubelet.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel::bench {

// Where a claim is made and what it is allocated: one request "dev" of device class `driver`
// (the DeviceClasses are named after their drivers), allocated `device` of pool `node`.
struct ClaimToMake {
  std::string namespace_name;
  std::string name;
  std::string node;
  std::string driver;
  std::string device;
  std::string part_of;  // the label app.kubernetes.io/part-of: the tool that made it
};

// POSTs the claim, then merge-PATCHes its status subresource with
// status.allocation.devices.results[{request, driver, pool, device}] and the node selector, as the
// scheduler writes it. Returns the claim as the kubelet names it, or what the API server said.
absl::StatusOr<testing::DraKubelet::Claim> MakeAllocatedClaim(const ApiClient& api, const ClaimToMake& claim);

// DELETEs the claim; a claim already gone is no error.
absl::Status DeleteClaim(const ApiClient& api, const std::string& namespace_name, const std::string& name);

}  // namespace edgeaccel::bench

#endif  // EDGEACCEL_BENCH_LAB_CLAIMS_H_
