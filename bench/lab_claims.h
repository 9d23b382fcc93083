// What the lab benchmarks (bench/dra_compare_main.cc, bench/dra_churn_main.cc) share: their
// "--flag=value" arguments, and a ResourceClaim made through the API server and allocated as the
// scheduler leaves it for the kubelet.
#ifndef EDGEACCEL_BENCH_LAB_CLAIMS_H_
#define EDGEACCEL_BENCH_LAB_CLAIMS_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dra_kubelet.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel::bench {

// One of a lab tool's arguments, asked in turn whether it is each "--flag=VALUE" the tool takes.
// A number that is not one, or is below its least, ends the tool (exit 2), naming the argument.
class FlagArg {
 public:
  FlagArg(std::string tool, absl::string_view arg) : tool_(std::move(tool)), arg_(arg) {}
  // True when the argument is `flag`=VALUE, with VALUE in `value`.
  bool Value(absl::string_view flag, std::string* value) const;
  // The same for a whole number of at least `min`.
  bool Number(absl::string_view flag, int min, int* value) const;

 private:
  const std::string tool_;
  const absl::string_view arg_;
};

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
