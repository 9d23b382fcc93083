#include "edgeaccel/dra/claim_preparer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/atomic_file.h"
#include "edgeaccel/node/cdi_spec.h"
#include "edgeaccel/host/json_fields.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

// A namespace or object name the API server could hold (a DNS subdomain's characters, at most
// 253): anything else never reaches a URL path.
bool IsObjectName(absl::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

std::string Describe(const ClaimRef& claim) {
  return absl::StrCat(claim.namespace_name, "/", claim.name, " (", claim.uid, ")");
}

std::string NotAUid(absl::string_view uid) {
  return absl::StrCat("claim UID \"", absl::CHexEscape(uid.substr(0, 80)), "\" is not a UID");
}

std::string DeviceNames(const std::vector<PreparedDevice>& devices) {
  return absl::StrJoin(devices, ", ", [](std::string* out, const PreparedDevice& d) {
    absl::StrAppend(out, d.device);
  });
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Whether a 404 answer is the API server saying that this claim does not exist (a Status naming
// resourceclaims), rather than that it does not serve the path at all.
bool ClaimNotFound(const HttpResponse& response, const ClaimRef& claim) {
  nlohmann::json status = nlohmann::json::parse(response.body, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json* details = JsonMember(status, "details");
  return JsonString(status, "reason") == "NotFound" && details != nullptr &&
         JsonString(*details, "kind") == "resourceclaims" && JsonString(*details, "name") == claim.name;
}

// Whether `tolerations` tolerate every taint the device is published with now. A NoExecute
// taint is published as NoSchedule until its condition has held a while
// (SlicePublisher::Options::no_execute_after): the scheduler may have matched that.
bool ToleratesEveryTaint(const std::vector<DeviceToleration>& tolerations, const Device& device) {
  const nlohmann::json taints = DeviceTaints(device);
  return std::all_of(taints.begin(), taints.end(), [&](const nlohmann::json& taint) {
    const std::string key = taint.value("key", "");
    const std::string value = taint.value("value", "");
    const std::string effect = taint.value("effect", "");
    return std::any_of(tolerations.begin(), tolerations.end(), [&](const DeviceToleration& t) {
      return Tolerates(t, key, value, effect) ||
             (effect == "NoExecute" && Tolerates(t, key, value, "NoSchedule"));
    });
  });
}

}  // namespace

absl::StatusOr<std::string> FetchClaim(const ApiClient& client, const ClaimRef& claim) {
  if (!IsObjectName(claim.namespace_name) || !IsObjectName(claim.name)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", claim.namespace_name, "/", claim.name,
                                                   "\" is not a ResourceClaim's namespace and name"));
  }
  absl::StatusOr<HttpResponse> response = client.Request(
      "GET", absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", claim.namespace_name,
                          "/resourceclaims/", claim.name));
  if (absl::IsCancelled(response.status())) return response.status();
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot read ResourceClaim ", claim.namespace_name, "/",
                                               claim.name, " from the API server: ",
                                               response.status().message()));
  }
  if (response->status == 200) return std::move(response->body);
  const std::string body = response->body.substr(0, 300);
  if (response->status == 404 && ClaimNotFound(*response, claim)) {
    return absl::NotFoundError(absl::StrCat("ResourceClaim ", claim.namespace_name, "/", claim.name,
                                            " does not exist (any more)"));
  }
  return absl::UnavailableError(absl::StrCat("the API server answered ", response->status,
                                             " to GET ResourceClaim ", claim.namespace_name, "/",
                                             claim.name, ": ", body));
}

ClaimPreparer::ClaimPreparer(Options options, const DeviceSet* set)
    : options_(std::move(options)), set_(set), prepared_(options_.state_dir, options_.driver) {}

ClaimPreparer::~ClaimPreparer() { Stop(); }

void ClaimPreparer::Stop() {
  readers_.Stop();
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // What the kubelet was told is on disk before the next daemon reads the checkpoint.
  const absl::Status flushed = FlushCheckpoint(absl::Seconds(5));
  if (!flushed.ok()) {
    LOG(ERROR) << options_.driver << ": stopping with changes to " << prepared_.path()
               << " unwritten: " << flushed.message()
               << " (the next start reads the claims they forgot again, and Cleanup unprepares them)";
  }
  saver_.Stop();
}

