// HostWatcher: keeps every DeviceSet current, driven by what the kernel announces.
//
// What is seen at once, and what only at the probe:
//   - a device node appearing or vanishing in /dev (devtmpfs sends inotify events): at once, so a
//     removed device node reaches ListAndWatch within about a millisecond (edgeaccel-bench);
//   - a kernel uevent for a subsystem a discoverer names (add, remove, bind, unbind, change):
//     at once, where the uevent socket works (host/uevent_socket.h);
//   - anything that only sysfs or procfs says (driver status DEAD, temperature, GPU load, the
//     NVIDIA driver's /proc files): at the next probe. sysfs and procfs send no inotify events,
//     so they are never watched, not even in test fixtures (Host::IsSilentToInotify). The probe
//     asks each family whether what its last scan read of that kind still reads the same
//     (Discoverer::InputsUnchanged, discovery/scan_inputs.h) and scans only the families where
//     it does not: the same devices, health and facts as scanning them all, at the same probe.
// After a change is seen, the families it concerned are scanned once more a moment later
// (`settle`): the kernel removes a device node before the sysfs directory that describes it, and
// adds it after, so the first look can catch a device half-gone.
//
// One PollLoop thread of its own ("ea-hostwatch": hot-plug must not wait behind the daemon's
// shared loop, whose steps can take a neighbour look's budget) waits on one epoll set: the
// inotify fd, the uevent socket, a timerfd for the settle look, RequestRescan's eventfd and each
// family's probe inputs' inotify instance (reported once per event, so a probe reads the queue
// only of a family that has one), until the next probe is due (the loop's wake time).
// Directories that do not exist yet (driver not loaded) are covered by watching their nearest
// existing ancestor. When idle the thread wakes only for the probe interval.
#ifndef EDGEACCEL_INVENTORY_HOST_WATCHER_H_
#define EDGEACCEL_INVENTORY_HOST_WATCHER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/host/directory_watcher.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/host/uevent_socket.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

class HostWatcher : private PollLoop::Member {
 public:
  struct Options {
    // How often devices are probed for what inotify cannot tell (temperature, driver status).
    // Zero disables the probe.
    absl::Duration probe_interval = absl::Seconds(5);
    // Listen for kernel uevents (where a socket can be opened).
    bool uevents = true;
    // The second look after a change.
    absl::Duration settle = absl::Milliseconds(100);
  };

  HostWatcher(const Host* host, Options options);
  ~HostWatcher();

  HostWatcher(const HostWatcher&) = delete;
  HostWatcher& operator=(const HostWatcher&) = delete;

  // Adds a family whose devices go to `set`. Several families may feed one set (PCIe and USB
  // Edge TPUs are both coral.ai/edgetpu): the set always holds all of their devices. Only
  // before Start().
  void Add(Discoverer* discoverer, DeviceSet* set);
  // Advertise every device of `set` as `replicas` time-sliced replicas. Only before Start().
  void SetReplicas(DeviceSet* set, int replicas);

  // Scans everything once (so the sets are filled when this returns), then watches.
  absl::Status Start();
  void Stop();

  // Scans all families now, on the caller's thread (used at start and by --discover).
  void ScanAll();

  // Rescans `discoverer`'s family soon, on the watcher's thread: for what only the discoverer's
  // own sources can announce (NVML's Xid errors). Any thread; never blocks. Before Start() it
  // does nothing (Start scans everything).
  void RequestRescan(const Discoverer* discoverer);

  // Number of family scans so far (each family of ScanAll counts one), for tests and metrics.
  uint64_t scans() const { return scans_.load(); }

  // Number of probes done so far (each after the families it found changed were scanned and
  // published): a test waits for this to know a probe has looked.
  uint64_t probes() const { return probes_.load(); }

  // Batches of inotify events and of kernel uevents read and acted on (a rescan, or none): a test
  // waits for this to know an event it expects to be ignored has been seen and ignored.
  uint64_t events_handled() const { return events_handled_.load(); }

  // Whether kernel uevents are being received (the socket opened).
  bool listening_to_uevents() const { return uevents_.ok(); }

 private:
  struct Family {
    Discoverer* discoverer;
    DeviceSet* set;
    std::vector<Device> last;  // this family's latest scan
    ScanInputs* inputs;        // discoverer->ProbeInputs(): told of their events through epoll
  };
  struct Target {  // one watched directory, and who cares about it
    size_t family;
    std::string name_prefix;
  };

  // While some directory cannot be watched (inotify watches used up), everything is looked at
  // this often instead of missing a device.
  static constexpr absl::Duration kLookInterval = absl::Seconds(1);

  // PollLoop::Member, on the loop's thread: the epoll set's events, then the look and the probe
  // when due. Returns when the next is due.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  // Reads the epoll set (without waiting) and acts on what it reports.
  void HandleEvents();
  void Rescan(size_t family);
  // The probe tick: scans the families whose inputs changed, or all of them while some
  // directory is not watched (then not every device node change is announced).
  void Probe();
  // Updates `set` with the latest scans of all its families.
  void Publish(DeviceSet* set);
  void ArmWatches();
  void HandleInotify();
  void HandleUevents();
  // Rescans `dirty` now and once more after the settle delay.
  void RescanChanged(const absl::flat_hash_set<size_t>& dirty);

  const Host* host_;
  const Options options_;
  std::vector<Family> families_;
  absl::flat_hash_map<DeviceSet*, int> replicas_;
  std::vector<Target> targets_;  // parallel to the directories armed in watcher_
  DirectoryWatcher watcher_;
  UeventSocket uevents_;
  absl::flat_hash_set<std::string> silent_logged_;  // directories we said we would not watch
  absl::flat_hash_set<size_t> settling_;            // families due for the second look
  int settle_fd_ = -1;
  int rescan_fd_ = -1;  // RequestRescan's wake-up
  int epoll_fd_ = -1;
  absl::Mutex rescan_mu_;
  absl::flat_hash_set<size_t> rescan_requested_ ABSL_GUARDED_BY(rescan_mu_);
  // The loop thread's own.
  absl::Time next_probe_ = absl::InfinitePast();
  absl::Time next_look_ = absl::InfinitePast();
  PollLoop loop_;
  bool started_ = false;  // Start() to Stop(), on the caller's thread
  std::atomic<uint64_t> scans_{0};
  std::atomic<uint64_t> probes_{0};
  std::atomic<uint64_t> events_handled_{0};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_INVENTORY_HOST_WATCHER_H_
