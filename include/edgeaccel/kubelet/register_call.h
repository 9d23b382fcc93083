// RegisterCall: one Register call on kubelet.sock (the kubelet's Registration service), the way
// the kubelet's own device manager client makes it: a fresh channel, a deadline, and
// wait-for-ready, since a kubelet may be a moment behind its socket file.
//
// Made with gRPC's callback API so the registrar's thread keeps watching meanwhile; its end is
// announced on an eventfd the caller polls, and read with Outcome() after that.
#ifndef EDGEACCEL_KUBELET_REGISTER_CALL_H_
#define EDGEACCEL_KUBELET_REGISTER_CALL_H_

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/kubelet/plugin_options.h"
#include "edgeaccel/kubelet/registration_machine.h"

namespace edgeaccel {

class RegisterCall {
 public:
  // `endpoint`: our socket's file name, as the kubelet wants it (relative to device-plugins/).
  RegisterCall(std::string kubelet_socket_path, KubeletSocketId kubelet, std::string resource,
               std::string endpoint, const PluginOptions& options, absl::Duration timeout);
  RegisterCall(const RegisterCall&) = delete;
  RegisterCall& operator=(const RegisterCall&) = delete;

  // Starts the call; `done_fd` (an eventfd) is written once it has ended. The call must outlive
  // that write: wait for it before destroying a started call.
  void Start(int done_fd);
  // Asks gRPC to end the call now; it still ends through `done_fd`.
  void Cancel();
  // How it ended; only after `done_fd` was written.
  RegisterOutcome Outcome() const;
  const KubeletSocketId& kubelet() const { return kubelet_; }

 private:
  const std::string kubelet_socket_path_;
  const KubeletSocketId kubelet_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::Registration::Stub> stub_;
  grpc::ClientContext context_;
  v1beta1::RegisterRequest request_;
  v1beta1::Empty response_;
  absl::Time started_;
  grpc::Status status_;  // written by gRPC's thread before it writes done_fd
  mutable absl::Mutex mu_;
  bool cancelled_by_us_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_REGISTER_CALL_H_