void ClaimPreparer::SaveLater(Urgency urgency) {
  // A write already queued takes this change too; an unhurried one does not replace a hurried
  // one that waits (a prepare waits for it).
  if (urgency == Urgency::kUnhurried && save_queued_) return;
  save_queued_ = true;
  saver_.PostRetrying(
      "checkpoint",
      [this, urgency] {
        // A write no call waits for gives the CPU to the answer going out first (on a 2-core
        // node its JSON and system calls would compete with it), and takes what the next call
        // changes meanwhile: group commit.
        if (urgency == Urgency::kUnhurried) absl::SleepFor(kUnhurriedSaveDelay);
        return SaveOnce();
      },
      Workers::Retry{.first = absl::Seconds(1), .max = absl::Seconds(30)});
}

Workers::Outcome ClaimPreparer::SaveOnce() {
  std::string text;
  uint64_t version;
  {
    absl::MutexLock lock(&mu_);
    save_queued_ = false;  // a change from here on needs a write of its own
    version = prepared_.version();
    if (version <= saved_version_) return Workers::Outcome::kDone;  // an earlier write had it
    text = prepared_.Text();
  }
  // Without the lock: a prepare reads and decides while the disk writes. One write at a time
  // (the saver's one key), each of a version no older than the last.
  const absl::Status written = prepared_.Write(text);
  absl::MutexLock lock(&mu_);
  ++save_attempts_;
  if (written.ok()) {
    saved_version_ = std::max(saved_version_, version);
    if (!save_error_.ok()) LOG(INFO) << options_.driver << ": " << prepared_.path() << " is written again";
    save_error_ = absl::OkStatus();
    return Workers::Outcome::kDone;
  }
  if (written.message() != save_error_.message()) {
    LOG(WARNING) << options_.driver << ": cannot write " << prepared_.path() << ": " << written.message()
                 << " (tried again at the next change, and within 30 s)";
  }
  failed_attempt_ = save_attempts_;
  failed_version_ = version;
  save_error_ = written;
  return Workers::Outcome::kRetry;
}

absl::Status ClaimPreparer::AwaitSaved(uint64_t version, uint64_t since, absl::Duration timeout) {
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return saved_version_ >= version || (failed_attempt_ > since && failed_version_ >= version);
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  if (saved_version_ >= version) return absl::OkStatus();
  if (failed_attempt_ > since && failed_version_ >= version) return save_error_;
  return absl::DeadlineExceededError(absl::StrCat("the write of ", prepared_.path(), " did not end within ",
                                                  absl::FormatDuration(timeout)));
}

absl::Status ClaimPreparer::FlushCheckpoint(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const uint64_t version = prepared_.version();
  if (saved_version_ >= version) return absl::OkStatus();
  const uint64_t since = save_attempts_;
  SaveLater();
  return AwaitSaved(version, since, timeout);
}

absl::Status ClaimPreparer::PutNow(std::vector<PreparedClaim> claims) {
  std::vector<std::string> uids;
  std::vector<PreparedClaim> before;
  for (const PreparedClaim& claim : claims) {
    uids.push_back(claim.claim.uid);
    if (const PreparedClaim* known = prepared_.Find(claim.claim.uid)) before.push_back(*known);
  }
  const uint64_t since = save_attempts_;
  prepared_.Put(std::move(claims));
  SaveLater();
  absl::Status saved = AwaitSaved(prepared_.version(), since, options_.read_timeout);
  if (!saved.ok()) {  // as they were (the saver writes that again)
    prepared_.Remove(uids);
    prepared_.Put(std::move(before));
    SaveLater(Urgency::kUnhurried);
  }
  return saved;
}

absl::Status ClaimPreparer::RemoveNow(const std::string& uid) {
  const PreparedClaim* known = prepared_.Find(uid);
  if (known == nullptr) return absl::OkStatus();
  PreparedClaim before = *known;
  const uint64_t since = save_attempts_;
  prepared_.Remove({uid});
  SaveLater();
  absl::Status saved = AwaitSaved(prepared_.version(), since, options_.read_timeout);
  if (!saved.ok() && prepared_.Find(uid) == nullptr) {
    prepared_.Put({std::move(before)});
    SaveLater(Urgency::kUnhurried);
  }
  return saved;
}

std::string ClaimPreparer::SpecPath(const std::string& uid) const {
  return absl::StrCat(options_.cdi_dir, "/", DraCdiSpecFileName(options_.driver, uid));
}

