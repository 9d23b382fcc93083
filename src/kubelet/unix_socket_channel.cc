#include "edgeaccel/kubelet/unix_socket_channel.h"

#include "absl/strings/str_cat.h"

namespace edgeaccel {

std::shared_ptr<grpc::Channel> DialUnixSocket(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 2);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 50);
  return grpc::CreateCustomChannel(absl::StrCat("unix:", path),
                                   grpc::InsecureChannelCredentials(), args);
}

}  // namespace edgeaccel
