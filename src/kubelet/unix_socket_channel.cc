#include "edgeaccel/kubelet/unix_socket_channel.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel {

std::shared_ptr<grpc::Channel> DialUnixSocket(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // gRPC raises each of these to 100 ms (its floor); they say "as soon as gRPC allows".
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", path),
                                   grpc::InsecureChannelCredentials(), args);
}

namespace {

// connect()'s errno on the Unix socket at `path` (0: it accepted).
int ConnectError(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int error = connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : errno;
  close(fd);
  return error;
}

}  // namespace

bool UnixSocketAnswers(const std::string& path) { return ConnectError(path) == 0; }

bool WaitUntilUnixSocketAccepts(const std::string& path, absl::Duration budget) {
  const absl::Time deadline = absl::Now() + budget;
  for (;;) {
    const int error = ConnectError(path);
    if (error != ECONNREFUSED) return error == 0;
    // No event says "listening now" (inotify saw the file at bind): look again, briefly.
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(500));
  }
}

absl::Status FreeSocketPath(const std::string& path, absl::string_view taken_hint) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", path, " is longer than ",
                                                   sizeof(sockaddr_un::sun_path) - 1,
                                                   " bytes, the limit for a Unix socket"));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot serve on ", path, ": the path is taken by ",
          S_ISDIR(st.st_mode) ? "a directory" : S_ISREG(st.st_mode) ? "a regular file" : "a non-socket file",
          "; ", taken_hint));
    }
    if (UnixSocketAnswers(path)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "cannot serve on ", path, ": another process is serving on it (a second edgeaccel-device-plugin?)"));
    }
    // A stale socket from an earlier run: replace it.
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("cannot remove stale socket ", path, ": ", strerror(errno)));
    }
    LOG(INFO) << "replaced stale socket " << path;
  } else if (errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

ino_t SocketInode(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

void RemoveSocketIfOurs(const std::string& path, ino_t inode) {
  struct stat st;
  if (inode != 0 && stat(path.c_str(), &st) == 0 && st.st_ino == inode && S_ISSOCK(st.st_mode)) {
    unlink(path.c_str());
  }
}

}  // namespace edgeaccel