absl::Status ClaimPreparer::Start() {
  absl::MutexLock lock(&mu_);
  absl::Status loaded = prepared_.Load();
  if (!loaded.ok()) LOG(ERROR) << options_.driver << ": " << loaded.message();
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  const std::map<std::string, PreparedClaim> recorded = prepared_.claims();
  int with_spec = 0;
  for (const auto& [uid, claim] : recorded) with_spec += Restore(claim, *snapshot) ? 1 : 0;
  if (!prepared_.claims().empty()) {
    LOG(INFO) << options_.driver << ": " << prepared_.claims().size() << " prepared claim(s) from "
              << prepared_.path() << ", " << with_spec << " with their CDI spec";
  }
  return loaded;
}

bool ClaimPreparer::Restore(const PreparedClaim& claim, const Snapshot& snapshot) {
  const std::string uid = claim.claim.uid;  // a key of the checkpoint: IsClaimUid holds
  const std::string spec = SpecPath(uid);
  const bool other_boot = !options_.boot_id.empty() && claim.boot_id != options_.boot_id;
  if (claim.pending) {
    // Its prepare was under way, or answered before its devices were written: Cleanup (at start)
    // reads the claim and prepares it again. A spec of another boot may name the wrong device
    // nodes: none until then.
    if (other_boot) unlink(spec.c_str());
    LOG(INFO) << options_.driver << ": the prepare of claim " << Describe(claim.claim)
              << " was under way when the last daemon stopped: it is read from the API server again";
    return false;
  }
  if (claim.devices.empty()) {
    // Nothing of ours: no record, and no spec (a spec without devices makes CDI refuse it).
    const bool removed = unlink(spec.c_str()) == 0;
    absl::Status forgotten = RemoveNow(uid);
    LOG(WARNING) << options_.driver << ": prepared claim " << Describe(claim.claim)
                 << " holds none of our devices: its record" << (removed ? " and empty CDI spec" : "")
                 << (forgotten.ok() ? " removed" : absl::StrCat(" cannot be removed: ", forgotten.message()));
    return false;
  }
  const bool present = FileExists(spec);
  if (present && !other_boot) return true;
  absl::Status written = WriteSpec(uid, claim.devices, snapshot);
  if (!written.ok()) {
    // A spec of another boot may name device nodes that are another device's now: none is
    // better than the wrong one.
    if (present && other_boot) unlink(spec.c_str());
    LOG(ERROR) << options_.driver << ": the CDI spec of prepared claim " << Describe(claim.claim)
               << (other_boot ? " (of another boot, or of none recorded)" : " is missing and")
               << " cannot be written again: " << written.message()
               << " (a container of it that starts now will not get its devices)";
    return false;
  }
  PreparedClaim updated = claim;
  updated.boot_id = options_.boot_id;
  absl::Status recorded = updated.boot_id == claim.boot_id ? absl::OkStatus() : PutNow({updated});
  const std::string note =
      recorded.ok() ? "" : absl::StrCat(" (the record keeps its old boot: ", recorded.message(), ")");
  if (other_boot) {
    LOG(INFO) << options_.driver << ": the CDI spec of prepared claim " << Describe(claim.claim)
              << " is of another boot (or of none recorded); written again from the devices found now" << note;
  } else {
    LOG(WARNING) << options_.driver << ": the CDI spec of prepared claim " << Describe(claim.claim)
                 << " was missing; written again" << note;
  }
  return true;
}

absl::Status ClaimPreparer::WriteSpec(const std::string& uid,
                                      const std::vector<PreparedDevice>& prepared,
                                      const Snapshot& snapshot) {
  if (prepared.empty()) return absl::InvalidArgumentError("a CDI spec needs at least one device");
  std::vector<std::string> devices;
  absl::flat_hash_set<std::string> written;  // a CDI spec names each device once
  for (const PreparedDevice& entry : prepared) {
    if (!written.insert(entry.device).second) continue;  // another share of it in this claim
    const Device* device = nullptr;
    for (const Device& candidate : snapshot.devices) {
      if (PhysicalId(candidate) == entry.physical_id) {
        device = &candidate;
        break;
      }
    }
    if (device == nullptr) {
      return absl::NotFoundError(absl::StrCat("device ", entry.device, " is not on this node any more"));
    }
    devices.push_back(absl::StrCat("    {\"name\": \"", uid, "-", entry.device,
                                   "\", \"containerEdits\": ", CdiContainerEditsJson(*device), "}"));
  }
  // cdiVersion 0.5.0: device names that start with a digit (a UID) need it (CDI SPEC.md).
  const std::string spec = absl::StrCat("{\n  \"cdiVersion\": \"0.5.0\",\n  \"kind\": \"",
                                        DraCdiKind(options_.driver), "\",\n  \"devices\": [\n",
                                        absl::StrJoin(devices, ",\n"), "\n  ]\n}\n");
  mkdir(options_.cdi_dir.c_str(), 0755);
  // The checkpoint is what must survive a power loss: every spec is written again from it at
  // the first start of each boot (Restore). Without a boot id to tell a new boot, a spec left
  // empty by one would stay, so then it is made durable itself.
  return WriteFileAtomically(options_.cdi_dir, DraCdiSpecFileName(options_.driver, uid), spec, 0644,
                             options_.boot_id.empty() ? FileSync::kDurable : FileSync::kPageCache);
}

