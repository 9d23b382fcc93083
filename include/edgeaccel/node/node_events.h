// NodeEventRecorder: Kubernetes Events on our own Node, so that `kubectl describe node` says why
// a device left Allocatable ("Warning  EdgeTPUUnhealthy  0000:03:00.0: temperature 101.2 °C ≥
// 99.8 °C").
//
// It behaves as client-go's recorder does for the kubelet (tools/record, EventCorrelator), so our
// events look and aggregate like the kubelet's own:
//  * an Event about the Node lives in namespace "default", with involvedObject {kind: Node,
//    name: <node>, uid: <node>} (the kubelet's node reference) and source.component
//    "edgeaccel-device-plugin", source.host <node>; its name is "<node>.<unix nanoseconds, hex>";
//  * the same event again (same type, reason and message) while it is remembered (an LRU of
//    4096) is not a new object: the existing Event's count and lastTimestamp are PATCHed
//    (strategic merge), as `kubectl describe` shows "x5 over 10m"; if that Event is gone
//    (events expire after an hour), a new one is created;
//  * a spam filter per Node: a token bucket of 25, refilled one per 5 minutes, so a flapping
//    device cannot flood the API server; what it drops is counted, and said once in the log.
// Recording never blocks: events are queued (at most 256; the oldest beyond that are dropped and
// counted) and sent one at a time, in the order recorded, by a Workers (under the key
// "node events"): the daemon's API sink worker, shared with the node labeller, or one of the
// recorder's own ("ea-events"). An answer the API server refuses (403, 422,
// 429, ...) or a failed connection is logged once per reason and the event dropped: device
// serving never waits on the API server.
#ifndef EDGEACCEL_NODE_NODE_EVENTS_H_
#define EDGEACCEL_NODE_NODE_EVENTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <string>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"

namespace edgeaccel {

struct NodeEvent {
  bool warning = true;  // type Warning, else Normal
  std::string reason;   // CamelCase, e.g. "EdgeTPUUnhealthy"
  std::string message;
};

// The Event object (JSON) client-go would create for `event` about `node`, first seen at `now`.
// Never throws, whatever bytes it is given: invalid UTF-8 becomes U+FFFD (as Go's encoding/json
// writes it), and a message is cut to at most 1024 bytes between characters.
std::string NodeEventObject(const NodeEvent& event, const std::string& node,
                            const std::string& name, int count, absl::Time first_seen,
                            absl::Time now);

class NodeEventRecorder {
 public:
  struct Limits {
    int spam_burst = 25;                         // client-go: defaultSpamBurst
    absl::Duration spam_refill = absl::Minutes(5);  // one token per (defaultSpamQPS = 1/300)
    size_t remembered = 4096;                    // client-go: maxLruCacheEntries
    size_t queue = 256;
  };

  // With `worker`, events are sent there, and the worker, which must be stopped before the
  // recorder is destroyed, cancels our request in flight when it stops. Without, the recorder
  // has a worker of its own.
  explicit NodeEventRecorder(ApiServerConfig config, Workers* worker = nullptr)
      : NodeEventRecorder(std::move(config), Limits(), worker) {}
  NodeEventRecorder(ApiServerConfig config, Limits limits, Workers* worker = nullptr);
  ~NodeEventRecorder();

  void Start();
  // Returns at once: a request in flight is cancelled (ApiClient::Cancel), what is queued is
  // dropped.
  void Stop();
  // Queues `event` (never blocks).
  void Record(NodeEvent event);

  uint64_t created() const { return created_.load(); }        // POSTed
  uint64_t aggregated() const { return aggregated_.load(); }  // PATCHed: count + 1
  uint64_t dropped() const { return dropped_.load(); }        // spam filter or full queue
  uint64_t failed() const { return failed_.load(); }          // refused, unreachable, or a bug

 private:
  struct Remembered {
    std::string name;
    int count = 0;
    absl::Time first_seen;
  };
  void Post() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the oldest queued event, on the worker's thread; posts again while more wait.
  void SendNext();
  void Send(const NodeEvent& event);
  bool TakeToken(absl::Time now);
  void Fail(const std::string& why, const std::string& detail);
  void Unexpected(const std::string& what);  // an exception out of Send
  static std::string Key(const NodeEvent& event);

  const ApiServerConfig config_;
  const Limits limits_;
  const ApiClient client_;
  std::unique_ptr<Workers> own_worker_;  // without a shared one
  Workers* const worker_;
  absl::Mutex mu_;
  std::deque<NodeEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The sender's own state (the worker sends one event at a time).
  double tokens_;
  absl::Time tokens_at_ = absl::InfinitePast();
  std::list<std::string> lru_;  // most recent first
  absl::flat_hash_map<std::string, std::pair<Remembered, std::list<std::string>::iterator>> seen_;
  absl::flat_hash_set<std::string> said_;  // failure reasons already logged
  std::atomic<uint64_t> created_{0}, aggregated_{0}, dropped_{0}, failed_{0};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_NODE_EVENTS_H_
