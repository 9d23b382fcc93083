// SlicePublisher: keeps this node's ResourceSlice of one driver equal to the driver's devices
// (the Unhealthy ones tainted, see below), on a thread of its own ("ea-dra-slices").
//
// What it knows of the API server's slices is a view kept by a watch, as the Go helper keeps its
// slices with an informer: a LIST of the driver's slices of this node (fieldSelector spec.driver
// and spec.nodeName) once, then a WATCH with the same selector from the list's resourceVersion,
// renewed from the last resourceVersion it saw (events and bookmarks) when the API server ends it
// (timeoutSeconds: a random time between `resync` and twice that, as client-go's reflector
// picks). It lists again only when the watch answers 410 Gone (that resourceVersion is
// compacted) or a write met a 409 Conflict. While nothing changes it sends nothing but the
// renewal of its watch.
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
// daemon must not make the devices vanish from the scheduler; RemoveAll() is for uninstalling.
//
// Unhealthy devices stay in the slice with device taints (resource_slice.h). The API server sets
// each taint's timeAdded; the publisher carries it over from the slice it read, so an unchanged
// taint is no difference and no write, and the time stays when the taint came. An API server with
// DRADeviceTaints off drops the taints on write without an error (strategy.go
// dropDisabledDRADeviceTaintsFields, kubernetes/kubernetes pkg/registry/resource/resourceslice):
// the publisher compares what came back, and when the taints are gone (or a 422 refuses them) it
// leaves Unhealthy devices out instead and says so once; it tries taints again each time its
// watch is renewed, so an API server whose gate is turned on gets them without a restart of the
// daemon.
//
// The driver's other periodic work (ClaimPreparer::Cleanup) runs on this thread too, as the
// `chore`: after the first reconcile, then each time a watch ends at least `chore_interval` after
// its last run, so it costs no thread and no wake-up of its own.
#ifndef EDGEACCEL_DRA_SLICE_PUBLISHER_H_
#define EDGEACCEL_DRA_SLICE_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

class SlicePublisher {
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
  };

  // `client` and `set` outlive this object.
  SlicePublisher(Options options, const ApiClient* client, DeviceSet* set);
  ~SlicePublisher();

  void Start();
  // Stops the thread (a watch in flight ends at once, another request at the client's timeout);
  // leaves the slice.
  void Stop();
  // List and reconcile now (also while the set did not change): the slices may have changed
  // without a watch event (the kubelet registered us, and a kubelet that starts deletes them).
  void Resync();
  // Deletes every slice of this driver on this node (uninstall); once, on the caller's thread.
  absl::Status RemoveAll();

  Status status() const;
  // One reconcile from a fresh LIST on the caller's thread (tests, --discover's check), before
  // Start() or after Stop().
  absl::Status ReconcileOnce();

 private:
  // The thread's knowledge of our slices on the API server.
  struct View {
    bool synced = false;                          // listed, and kept by the watch since
    std::string resource_version;                 // where the next watch starts
    std::map<std::string, nlohmann::json> slices;  // by name
  };
  enum class WatchEnd { kRenew, kReconcile, kRelist, kRefused, kStopping };

  void Run();
  absl::Status Reconcile(View& view);
  absl::Status List(View& view);
  // One watch from view.resource_version; updates the view from its events.
  absl::StatusOr<WatchEnd> WatchOnce(View& view);
  std::string NodeUid();
  void Wake();
  // Waits until Resync(), Stop() or `deadline`; false when stopping.
  bool WaitUntil(absl::Time deadline);

  const Options options_;
  const ApiClient* const client_;
  DeviceSet* const set_;
  const int wake_fd_;  // an eventfd: ends the wait inside a watch (Resync, Stop)
  uint64_t listener_ = 0;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;   // reconcile
  bool relist_ ABSL_GUARDED_BY(mu_) = false;  // and list first
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool taints_dropped_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
  std::string node_uid_;  // the thread's (or ReconcileOnce's caller's)
  OnceLogger errors_;
};

// "spec.driver=<driver>,spec.nodeName=<node>", URL-encoded, for the list and delete requests.
std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_SLICE_PUBLISHER_H_
