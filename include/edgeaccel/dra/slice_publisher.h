// SlicePublisher: keeps this node's ResourceSlice of one driver equal to the driver's devices
// (the Unhealthy ones tainted, see below). Its watch is read on a PollLoop (the daemon's ea-loop;
// alone, a publisher makes a loop of its own), which never waits for the API server: every
// request (list, writes, opening a watch) is made by the publisher's worker ("ea-dra-slices", a
// SerialWorker that exits when idle), so an idle publisher holds no thread of its own.
//
// What it knows of the API server's slices is a view kept by a watch, as the Go helper keeps its
// slices with an informer: a LIST of the driver's slices of this node (fieldSelector spec.driver
// and spec.nodeName) once, then a WATCH with the same selector from the list's resourceVersion,
// renewed from the last resourceVersion it saw (events and bookmarks) when the API server ends it
// (timeoutSeconds: a random time between `resync` and twice that, as client-go's reflector
// picks). It lists again only when the watch answers 410 Gone (that resourceVersion is
// compacted) or a write met a 409 Conflict, and then watches again from the list. While nothing
// changes it sends nothing but the renewal of its watch. A watch the server ends within a second of
// asking, with nothing in it, is asked again only after a backoff (as client-go's reflector takes
// a "very short watch" for an error), so a proxy that cuts every watch is not asked again and
// again at once. The loop reads the watch as it arrives
// (ApiClient::OpenWatch) and hands its events to the worker, which keeps the view; the watch stays
// open across the worker's writes.
//
// It reconciles the view with the devices when the device set changes (hot-plug, health, or the
// devices' facts alone: NVML's, which arrive after the first scan), on Resync() (the kubelet
// registered us), and when the watch shows a slice changed or deleted by someone else (the
// kubelet's wipe at its start or 30 s after it lost our connection, an admin's delete): within
// the event's round trip. One reconcile writes only where the view differs: create the slice if
// there is none (generateName, ownerReference to the Node); replace its devices if they differ,
// with the pool's generation one higher and the resourceVersion it was read with (409 Conflict:
// list again and retry); delete any other slice of ours on this node (preconditions: UID and
// resourceVersion). Errors are retried with backoff and said once per distinct message; a
// request cancelled (ApiClient::Cancel: the daemon is stopping) is neither said nor retried.
// Where the watch is refused (403: a role without `watch` on resourceslices; 405) it says so
// once and lists every `resync` instead. It never deletes the slice when it stops: a restarting
// daemon must not make the devices vanish from the scheduler (on uninstall the kubelet deletes a
// driver's slices 30 s after it lost the plugin).
//
// Unhealthy devices stay in the slice with device taints (resource_slice.h); a NoExecute taint
// only once its condition has held for Options::no_execute_after (NoSchedule until then). The API server sets
// each taint's timeAdded; the publisher carries it over from the slice it read, so an unchanged
// taint is no difference and no write, and the time stays when the taint came. An API server with
// DRADeviceTaints off drops the taints on write without an error (strategy.go
// dropDisabledDRADeviceTaintsFields, kubernetes/kubernetes pkg/registry/resource/resourceslice):
// the publisher compares what came back, and when the taints are gone (or a 422 refuses them) it
// leaves Unhealthy devices out instead and says so once; it tries taints again each time its
// watch is renewed, so an API server whose gate is turned on gets them without a restart of the
// daemon.
//
// The driver's other periodic work (ClaimPreparer::Cleanup) runs on the worker too, as the
// `chore`: after the first reconcile, then at the first sync at least `chore_interval` after its
// last run (a watch's renewal at the latest), so it costs no thread and no wake-up of its own.
#ifndef EDGEACCEL_DRA_SLICE_PUBLISHER_H_
#define EDGEACCEL_DRA_SLICE_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/host/serial_worker.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

class SlicePublisher : private PollLoop::Member {
 public:
  struct Options {
    std::string driver;
    std::string node_name;
    // A watch lasts between this and twice this; without a watch, the LIST period.
    absl::Duration resync = absl::Minutes(5);
    absl::Duration initial_backoff = absl::Milliseconds(200);
    absl::Duration max_backoff = absl::Seconds(30);
    // The GPUs offered to several claims at once (--dra-shared).
    GpuSharing sharing;
    // Run after reconciles (see above); empty: none.
    std::function<void()> chore;
    absl::Duration chore_interval = absl::Minutes(5);
    // The loop that reads its watch (it outlives the publisher); nullptr: a loop of its own.
    PollLoop* loop = nullptr;
    // A NoExecute taint (device node missing, critical Xid: pods using the device are evicted,
    // which cannot be undone) is published as NoSchedule until its condition has held this long
    // without a break, so one odd scan (udev re-creating a node, a driver reload) evicts nothing.
    absl::Duration no_execute_after = absl::Seconds(30);
  };

  // What the publisher last did, for --discover, /metrics and tests.
  struct Status {
    bool published = false;        // the slice on the API server holds what we want
    int64_t generation = 0;        // the pool's generation we last wrote or saw
    size_t devices = 0;            // devices in it
    std::string slice_name;        // metadata.name
    std::string last_error;        // empty after a good reconcile
    uint64_t writes = 0;           // creates, updates and deletes sent
    uint64_t conflicts = 0;        // 409s answered
    uint64_t lists = 0;            // LISTs sent (the first, then after a 410 or a 409)
    uint64_t watches = 0;          // WATCHes started
    bool watch_refused = false;    // the API server refuses the watch: listing every resync
    std::string resource_version;  // where the view is (the next watch starts there)
    size_t tainted = 0;            // devices in it with taints (Unhealthy)
    bool taints_dropped = false;   // the API server does not keep taints: Unhealthy left out
    uint64_t syncs = 0;            // runs of the worker's sync (a bookmark alone needs none)
  };

