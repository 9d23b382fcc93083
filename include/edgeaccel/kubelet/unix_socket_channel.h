#ifndef EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_
#define EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace edgeaccel {

// A channel to a Unix socket that retries connecting every few milliseconds: kubelet.sock
// appears (inotify) a moment before the kubelet serves on it, and gRPC's default reconnect
// backoff (1 s, shared between channels) would make us wait a second for nothing.
std::shared_ptr<grpc::Channel> DialUnixSocket(const std::string& path);

// True if something accepts connections on the Unix socket at `path` now (a socket file whose
// process is gone refuses them).
bool UnixSocketAnswers(const std::string& path);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_UNIX_SOCKET_CHANNEL_H_
