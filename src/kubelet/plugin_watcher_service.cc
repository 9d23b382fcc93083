#include "edgeaccel/kubelet/plugin_watcher_service.h"

#include <utility>

#include "edgeaccel/kubelet/kubelet_api.h"
#include "glog/logging.h"

namespace edgeaccel {

PluginWatcherService::PluginWatcherService(std::string resource_name)
    : resource_name_(std::move(resource_name)) {}

grpc::ServerUnaryReactor* PluginWatcherService::GetInfo(grpc::CallbackServerContext* context,
                                                        const pluginregistration::InfoRequest*,
                                                        pluginregistration::PluginInfo* response) {
  response->set_type(std::string(kPluginTypeDevicePlugin));
  response->set_name(resource_name_);
  // Empty endpoint: the DevicePlugin service is on this same socket, at whatever path the
  // kubelet found it (its own view of the host, which may differ from ours in a container).
  response->set_endpoint("");
  response->add_supported_versions(std::string(kDevicePluginApiVersion));
  VLOG(1) << resource_name_ << ": plugin watcher asked for our info";
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PluginWatcherService::NotifyRegistrationStatus(
    grpc::CallbackServerContext* context, const pluginregistration::RegistrationStatus* request,
    pluginregistration::RegistrationStatusResponse*) {
  if (request->plugin_registered()) {
    registered_.store(true);
    registrations_.fetch_add(1);
    LOG(INFO) << resource_name_ << ": registered with the kubelet through its plugin watcher";
  } else {
    registered_.store(false);
    LOG(ERROR) << resource_name_ << ": the kubelet's plugin watcher refused the registration: "
               << request->error() << " (the kubelet retries on its own, with backoff)";
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace edgeaccel
