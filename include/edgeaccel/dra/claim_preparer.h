// ClaimPreparer: what NodePrepareResources and NodeUnprepareResources do, without gRPC.
//
// Prepare, per claim: read the ResourceClaim from the API server (UID checked, allocated), take
// the results of our driver on our node's pool, check each device is here and Healthy and not
// prepared for another claim, write one CDI spec for the claim (devices "<claimUID>-<device>",
// containerEdits from discovery: device nodes with the host's mode and owner, envs), record the
// claim (PreparedClaims) and answer the CDI ids. A claim already prepared is answered from the
// record (idempotent: the kubelet repeats prepares after its own restart), its spec rewritten
// if it went missing. Unprepare removes the claim's spec and record; an unknown claim is done.
//
// Every error is per claim and says why; one claim's failure never fails the others. Calls are
// serialized (the kubelet sends one call per pod and driver at a time, but two pods' calls may
// overlap).
#ifndef EDGEACCEL_DRA_CLAIM_PREPARER_H_
#define EDGEACCEL_DRA_CLAIM_PREPARER_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/dra/claim_reader.h"
#include "edgeaccel/dra/prepared_claims.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

// A claim's answer: its devices, or the error (then devices are empty).
struct ClaimOutcome {
  std::vector<PreparedDevice> devices;
  std::string error;
};

// Gets a ResourceClaim's JSON from the API server: the body, NotFound when it is gone, another
// error when the API server cannot be asked or refuses.
using ClaimFetcher = std::function<absl::StatusOr<std::string>(const ClaimRef&)>;

// GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name> with `client`. Names that
// are not DNS names are refused before anything is sent.
absl::StatusOr<std::string> FetchClaim(const ApiClient& client, const ClaimRef& claim);

class ClaimPreparer {
 public:
  struct Options {
    std::string driver;     // edgetpu.edgeaccel.io
    std::string pool;       // the node's name
    std::string cdi_dir;    // where claim specs go (/var/run/cdi)
    std::string state_dir;  // <kubelet-root>/plugins/<driver>: checkpoint.json
    ClaimFetcher fetch_claim;
  };

  // `set` holds the driver's devices (all of them, Healthy or not); it outlives this object.
  ClaimPreparer(Options options, const DeviceSet* set);

  // Reads the checkpoint and checks each prepared claim's spec file, rewriting a missing one from
  // the devices found now. The error (an unreadable checkpoint) is for the log: it still starts.
  absl::Status Start();

  std::map<std::string, ClaimOutcome> Prepare(const std::vector<ClaimRef>& claims);
  // Claim UID -> error ("" when done).
  std::map<std::string, std::string> Unprepare(const std::vector<ClaimRef>& claims);

  // What is prepared now (for --discover, metrics and tests).
  std::vector<PreparedClaim> Prepared() const;
  const Options& options() const { return options_; }

 private:
  ClaimOutcome PrepareOne(const ClaimRef& claim, const Snapshot& snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the claim's CDI spec for `devices` (physical id -> device).
  absl::Status WriteSpec(const std::string& uid, const std::vector<PreparedDevice>& prepared,
                         const Snapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SpecPath(const std::string& uid) const;

  const Options options_;
  const DeviceSet* const set_;
  mutable absl::Mutex mu_;
  PreparedClaims prepared_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_CLAIM_PREPARER_H_
