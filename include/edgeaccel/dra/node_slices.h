// NodeSlices: what the API server holds of this node's ResourceSlices, for every DRA driver of the
// daemon, kept by one LIST and one WATCH (fieldSelector spec.nodeName), as client-go's shared
// informer keeps one cache for all the controllers of a process. Each driver's SlicePublisher
// reads its slices here and is told when someone else changed them; so a node costs the API server
// one watch however many drivers it runs (two on a Jetson with a Coral: edgetpu.edgeaccel.io and
// gpu.edgeaccel.io).
//
// The view: a LIST of the node's slices, then a WATCH from the list's resourceVersion, renewed
// from the last resourceVersion it saw (events and bookmarks) when the API server ends it
// (timeoutSeconds: a random time between `resync` and twice that, as client-go's reflector
// picks). It lists again only when the watch answers 410 Gone (that resourceVersion is
// compacted), when a publisher's write met a 409 Conflict (MarkStale), and where the watch is
// refused (403: a role without `watch`; 405): then every `resync`, said once. A watch the server
// ends within a second of asking, with nothing in it, is asked again only after a backoff (as the
// reflector takes a "very short watch" for an error), so a proxy that cuts every watch is not asked
// again and again at once. While nothing changes it sends nothing but the renewal of its watch.
//
// Threads: the watch is read on a PollLoop (the daemon's ea-loop), which applies its events to the
// view and tells the publishers whose slices someone else changed (an event newer than what the
// view holds: the kubelet's wipe at its start or 30 s after it lost a driver, an admin's delete).
// Every request (list, opening a watch) is made by the view's worker ("ea-dra-watch", a
// Workers that exits when idle) or by the publisher that asked for a fresh view: the loop
// never waits for the API server. Errors are retried with backoff and said once per distinct
// message; a request cancelled (ApiClient::Cancel: the daemon is stopping) is neither said nor
// retried. A publisher's own writes are put into the view by the publisher (Wrote, Deleted), so
// their events, which carry the same resourceVersion, are known as no change.
#ifndef EDGEACCEL_DRA_NODE_SLICES_H_
#define EDGEACCEL_DRA_NODE_SLICES_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

class NodeSlices : private PollLoop::Member {
 public:
  struct Options {
    std::string node_name;
    // A watch lasts between this and twice this; without a watch, the LIST period.
    absl::Duration resync = absl::Minutes(5);
    absl::Duration initial_backoff = absl::Milliseconds(200);
    absl::Duration max_backoff = absl::Seconds(30);
    // The loop that reads the watch (it outlives this object); nullptr: a loop of its own.
    PollLoop* loop = nullptr;
  };

  // What a subscriber is told.
  enum class Change {
    kSlices,   // its driver's slices changed, not by its own write, or were listed anew
    kRenewed,  // the API server ended the watch as asked and it was renewed
  };

  // One driver's slices on this node, by name, and the view's resourceVersion.
  struct View {
    std::string resource_version;
    std::map<std::string, nlohmann::json> slices;
  };

  struct Status {
    bool synced = false;           // listed, and kept by the watch (or the listing) since
    uint64_t lists = 0;            // LISTs sent
    uint64_t watches = 0;          // WATCHes started
    bool watch_refused = false;    // the API server refuses the watch: listing every resync
    std::string resource_version;  // where the view is (the next watch starts there)
    std::string last_error;        // of the last list or watch; empty after a good one
  };

  // `client` outlives this object.
  NodeSlices(Options options, const ApiClient* client);
  ~NodeSlices() override;
  NodeSlices(const NodeSlices&) = delete;
  NodeSlices& operator=(const NodeSlices&) = delete;

  // `on_change` is called (on the loop's or the worker's thread; it must not block, and must not
  // call Unsubscribe) when `driver`'s slices change as above, and on each renewal. The first
  // subscriber starts the list and the watch; while there is none, no watch is open. After
  // Unsubscribe returns, `on_change` is not running and is not called again.
  uint64_t Subscribe(const std::string& driver, std::function<void(Change)> on_change);
  void Unsubscribe(uint64_t id);

  // `driver`'s slices. Lists first, on the caller's thread, when the view is not synced (the
  // first call, after MarkStale, after a 410); an error is that list's.
  absl::StatusOr<View> Slices(const std::string& driver);
  // The view is behind the API server (a write met 409 Conflict, a kubelet that registered a
  // driver may have deleted its slices): the next Slices() lists.
  void MarkStale();
  // A write of ours, as the API server answered it (its resourceVersion is how the watch's event
  // of it is known as ours), or a slice we deleted.
  void Wrote(const nlohmann::json& slice);
  void Deleted(const std::string& name);

  Status status() const;
  // Ends the watch and the worker (a request in flight ends at the client's timeout, or at once
  // after ApiClient::Cancel). After it, the view asks the API server nothing more.
  void Stop();