std::vector<absl::StatusOr<std::string>> ClaimPreparer::ReadClaims(const std::vector<ClaimRef>& claims) {
  // Shared with the reading threads: one that outlives the wait writes here, not into the call.
  struct Reads {
    bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return left == 0; }
    absl::Mutex mu;
    std::vector<std::optional<absl::StatusOr<std::string>>> results ABSL_GUARDED_BY(mu);
    size_t left ABSL_GUARDED_BY(mu) = 0;
  };
  auto reads = std::make_shared<Reads>();
  {
    absl::MutexLock lock(&reads->mu);
    reads->results.resize(claims.size());
    reads->left = claims.size();
  }
  for (size_t i = 0; i < claims.size(); ++i) {
    const absl::Status started = readers_.Start([reads, i, claim = claims[i], fetch = options_.fetch_claim] {
      absl::StatusOr<std::string> body = fetch(claim);
      absl::MutexLock lock(&reads->mu);
      reads->results[i] = std::move(body);
      --reads->left;
    });
    if (!started.ok()) {
      absl::MutexLock lock(&reads->mu);
      reads->results[i] = absl::IsCancelled(started)
                              ? absl::CancelledError("the driver is stopping")
                              : absl::ResourceExhaustedError(absl::StrCat(
                                    "cannot read ResourceClaim ", claims[i].namespace_name, "/",
                                    claims[i].name, ": ", started.message()));
      --reads->left;
    }
  }
  std::vector<absl::StatusOr<std::string>> out;
  absl::MutexLock lock(&reads->mu);
  reads->mu.AwaitWithTimeout(absl::Condition(reads.get(), &Reads::Done), options_.read_timeout);
  for (size_t i = 0; i < claims.size(); ++i) {
    if (reads->results[i].has_value()) {
      out.push_back(*reads->results[i]);
    } else {
      out.push_back(absl::DeadlineExceededError(
          absl::StrCat("the API server did not answer the read of ResourceClaim ", claims[i].namespace_name,
                       "/", claims[i].name, " within ", absl::FormatDuration(options_.read_timeout))));
    }
  }
  return out;
}

std::optional<ClaimOutcome> ClaimPreparer::Recorded(const std::string& uid) const {
  const PreparedClaim* known = prepared_.Find(uid);
  // A spec gone missing (removed by hand, a tmpfs /var/run after a reboot): prepare again.
  if (known == nullptr || known->pending || !FileExists(SpecPath(uid))) return std::nullopt;
  return ClaimOutcome{known->devices, ""};
}

