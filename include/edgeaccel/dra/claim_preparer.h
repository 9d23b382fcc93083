// ClaimPreparer: what NodePrepareResources and NodeUnprepareResources do, without gRPC, and the
// driver's own unprepare of claims the kubelet will never unprepare.
//
// Prepare, per claim: read the ResourceClaim from the API server (UID checked, allocated), take
// the results of our driver on our node's pool, check each device is here and Healthy and not
// prepared for another claim (unless both claims hold it as shares: results with distinct
// shareIDs, which the scheduler gives only on a device offered with allowMultipleAllocations;
// each share is answered with its share_id), write one CDI spec for the claim (devices "<claimUID>-<device>",
// containerEdits from discovery: device nodes with the host's mode and owner, envs), record the
// claim (PreparedClaims) and answer the CDI ids. A claim with none of our devices is answered
// with none and leaves nothing behind: no spec (CDI refuses one without devices) and no record.
// A claim already prepared is answered from the record (idempotent: the kubelet repeats
// prepares after its own restart), its spec rewritten if it went missing. Unprepare removes the
// claim's spec and record; an unknown claim is done.
//
// The claims of one call are read from the API server at the same time, each on a thread of its
// own (which waits kDraThreadLinger for the next read, then ends), and the call waits at most
// `read_timeout` for them: a claim not read by then fails alone, with the reason. No lock is held
// while reading, so an Unprepare or another Prepare never waits for the API server; what is
// decided after the reads (devices free, spec, record) is serialized.
//
// Cleanup: for each recorded claim, a GET by namespace and name; a claim that is gone, made
// again under its name (another UID) or no longer allocated is unprepared here, if its record is
// still the one Cleanup read before asking (a claim unprepared and prepared again meanwhile is
// left alone) (spec and record
// removed, a log line, a counter, a Node Event): a force-deleted pod or a kubelet that lost its
// state would otherwise leave a record that refuses the device to every later claim.
//
// The checkpoint (PreparedClaims) is written by a saver thread of its own, each write holding
// every change made before it. A prepare answers only once the disk holds a record of each claim
// it answers prepared: a pending record (the claim's namespace, name and UID) is written while
// the claim is read from the API server, so that fsync is hidden behind the read, and the record
// with the devices follows without the answer waiting for it. After a crash in between, the
// pending record is found at start and the claim is read and prepared again (Cleanup), or
// forgotten if it is gone: the kubelet, which may not ask again after a reboot, still finds the
// claim's spec. An unprepare answers once the spec is removed and the record forgotten in
// memory; the write follows. Lost by a crash before it, the claim comes back as a record whose
// pod the kubelet no longer runs: Cleanup (at start, then every --dra-resync) reads it from the
// API server and unprepares it once it is gone or deallocated. A write that fails is tried again
// (1 s, doubling to 30 s) and said in the log; a prepare whose records could not be written
// fails, with the reason, and leaves no spec.
//
// Every error is per claim and says why; one claim's failure never fails the others. Claim
// UIDs are checked (IsClaimUid) before any path is built from one.
#ifndef EDGEACCEL_DRA_CLAIM_PREPARER_H_
#define EDGEACCEL_DRA_CLAIM_PREPARER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/claim_reader.h"
#include "edgeaccel/dra/dra_counters.h"
#include "edgeaccel/dra/prepared_claims.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

// A claim's answer: its devices, or the error (then devices are empty).
struct ClaimOutcome {
  std::vector<PreparedDevice> devices;
  std::string error;
};

// Gets a ResourceClaim's JSON from the API server: the body; NotFound when the claim does not
// exist; Cancelled when the client was cancelled (the daemon is stopping); another error when
// the API server cannot be asked or refuses.
using ClaimFetcher = std::function<absl::StatusOr<std::string>(const ClaimRef&)>;

// GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name> with `client`. Names that
// are not DNS names are refused before anything is sent. NotFound only when the API server says
// that claim is not found (a 404 Status naming resourceclaims); a 404 for the path itself
// (resource.k8s.io/v1 not served) is an error like any other.
absl::StatusOr<std::string> FetchClaim(const ApiClient& client, const ClaimRef& claim);

