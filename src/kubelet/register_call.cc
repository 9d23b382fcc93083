#include "edgeaccel/kubelet/register_call.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <utility>

#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"

namespace edgeaccel {
namespace {

constexpr absl::Duration kWaitForKubeletToListen = absl::Milliseconds(20);

}  // namespace

RegisterCall::RegisterCall(std::string kubelet_socket_path, KubeletSocketId kubelet,
                           std::string resource, std::string endpoint,
                           const PluginOptions& options, absl::Duration timeout)
    : kubelet_socket_path_(std::move(kubelet_socket_path)), kubelet_(kubelet) {
  request_.set_version(std::string(kDevicePluginApiVersion));
  request_.set_endpoint(std::move(endpoint));
  request_.set_resource_name(std::move(resource));
  *request_.mutable_options() = AdvertisedOptions(options);
  context_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  // Wait for the kubelet to accept connections (it may be a moment behind its socket file).
  context_.set_wait_for_ready(true);
}

void RegisterCall::Start(int done_fd) {
  started_ = absl::Now();
  // kubelet.sock may be seen a moment before the kubelet listens on it; a refused connect would
  // cost gRPC's 100 ms reconnect floor. A few milliseconds at most, and only then.
  WaitUntilUnixSocketAccepts(kubelet_socket_path_, kWaitForKubeletToListen);
  channel_ = DialUnixSocket(kubelet_socket_path_);
  stub_ = v1beta1::Registration::NewStub(channel_);
  stub_->async()->Register(&context_, &request_, &response_, [this, done_fd](grpc::Status status) {
    status_ = std::move(status);
    uint64_t one = 1;
    (void)!write(done_fd, &one, sizeof(one));
  });
}

void RegisterCall::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_by_us_ = true;
  }
  context_.TryCancel();
}

RegisterOutcome RegisterCall::Outcome() const {
  RegisterOutcome outcome;
  outcome.kubelet = kubelet_;
  outcome.started = started_;
  outcome.ok = status_.ok();
  outcome.deadline_exceeded = status_.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  outcome.message = status_.error_message();
  absl::MutexLock lock(&mu_);
  outcome.cancelled_by_us = cancelled_by_us_;
  return outcome;
}

}  // namespace edgeaccel