 private:
  // A watch the worker opened, as it hands it to the loop, and as the loop keeps it.
  struct HeldWatch {
    std::unique_ptr<WatchStream> stream;  // null: none
    uint64_t id = 0;                      // its stream_id_
    absl::Time deadline = absl::InfiniteFuture();  // we end a watch the server did not end
    absl::Time asked;                     // when the worker began to open it
    size_t lines = 0;                     // what it brought, bookmarks too
  };

  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  // On the loop: applies what the watch brought to the view and tells the subscribers; hands the
  // watch's end, or an error event, to the worker.
  void ReadWatch();
  // One watch event applied to the view (mu_ held): the driver whose slices someone else changed,
  // if any. 410 Gone in an ERROR event is OUT_OF_RANGE.
  absl::StatusOr<std::optional<std::string>> ApplyEvent(absl::string_view line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void PostSync();
  // The worker's task: takes the watch's end, lists where the view is not synced, opens a watch
  // where none is open. kRetry: after the worker's backoff.
  Workers::Outcome Sync();
  Workers::Outcome Failed(const absl::Status& error, absl::string_view what);
  // How the watch ended; an error is a failed watch (retried after the backoff).
  absl::Status WatchEnded(const absl::StatusOr<HttpResponse>& end, bool* renewed);
  absl::Status OpenWatch();
  // LIST (list_mu_ held): the view anew, the open watch dropped (the next starts from the list).
  absl::Status List() ABSL_EXCLUSIVE_LOCKS_REQUIRED(list_mu_);
  // Lists unless the view is synced (another caller may have listed while this one waited for
  // list_mu_): true when this call listed.
  absl::StatusOr<bool> ListUnlessSynced();
  // Ends the open watch: the next one starts from the view.
  void DropWatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the subscribers of `drivers` (all: every subscriber) of `change`.
  void Notify(const std::set<std::string>& drivers, bool all, Change change);
  void Wake();

  const Options options_;
  const ApiClient* const client_;
  const int wake_fd_;  // an eventfd: the worker opened or dropped a watch
  std::unique_ptr<PollLoop> own_loop_;
  PollLoop* loop_ = nullptr;  // while a member
  Workers worker_{"ea-dra-watch", {.exit_when_idle = true}};

  // The loop's alone.
  HeldWatch watch_;
  Backoff short_watches_;  // for watches ended at once; reset by one that proved itself
  bool short_watch_said_ = false;

  // Held while a LIST is asked, so two publishers that find the view stale list once.
  absl::Mutex list_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // Held while subscribers are told (so Unsubscribe waits for a call in flight).
  mutable absl::Mutex subscribers_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<uint64_t, std::pair<std::string, std::function<void(Change)>>> subscribers_
      ABSL_GUARDED_BY(subscribers_mu_);
  uint64_t next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 0;

  mutable absl::Mutex mu_;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, nlohmann::json> slices_ ABSL_GUARDED_BY(mu_);  // every driver's, by name
  std::string resource_version_ ABSL_GUARDED_BY(mu_);  // where the next watch starts
  std::string listed_version_ ABSL_GUARDED_BY(mu_);    // an event no newer is in the list already
  bool subscribed_ ABSL_GUARDED_BY(mu_) = false;       // some subscriber: keep a watch open
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The watch the worker opened last (0: none yet); the loop's watch_ is stale when its id differs.
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_open_ ABSL_GUARDED_BY(mu_) = false;  // it has not ended
  HeldWatch opened_ ABSL_GUARDED_BY(mu_);           // handed to the loop
  std::optional<absl::StatusOr<HttpResponse>> stream_end_ ABSL_GUARDED_BY(mu_);
  absl::Status watch_error_ ABSL_GUARDED_BY(mu_);   // an ERROR event other than 410
  absl::Time next_list_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // without a watch
  // After a watch ended at once, no other is opened before this.
  absl::Time reopen_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  Status status_ ABSL_GUARDED_BY(mu_);
  OnceLogger errors_;
};

// "spec.driver=<driver>,spec.nodeName=<node>" (or only the node's, with an empty driver),
// URL-encoded, for list, watch and delete requests.
std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name);

// A ResourceSlice request's answer that is not the one wanted, as an error: "<what>: the API
// server answered <status>: <its metav1.Status message, or the start of the body>".
absl::Status SliceAnswerError(absl::string_view what, const HttpResponse& response);

// True unless `version` is known to be no newer than `known`. Versions are compared as the
// integers kube-apiserver makes them (etcd revisions; KEP-5504 makes them comparable), and any
// version that is not one counts as newer.
bool NewerVersion(const std::string& version, const std::string& known);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_NODE_SLICES_H_
