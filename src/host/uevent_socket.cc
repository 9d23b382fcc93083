#include "edgeaccel/host/uevent_socket.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace edgeaccel {

std::optional<Uevent> ParseUevent(absl::string_view message) {
  // The header "ACTION@DEVPATH" comes first, then NUL-terminated KEY=VALUE pairs. udev's own
  // messages start with "libudev\0" instead and never have an '@' header.
  const size_t header_end = message.find('\0');
  absl::string_view header = message.substr(0, header_end);
  const size_t at = header.find('@');
  if (at == absl::string_view::npos || at == 0 || at + 1 >= header.size()) return std::nullopt;
  Uevent event;
  event.action = std::string(header.substr(0, at));
  event.devpath = std::string(header.substr(at + 1));
  if (header_end == absl::string_view::npos) return std::nullopt;
  for (absl::string_view pair : absl::StrSplit(message.substr(header_end + 1), '\0')) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) continue;
    absl::string_view key = pair.substr(0, eq);
    absl::string_view value = pair.substr(eq + 1);
    if (key == "ACTION" && value != event.action) return std::nullopt;  // not a kernel message
    if (key == "SUBSYSTEM") event.subsystem = std::string(value);
    if (key == "DEVNAME") event.devname = std::string(value);
  }
  if (event.subsystem.empty()) return std::nullopt;
  return event;
}

UeventSocket::~UeventSocket() {
  if (fd_ >= 0) close(fd_);
}

absl::Status UeventSocket::Open() {
  if (fd_ >= 0) return absl::OkStatus();
  fd_ = socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  if (fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot open a uevent socket: ", strerror(errno)));
  }
  // A burst (a USB hub with several devices, a driver reload) must not overrun the buffer; the
  // kernel caps this at net.core.rmem_max without privilege, which is fine.
  int size = 1 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  struct sockaddr_nl address = {};
  address.nl_family = AF_NETLINK;
  address.nl_groups = 1;  // the kernel's group; udev re-broadcasts on 2
  if (bind(fd_, reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    close(fd_);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat("cannot bind a uevent socket: ", strerror(err)));
  }
  return absl::OkStatus();
}

std::vector<Uevent> UeventSocket::Drain(bool* lost) {
  std::vector<Uevent> events;
  if (fd_ < 0) return events;
  char buffer[8192];
  while (true) {
    struct sockaddr_nl from = {};
    struct iovec iov = {buffer, sizeof(buffer)};
    struct msghdr message = {};
    message.msg_name = &from;
    message.msg_namelen = sizeof(from);
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    ssize_t n = recvmsg(fd_, &message, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOBUFS) {  // overrun: some messages are gone
        *lost = true;
        continue;
      }
      break;  // EAGAIN: drained
    }
    if (from.nl_pid != 0 || (message.msg_flags & MSG_TRUNC)) continue;  // not the kernel's
    if (std::optional<Uevent> event = ParseUevent(absl::string_view(buffer, static_cast<size_t>(n)))) {
      events.push_back(*std::move(event));
    }
  }
  return events;
}

}  // namespace edgeaccel