// The Node Event's reason for a claim the driver unprepared itself.
inline constexpr char kClaimCleanedUpReason[] = "DRAClaimCleanedUp";
// How long a DRA call's, claim read's or checkpoint write's thread waits for the next one before
// it ends: the calls of pods started together (and a prepare's read and write) start no thread
// each, and an idle driver still has none a few seconds later.
inline constexpr absl::Duration kDraThreadLinger = absl::Seconds(2);
// How much later a checkpoint write no call waits for begins (see ClaimPreparer::SaveLater).
inline constexpr absl::Duration kUnhurriedSaveDelay = absl::Milliseconds(1);
// Where the node's boot id is read (under --host-root): Options::boot_id.
inline constexpr char kDraBootIdPath[] = "/proc/sys/kernel/random/boot_id";

class ClaimPreparer {
 public:
  struct Options {
    std::string driver;     // edgetpu.edgeaccel.io
    std::string pool;       // the node's name
    std::string cdi_dir;    // where claim specs go (/var/run/cdi)
    std::string state_dir;  // <kubelet-root>/plugins/<driver>: checkpoint.json
    ClaimFetcher fetch_claim;
    // This boot's id (/proc/sys/kernel/random/boot_id); "" when unknown, and then only a missing
    // spec is written again at start.
    std::string boot_id;
    // The longest a claim's read may take (the kubelet gives the whole call 45 s).
    absl::Duration read_timeout = absl::Seconds(20);
    // Told of each claim Cleanup() unprepared: a Node Event's reason (kClaimCleanedUpReason) and
    // message. May be empty.
    std::function<void(const std::string& reason, const std::string& message)> on_event;
    // Where cleanups are counted; may be null.
    DraCounters* counters = nullptr;
    // The claims ("namespace/name") the kubelet lists for its active pods under this driver (its
    // pod-resources API), for Cleanup: such a claim is in use, and the API server is not asked
    // about it. May be empty, or fail: then every recorded claim is asked about.
    std::function<absl::StatusOr<std::set<std::string>>()> claims_in_use;
  };

  // What one Cleanup() did.
  struct CleanupReport {
    int in_use = 0;      // recorded claims the kubelet lists for a pod: not asked about
    int checked = 0;     // recorded claims asked about
    int unprepared = 0;  // of them, unprepared here
    // The first reason a claim could not be judged or unprepared (API server away, a file that
    // cannot be removed); those claims are looked at again next time. Cancelled: stopping.
    absl::Status error;
  };

  // `set` holds the driver's devices (all of them, Healthy or not); it outlives this object.
  ClaimPreparer(Options options, const DeviceSet* set);
  ~ClaimPreparer();  // Stop()

  // Reads the checkpoint and brings each record's spec up to date before the kubelet can ask:
  // a claim recorded in another boot has its spec written again from the devices found now
  // (/dev numbering may have changed; /var/run/cdi is a tmpfs), one of this boot only when its
  // spec is missing; a record without devices goes, with any spec written for it (no claim
  // with none of our devices is recorded). The error (an unreadable checkpoint, kept aside) is for the log: it
  // still starts.
  absl::Status Start();
  // Reads no more claims (Prepare and Cleanup then answer at once that the driver is stopping)
  // and joins the threads still reading one. Call once the API client is cancelled (a read in
  // flight then ends at once) and before the client goes.
  void Stop();

  std::map<std::string, ClaimOutcome> Prepare(const std::vector<ClaimRef>& claims);
  // Claim UID -> error ("" when done).
  std::map<std::string, std::string> Unprepare(const std::vector<ClaimRef>& claims);
  // Asks the API server about every recorded claim (at the same time, as Prepare reads) and
  // unprepares those it no longer needs (see above). Its error is logged when it is not the one
  // the last pass logged.
  CleanupReport Cleanup();

