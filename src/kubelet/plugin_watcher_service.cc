#include "edgeaccel/kubelet/plugin_watcher_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/unix_socket_channel.h"
#include "glog/logging.h"

namespace edgeaccel {

void TellWatcherLetGo(const std::string& socket, absl::Duration timeout) {
  auto stub = pluginregistration::Registration::NewStub(DialUnixSocket(socket));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  context.AddMetadata(kWatcherLetGoMetadata, "1");
  pluginregistration::PluginInfo info;
  (void)stub->GetInfo(&context, pluginregistration::InfoRequest(), &info);
}

PluginWatcherService::PluginWatcherService(
    std::string resource_name, std::function<void(const std::string& error)> on_refused)
    : resource_name_(std::move(resource_name)), on_refused_(std::move(on_refused)) {}

void ServeRegistration(
    pluginregistration::Registration::AsyncService* service, CompletionLoop* loop,
    UnaryMethod<pluginregistration::InfoRequest, pluginregistration::PluginInfo>::CallHandler
        get_info,
    UnaryMethod<pluginregistration::RegistrationStatus,
                pluginregistration::RegistrationStatusResponse>::CallHandler notify) {
  grpc::ServerCompletionQueue* cq = loop->cq();
  UnaryMethod<pluginregistration::InfoRequest, pluginregistration::PluginInfo>::ServeSeeingCall(
      loop,
      [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestGetInfo(context, request, responder, cq, cq, tag);
      },
      std::move(get_info));
  if (notify == nullptr) return;
  UnaryMethod<pluginregistration::RegistrationStatus,
              pluginregistration::RegistrationStatusResponse>::ServeSeeingCall(
      loop,
      [service, cq](auto* context, auto* request, auto* responder, void* tag) {
        service->RequestNotifyRegistrationStatus(context, request, responder, cq, cq, tag);
      },
      std::move(notify));
}

void PluginWatcherService::Serve(pluginregistration::Registration::AsyncService* service,
                                 CompletionLoop* loop) {
  ServeRegistration(
      service, loop,
      [this](const grpc::ServerContext& context, const auto& request, auto* response) {
        if (context.client_metadata().count(kWatcherLetGoMetadata) > 0) {
          VLOG(1) << resource_name_ << ": an earlier edgeaccel says the plugin watcher let go of "
                                       "its registration";
          if (on_let_go_) on_let_go_();
        }
        return GetInfo(request, response);
      },
      [this](const grpc::ServerContext&, const auto& request, auto* response) {
        return NotifyRegistrationStatus(request, response);
      });
}

grpc::Status PluginWatcherService::GetInfo(const pluginregistration::InfoRequest&,
                                           pluginregistration::PluginInfo* response) {
  if (stepped_back_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(resource_name_, " is left to another device plugin"));
  }
  response->set_type(std::string(kPluginTypeDevicePlugin));
  response->set_name(resource_name_);
  // Empty endpoint: the DevicePlugin service is on this same socket, at whatever path the
  // kubelet found it (its own view of the host, which may differ from ours in a container).
  response->set_endpoint("");
  response->add_supported_versions(std::string(kDevicePluginApiVersion));
  VLOG(1) << resource_name_ << ": plugin watcher asked for our info";
  return grpc::Status::OK;
}

grpc::Status PluginWatcherService::NotifyRegistrationStatus(
    const pluginregistration::RegistrationStatus& request,
    pluginregistration::RegistrationStatusResponse*) {
  if (request.plugin_registered()) {
    registered_.store(true);
    registrations_.fetch_add(1);
    LOG(INFO) << resource_name_ << ": registered with the kubelet through its plugin watcher";
  } else {
    registered_.store(false);
    LOG(ERROR) << resource_name_ << ": the kubelet's plugin watcher refused the registration: "
               << request.error() << " (the kubelet retries on its own, with backoff)";
    if (on_refused_) on_refused_(request.error());
  }
  return grpc::Status::OK;
}

}  // namespace edgeaccel
