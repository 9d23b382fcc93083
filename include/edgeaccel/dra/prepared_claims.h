// PreparedClaims: the claims this driver has prepared on this node, kept on disk
// (<kubelet-root>/plugins/<driver>/checkpoint.json) so a daemon restarted between
// NodePrepareResources and NodeUnprepareResources loses nothing: the next process answers a
// repeated prepare with the same devices, and an unprepare removes exactly the spec it wrote,
// even when the ResourceClaim is already gone from the API server.
//
// Changed in memory, each change a new version(); written atomically (dot-file, fsync, rename)
// by whoever owns it (ClaimPreparer's saver: a write holds every change made before it, so one
// write carries a burst of changes); read once at start. A file
// that cannot be read or parsed, or whose claims are keyed by anything but claim UIDs
// (IsClaimUid: file names are built from them), is kept aside as
// checkpoint.json.unreadable-<time> and said in the log: the daemon starts with no prepared
// claims rather than not at all, and the claims' specs are still found by unprepare from the
// claim UID.
#ifndef EDGEACCEL_DRA_PREPARED_CLAIMS_H_
#define EDGEACCEL_DRA_PREPARED_CLAIMS_H_

#include <cstdint>
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
  // A claim whose prepare was under way: recorded (namespace, name, UID; no devices) while its
  // ResourceClaim is read, so that the record is on disk by the time the prepare is answered
  // even when its devices are not yet (ClaimPreparer). Found at start, such a claim is read from
  // the API server again and prepared, or forgotten if it is gone.
  bool pending = false;
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
  // Records or forgets claims, in memory: a change makes a new version(); forgetting claims
  // none of which is recorded changes nothing.
  void Put(std::vector<PreparedClaim> claims);
  void Remove(const std::vector<std::string>& uids);
  uint64_t version() const { return version_; }
  // The file's text for what is recorded now.
  std::string Text() const;
  // Writes `text` as the file (dot-file, fsync, rename). Reads nothing that changes, so the
  // owner may call it without its lock, one write at a time.
  absl::Status Write(const std::string& text) const;
  // Write(Text()): for those who need no saver (tests, tools).
  absl::Status Save() const { return Write(Text()); }
  std::string path() const;

 private:
  const std::string directory_;
  const std::string driver_;
  std::map<std::string, PreparedClaim> claims_;
  uint64_t version_ = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_PREPARED_CLAIMS_H_
