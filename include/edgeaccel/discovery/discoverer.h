// Discoverer: one per device family. Reads the host (through Host) and says which devices exist
// and how healthy they are. Knows nothing about gRPC or the kubelet.
#ifndef EDGEACCEL_DISCOVERY_DISCOVERER_H_
#define EDGEACCEL_DISCOVERY_DISCOVERER_H_

#include <string>
#include <vector>

#include "edgeaccel/discovery/device.h"

namespace edgeaccel {

// A host directory whose entries matter to a discoverer. A change to an entry whose name starts
// with `name_prefix` (empty: any) triggers a rescan.
struct WatchSpec {
  std::string directory;  // host path
  std::string name_prefix;
};

class ScanInputs;

class Discoverer {
 public:
  virtual ~Discoverer() = default;

  // The extended resource these devices are advertised as.
  virtual std::string ResourceName() const = 0;

  // Short family name for logs and --discover ("coral-pcie").
  virtual std::string Family() const = 0;

  // Reads the host now. Never fails as a whole: a device whose files cannot be read is reported
  // Unhealthy with the reason, or left out when it cannot be told apart from noise. Called from
  // one thread at a time.
  virtual std::vector<Device> Scan() = 0;

  // Whether a Scan() now would find what the last one found, told by reading again only what the
  // kernel can change without an event on WatchPaths() or UeventSubsystems() (sysfs and procfs
  // values, files under /etc: scan_inputs.h). False when anything differs, before the first
  // Scan(), and where a family cannot tell (the default): the probe then scans it. Called from
  // the thread that calls Scan(), on each probe.
  virtual bool InputsUnchanged() { return false; }

  // What InputsUnchanged() reads again, where it is kept in one ScanInputs: the HostWatcher has
  // it say through the watcher's epoll when an inotify event for it waits
  // (ScanInputs::WakeThrough), so a probe with none reads no queue. Null: none (the default).
  virtual ScanInputs* ProbeInputs() { return nullptr; }

  // Where the kernel tells us about changes through inotify: device nodes in /dev (devtmpfs).
  // Never sysfs or procfs, which send no inotify events (HostWatcher refuses to watch them).
  // Anything else is read on the probe interval.
  virtual std::vector<WatchSpec> WatchPaths() const = 0;

  // Kernel uevent subsystems ("usb", "apex") whose add/remove/bind/unbind/change messages
  // trigger a rescan. They arrive where a uevent socket can be opened and the kernel delivers
  // to it (see host/uevent_socket.h); never the only way a change is seen.
  virtual std::vector<std::string> UeventSubsystems() const { return {}; }

  // One line for the log when nothing of this family is present, saying what was looked for.
  virtual std::string NothingFoundHint() const = 0;

  // What is wrong with how this process sees the host, found by the last scan, when only a
  // restart of the daemon (a fresh pod, with fresh mounts) fixes it; empty when nothing is.
  // Makes /healthz fail. Called from any thread.
  virtual std::string StaleHostView() const { return {}; }

  // Lines for --discover about what was found but is not served, and why (a GPU in MIG mode).
  // Called from any thread.
  virtual std::vector<std::string> Remarks() const { return {}; }
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_DISCOVERER_H_
