// SlicePublisher: keeps this node's ResourceSlice of one driver equal to the driver's devices
// (the Unhealthy ones tainted, see below), on a thread of its own ("ea-dra-slices").
//
// A change of the device set (hot-plug, health, or the devices' facts alone: NVML's, which
// arrive after the first scan) wakes it at once; so does Resync() (the kubelet registered us: a
// kubelet that starts deletes every slice of its node). Otherwise it lists the slice every
// `resync` (30 s by default, as the Go helper re-syncs) to put back a slice that someone deleted
// (the kubelet's 30 s wipe after it lost our connection).
//
// One reconcile: list the driver's slices of this node (fieldSelector spec.driver and
// spec.nodeName); create the slice if there is none (generateName, ownerReference to the Node);
// replace its devices if they differ, with the pool's generation one higher and the
// resourceVersion it was read with (409 Conflict: read again and retry); delete any other slice
// of ours on this node (preconditions: UID and resourceVersion). Errors are retried with
// backoff and said once per distinct message; a request cancelled (ApiClient::Cancel: the daemon
// is stopping) is neither said nor retried. It never deletes the slice when it stops: a
// restarting daemon must not make the devices vanish from the scheduler; RemoveAll() is for
// uninstalling.
//
// Unhealthy devices stay in the slice with device taints (resource_slice.h). The API server sets
// each taint's timeAdded; the publisher carries it over from the slice it read, so an unchanged
// taint is no difference and no write, and the time stays when the taint came. An API server with
// DRADeviceTaints off drops the taints on write without an error (strategy.go
// dropDisabledDRADeviceTaintsFields, kubernetes/kubernetes pkg/registry/resource/resourceslice):
// the publisher compares what came back, and when the taints are gone (or a 422 refuses them) it
// leaves Unhealthy devices out instead, as before taints, says so once, and keeps to that until
// the daemon restarts.
//
// The driver's other periodic work (ClaimPreparer::Cleanup) runs on this thread too, as the
// `chore`: after the first reconcile, then after the first reconcile that comes at least
// `chore_interval` after its last run, so it costs no thread and no wake-up of its own.
#ifndef EDGEACCEL_DRA_SLICE_PUBLISHER_H_
#define EDGEACCEL_DRA_SLICE_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/node/api_client.h"

namespace edgeaccel {

class SlicePublisher {
 public:
  struct Options {
    std::string driver;
    std::string node_name;
    absl::Duration resync = absl::Seconds(30);
    absl::Duration initial_backoff = absl::Milliseconds(200);
    absl::Duration max_backoff = absl::Seconds(30);
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
    size_t tainted = 0;            // devices in it with taints (Unhealthy)
    bool taints_dropped = false;   // the API server does not keep taints: Unhealthy left out
  };

  // `client` and `set` outlive this object.
  SlicePublisher(Options options, const ApiClient* client, DeviceSet* set);
  ~SlicePublisher();

  void Start();
  // Stops the thread (a request in flight ends at the client's timeout); leaves the slice.
  void Stop();
  // Reconcile now (also while the set did not change).
  void Resync();
  // Deletes every slice of this driver on this node (uninstall); once, on the caller's thread.
  absl::Status RemoveAll();

  Status status() const;
  // One reconcile on the caller's thread (tests, --discover's check).
  absl::Status ReconcileOnce();

 private:
  void Run();
  absl::Status Reconcile();
  absl::StatusOr<nlohmann::json> ListSlices() const;
  std::string NodeUid();

  const Options options_;
  const ApiClient* const client_;
  DeviceSet* const set_;
  uint64_t listener_ = 0;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
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
