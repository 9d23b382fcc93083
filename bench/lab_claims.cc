#include "lab_claims.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace edgeaccel::bench {
namespace {

using nlohmann::json;

std::string ClaimsPath(const std::string& namespace_name) {
  return absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", namespace_name, "/resourceclaims");
}

}  // namespace

bool FlagArg::Value(absl::string_view flag, std::string* value) const {
  absl::string_view rest = arg_;
  if (!absl::ConsumePrefix(&rest, flag) || !absl::ConsumePrefix(&rest, "=")) return false;
  *value = std::string(rest);
  return true;
}

bool FlagArg::Number(absl::string_view flag, int min, int* value) const {
  std::string text;
  if (!Value(flag, &text)) return false;
  if (!absl::SimpleAtoi(text, value) || *value < min) {
    fprintf(stderr, "%s: bad %s\n", tool_.c_str(), std::string(arg_).c_str());
    exit(2);
  }
  return true;
}

absl::StatusOr<testing::DraKubelet::Claim> MakeAllocatedClaim(const ApiClient& api, const ClaimToMake& made) {
  const std::string base = ClaimsPath(made.namespace_name);
  const json claim = {
      {"apiVersion", "resource.k8s.io/v1"},
      {"kind", "ResourceClaim"},
      {"metadata", {{"name", made.name}, {"labels", {{"app.kubernetes.io/part-of", made.part_of}}}}},
      {"spec",
       {{"devices",
         {{"requests", json::array({{{"name", "dev"}, {"exactly", {{"deviceClassName", made.driver}}}}})}}}}}};
  absl::StatusOr<HttpResponse> created = api.Request("POST", base, "application/json", claim.dump());
  if (!created.ok()) return absl::Status(created.status().code(), absl::StrCat("POST ", made.name, ": ", created.status().message()));
  if (created->status != 201) {
    return absl::UnavailableError(absl::StrCat("POST ", made.name, ": HTTP ", created->status, " ", created->body));
  }
  const json body = json::parse(created->body, nullptr, false);
  if (body.is_discarded() || !body.contains("metadata") || !body["metadata"].contains("uid")) {
    return absl::DataLossError(absl::StrCat("POST ", made.name, ": no metadata.uid in the answer"));
  }
  const json status = {
      {"status",
       {{"allocation",
         {{"devices",
           {{"results", json::array({{{"request", "dev"},
                                      {"driver", made.driver},
                                      {"pool", made.node},
                                      {"device", made.device}}})}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             json::array({{{"matchFields", json::array({{{"key", "metadata.name"},
                                                         {"operator", "In"},
                                                         {"values", json::array({made.node})}}})}}})}}}}}}}};
  absl::StatusOr<HttpResponse> patched = api.Request("PATCH", absl::StrCat(base, "/", made.name, "/status"),
                                                     "application/merge-patch+json", status.dump());
  if (!patched.ok()) {
    return absl::Status(patched.status().code(), absl::StrCat("PATCH ", made.name, "/status: ", patched.status().message()));
  }
  if (patched->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("PATCH ", made.name, "/status: HTTP ", patched->status, " ", patched->body));
  }
  return testing::DraKubelet::Claim{made.namespace_name, made.name, body["metadata"]["uid"].get<std::string>()};
}

absl::Status DeleteClaim(const ApiClient& api, const std::string& namespace_name, const std::string& name) {
  absl::StatusOr<HttpResponse> deleted = api.Request("DELETE", absl::StrCat(ClaimsPath(namespace_name), "/", name));
  if (!deleted.ok()) return deleted.status();
  if (deleted->status != 200 && deleted->status != 202 && deleted->status != 404) {
    return absl::UnavailableError(absl::StrCat("DELETE ", name, ": HTTP ", deleted->status, " ", deleted->body));
  }
  return absl::OkStatus();
}

}  // namespace edgeaccel::bench