ClaimOutcome ClaimPreparer::PrepareRead(const ClaimRef& claim, const absl::StatusOr<std::string>& body,
                                        const Snapshot& snapshot,
                                        const std::map<std::string, PreparedClaim>& batch,
                                        std::optional<PreparedClaim>* record) {
  ClaimOutcome outcome;
  if (!body.ok()) {
    outcome.error = absl::IsCancelled(body.status())
                        ? "the DRA driver is stopping; the kubelet asks its next instance again"
                        : std::string(body.status().message());
    return outcome;
  }
  absl::StatusOr<ClaimAllocation> allocation =
      ReadClaimAllocation(*body, claim, options_.driver, options_.pool);
  if (!allocation.ok()) {
    outcome.error = std::string(allocation.status().message());
    return outcome;
  }
  std::vector<PreparedDevice> prepared;
  std::vector<std::string> problems;
  for (const ClaimResult& result : allocation->results) {
    const Device* device = nullptr;
    for (const Device& candidate : snapshot.devices) {
      if (candidate.replica_of.empty() && DraDeviceName(candidate) == result.device) {
        device = &candidate;
        break;
      }
    }
    if (device == nullptr) {
      problems.push_back(absl::StrCat("device ", result.device, " is not on this node"));
      continue;
    }
    if (device->health != Health::kHealthy && !result.admin_access) {
      // The scheduler gives a tainted device only to a request that tolerates its taints; an
      // Unhealthy device is offered with the taints DeviceTaints gives it (resource_slice.h).
      // A claim that tolerates every one of them now, or asks for admin access (monitoring, a
      // health check), gets it; any other is refused with the reason.
      if (!ToleratesEveryTaint(result.tolerations, *device)) {
        problems.push_back(absl::StrCat("device ", result.device, " is Unhealthy: ", device->unhealthy_reason,
                                        " (the claim does not tolerate its taints)"));
        continue;
      }
      LOG(INFO) << options_.driver << ": ResourceClaim " << Describe(claim) << " tolerates the taints of "
                << result.device << ", which is Unhealthy: " << device->unhealthy_reason;
    }
    if (!result.admin_access) {
      // A device goes to two claims only as two shares the scheduler handed out (each result
      // with its own shareID): one claim holding it alone excludes every other.
      // The holders: the claims recorded, and those of this call not yet written.
      for (const auto* held_by : {&prepared_.claims(), &batch}) {
        for (const auto& [uid, other] : *held_by) {
          if (uid == claim.uid) continue;
          for (const PreparedDevice& held : other.devices) {
            if (held.device != result.device) continue;
            if (result.share_id.empty()) {
              problems.push_back(absl::StrCat("device ", result.device, " is prepared for claim ",
                                              Describe(other.claim), " and is not shared"));
            } else if (held.share_id.empty()) {
              problems.push_back(absl::StrCat("device ", result.device, " is prepared for claim ",
                                              Describe(other.claim), ", which holds it alone"));
            } else if (held.share_id == result.share_id) {
              problems.push_back(absl::StrCat("share ", result.share_id, " of device ",
                                              result.device, " is prepared for claim ",
                                              Describe(other.claim)));
            }
          }
        }
      }
    }
    bool merged = false;
    for (PreparedDevice& existing : prepared) {  // one device (or share) for two requests: one entry
      if (existing.device == result.device && existing.share_id == result.share_id) {
        existing.requests.push_back(result.request);
        merged = true;
      }
    }
    if (merged) continue;
    PreparedDevice entry;
    entry.requests = {result.request};
    entry.pool = options_.pool;
    entry.device = result.device;
    entry.physical_id = device->id;
    // Two shares of one device in this claim name the same CDI device: the same device nodes.
    entry.cdi_ids = {DraCdiDeviceId(options_.driver, claim.uid, result.device)};
    entry.share_id = result.share_id;
    prepared.push_back(std::move(entry));
  }
  if (!problems.empty()) {
    outcome.error = absl::StrCat("ResourceClaim ", Describe(claim), ": ", absl::StrJoin(problems, "; "));
    return outcome;
  }
  if (prepared.empty()) {
    // Allocated, but nothing of ours on this node: nothing to write, nothing to undo later.
    LOG(INFO) << options_.driver << ": ResourceClaim " << Describe(claim) << " holds none of our devices";
    return outcome;
  }
  absl::Status written = WriteSpec(claim.uid, prepared, snapshot);
  if (!written.ok()) {
    outcome.error = absl::StrCat("cannot write the CDI spec of ResourceClaim ", Describe(claim), ": ",
                                 written.message());
    return outcome;
  }
  PreparedClaim& kept = record->emplace();
  kept.claim = claim;
  kept.devices = prepared;
  kept.cdi_spec = DraCdiSpecFileName(options_.driver, claim.uid);
  kept.boot_id = options_.boot_id;
  outcome.devices = std::move(prepared);
  return outcome;
}

