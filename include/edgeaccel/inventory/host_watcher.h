// HostWatcher: keeps every DeviceSet current, driven by the kernel.
//
// One thread sleeps in epoll on an inotify fd (device nodes and sysfs class directories each
// discoverer names), a timerfd for the probe interval (temperature and driver status have no
// inotify events), and an eventfd to stop. A change under a watched directory rescans just the
// discoverers that care, at once, so a removed device reaches ListAndWatch in well under a
// millisecond. Directories that do not exist yet (driver not loaded) are covered by watching
// their nearest existing ancestor and re-arming when it changes. When idle the thread wakes only
// for the probe interval.
#ifndef EDGEACCEL_INVENTORY_HOST_WATCHER_H_
#define EDGEACCEL_INVENTORY_HOST_WATCHER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/host/directory_watcher.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

class HostWatcher {
 public:
  struct Options {
    // How often devices are probed for what inotify cannot tell (temperature, driver status).
    // Zero disables the probe.
    absl::Duration probe_interval = absl::Seconds(5);
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

  // Number of rescans triggered so far, for tests and metrics.
  uint64_t scans() const { return scans_.load(); }

 private:
  struct Family {
    Discoverer* discoverer;
    DeviceSet* set;
    std::vector<Device> last;  // this family's latest scan
  };
  struct Target {  // one watched directory, and who cares about it
    size_t family;
    std::string name_prefix;
  };

  void Run();
  void Rescan(size_t family);
  // Updates `set` with the latest scans of all its families.
  void Publish(DeviceSet* set);
  void ArmWatches();
  void HandleInotify();

  const Host* host_;
  const Options options_;
  std::vector<Family> families_;
  absl::flat_hash_map<DeviceSet*, int> replicas_;
  std::vector<Target> targets_;  // parallel to the directories armed in watcher_
  DirectoryWatcher watcher_;
  int timer_fd_ = -1;
  int stop_fd_ = -1;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::atomic<uint64_t> scans_{0};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_INVENTORY_HOST_WATCHER_H_
