#include "edgeaccel/dra/claim_preparer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/host/atomic_file.h"
#include "edgeaccel/node/cdi_spec.h"
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

// A claim UID as the API server makes them (a UUID); it names files, so nothing else.
bool IsUid(absl::string_view uid) {
  if (uid.empty() || uid.size() > 64) return false;
  for (char c : uid) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-')) return false;
  }
  return true;
}

std::string Describe(const ClaimRef& claim) {
  return absl::StrCat(claim.namespace_name, "/", claim.name, " (", claim.uid, ")");
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
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot read ResourceClaim ", claim.namespace_name, "/",
                                               claim.name, " from the API server: ",
                                               response.status().message()));
  }
  if (response->status == 200) return std::move(response->body);
  const std::string body = response->body.substr(0, 300);
  if (response->status == 404) {
    return absl::NotFoundError(absl::StrCat("ResourceClaim ", claim.namespace_name, "/", claim.name,
                                            " does not exist (any more)"));
  }
  return absl::UnavailableError(absl::StrCat("the API server answered ", response->status,
                                             " to GET ResourceClaim ", claim.namespace_name, "/",
                                             claim.name, ": ", body));
}

ClaimPreparer::ClaimPreparer(Options options, const DeviceSet* set)
    : options_(std::move(options)), set_(set), prepared_(options_.state_dir, options_.driver) {}

std::string ClaimPreparer::SpecPath(const std::string& uid) const {
  return absl::StrCat(options_.cdi_dir, "/", DraCdiSpecFileName(options_.driver, uid));
}

absl::Status ClaimPreparer::Start() {
  absl::MutexLock lock(&mu_);
  absl::Status loaded = prepared_.Load();
  if (!loaded.ok()) LOG(ERROR) << options_.driver << ": " << loaded.message();
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  int kept = 0;
  for (const auto& [uid, claim] : prepared_.claims()) {
    struct stat st;
    if (stat(SpecPath(uid).c_str(), &st) == 0) {
      ++kept;
      continue;
    }
    absl::Status written = WriteSpec(uid, claim.devices, *snapshot);
    if (written.ok()) {
      LOG(WARNING) << options_.driver << ": the CDI spec of prepared claim " << Describe(claim.claim)
                   << " was missing; written again";
      ++kept;
    } else {
      LOG(ERROR) << options_.driver << ": the CDI spec of prepared claim " << Describe(claim.claim)
                 << " is missing and cannot be written again: " << written.message()
                 << " (a container of it that starts now will not get its devices)";
    }
  }
  if (!prepared_.claims().empty()) {
    LOG(INFO) << options_.driver << ": " << prepared_.claims().size()
              << " prepared claim(s) from " << prepared_.path() << ", " << kept << " with their CDI spec";
  }
  return loaded;
}