std::map<std::string, ClaimOutcome> ClaimPreparer::Prepare(const std::vector<ClaimRef>& claims) {
  std::map<std::string, ClaimOutcome> out;
  std::vector<ClaimRef> to_read;
  std::set<std::string> marked;  // the pending records this call made
  uint64_t pending_version;      // a version that holds a record of every claim read
  uint64_t since;
  {
    absl::MutexLock lock(&mu_);
    std::vector<PreparedClaim> pending;
    for (const ClaimRef& claim : claims) {
      if (!IsClaimUid(claim.uid)) {
        out[claim.uid].error = NotAUid(claim.uid);
      } else if (std::optional<ClaimOutcome> known = Recorded(claim.uid)) {
        out[claim.uid] = *std::move(known);  // prepared before: the same answer
      } else {
        to_read.push_back(claim);
        if (prepared_.Find(claim.uid) != nullptr) continue;  // pending already (another call, a crash)
        PreparedClaim& record = pending.emplace_back();
        record.claim = claim;
        record.cdi_spec = DraCdiSpecFileName(options_.driver, claim.uid);
        record.boot_id = options_.boot_id;
        record.pending = true;
        marked.insert(claim.uid);
      }
    }
    since = save_attempts_;
    if (!pending.empty()) {
      // Written while the API server is asked: the fsync costs the call nothing.
      prepared_.Put(std::move(pending));
      for (const std::string& uid : marked) NoteRecord(uid, true);
      SaveLater();
    }
    pending_version = prepared_.version();
  }
  if (to_read.empty()) return out;
  // No lock while the API server is asked.
  const std::vector<absl::StatusOr<std::string>> bodies = ReadClaims(to_read);
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  std::map<std::string, PreparedClaim> batch;  // the call's records, devices held as recorded ones
  std::vector<std::string> failed;             // pending records of this call to forget
  for (size_t i = 0; i < to_read.size(); ++i) {
    const ClaimRef& claim = to_read[i];
    std::optional<ClaimOutcome> known = Recorded(claim.uid);  // another call prepared it meanwhile
    if (known.has_value()) {
      out[claim.uid] = *std::move(known);
      continue;
    }
    std::optional<PreparedClaim> record;
    ClaimOutcome outcome = PrepareRead(claim, bodies[i], *snapshot, batch, &record);
    if (!outcome.error.empty() && !absl::IsCancelled(bodies[i].status())) {
      LOG(WARNING) << options_.driver << ": cannot prepare ResourceClaim " << Describe(claim) << ": "
                   << outcome.error;
    }
    const PreparedClaim* existing = prepared_.Find(claim.uid);
    if (record.has_value()) {
      batch[claim.uid] = *std::move(record);
    } else if (marked.count(claim.uid) > 0 || (existing != nullptr && existing->pending && outcome.error.empty())) {
      // An error, or none of our devices: nothing to keep (a pending record found at start
      // stays until a read says what its claim is).
      failed.push_back(claim.uid);
    }
    out[claim.uid] = std::move(outcome);
  }
  std::vector<PreparedClaim> records;
  for (const auto& [uid, record] : batch) records.push_back(record);
  const uint64_t before = prepared_.version();
  prepared_.Remove(failed);
  prepared_.Put(std::move(records));
  for (const std::string& uid : failed) NoteRecord(uid, false);
  for (const auto& [uid, record] : batch) NoteRecord(uid, true);
  if (prepared_.version() != before) SaveLater(Urgency::kUnhurried);  // the devices: no one waits
  if (batch.empty()) return out;
  // A claim is answered prepared once the disk holds a record of it (pending or with devices).
  const absl::Status recorded = AwaitSaved(pending_version, since, options_.read_timeout);
  if (recorded.ok()) {
    // One line for the call's claims: a log write is a system call, on the pod's path.
    LOG(INFO) << options_.driver << ": prepared ResourceClaim" << (batch.size() > 1 ? "s " : " ")
              << absl::StrJoin(batch, "; ", [](std::string* line, const auto& entry) {
                   absl::StrAppend(line, Describe(entry.second.claim), ": ", DeviceNames(entry.second.devices));
                 });
    return out;
  }
  std::vector<std::string> undone;
  for (const auto& [uid, record] : batch) {
    ClaimOutcome& outcome = out[uid];
    unlink(SpecPath(uid).c_str());  // nothing half-done: the kubelet will ask again
    undone.push_back(uid);
    NoteRecord(uid, false);
    outcome.devices.clear();
    outcome.error = absl::StrCat("cannot record ResourceClaim ", Describe(record.claim), " as prepared: ",
                                 recorded.message());
    LOG(WARNING) << options_.driver << ": cannot prepare ResourceClaim " << Describe(record.claim) << ": "
                 << outcome.error;
  }
  if (!undone.empty()) {
    prepared_.Remove(undone);
    SaveLater(Urgency::kUnhurried);
  }
  return out;
}

