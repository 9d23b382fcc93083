#ifndef EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_
#define EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {

// The plugin watcher's Registration service for one resource.
class PluginWatcherService final : public pluginregistration::Registration::CallbackService {
 public:
  explicit PluginWatcherService(std::string resource_name);

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const pluginregistration::InfoRequest* request,
                                    pluginregistration::PluginInfo* response) override;
  grpc::ServerUnaryReactor* NotifyRegistrationStatus(
      grpc::CallbackServerContext* context, const pluginregistration::RegistrationStatus* request,
      pluginregistration::RegistrationStatusResponse* response) override;

  bool registered() const { return registered_.load(); }
  // The kubelet dropped the endpoint it had registered: no longer registered until it notifies
  // us again.
  void EndpointLost() { registered_.store(false); }
  uint64_t registrations() const { return registrations_.load(); }

 private:
  const std::string resource_name_;
  std::atomic<bool> registered_{false};
  std::atomic<uint64_t> registrations_{0};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_
