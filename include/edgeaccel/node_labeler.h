// NodeLabeler: keeps our labels on our own Node object through the Kubernetes API.
//
// It sends a JSON merge patch (PATCH /api/v1/nodes/<name>, application/merge-patch+json) that
// sets our labels and removes (null) the ones we set earlier and no longer hold; labels anyone
// else set are never touched. Which keys are ours is kept in the Node annotation
// edgeaccel.io/managed-labels, read once at start, so a restarted daemon still cleans up.
// It patches only when the label set changes; failures are retried with jittered exponential
// backoff (1 s to 5 min), and a 403 names the RBAC rule that is missing. One node's steady-state
// load on the API server: one GET at start, then one PATCH per hardware change.
#ifndef EDGEACCEL_NODE_LABELER_H_
#define EDGEACCEL_NODE_LABELER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/labels.h"

namespace httplib {
class SSLClient;
}

namespace edgeaccel {

inline constexpr absl::string_view kManagedLabelsAnnotation = "edgeaccel.io/managed-labels";

struct ApiServerConfig {
  std::string host;        // API server host or IP
  int port = 443;
  std::string ca_file;     // CA bundle that signed the API server's certificate...
  std::string ca_pem;      // ...or the bundle itself (kubeconfig certificate-authority-data)
  std::string token_file;  // bearer token, re-read for every request (tokens are rotated)...
  std::string token;       // ...or the token itself (kubeconfig)
  std::string client_cert_pem;  // client certificate authentication (kubeconfig)
  std::string client_key_pem;
  std::string node_name;
  absl::Duration timeout = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Minutes(5);
};

// In a pod: KUBERNETES_SERVICE_HOST/PORT and the service account's token and CA. `api_server`
// ("https://host:port"), when given, replaces the first.
absl::StatusOr<ApiServerConfig> InClusterConfig(const std::string& node_name,
                                                const std::string& api_server,
                                                const std::string& token_file,
                                                const std::string& ca_file);

// From a kubeconfig (the file kubectl uses), for running outside a pod: the current context's
// cluster (server, certificate-authority or -data) and user (token, tokenFile, or
// client-certificate/-key or their -data). Relative paths are relative to the file's directory.
absl::StatusOr<ApiServerConfig> KubeconfigConfig(const std::string& node_name,
                                                 const std::string& kubeconfig_path);

// The merge patch taking a node from `managed` (our keys now on it) to `labels`.
std::string NodeLabelPatch(const LabelSet& labels, const std::set<std::string>& managed);

class NodeLabeler {
 public:
  explicit NodeLabeler(ApiServerConfig config);
  ~NodeLabeler();

  void Start();
  void Stop();
  // The labels the node should carry; patched in the background if they differ.
  void Set(const LabelSet& labels);

  uint64_t patches() const { return patches_.load(); }  // successful PATCHes
  uint64_t failures() const { return failures_.load(); }

 private:
  void Run();
  // An HTTPS client for the API server: CA-verified, with our credentials and timeouts.
  absl::StatusOr<std::unique_ptr<httplib::SSLClient>> Client() const;
  // GET the node: which keys did we manage before?
  absl::StatusOr<std::set<std::string>> ReadManagedKeys();
  absl::Status Patch(const LabelSet& labels, const std::set<std::string>& managed);

  const ApiServerConfig config_;
  std::thread thread_;
  std::atomic<uint64_t> patches_{0};
  std::atomic<uint64_t> failures_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<LabelSet> desired_ ABSL_GUARDED_BY(mu_);
  uint64_t desired_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_LABELER_H_
