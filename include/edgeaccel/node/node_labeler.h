// NodeLabeler: keeps our labels on our own Node object through the Kubernetes API.
//
// It sends a JSON merge patch (PATCH /api/v1/nodes/<name>, application/merge-patch+json) that
// sets our labels and removes (null) the ones we set earlier and no longer hold; labels anyone
// else set are never touched. Which keys are ours is kept in the Node annotation
// edgeaccel.io/managed-labels, so a restarted daemon still cleans up.
// It patches only when the label set changes; failures are retried with jittered exponential
// backoff (1 s to 5 min), and a 403 names the RBAC rule that is missing. A key another writer
// holds on the Node (GFD's nvidia.com/gpu.*, say) is left to it (label_ownership.h), so the Node
// is read before each patch. One node's steady-state load on the API server: one GET and one
// PATCH per hardware change.
#ifndef EDGEACCEL_NODE_NODE_LABELER_H_
#define EDGEACCEL_NODE_NODE_LABELER_H_

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
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "edgeaccel/node/node_labels.h"

namespace edgeaccel {

inline constexpr absl::string_view kManagedLabelsAnnotation = "edgeaccel.io/managed-labels";

// The merge patch taking a node from `managed` (our keys now on it) to `labels`.
std::string NodeLabelPatch(const LabelSet& labels, const std::set<std::string>& managed);

class NodeLabeler {
 public:
  explicit NodeLabeler(ApiServerConfig config);
  ~NodeLabeler();

  void Start();
  // Returns at once: a request in flight is cancelled (ApiClient::Cancel), nothing more is sent.
  void Stop();
  // The labels the node should carry; patched in the background if they differ.
  void Set(const LabelSet& labels);

  uint64_t patches() const { return patches_.load(); }  // successful PATCHes
  uint64_t failures() const { return failures_.load(); }

 private:
  void Run();
  // GET the node: which keys did we manage before?
  struct NodeLabels {
    LabelSet labels;                // on the Node now
    std::set<std::string> managed;  // ours, from our annotation
  };
  absl::StatusOr<NodeLabels> ReadNode();
  absl::Status Patch(const LabelSet& labels, const std::set<std::string>& managed);

  const ApiServerConfig config_;
  const ApiClient client_;
  std::thread thread_;
  std::atomic<uint64_t> patches_{0};
  std::atomic<uint64_t> failures_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<LabelSet> desired_ ABSL_GUARDED_BY(mu_);
  uint64_t desired_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NODE_LABELER_H_
