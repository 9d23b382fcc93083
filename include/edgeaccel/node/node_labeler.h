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
// The requests run as one key ("node labels") of a Workers: the daemon's API sink worker,
// shared with the Event recorder, or one of its own ("ea-nodelabels"). Each attempt applies the
// newest labels set; a failed one is retried after the backoff, and labels set meanwhile wait for
// that retry time too (the API server is not asked more often because the labels change).
#ifndef EDGEACCEL_NODE_NODE_LABELER_H_
#define EDGEACCEL_NODE_NODE_LABELER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "edgeaccel/node/node_labels.h"

namespace edgeaccel {

inline constexpr absl::string_view kManagedLabelsAnnotation = "edgeaccel.io/managed-labels";

// The merge patch taking a node from `managed` (our keys now on it) to `labels`.
std::string NodeLabelPatch(const LabelSet& labels, const std::set<std::string>& managed);

class NodeLabeler {
 public:
  // With `worker`, requests run there (under the key "node labels"), and the worker, which must
  // be stopped before the labeller is destroyed, cancels our request in flight when it stops.
  // Without, the labeller has a worker of its own.
  explicit NodeLabeler(ApiServerConfig config, Workers* worker = nullptr);
  ~NodeLabeler();

  void Start();
  // Returns at once: a request in flight is cancelled (ApiClient::Cancel), nothing more is sent.
  void Stop();
  // The labels the node should carry; patched in the background if they differ.
  void Set(const LabelSet& labels);

  uint64_t patches() const { return patches_.load(); }  // successful PATCHes
  uint64_t failures() const { return failures_.load(); }

 private:
  // One try at applying the newest labels set, on the worker's thread.
  Workers::Outcome Apply();
  void Post() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GET the node: which keys did we manage before?
  struct NodeLabels {
    LabelSet labels;                // on the Node now
    std::set<std::string> managed;  // ours, from our annotation
  };
  absl::StatusOr<NodeLabels> ReadNode();
  absl::Status Patch(const LabelSet& labels, const std::set<std::string>& managed);

  const ApiServerConfig config_;
  const ApiClient client_;
  std::unique_ptr<Workers> own_worker_;  // without a shared one
  Workers* const worker_;
  std::atomic<uint64_t> patches_{0};
  std::atomic<uint64_t> failures_{0};
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<LabelSet> desired_ ABSL_GUARDED_BY(mu_);
  uint64_t desired_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Apply()'s own state (the worker runs one attempt at a time).
  std::optional<std::set<std::string>> managed_;  // our keys on the node, once known
  std::optional<LabelSet> applied_;
  std::set<std::string> left_to_others_;
  uint64_t applied_version_ = 0;
  std::string last_error_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NODE_LABELER_H_
