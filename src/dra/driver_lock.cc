#include "edgeaccel/dra/driver_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"

namespace edgeaccel {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

// A non-blocking connection to the Unix socket at `path`, or -1 when nothing accepts there.
int ConnectTo(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) return -1;
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

DriverLock::DriverLock(std::string plugin_dir, std::function<void()> on_acquired)
    : plugin_dir_(std::move(plugin_dir)),
      lock_path_(absl::StrCat(plugin_dir_, "/", kDriverLockName)),
      service_socket_(absl::StrCat(plugin_dir_, "/", kDraServiceSocketName)),
      on_acquired_(std::move(on_acquired)) {}

DriverLock::~DriverLock() {
  absl::MutexLock lock(&mu_);
  CloseWaitFds();
  if (lock_fd_ >= 0) close(lock_fd_);  // lets go of the flock
}

absl::StatusOr<bool> DriverLock::TryAcquire() {
  absl::MutexLock lock(&mu_);
  if (acquired_) return true;
  if (lock_fd_ < 0) {
    for (const std::string& dir : {Parent(plugin_dir_), plugin_dir_}) {
      if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
        return absl::UnavailableError(absl::StrCat("cannot make ", dir, ": ", strerror(errno)));
      }
    }
    lock_fd_ = open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("cannot open ", lock_path_, ": ", strerror(errno)));
    }
  }
  int lock_error = 0;
  const bool ours = Check(&lock_error);
  if (lock_error != 0) {
    close(lock_fd_);
    lock_fd_ = -1;
    waiting_.clear();
    return absl::UnavailableError(absl::StrCat("cannot lock ", lock_path_, ": ", strerror(lock_error)));
  }
  return ours;
}

bool DriverLock::Check(int* lock_error) {
  if (acquired_) return true;
  if (!locked_) {
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && lock_error != nullptr) *lock_error = errno;
      waiting_ = absl::StrCat("another process holds ", lock_path_);
      return false;
    }
    locked_ = true;
  }
  if (UnixSocketAnswers(service_socket_)) {
    waiting_ = absl::StrCat("another process serves ", service_socket_);
    return false;
  }
  acquired_ = true;
  waiting_.clear();
  return true;
}

void DriverLock::Release() {
  absl::MutexLock lock(&mu_);
  if (lock_fd_ >= 0) close(lock_fd_);
  lock_fd_ = -1;
  locked_ = acquired_ = false;
}

bool DriverLock::held() const {
  absl::MutexLock lock(&mu_);
  return acquired_;
}

std::string DriverLock::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

bool DriverLock::Arm() {
  bool complete = true;
  if (inotify_fd_ < 0) {
    inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd_ < 0 ||
        inotify_add_watch(inotify_fd_, lock_path_.c_str(), IN_CLOSE_WRITE | IN_CLOSE_NOWRITE) < 0 ||
        inotify_add_watch(inotify_fd_, plugin_dir_.c_str(), IN_DELETE | IN_MOVED_FROM) < 0) {
      if (inotify_fd_ >= 0) close(inotify_fd_);
      inotify_fd_ = -1;
      complete = false;
    }
  }
  if (locked_ && probe_fd_ < 0) {
    // The predecessor's end closes this connection: no inotify event says a socket stopped
    // being served when its process died without removing the file.
    probe_fd_ = ConnectTo(service_socket_);
    if (probe_fd_ < 0) complete = false;
  }
  return complete;
}

void DriverLock::CloseWaitFds() {
  if (inotify_fd_ >= 0) close(inotify_fd_);
  if (probe_fd_ >= 0) close(probe_fd_);
  inotify_fd_ = probe_fd_ = -1;
}

PollLoop::Fds DriverLock::WaitFds() {
  absl::MutexLock lock(&mu_);
  return {inotify_fd_, probe_fd_, -1, -1};
}

absl::Time DriverLock::Step(const PollLoop::Events& ready) {
  bool acquired = false;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    if (acquired_ || lock_fd_ < 0) return absl::InfiniteFuture();  // released meanwhile
    if (ready[0] != 0) {
      char buffer[4096];
      while (read(inotify_fd_, buffer, sizeof(buffer)) > 0) {
      }
    }
    if (ready[1] != 0) {
      // What a gRPC server says first (its SETTINGS) is read and dropped; its end, or the
      // connection's, means looking again.
      char buffer[512];
      ssize_t n;
      while ((n = read(probe_fd_, buffer, sizeof(buffer))) > 0) {
      }
      const bool ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
      if (ended || (ready[1] & (POLLHUP | POLLERR)) != 0) {
        close(probe_fd_);
        probe_fd_ = -1;
      }
    }
    acquired = Check();
    if (!acquired) {
      // Armed, then checked again: what went between the look and the watch. Armed once more
      // for the connection a lock taken just now calls for.
      Arm();
      acquired = Check();
      if (!acquired && !Arm()) next = absl::Now() + absl::Seconds(1);
    }
    if (acquired) CloseWaitFds();
  }
  if (acquired) {
    LOG(INFO) << plugin_dir_ << ": the DRA driver is this process's now";
    on_acquired_();
  }
  return next;
}

}  // namespace edgeaccel
