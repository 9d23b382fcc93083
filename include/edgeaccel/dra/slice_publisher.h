// SlicePublisher: keeps this node's ResourceSlice of one driver equal to the driver's devices
// (the Unhealthy ones tainted, see below). What the API server holds of the driver's slices it
// reads from NodeSlices (dra/node_slices.h: one LIST and one WATCH for every driver of the node);
// every write is made by the publisher's worker ("ea-dra-slices", a Workers that exits when
// idle), so an idle publisher holds no thread of its own.
//
// It reconciles when the device set changes (hot-plug, health, or the devices' facts alone:
// NVML's, which arrive after the first scan), on Resync() (the kubelet registered us: a kubelet
// that starts deletes its node's slices), and when NodeSlices says someone else changed or deleted
// the driver's slices (the kubelet's wipe, an admin's delete): within the event's round trip. One
// reconcile writes only where the view differs: create the slice if there is none (generateName,
// ownerReference to the Node); replace its devices if they differ, with the pool's generation one
// higher and the resourceVersion it was read with (409 Conflict: the view is marked stale, listed
// again and the write retried); delete any other slice of ours on this node (preconditions: UID
// and resourceVersion). Errors are retried with backoff and said once per distinct message; a
// request cancelled (ApiClient::Cancel: the daemon is stopping) is neither said nor retried. It
// never deletes the slice when it stops: a restarting daemon must not make the devices vanish from
// the scheduler (on uninstall the kubelet deletes a driver's slices 30 s after it lost the plugin).
//
// Unhealthy devices stay in the slice with device taints (resource_slice.h); a NoExecute taint
// only once its condition has held for Options::no_execute_after (NoSchedule until then; the
// publisher's PollLoop membership is that timer). The API server sets each taint's timeAdded; the
// publisher carries it over from the slice it read, so an unchanged taint is no difference and no
// write, and the time stays when the taint came. An API server with DRADeviceTaints off drops the
// taints on write without an error (strategy.go dropDisabledDRADeviceTaintsFields,
// kubernetes/kubernetes pkg/registry/resource/resourceslice): the publisher compares what came
// back, and when the taints are gone (or a 422 refuses them) it leaves Unhealthy devices out
// instead and says so once; it tries taints again each time the watch is renewed, so an API
// server whose gate is turned on gets them without a restart of the daemon.
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
#include "edgeaccel/dra/node_slices.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

class SlicePublisher : private PollLoop::Member {
 public:
  struct Options {
    std::string driver;
    std::string node_name;
    // The node's slices, shared with the node's other drivers (it outlives the publisher);
    // nullptr: a view of its own, with `resync`, the backoffs and `loop` as its options.
    NodeSlices* slices = nullptr;
    absl::Duration resync = absl::Minutes(5);
    absl::Duration initial_backoff = absl::Milliseconds(200);
    absl::Duration max_backoff = absl::Seconds(30);
    // The GPUs offered to several claims at once (--dra-shared).
    GpuSharing sharing;
    // Run after reconciles (see above); empty: none.
    std::function<void()> chore;
    absl::Duration chore_interval = absl::Minutes(5);
    // The loop of its NoExecute timer (and of its own view's watch; it outlives the publisher);
    // nullptr: a loop of its own.
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
    // The node's view (NodeSlices::Status, shared by the node's drivers).
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

  // Subscribes to the node's view, joins the loop and asks the worker for the first publish.
  void Start();
  // Leaves the view and the loop and stops the worker (a request in flight ends at the client's
  // timeout, or at once after ApiClient::Cancel); leaves the slice. After it, the publisher does
  // nothing more.
  void Stop();
  // List and reconcile now (also while the set did not change): the slices may have changed
  // without a watch event (the kubelet registered us, and a kubelet that starts deletes them).
  void Resync();

  Status status() const;

 private:
  // Its unit tests drive one reconcile from a fresh LIST on their own thread, before Start().
  friend class SlicePublisherTest;
  // PollLoop::Member, on the loop's thread: the wake eventfd; a held NoExecute taint's due time as
  // its wake time.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;

  void PostSync();
  // The worker's task: reconciles where something changed, runs the chore. kRetry: after the
  // worker's backoff.
  Workers::Outcome Sync();
  // A sync that failed: said once per distinct message and retried after the backoff (kRetry);
  // cancelled (the daemon stops): neither (kDone).
  Workers::Outcome Failed(const absl::Status& error, absl::string_view what);
  // What NodeSlices tells (on its threads; never blocks).
  void OnSlicesChange(NodeSlices::Change change);
  absl::Status Reconcile();
  // Publishes each NoExecute taint of `devices` as NoSchedule until its condition has held for
  // no_execute_after (tracked by device, key and value), and has the loop ask for a reconcile
  // when the first held one is due.
  void HoldNoExecute(nlohmann::json* devices, absl::Time now);
  std::string NodeUid();
  void Wake();

  const Options options_;
  const ApiClient* const client_;
  DeviceSet* const set_;
  const int wake_fd_;  // an eventfd: a NoExecute taint's due time moved
  uint64_t listener_ = 0;
  std::unique_ptr<PollLoop> own_loop_;
  std::unique_ptr<NodeSlices> own_slices_;
  NodeSlices* slices_ = nullptr;
  uint64_t subscription_ = 0;  // in slices_, while started
  PollLoop* loop_ = nullptr;   // while started
  Workers worker_{"ea-dra-slices", {.exit_when_idle = true}};

  // The worker's alone (or, in the unit tests, the test's thread's before Start()).
  bool reconcile_ = true;
  absl::Time next_chore_ = absl::InfiniteFuture();
  // When each NoExecute taint wanted now was first wanted ("<device>\n<key>\n<value>").
  std::map<std::string, absl::Time> no_execute_since_;
  std::string node_uid_;

  mutable absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;  // reconcile
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool taints_dropped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time no_execute_due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();  // HoldNoExecute
  Status status_ ABSL_GUARDED_BY(mu_);
  OnceLogger errors_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_SLICE_PUBLISHER_H_