absl::Status ClaimPreparer::WriteSpec(const std::string& uid,
                                      const std::vector<PreparedDevice>& prepared,
                                      const Snapshot& snapshot) {
  std::vector<std::string> devices;
  for (const PreparedDevice& entry : prepared) {
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
  return WriteFileAtomically(options_.cdi_dir, DraCdiSpecFileName(options_.driver, uid), spec, 0644);
}

ClaimOutcome ClaimPreparer::PrepareOne(const ClaimRef& claim, const Snapshot& snapshot) {
  ClaimOutcome outcome;
  if (!IsUid(claim.uid)) {
    outcome.error = absl::StrCat("claim UID \"", claim.uid, "\" is not a UID");
    return outcome;
  }
  if (const PreparedClaim* known = prepared_.Find(claim.uid)) {
    struct stat st;
    if (stat(SpecPath(claim.uid).c_str(), &st) == 0) {
      outcome.devices = known->devices;  // prepared before: the same answer
      return outcome;
    }
    // The spec went missing (removed by hand, a tmpfs /var/run after a reboot): prepare again.
  }
  absl::StatusOr<std::string> body = options_.fetch_claim(claim);
  if (!body.ok()) {
    outcome.error = std::string(body.status().message());
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
    if (device->health != Health::kHealthy) {
      problems.push_back(absl::StrCat("device ", result.device, " is Unhealthy: ", device->unhealthy_reason));
      continue;
    }
    if (!result.admin_access) {
      for (const auto& [uid, other] : prepared_.claims()) {
        if (uid == claim.uid) continue;
        for (const PreparedDevice& held : other.devices) {
          if (held.device == result.device) {
            problems.push_back(absl::StrCat("device ", result.device, " is prepared for claim ",
                                            Describe(other.claim), " and is not shared"));
          }
        }
      }
    }
    bool merged = false;
    for (PreparedDevice& existing : prepared) {  // one device for two requests: one entry
      if (existing.device == result.device) {
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
    entry.cdi_ids = {DraCdiDeviceId(options_.driver, claim.uid, result.device)};
    prepared.push_back(std::move(entry));
  }
  if (!problems.empty()) {
    outcome.error = absl::StrCat("ResourceClaim ", Describe(claim), ": ", absl::StrJoin(problems, "; "));
    return outcome;
  }
  PreparedClaim record;
  record.claim = claim;
  record.devices = prepared;
  record.cdi_spec = DraCdiSpecFileName(options_.driver, claim.uid);
  if (!prepared.empty()) {
    absl::Status written = WriteSpec(claim.uid, prepared, snapshot);
    if (!written.ok()) {
      outcome.error = absl::StrCat("cannot write the CDI spec of ResourceClaim ", Describe(claim), ": ",
                                   written.message());
      return outcome;
    }
  }
  absl::Status recorded = prepared_.Put(record);
  if (!recorded.ok()) {
    unlink(SpecPath(claim.uid).c_str());  // nothing half-done: the kubelet will ask again
    outcome.error = absl::StrCat("cannot record ResourceClaim ", Describe(claim), " as prepared: ",
                                 recorded.message());
    return outcome;
  }
  LOG(INFO) << options_.driver << ": prepared ResourceClaim " << Describe(claim) << ": "
            << (prepared.empty() ? std::string("no devices of ours")
                                 : absl::StrJoin(prepared, ", ", [](std::string* out, const PreparedDevice& d) {
                                     absl::StrAppend(out, d.device);
                                   }));
  outcome.devices = std::move(prepared);
  return outcome;
}

std::map<std::string, ClaimOutcome> ClaimPreparer::Prepare(const std::vector<ClaimRef>& claims) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const Snapshot> snapshot = set_->Current();
  std::map<std::string, ClaimOutcome> out;
  for (const ClaimRef& claim : claims) {
    ClaimOutcome outcome = PrepareOne(claim, *snapshot);
    if (!outcome.error.empty()) {
      LOG(WARNING) << options_.driver << ": cannot prepare ResourceClaim " << Describe(claim) << ": "
                   << outcome.error;
    }
    out[claim.uid] = std::move(outcome);
  }
  return out;
}

std::map<std::string, std::string> ClaimPreparer::Unprepare(const std::vector<ClaimRef>& claims) {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::string> out;
  for (const ClaimRef& claim : claims) {
    std::string& error = out[claim.uid];
    if (!IsUid(claim.uid)) {
      error = absl::StrCat("claim UID \"", claim.uid, "\" is not a UID");
      continue;
    }
    const bool known = prepared_.Find(claim.uid) != nullptr;
    if (unlink(SpecPath(claim.uid).c_str()) != 0 && errno != ENOENT) {
      error = absl::StrCat("cannot remove ", SpecPath(claim.uid), ": ", strerror(errno));
      continue;
    }
    absl::Status removed = prepared_.Remove(claim.uid);
    if (!removed.ok()) {
      error = absl::StrCat("cannot record ResourceClaim ", Describe(claim), " as unprepared: ",
                           removed.message());
      continue;
    }
    if (known) LOG(INFO) << options_.driver << ": unprepared ResourceClaim " << Describe(claim);
  }
  return out;
}

std::vector<PreparedClaim> ClaimPreparer::Prepared() const {
  absl::MutexLock lock(&mu_);
  std::vector<PreparedClaim> out;
  for (const auto& [uid, claim] : prepared_.claims()) out.push_back(claim);
  return out;
}

}  // namespace edgeaccel
