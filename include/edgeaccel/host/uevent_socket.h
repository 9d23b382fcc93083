// UeventSocket: the kernel's device announcements (NETLINK_KOBJECT_UEVENT, multicast group 1).
//
// The kernel sends one message per device added, removed, bound, unbound or changed, with its
// subsystem ("usb", "apex", "pci"). It is the one notification that covers sysfs, which sends no
// inotify events. What reaches a socket depends on where the daemon runs (checked on Linux 6.x,
// by creating and removing loop57 through /dev/loop-control):
//   - the host's network namespace, or a pod's own network namespace owned by the initial user
//     namespace (an ordinary pod): every device uevent arrives;
//   - a network namespace owned by another user namespace (a pod with hostUsers: false, a rootless
//     runtime): the socket opens, but device uevents never arrive;
//   - netlink refused by a seccomp profile: Open fails.
// So uevents only ever add speed: devtmpfs (inotify on /dev) and the probe still see everything.
// Only messages from the kernel itself (netlink port 0) are accepted; udev's re-broadcasts (group
// 2, "libudev" header) and anything a process sends are ignored.
#ifndef EDGEACCEL_HOST_UEVENT_SOCKET_H_
#define EDGEACCEL_HOST_UEVENT_SOCKET_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace edgeaccel {

struct Uevent {
  std::string action;     // add, remove, change, bind, unbind, move, online, offline
  std::string devpath;    // /devices/pci0000:00/0000:03:00.0/apex/apex_0
  std::string subsystem;  // apex, usb, pci, block...
  std::string devname;    // apex_0, bus/usb/002/003 (empty when the device has no node)
};

// Parses one kernel message: "ACTION@DEVPATH\0KEY=VALUE\0...". nullopt for anything else.
std::optional<Uevent> ParseUevent(absl::string_view message);

class UeventSocket {
 public:
  UeventSocket() = default;
  ~UeventSocket();
  UeventSocket(const UeventSocket&) = delete;
  UeventSocket& operator=(const UeventSocket&) = delete;

  absl::Status Open();
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // readable when messages are pending (for epoll)

  // Reads every pending message without blocking. Sets *lost when the kernel dropped some
  // (receive buffer overrun): the caller should look at everything again.
  std::vector<Uevent> Drain(bool* lost);

 private:
  int fd_ = -1;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_UEVENT_SOCKET_H_