std::map<std::string, std::string> ClaimPreparer::Unprepare(const std::vector<ClaimRef>& claims) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::string> out;
  std::vector<std::string> uids;  // specs removed: forgotten with one write of the checkpoint
  std::vector<std::string> said;  // of them, those prepared: one log line for the call
  for (const ClaimRef& claim : claims) {
    std::string& error = out[claim.uid];
    if (!IsClaimUid(claim.uid)) {
      error = NotAUid(claim.uid);
      continue;
    }
    if (unlink(SpecPath(claim.uid).c_str()) != 0 && errno != ENOENT) {
      error = absl::StrCat("cannot remove ", SpecPath(claim.uid), ": ", strerror(errno));
      continue;
    }
    const PreparedClaim* known = prepared_.Find(claim.uid);
    if (known == nullptr) continue;  // never prepared, or unprepared before: done
    if (!known->pending) said.push_back(Describe(claim));
    uids.push_back(claim.uid);
    NoteRecord(claim.uid, false);
  }
  // Answered without waiting for the write: a forget a crash loses comes back as a claim no pod
  // of the kubelet's uses, which Cleanup unprepares (see the header).
  if (!uids.empty()) {
    prepared_.Remove(uids);
    SaveLater(Urgency::kUnhurried);
  }
  if (!said.empty()) {
    LOG(INFO) << options_.driver << ": unprepared ResourceClaim" << (said.size() > 1 ? "s " : " ")
              << absl::StrJoin(said, ", ");
  }
  return out;
}

ClaimPreparer::CleanupReport ClaimPreparer::Cleanup() {
  CleanupReport report;
  std::vector<ClaimRef> recorded;
  std::vector<uint64_t> generations;  // of each record as read here
  std::set<std::string> pending;      // their UIDs whose prepare was under way
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [uid, claim] : prepared_.claims()) {
      recorded.push_back(claim.claim);
      generations.push_back(GenerationOf(uid));
      if (claim.pending) pending.insert(uid);
    }
  }
  // A claim the kubelet lists for one of its pods is in use: only the others are read, so an idle
  // node with prepared claims sends the API server nothing (a GET per claim every --dra-resync
  // was the bulk of a node's idle requests). A name recorded twice (a claim deleted and made
  // again) is read either way: the listing names claims, not UIDs; so is a claim whose prepare
  // was under way (its devices are not recorded yet).
  if (options_.claims_in_use) {
    absl::StatusOr<std::set<std::string>> in_use = options_.claims_in_use();
    if (in_use.ok()) {
      std::map<std::string, int> records_of;
      for (const ClaimRef& claim : recorded) ++records_of[absl::StrCat(claim.namespace_name, "/", claim.name)];
      std::vector<ClaimRef> asked;
      std::vector<uint64_t> asked_generations;
      for (size_t i = 0; i < recorded.size(); ++i) {
        const std::string name = absl::StrCat(recorded[i].namespace_name, "/", recorded[i].name);
        if (in_use->count(name) > 0 && records_of[name] == 1 && pending.count(recorded[i].uid) == 0) {
          ++report.in_use;
          continue;
        }
        asked.push_back(recorded[i]);
        asked_generations.push_back(generations[i]);
      }
      recorded = std::move(asked);
      generations = std::move(asked_generations);
    } else {
      VLOG(1) << options_.driver << ": the kubelet's pod-resources API cannot say which claims are in use ("
              << in_use.status().message() << "): every prepared claim is read from the API server";
    }
  }
  report.checked = static_cast<int>(recorded.size());
  const std::vector<absl::StatusOr<std::string>> bodies = ReadClaims(recorded);
  for (size_t i = 0; i < recorded.size(); ++i) {
    const ClaimRef& claim = recorded[i];
    std::optional<CleanupReason> reason;
    if (absl::IsNotFound(bodies[i].status())) {
      reason = CleanupReason::kGone;
    } else if (bodies[i].ok()) {
      absl::StatusOr<ClaimLiveness> liveness = ReadClaimLiveness(*bodies[i], claim);
      if (!liveness.ok()) {
        if (report.error.ok()) report.error = liveness.status();
        continue;
      }
      if (*liveness == ClaimLiveness::kReplaced) reason = CleanupReason::kReplaced;
      if (*liveness == ClaimLiveness::kDeallocated) reason = CleanupReason::kDeallocated;
    } else if (report.error.ok()) {
      report.error = bodies[i].status();
    }
    if (reason.has_value() && UnprepareStale(claim, generations[i], *reason, &report.error)) {
      ++report.unprepared;
    } else if (!reason.has_value() && bodies[i].ok() && pending.count(claim.uid) > 0) {
      FinishPending(claim, generations[i], *bodies[i]);
    }
  }
  if (absl::IsCancelled(report.error)) return report;  // stopping
  const std::string error(report.error.message());
  absl::MutexLock lock(&mu_);
  if (!error.empty() && error != last_cleanup_error_) {
    LOG(WARNING) << options_.driver << ": cannot tell whether every prepared claim is still in use: " << error
                 << " (asked again at the next cleanup)";
  }
  last_cleanup_error_ = error;
  return report;
}

