// PreparedClaims: the claims this driver has prepared on this node, kept on disk
// (<kubelet-root>/plugins/<driver>/checkpoint.json) so a daemon restarted between
// NodePrepareResources and NodeUnprepareResources loses nothing: the next process answers a
// repeated prepare with the same devices, and an unprepare removes exactly the spec it wrote,
// even when the ResourceClaim is already gone from the API server.
//
// Written atomically (dot-file, fsync, rename) after every change; read once at start. A file
// that cannot be read or parsed, or whose claims are keyed by anything but claim UIDs
// (IsClaimUid: file names are built from them), is kept aside as
// checkpoint.json.unreadable-<time> and said in the log: the daemon starts with no prepared
// claims rather than not at all, and the claims' specs are still found by unprepare from the
// claim UID.
#ifndef EDGEACCEL_DRA_PREPARED_CLAIMS_H_
#define EDGEACCEL_DRA_PREPARED_CLAIMS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "edgeaccel/dra/claim_reader.h"

namespace edgeaccel {

struct PreparedDevice {
  std::vector<std::string> requests;  // the kubelet's request_names
  std::string pool;
  std::string device;       // the DRA device name
  std::string physical_id;  // the device's id in the device set
  std::vector<std::string> cdi_ids;
  // The allocation's shareID when the device is shared with other claims (the kubelet's
  // share_id); empty when this claim holds the device alone.
  std::string share_id;

  bool operator==(const PreparedDevice& other) const {
    return requests == other.requests && pool == other.pool && device == other.device &&
           physical_id == other.physical_id && cdi_ids == other.cdi_ids &&
           share_id == other.share_id;
  }
};

struct PreparedClaim {
  ClaimRef claim;
  std::vector<PreparedDevice> devices;
  std::string cdi_spec;  // the spec file's name in the CDI directory
  // The node's boot (/proc/sys/kernel/random/boot_id) the spec was last written in; "" when
  // unknown. Specs live on a tmpfs (/var/run/cdi) and /dev numbering may change, so a claim of
  // another boot has its spec written again.
  std::string boot_id;
};

// The checkpoint's JSON, and back. Parse errors say what is wrong.
std::string PreparedClaimsJson(absl::string_view driver,
                               const std::map<std::string, PreparedClaim>& claims);
absl::StatusOr<std::map<std::string, PreparedClaim>> ParsePreparedClaims(absl::string_view text,
                                                                          absl::string_view driver);

// Reads the checkpoint in `directory` (a driver's DraPluginDir) without changing anything:
// NotFound when there is none, DataLoss (what is wrong) when it cannot be parsed, Internal when
// it cannot be read. For the driver's own start (PreparedClaims::Load) and for anyone who needs
// to know what a driver holds (the device plugin after a move from DRA).
absl::StatusOr<std::map<std::string, PreparedClaim>> ReadPreparedClaims(const std::string& directory,
                                                                         absl::string_view driver);

class PreparedClaims {
 public:
  PreparedClaims(std::string directory, std::string driver);

  // Reads the file (none: no claims). An unreadable one is moved aside; the error says so.
  absl::Status Load();
  const std::map<std::string, PreparedClaim>& claims() const { return claims_; }
  const PreparedClaim* Find(absl::string_view uid) const;
  // Records or forgets a claim and writes the file; on a write error the record is as before.
  absl::Status Put(PreparedClaim claim);
  absl::Status Remove(absl::string_view uid);
  // The same for several claims with one write of the file (one fsync for a kubelet call's
  // claims); on a write error none is recorded or forgotten. Nothing to change writes nothing.
  absl::Status PutAll(std::vector<PreparedClaim> claims);
  absl::Status RemoveAll(const std::vector<std::string>& uids);
  std::string path() const;

 private:
  absl::Status Save(const std::map<std::string, PreparedClaim>& claims);
  const std::string directory_;
  const std::string driver_;
  std::map<std::string, PreparedClaim> claims_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_PREPARED_CLAIMS_H_
