// Reads a ResourceClaim (resource.k8s.io/v1, as the API server answers a GET) for
// NodePrepareResources: checks it is the claim the kubelet named (its UID: a claim deleted and
// made again under the same name is another claim) and that it is allocated, and takes the
// allocation results that are ours (our driver, our node's pool). The claim comes from the API
// server, so nothing in it is trusted: every field is checked for type and size, and a claim
// that cannot be read is an error that says why, never a crash (fuzz/fuzz_dra_claim.cc).
#ifndef EDGEACCEL_DRA_CLAIM_READER_H_
#define EDGEACCEL_DRA_CLAIM_READER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace edgeaccel {

// A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources.
struct ClaimRef {
  std::string namespace_name;
  std::string name;
  std::string uid;
};

// One of a result's tolerations (k8s.io/api resource/v1 DeviceToleration): the scheduler copies
// the request's tolerations into the result, and allocates a tainted device only where they
// tolerate every taint.
struct DeviceToleration {
  std::string key;       // empty: every key (with Exists)
  std::string op;        // "Equal" (the default, also for empty) or "Exists"
  std::string value;
  std::string effect;    // empty: every effect
};
// DeviceToleration.ToleratesTaint (k8s.io/dynamic-resource-allocation resourceclaim): the effect
// and the key match where given, and the value where the operator is Equal.
bool Tolerates(const DeviceToleration& toleration, absl::string_view key, absl::string_view value,
               absl::string_view effect);
// At most this many tolerations a request (DeviceTolerationsMaxLength).
inline constexpr size_t kMaxTolerations = 16;

// One allocation result of ours: which request it satisfies (a sub-request "main/sub" becomes
// "main", as the kubelet matches container requests by the main name) and which device.
struct ClaimResult {
  std::string request;
  std::string device;
  bool admin_access = false;
  std::vector<DeviceToleration> tolerations;
  // One share of a device several claims may hold at once (results[].shareID, KEP-5075: the
  // scheduler sets it, a UUID, only on devices the slice offered with allowMultipleAllocations);
  // empty for a device allocated to this claim alone.
  std::string share_id;
};

struct ClaimAllocation {
  std::vector<ClaimResult> results;  // ours only; empty when the claim has none for us
};

// At most this many results (AllocationResultsMaxSize in k8s.io/api resource/v1).
inline constexpr size_t kMaxAllocationResults = 32;

// Parses `body` (the ResourceClaim JSON) for `claim`, keeping the results of `driver` in pool
// `pool`. Errors: not JSON or not a ResourceClaim, another UID ("replaced"), not allocated, a
// result of ours in another pool, malformed fields (a shareID that is not a UID among them).
absl::StatusOr<ClaimAllocation> ReadClaimAllocation(absl::string_view body, const ClaimRef& claim,
                                                    absl::string_view driver,
                                                    absl::string_view pool);

// What a GET of a claim prepared here says about it, for the driver's own cleanup: still the
// claim the kubelet named and allocated (kCurrent); made again under its name (kReplaced: another
// UID); or the same claim with no allocation any more (kDeallocated: the resource claim
// controller deallocates only once no pod has it reserved). A body that is not a ResourceClaim
// is an error: nothing is concluded from it.
enum class ClaimLiveness { kCurrent, kReplaced, kDeallocated };
absl::StatusOr<ClaimLiveness> ReadClaimLiveness(absl::string_view body, const ClaimRef& claim);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_CLAIM_READER_H_