  // `client` and `set` outlive this object.
  SlicePublisher(Options options, const ApiClient* client, DeviceSet* set);
  ~SlicePublisher() override;

  // Joins the loop and asks the worker for the first list and publish.
  void Start();
  // Leaves the loop (the watch ends at once) and stops the worker (a request in flight ends at
  // the client's timeout, or at once after ApiClient::Cancel); leaves the slice. After it, the
  // publisher does nothing more.
  void Stop();
  // List and reconcile now (also while the set did not change): the slices may have changed
  // without a watch event (the kubelet registered us, and a kubelet that starts deletes them).
  void Resync();

  Status status() const;
  // One reconcile from a fresh LIST on the caller's thread (tests, --discover's check), before
  // Start() or after Stop().
  absl::Status ReconcileOnce();

 private:
  // What the publisher knows of our slices on the API server.
  struct View {
    bool synced = false;                          // listed, and kept by the watch since
    std::string resource_version;                 // where the next watch starts
    std::map<std::string, nlohmann::json> slices;  // by name
  };

  // PollLoop::Member, on the loop's thread: the wake eventfd and the open watch's socket; the
  // watch's deadline, and without a watch (refused) the next list, as its wake time.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  // Hands what the watch brought, and its end, to the worker; a bookmark alone is kept here
  // (the API server sends one a minute), so it starts no worker.
  void ReadWatch();

  void PostSync();
  // The worker's task: applies the watch's events and end to the view, reconciles, runs the
  // chore, opens a watch when none is open. kRetry: after the worker's backoff.
  SerialWorker::Outcome Sync();
  // A sync that failed: said once per distinct message and retried after the backoff (kRetry);
  // cancelled (the daemon stops): neither (kDone).
  SerialWorker::Outcome Failed(const absl::Status& error, absl::string_view what);
  // One watch event applied to the view: true when someone else changed our slices. 410 Gone in
  // an ERROR event is OUT_OF_RANGE.
  absl::StatusOr<bool> ApplyEvent(absl::string_view line);
  // How the watch ended; an error is a failed watch (retried after the backoff).
  absl::Status WatchEnded(const absl::StatusOr<HttpResponse>& end);
  // Ends the open watch: the next one starts from the view.
  void DropWatch();
  absl::Status OpenWatch();
  absl::Status Reconcile(View& view);
  // Publishes each NoExecute taint of `devices` as NoSchedule until its condition has held for
  // no_execute_after (tracked by device, key and value), and has the loop ask for a reconcile
  // when the first held one is due.
  void HoldNoExecute(nlohmann::json* devices, absl::Time now);
  absl::Status List(View& view);
  std::string NodeUid();
  void Wake();

  const Options options_;
  const ApiClient* const client_;
  DeviceSet* const set_;
  const int wake_fd_;  // an eventfd: the worker opened or dropped a watch
  uint64_t listener_ = 0;
  std::unique_ptr<PollLoop> own_loop_;
  PollLoop* loop_ = nullptr;  // while started
  SerialWorker worker_{"ea-dra-slices", {.exit_when_idle = true}};

  // A watch the worker opened, as it hands it to the loop, and as the loop keeps it.
  struct HeldWatch {
    std::unique_ptr<WatchStream> stream;  // null: none
    uint64_t id = 0;                      // its stream_id_
    absl::Time deadline = absl::InfiniteFuture();  // we end a watch the server did not end
    absl::Time asked;                     // when the worker began to open it
    size_t lines = 0;                     // what it brought, bookmarks too (the loop counts)
  };

  // The loop's alone.
  HeldWatch watch_;
  Backoff short_watches_;    // for watches ended at once; reset by one that proved itself
  absl::Time reopen_at_ = absl::InfiniteFuture();  // after one ended at once, the next one
  bool short_watch_said_ = false;

  // The worker's alone (ReconcileOnce has a view of its own).
  View view_;
  bool reconcile_ = true;
  absl::Time next_chore_ = absl::InfiniteFuture();
  // When each NoExecute taint wanted now was first wanted ("<device>\n<key>\n<value>").
  std::map<std::string, absl::Time> no_execute_since_;

  mutable absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;   // reconcile
  bool relist_ ABSL_GUARDED_BY(mu_) = false;  // and list first
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool taints_dropped_ ABSL_GUARDED_BY(mu_) = false;
  // The watch the worker opened last (0: none yet); the loop's watch_ is stale when its id differs.
  uint64_t stream_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_open_ ABSL_GUARDED_BY(mu_) = false;  // it has not ended
  HeldWatch opened_ ABSL_GUARDED_BY(mu_);  // handed to the loop
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);  // of stream_id_, not yet applied
  // A bookmark's version, read while no event waited (so it comes before every event in events_).
  std::string bookmark_version_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<HttpResponse>> stream_end_ ABSL_GUARDED_BY(mu_);
  absl::Time next_list_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // without a watch
  absl::Time no_execute_due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // HoldNoExecute
  Status status_ ABSL_GUARDED_BY(mu_);
  std::string node_uid_;  // the worker's (or ReconcileOnce's caller's)
  OnceLogger errors_;
};

// "spec.driver=<driver>,spec.nodeName=<node>", URL-encoded, for the list and delete requests.
std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_SLICE_PUBLISHER_H_
