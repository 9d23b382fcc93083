#include "edgeaccel/dra/prepared_claims.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/host/atomic_file.h"
#include "edgeaccel/host/json_fields.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

constexpr absl::string_view kCheckpointKind = "edgeaccel.io/dra-prepared-claims";
constexpr int kCheckpointVersion = 1;
constexpr char kFileName[] = "checkpoint.json";

}  // namespace

std::string PreparedClaimsJson(absl::string_view driver,
                               const std::map<std::string, PreparedClaim>& claims) {
  json out{{"kind", std::string(kCheckpointKind)},
           {"version", kCheckpointVersion},
           {"driver", std::string(driver)},
           {"claims", json::object()}};
  for (const auto& [uid, prepared] : claims) {
    json devices = json::array();
    for (const PreparedDevice& device : prepared.devices) {
      json entry{{"requests", device.requests},
                 {"pool", device.pool},
                 {"device", device.device},
                 {"physicalId", device.physical_id},
                 {"cdiIds", device.cdi_ids}};
      if (!device.share_id.empty()) entry["shareID"] = device.share_id;
      devices.push_back(std::move(entry));
    }
    out["claims"][uid] = json{{"namespace", prepared.claim.namespace_name},
                              {"name", prepared.claim.name},
                              {"devices", devices},
                              {"cdiSpec", prepared.cdi_spec}};
    if (!prepared.boot_id.empty()) out["claims"][uid]["bootId"] = prepared.boot_id;
    if (prepared.pending) out["claims"][uid]["pending"] = true;
  }
  return out.dump(2) + "\n";
}

absl::StatusOr<std::map<std::string, PreparedClaim>> ParsePreparedClaims(absl::string_view text,
                                                                          absl::string_view driver) {
  json in = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) return absl::DataLossError("not a JSON object");
  if (JsonString(in, "kind") != kCheckpointKind) return absl::DataLossError("not a prepared-claims checkpoint");
  if (JsonInt(in, "version") != kCheckpointVersion) return absl::DataLossError("checkpoint version is not 1");
  const std::optional<std::string> checkpoint_driver = JsonString(in, "driver");
  if (checkpoint_driver != driver) {
    return absl::DataLossError(
        absl::StrCat("checkpoint of driver ", checkpoint_driver.value_or("(not a string)"), ", not ", driver));
  }
  const json* claims = JsonMember(in, "claims");
  if (claims == nullptr || !claims->is_object()) return absl::DataLossError("claims is not an object");
  std::map<std::string, PreparedClaim> out;
  for (const auto& [uid, entry] : claims->items()) {
    if (!IsClaimUid(uid)) {
      return absl::DataLossError(absl::StrCat("key \"", absl::CHexEscape(uid.substr(0, 80)),
                                              "\" is not a claim UID"));
    }
    const std::string what = absl::StrCat("claim ", uid, ": ");
    if (!entry.is_object()) return absl::DataLossError(what + "not an object");
    PreparedClaim prepared;
    prepared.claim.uid = uid;
    for (const auto& [key, target] : {std::pair<const char*, std::string*>{"namespace", &prepared.claim.namespace_name},
                                      {"name", &prepared.claim.name},
                                      {"cdiSpec", &prepared.cdi_spec}}) {
      std::optional<std::string> value = JsonString(entry, key);
      if (!value) return absl::DataLossError(absl::StrCat(what, key, " is not a string"));
      *target = *std::move(value);
    }
    if (JsonMember(entry, "bootId") != nullptr) {  // optional
      std::optional<std::string> boot = JsonString(entry, "bootId");
      if (!boot) return absl::DataLossError(what + "bootId is not a string");
      prepared.boot_id = *std::move(boot);
    }
    if (JsonMember(entry, "pending") != nullptr) {  // optional: a prepare under way
      std::optional<bool> pending = JsonBool(entry, "pending");
      if (!pending) return absl::DataLossError(what + "pending is not a boolean");
      prepared.pending = *pending;
    }
    if (prepared.cdi_spec.find('/') != std::string::npos || prepared.cdi_spec.empty() ||
        prepared.cdi_spec[0] == '.') {
      return absl::DataLossError(what + "cdiSpec is not a file name");
    }
    const json* devices = JsonMember(entry, "devices");
    if (devices == nullptr || !devices->is_array()) return absl::DataLossError(what + "devices is not a list");
    for (const json& device : *devices) {
      if (!device.is_object()) return absl::DataLossError(what + "a device is not an object");
      PreparedDevice parsed;
      for (const auto& [key, target] : {std::pair<const char*, std::string*>{"pool", &parsed.pool},
                                        {"device", &parsed.device},
                                        {"physicalId", &parsed.physical_id}}) {
        std::optional<std::string> value = JsonString(device, key);
        if (!value) return absl::DataLossError(absl::StrCat(what, "device ", key, " is not a string"));
        *target = *std::move(value);
      }
      for (const auto& [key, target] : {std::pair<const char*, std::vector<std::string>*>{"requests", &parsed.requests},
                                        {"cdiIds", &parsed.cdi_ids}}) {
        std::optional<std::vector<std::string>> value = JsonStringList(device, key);
        if (!value) return absl::DataLossError(absl::StrCat(what, "device ", key, " is not a list of strings"));
        *target = *std::move(value);
      }
      if (JsonMember(device, "shareID") != nullptr) {  // optional: shared devices
        std::optional<std::string> share = JsonString(device, "shareID");
        if (!share || !IsClaimUid(*share)) return absl::DataLossError(what + "device shareID is not a UID");
        parsed.share_id = *std::move(share);
      }
      prepared.devices.push_back(std::move(parsed));
    }
    out[uid] = std::move(prepared);
  }
  return out;
}

