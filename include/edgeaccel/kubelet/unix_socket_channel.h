#ifndef EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_
#define EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace edgeaccel {

// A channel to a Unix socket of its own (no subchannel shared with other channels) that retries
// connecting after 100 ms, not gRPC's default 1 s. 100 ms is gRPC's floor for any reconnect
// backoff (ParseArgsForBackoffValues in subchannel.cc clamps every backoff argument to it): to
// meet a socket that is about to accept sooner, see WaitUntilUnixSocketAccepts.
std::shared_ptr<grpc::Channel> DialUnixSocket(const std::string& path);

// Waits, at most `budget`, until the Unix socket at `path` accepts connections, trying again
// every half millisecond while connect() is refused. The kubelet's socket file appears (inotify)
// at its bind(), a moment before its listen(); a connect in between is refused, after which gRPC
// would wait its 100 ms floor before trying again. True once it accepts; false when the budget
// runs out or connect fails otherwise (no such file: the kubelet is not there).
bool WaitUntilUnixSocketAccepts(const std::string& path, absl::Duration budget);

// True if something accepts connections on the Unix socket at `path` now (a socket file whose
// process is gone refuses them).
bool UnixSocketAnswers(const std::string& path);

// Makes `path` free for a socket we serve on: nothing there, or a stale socket (one nobody
// answers on, left by a process that died), which is removed. Errors: a path too long for a Unix
// socket, one taken by something that is not a socket (`taken_hint` ends that message: which
// flag to change), or a socket another process serves on (a second daemon).
absl::Status FreeSocketPath(const std::string& path, absl::string_view taken_hint);

// The inode of the socket at `path` (0 if none), to know it later as ours.
ino_t SocketInode(const std::string& path);

// Removes the socket at `path` if it is still ours (`inode`), not one a newer process put there.
void RemoveSocketIfOurs(const std::string& path, ino_t inode);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_
