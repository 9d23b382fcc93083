#include "edgeaccel/dra/claim_reader.h"

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/host/json_fields.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

// The string at `key` of `object`, or an error naming the field.
absl::StatusOr<std::string> StringField(const json& object, const char* key, const std::string& path) {
  const json* member = JsonMember(object, key);
  if (member == nullptr || member->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".", key, " is missing"));
  }
  std::optional<std::string> value = JsonString(object, key);
  if (!value) return absl::InvalidArgumentError(absl::StrCat(path, ".", key, " is not a string"));
  if (value->size() > 253) return absl::InvalidArgumentError(absl::StrCat(path, ".", key, " is too long"));
  return *std::move(value);
}

// A ResourceClaim's metadata.uid and status.allocation (null when it has none).
struct ParsedClaim {
  std::string uid;
  json allocation;
};

absl::StatusOr<ParsedClaim> ParseClaim(absl::string_view body, const std::string& what) {
  ParsedClaim parsed;
  const json object = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded() || !object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the API server's answer is not a JSON object"));
  }
  if (JsonMember(object, "kind") != nullptr && JsonString(object, "kind") != "ResourceClaim") {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the API server answered with another kind"));
  }
  const json* metadata = JsonMember(object, "metadata");
  if (metadata == nullptr || !metadata->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no metadata"));
  }
  absl::StatusOr<std::string> uid = StringField(*metadata, "uid", "metadata");
  if (!uid.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", uid.status().message()));
  parsed.uid = *std::move(uid);
  if (const json* status = JsonMember(object, "status"); status != nullptr) {
    const json* allocation = JsonMember(*status, "allocation");
    if (allocation != nullptr && allocation->is_object()) parsed.allocation = *allocation;
  }
  return parsed;
}

std::string What(const ClaimRef& claim) {
  return absl::StrCat("ResourceClaim ", claim.namespace_name, "/", claim.name);
}

}  // namespace

absl::StatusOr<ClaimLiveness> ReadClaimLiveness(absl::string_view body, const ClaimRef& claim) {
  absl::StatusOr<ParsedClaim> parsed = ParseClaim(body, What(claim));
  if (!parsed.ok()) return parsed.status();
  if (parsed->uid != claim.uid) return ClaimLiveness::kReplaced;
  if (parsed->allocation.is_null()) return ClaimLiveness::kDeallocated;
  return ClaimLiveness::kCurrent;
}

bool Tolerates(const DeviceToleration& toleration, absl::string_view key, absl::string_view value,
               absl::string_view effect) {
  if (!toleration.effect.empty() && toleration.effect != effect) return false;
  if (!toleration.key.empty() && toleration.key != key) return false;
  if (toleration.op == "Exists") return true;
  return (toleration.op.empty() || toleration.op == "Equal") && toleration.value == value;
}

absl::StatusOr<ClaimAllocation> ReadClaimAllocation(absl::string_view body, const ClaimRef& claim,
                                                    absl::string_view driver,
                                                    absl::string_view pool) {
  const std::string what = What(claim);
  absl::StatusOr<ParsedClaim> parsed = ParseClaim(body, what);
  if (!parsed.ok()) return parsed.status();
  if (parsed->uid != claim.uid) {
    // DRAH getResourceClaims: "got replaced". The kubelet's claim is gone; this is a new one.
    return absl::FailedPreconditionError(absl::StrCat(what, " has UID ", parsed->uid, ", not ", claim.uid,
                                                      ": it was deleted and made again"));
  }
  if (parsed->allocation.is_null()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not allocated"));
  }
  const json& allocation = parsed->allocation;
  ClaimAllocation out;
  const json* devices = JsonMember(allocation, "devices");
  if (devices == nullptr || devices->is_null()) return out;
  if (!devices->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": status.allocation.devices is not an object"));
  }
  const json* results = JsonMember(*devices, "results");
  if (results == nullptr || results->is_null()) return out;
  if (!results->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": status.allocation.devices.results is not a list"));
  }
  if (results->size() > kMaxAllocationResults) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", results->size(),
                                                   " allocation results, more than the API allows (32)"));
  }
  for (size_t i = 0; i < results->size(); ++i) {
    const json& result = (*results)[i];
    const std::string path = absl::StrCat("status.allocation.devices.results[", i, "]");
    if (!result.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not an object"));
    absl::StatusOr<std::string> result_driver = StringField(result, "driver", path);
    if (!result_driver.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", result_driver.status().message()));
    if (*result_driver != driver) continue;  // another driver's: the kubelet asks it separately
    absl::StatusOr<std::string> result_pool = StringField(result, "pool", path);
    absl::StatusOr<std::string> device = StringField(result, "device", path);
    absl::StatusOr<std::string> request = StringField(result, "request", path);
    for (const auto* field : {&result_pool, &device, &request}) {
      if (!field->ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", field->status().message()));
    }
    if (*result_pool != pool) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": device ", *device, " is allocated from pool ",
                                                        *result_pool, ", not this node's (", pool, ")"));
    }
    ClaimResult entry;
    // DRAH stripSubrequestNames: "main/sub" -> "main".
    entry.request = request->substr(0, request->find('/'));
    entry.device = *device;
    entry.admin_access = JsonBool(result, "adminAccess").value_or(false);
    if (const json* tolerations = JsonMember(result, "tolerations");
        tolerations != nullptr && !tolerations->is_null()) {
      if (!tolerations->is_array() || tolerations->size() > kMaxTolerations) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", path, ".tolerations is not a list of at most ", kMaxTolerations));
      }
      for (const json& toleration : *tolerations) {
        DeviceToleration parsed;
        bool valid = toleration.is_object();
        for (const auto& [key, target] : {std::pair<const char*, std::string*>{"key", &parsed.key},
                                          {"operator", &parsed.op},
                                          {"value", &parsed.value},
                                          {"effect", &parsed.effect}}) {
          if (!valid || JsonMember(toleration, key) == nullptr || toleration[key].is_null()) continue;
          std::optional<std::string> text = JsonString(toleration, key);
          if (!text || text->size() > 316) valid = false;  // a qualified key is at most 316
          else *target = *std::move(text);
        }
        if (!valid || !(parsed.op.empty() || parsed.op == "Equal" || parsed.op == "Exists")) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": ", path, ".tolerations has an entry that is not a toleration"));
        }
        entry.tolerations.push_back(std::move(parsed));
      }
    }
    if (const json* share = JsonMember(result, "shareID"); share != nullptr && !share->is_null()) {
      // A UUID (k8s-uuid) as the scheduler makes it; it goes back to the kubelet verbatim.
      std::optional<std::string> share_id = JsonString(result, "shareID");
      if (!share_id || !IsClaimUid(*share_id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", path, ".shareID ",
            share_id ? absl::StrCat("\"", absl::CHexEscape(share_id->substr(0, 80)), "\"")
                     : std::string("(not a string)"),
            " is not a UID"));
      }
      entry.share_id = *std::move(share_id);
    }
    out.results.push_back(std::move(entry));
  }
  return out;
}

}  // namespace edgeaccel