PreparedClaims::PreparedClaims(std::string directory, std::string driver)
    : directory_(std::move(directory)), driver_(std::move(driver)) {}

std::string PreparedClaims::path() const { return absl::StrCat(directory_, "/", kFileName); }

absl::StatusOr<std::map<std::string, PreparedClaim>> ReadPreparedClaims(const std::string& directory,
                                                                         absl::string_view driver) {
  const std::string path = absl::StrCat(directory, "/", kFileName);
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::InternalError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParsePreparedClaims(text.str(), driver);
}

absl::Status PreparedClaims::Load() {
  claims_.clear();
  absl::StatusOr<std::map<std::string, PreparedClaim>> read = ReadPreparedClaims(directory_, driver_);
  if (read.ok()) {
    claims_ = std::move(*read);
    return absl::OkStatus();
  }
  if (absl::IsNotFound(read.status())) return absl::OkStatus();
  if (!absl::IsDataLoss(read.status())) return read.status();
  const std::string aside = absl::StrCat(path(), ".unreadable-", absl::ToUnixSeconds(absl::Now()));
  const bool moved = rename(path().c_str(), aside.c_str()) == 0;
  return absl::DataLossError(absl::StrCat(path(), " is unreadable (", read.status().message(), "); ",
                                          moved ? absl::StrCat("kept as ", aside) : "left in place",
                                          "; starting with no prepared claims"));
}

const PreparedClaim* PreparedClaims::Find(absl::string_view uid) const {
  auto it = claims_.find(std::string(uid));
  return it == claims_.end() ? nullptr : &it->second;
}

std::string PreparedClaims::Text() const { return PreparedClaimsJson(driver_, claims_); }

absl::Status PreparedClaims::Write(const std::string& text) const {
  mkdir(directory_.c_str(), 0750);  // normally made with the service socket
  return WriteFileAtomically(directory_, kFileName, text, 0600);
}

void PreparedClaims::Put(std::vector<PreparedClaim> claims) {
  if (claims.empty()) return;
  for (PreparedClaim& claim : claims) claims_[claim.claim.uid] = std::move(claim);
  ++version_;
}

void PreparedClaims::Remove(const std::vector<std::string>& uids) {
  size_t erased = 0;
  for (const std::string& uid : uids) erased += claims_.erase(uid);
  if (erased > 0) ++version_;
}

}  // namespace edgeaccel
