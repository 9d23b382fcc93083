#include "edgeaccel/node/node_labeler.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/host/json_fields.h"
#include "edgeaccel/node/label_ownership.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

std::string NodePath(const std::string& node) { return "/api/v1/nodes/" + node; }

}  // namespace

std::string NodeLabelPatch(const LabelSet& labels, const std::set<std::string>& managed) {
  nlohmann::json patch;
  nlohmann::json& out = patch["metadata"]["labels"];
  out = nlohmann::json::object();
  for (const std::string& key : managed) {
    if (!labels.count(key)) out[key] = nullptr;  // ours before, not now: remove
  }
  std::vector<std::string> keys;
  for (const auto& [key, value] : labels) {
    out[key] = value;
    keys.push_back(key);
  }
  patch["metadata"]["annotations"][std::string(kManagedLabelsAnnotation)] = absl::StrJoin(keys, ",");
  return patch.dump();
}

NodeLabeler::NodeLabeler(ApiServerConfig config, Workers* worker)
    : config_(std::move(config)),
      client_(config_),
      own_worker_(worker == nullptr ? std::make_unique<Workers>("ea-nodelabels") : nullptr),
      worker_(worker == nullptr ? own_worker_.get() : worker) {}

NodeLabeler::~NodeLabeler() { Stop(); }

void NodeLabeler::Start() {
  worker_->AddStopHook([this] { client_.Cancel(); });
  absl::MutexLock lock(&mu_);
  started_ = true;
  if (desired_.has_value()) Post();
}

void NodeLabeler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  client_.Cancel();  // a request in flight ends now, whatever the API server does
  if (own_worker_ != nullptr) own_worker_->Stop();
}

void NodeLabeler::Set(const LabelSet& labels) {
  absl::MutexLock lock(&mu_);
  if (desired_.has_value() && *desired_ == labels) return;
  desired_ = labels;
  desired_version_++;
  if (started_) Post();
}

void NodeLabeler::Post() {
  if (stopping_) return;
  worker_->PostRetrying("node labels", [this] { return Apply(); },
                        {.first = config_.initial_backoff,
                         .max = config_.max_backoff,
                         .jitter = 0.5,
                         .newer_waits_for_retry = true});
}

absl::StatusOr<NodeLabeler::NodeLabels> NodeLabeler::ReadNode() {
  absl::StatusOr<HttpResponse> response = client_.Request("GET", NodePath(config_.node_name));
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return absl::Status(response->status == 403 ? absl::StatusCode::kPermissionDenied
                                                : absl::StatusCode::kUnavailable,
                        absl::StrCat("GET node ", config_.node_name, ": HTTP ", response->status));
  }
  nlohmann::json node = nlohmann::json::parse(response->body, nullptr, false);
  NodeLabels result;
  if (node.is_discarded() || !node.is_object()) {
    return absl::UnavailableError("GET node: the answer is not JSON");
  }
  const nlohmann::json* metadata = JsonMember(node, "metadata");
  const nlohmann::json* annotations = metadata == nullptr ? nullptr : JsonMember(*metadata, "annotations");
  if (annotations != nullptr) {
    const std::optional<std::string> managed = JsonString(*annotations, kManagedLabelsAnnotation);
    for (absl::string_view key : absl::StrSplit(managed.value_or(""), ',', absl::SkipEmpty())) {
      result.managed.insert(std::string(key));
    }
  }
  const nlohmann::json* labels = metadata == nullptr ? nullptr : JsonMember(*metadata, "labels");
  if (labels != nullptr && labels->is_object()) {
    for (const auto& [key, value] : labels->items()) {
      if (value.is_string()) result.labels[key] = value.get<std::string>();
    }
  }
  return result;
}

absl::Status NodeLabeler::Patch(const LabelSet& labels, const std::set<std::string>& managed) {
  absl::StatusOr<HttpResponse> response =
      client_.Request("PATCH", NodePath(config_.node_name), "application/merge-patch+json",
                      NodeLabelPatch(labels, managed));
  if (!response.ok()) return response.status();
  switch (response->status) {
    case 200:
      return absl::OkStatus();
    case 401:
      return absl::UnauthenticatedError("PATCH node: HTTP 401, the token was not accepted");
    case 403:
      return absl::PermissionDeniedError(absl::StrCat(
          "PATCH node ", config_.node_name, ": HTTP 403. The service account needs the RBAC rule "
          "{apiGroups: [\"\"], resources: [\"nodes\"], verbs: [\"get\", \"patch\"]} in a "
          "ClusterRole bound to it"));
    case 404:
      return absl::NotFoundError(absl::StrCat("PATCH node: no node named ", config_.node_name,
                                              " (is NODE_NAME right?)"));
    default:
      return absl::UnavailableError(absl::StrCat("PATCH node ", config_.node_name, ": HTTP ",
                                                 response->status));
  }
}

Workers::Outcome NodeLabeler::Apply() {
  LabelSet want;
  uint64_t version;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Workers::Outcome::kDone;
    if (!desired_.has_value() || desired_version_ == applied_version_) {
      return Workers::Outcome::kDone;
    }
    want = *desired_;
    version = desired_version_;
  }
  // Read the Node first: whose keys are whose is decided against what is on it now.
  absl::StatusOr<NodeLabels> node = ReadNode();
  absl::Status status = node.status();
  if (status.ok() && !managed_.has_value()) managed_ = node->managed;
  LabelSet ours = want;
  std::set<std::string> patch_managed;
  if (status.ok()) {
    const std::set<std::string> others =
        KeysHeldByOthers(want, node->labels, *managed_, applied_.value_or(LabelSet()));
    for (const std::string& key : others) ours.erase(key);
    // A key left to another writer is not ours to remove either.
    for (const std::string& key : *managed_) {
      if (others.count(key) == 0) patch_managed.insert(key);
    }
    if (others != left_to_others_) {
      left_to_others_ = others;
      if (!others.empty()) {
        LOG(INFO) << "node " << config_.node_name << ": leaving "
                  << absl::StrJoin(others, ", ")
                  << " to the other writer that holds them on the node (GPU feature discovery?)";
      }
    }
  }
  if (status.ok() && applied_.has_value() && *applied_ == ours) {
    applied_version_ = version;
    return Workers::Outcome::kDone;
  }
  if (status.ok()) status = Patch(ours, patch_managed);
  if (status.ok()) {
    patches_.fetch_add(1);
    applied_ = ours;
    applied_version_ = version;
    managed_ = std::set<std::string>();
    for (const auto& [key, value] : ours) managed_->insert(key);
    last_error_.clear();
    LOG(INFO) << "node " << config_.node_name << " labelled (" << ours.size() << " labels)";
    return Workers::Outcome::kDone;
  }
  if (client_.cancelled()) return Workers::Outcome::kDone;  // Stop() cut it short
  failures_.fetch_add(1);
  if (std::string(status.message()) != last_error_) {
    last_error_ = std::string(status.message());
    LOG(ERROR) << "cannot label node " << config_.node_name << ": " << status.message()
               << "; retrying with backoff";
  }
  return Workers::Outcome::kRetry;
}

}  // namespace edgeaccel
