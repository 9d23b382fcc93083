#ifndef EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_
#define EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel {

// Answers the Registration service of `service` on `loop`, as the kubelet's plugin watcher calls
// it: GetInfo with `get_info` and, where `notify` is given, NotifyRegistrationStatus with it (a
// socket that only answers GetInfo leaves the other call unanswered). The handlers run on the
// loop thread, and see the call (its peer: which connection it came on).
void ServeRegistration(
    pluginregistration::Registration::AsyncService* service, CompletionLoop* loop,
    UnaryMethod<pluginregistration::InfoRequest, pluginregistration::PluginInfo>::CallHandler
        get_info,
    UnaryMethod<pluginregistration::RegistrationStatus,
                pluginregistration::RegistrationStatusResponse>::CallHandler notify = nullptr);

// An edgeaccel that served on a plugins_registry/ path and whose plugin-watcher registration the
// kubelet has just dropped tells whatever now serves on that path, with a GetInfo carrying this
// metadata key: the watcher has let go of that registration, a pass before it asks the new socket
// (docs/kubelet-behaviour.md §11). The kubelet's own GetInfo never carries it.
inline constexpr char kWatcherLetGoMetadata[] = "edgeaccel-watcher-let-go";
// Sends that GetInfo to `socket`, waiting at most `timeout` for its answer (which says nothing we
// need: a WatcherProbe refuses it).
void TellWatcherLetGo(const std::string& socket, absl::Duration timeout);

// The plugin watcher's Registration service for one resource. It outlives the servers that
// carry it (the registrar's socket is re-created when the kubelet restarts); each one calls
// Serve() with its own AsyncService and queue.
class PluginWatcherService final {
 public:
  // `on_refused`, when set, hears the kubelet's error when it refuses the registration.
  explicit PluginWatcherService(std::string resource_name,
                                std::function<void(const std::string& error)> on_refused = nullptr);

  // Starts answering `service`'s methods on `loop` (see CompletionLoop).
  void Serve(pluginregistration::Registration::AsyncService* service, CompletionLoop* loop);

  grpc::Status GetInfo(const pluginregistration::InfoRequest& request,
                       pluginregistration::PluginInfo* response);
  grpc::Status NotifyRegistrationStatus(const pluginregistration::RegistrationStatus& request,
                                        pluginregistration::RegistrationStatusResponse* response);

  bool registered() const { return registered_.load(); }
  // The kubelet dropped the endpoint it had registered: no longer registered until it notifies
  // us again.
  void EndpointLost() { registered_.store(false); }
  // While set, GetInfo is refused: the resource is left to another plugin, and a plugin watcher
  // that registered our socket (after a kubelet restart) would take it from that plugin. Removing
  // the socket instead would be worse: the watcher deregisters by resource name, and so would
  // disconnect the other plugin.
  void SetSteppedBack(bool stepped_back) { stepped_back_.store(stepped_back); }
  uint64_t registrations() const { return registrations_.load(); }
  // Runs on the serving loop's thread when an earlier edgeaccel tells us the watcher let go of
  // its registration (TellWatcherLetGo); it must not block. Set before any server carries this.
  void OnWatcherLetGo(std::function<void()> heard) { on_let_go_ = std::move(heard); }

 private:
  const std::string resource_name_;
  const std::function<void(const std::string& error)> on_refused_;
  std::function<void()> on_let_go_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> stepped_back_{false};
  std::atomic<uint64_t> registrations_{0};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_PLUGIN_WATCHER_SERVICE_H_