  // What is prepared now (for --discover, metrics and tests); not a claim whose prepare is under
  // way.
  std::vector<PreparedClaim> Prepared() const;
  // Waits until the checkpoint on disk holds everything recorded now (Stop() does, so the next
  // daemon reads what the kubelet was told); the write's error, or DeadlineExceeded.
  absl::Status FlushCheckpoint(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  const Options& options() const { return options_; }

 private:
  // Reads `claims` at the same time, at most read_timeout: one result per claim, in order.
  std::vector<absl::StatusOr<std::string>> ReadClaims(const std::vector<ClaimRef>& claims);
  // The recorded answer of a claim prepared before whose spec is on disk.
  std::optional<ClaimOutcome> Recorded(const std::string& uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prepares `claim` from what its read gave: writes its CDI spec and gives the record to keep
  // in `*record`, beside `batch`, the records of the same call not yet written (their devices are
  // held as the recorded ones are). The caller writes them all at once.
  ClaimOutcome PrepareRead(const ClaimRef& claim, const absl::StatusOr<std::string>& body,
                           const Snapshot& snapshot, const std::map<std::string, PreparedClaim>& batch,
                           std::optional<PreparedClaim>* record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the spec and record of a claim the API server no longer has for us; false when it
  // is not recorded any more or cannot be removed (then *error says why).
  // Only the record of `generation` (GenerationOf when Cleanup read the records) goes.
  bool UnprepareStale(const ClaimRef& claim, uint64_t generation, CleanupReason reason,
                      absl::Status* error);
  // Each record's generation: a new one whenever a claim is prepared (or first looked at after
  // Start), forgotten when it is unprepared. Cleanup removes a record only if it is still the one
  // it judged.
  uint64_t GenerationOf(const std::string& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteRecord(const std::string& uid, bool present) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the claim's CDI spec for `prepared` (at least one device).
  absl::Status WriteSpec(const std::string& uid, const std::vector<PreparedDevice>& prepared,
                         const Snapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings one record's spec up to date (Start). True when the claim stays recorded with its spec
  // on disk.
  bool Restore(const PreparedClaim& claim, const Snapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string SpecPath(const std::string& uid) const;
  // The saver: has the checkpoint written as recorded now (a write not yet started takes this
  // change too), and waits (mu_ released meanwhile) until the file holds `version` or later: Ok;
  // the error of a write begun after attempt `since` (save_attempts_ then) that held `version`;
  // or DeadlineExceeded after `timeout`.
  // kHurried: a call waits for it (a prepare's pending records; Start, Cleanup, Stop); kUnhurried:
  // none does, and it starts kUnhurriedSaveDelay later.
  enum class Urgency { kHurried, kUnhurried };
  void SaveLater(Urgency urgency = Urgency::kHurried) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitSaved(uint64_t version, uint64_t since, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Changes the records in memory and waits for their write (Start and Cleanup: nothing waits on
  // them); on a write error the records are put back as they were.
  absl::Status PutNow(std::vector<PreparedClaim> claims) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RemoveNow(const std::string& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Workers::Outcome SaveOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads a pending record's claim again and prepares it (Cleanup), from `body`.
  void FinishPending(const ClaimRef& claim, uint64_t generation, const std::string& body)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const DeviceSet* const set_;
  Workers readers_{"ea-dra-read",
                   {.parallel = Workers::kUnbounded, .exit_when_idle = true, .linger = kDraThreadLinger}};
  mutable absl::Mutex mu_;
  PreparedClaims prepared_ ABSL_GUARDED_BY(mu_);
  std::string last_cleanup_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> generations_ ABSL_GUARDED_BY(mu_);
  uint64_t last_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The saver's record: the newest version on disk; writes attempted; the last failed one's
  // number, version and error.
  uint64_t saved_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t save_attempts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_attempt_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_version_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status save_error_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool save_queued_ ABSL_GUARDED_BY(mu_) = false;  // a write is posted and has not begun
  // Last: gone before what its writes read.
  Workers saver_{"ea-dra-save", {.parallel = 1, .exit_when_idle = true, .linger = kDraThreadLinger}};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_CLAIM_PREPARER_H_