uint64_t ClaimPreparer::GenerationOf(const std::string& uid) {
  uint64_t& generation = generations_[uid];
  if (generation == 0) generation = ++last_generation_;
  return generation;
}

void ClaimPreparer::NoteRecord(const std::string& uid, bool present) {
  if (present) {
    generations_[uid] = ++last_generation_;
  } else {
    generations_.erase(uid);
  }
}

bool ClaimPreparer::UnprepareStale(const ClaimRef& claim, uint64_t generation, CleanupReason reason,
                                   absl::Status* error) {
  std::vector<PreparedDevice> devices;
  {
    absl::MutexLock lock(&mu_);
    const PreparedClaim* known = prepared_.Find(claim.uid);
    if (known == nullptr) return false;  // the kubelet unprepared it meanwhile
    // Unprepared and prepared again while the API server was asked (a pod deleted and its claim
    // allocated anew): that record is not the one judged stale.
    if (GenerationOf(claim.uid) != generation) return false;
    devices = known->devices;
    absl::Status removed;
    if (unlink(SpecPath(claim.uid).c_str()) != 0 && errno != ENOENT) {
      removed = absl::InternalError(absl::StrCat("cannot remove ", SpecPath(claim.uid), ": ", strerror(errno)));
    } else {
      removed = RemoveNow(claim.uid);
    }
    if (!removed.ok()) {
      if (error->ok()) *error = removed;
      return false;
    }
    NoteRecord(claim.uid, false);
  }
  const char* why = reason == CleanupReason::kGone        ? "is gone from the API server"
                    : reason == CleanupReason::kReplaced ? "was deleted and made again under its name"
                                                          : "is no longer allocated";
  const std::string message =
      absl::StrCat("ResourceClaim ", Describe(claim), " ", why,
                   " but was still prepared on this node (its pod was force-deleted, or the kubelet "
                   "lost its own record): unprepared by driver ", options_.driver, "; ",
                   DeviceNames(devices), " free again");
  LOG(WARNING) << options_.driver << ": " << message;
  if (options_.counters != nullptr) options_.counters->cleaned_up_for(reason).fetch_add(1);
  if (options_.on_event) options_.on_event(kClaimCleanedUpReason, message);
  return true;
}

void ClaimPreparer::FinishPending(const ClaimRef& claim, uint64_t generation, const std::string& body) {
  absl::MutexLock lock(&mu_);
  const PreparedClaim* known = prepared_.Find(claim.uid);
  // Prepared or unprepared by the kubelet meanwhile: not the record that was read.
  if (known == nullptr || !known->pending || GenerationOf(claim.uid) != generation) return;
  std::optional<PreparedClaim> record;
  const ClaimOutcome outcome = PrepareRead(claim, body, *set_->Current(), {}, &record);
  if (!outcome.error.empty()) {
    LOG(WARNING) << options_.driver << ": the prepare of ResourceClaim " << Describe(claim)
                 << ", under way when the last daemon stopped, cannot be finished: " << outcome.error
                 << " (tried again at the next cleanup)";
    return;
  }
  if (!record.has_value()) {  // none of our devices
    prepared_.Remove({claim.uid});
    NoteRecord(claim.uid, false);
    SaveLater(Urgency::kUnhurried);
    return;
  }
  const std::string devices = DeviceNames(record->devices);
  prepared_.Put({*std::move(record)});
  NoteRecord(claim.uid, true);
  SaveLater(Urgency::kUnhurried);
  LOG(INFO) << options_.driver << ": prepared ResourceClaim " << Describe(claim)
            << ", whose prepare was under way when the last daemon stopped: " << devices;
}

std::vector<PreparedClaim> ClaimPreparer::Prepared() const {
  absl::MutexLock lock(&mu_);
  std::vector<PreparedClaim> out;
  for (const auto& [uid, claim] : prepared_.claims()) {
    if (!claim.pending) out.push_back(claim);
  }
  return out;
}

}  // namespace edgeaccel
