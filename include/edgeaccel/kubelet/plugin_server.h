// PluginServer: the gRPC server that carries a DevicePlugin service on one Unix socket, and
// owns that socket file (stale ones replaced, ours removed on Stop, never someone else's).
// WatcherProbe: a socket the kubelet's plugin watcher is to find and ask, nothing more.
#ifndef EDGEACCEL_KUBELET_PLUGIN_SERVER_H_
#define EDGEACCEL_KUBELET_PLUGIN_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "edgeaccel/kubelet/device_plugin_service.h"
#include "edgeaccel/kubelet/plugin_options.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"

namespace edgeaccel {

// A gRPC server on one Unix socket. Serves the DevicePlugin service and, when given, the plugin
// watcher's Registration service on the same socket, from one CompletionLoop thread.
class PluginServer {
 public:
  // `socket_path` is the path this process binds. `on_stream_cancelled`: see
  // DevicePluginService.
  PluginServer(std::string socket_path, DeviceSet* set, PluginCounters* counters,
               PluginWatcherService* registration, PluginOptions options = {},
               std::function<void()> on_stream_cancelled = nullptr);
  ~PluginServer();

  // Binds and serves. A stale socket at the path is replaced; anything else there is an error
  // that names it. The socket is made owner-only (0600).
  absl::Status Start();

  // Ends streams, stops serving within `grace`, and removes our socket file (only if it is
  // still ours).
  void Stop(absl::Duration grace = absl::Milliseconds(200));

  // True while our socket file is still at the path (the kubelet deletes it when it restarts).
  bool SocketPresent() const;

  // Makes the server reachable at `path` too (a second link to the socket gRPC listens on),
  // until Stop() or RemoveSocket(): a server in plugins_registry/ registering through
  // kubelet.sock for a handover names it there. A stale socket at `path` is replaced.
  absl::Status LinkAlso(const std::string& path);
  // The path LinkAlso made ("" when none).
  const std::string& also_path() const { return also_path_; }

  // Removes our socket file and the LinkAlso one (each if still ours) and keeps serving: the
  // kubelet's connections, made through the files, stay. For a server registered through the
  // plugin watcher that goes for good (ResourceRegistrar::LeavePluginWatcher).
  void RemoveSocket();
  // Waits until at most `most` ListAndWatch streams are open, or `by`. True when so.
  bool WaitForStreamsAtMost(int most, absl::Time by);

  // ListAndWatch streams open now (0 when not serving).
  int OpenStreams() const;
  void Readvertise();
  // Open streams stay open and hear nothing more (DevicePluginService::Silence).
  void Silence() {
    if (service_ != nullptr) service_->Silence();
  }

  const std::string& socket_path() const { return socket_path_; }

  // Another service (sync or async with its own threads) on the same server; before Start().
  // The benchmarks put an echo service beside Allocate this way.
  void AlsoServe(grpc::Service* service) { also_serve_ = service; }

 private:
  const std::string socket_path_;
  DeviceSet* const set_;
  PluginCounters* const counters_;
  PluginWatcherService* const registration_;
  grpc::Service* also_serve_ = nullptr;
  const PluginOptions options_;
  const std::function<void()> on_stream_cancelled_;
  std::unique_ptr<DevicePluginService> service_;
  // Per server: gRPC binds an async service to the one server it was registered with.
  std::unique_ptr<v1beta1::DevicePlugin::AsyncService> device_plugin_grpc_;
  std::unique_ptr<pluginregistration::Registration::AsyncService> registration_grpc_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionLoop> loop_;
  ino_t inode_ = 0;
  std::string listen_path_;
  std::string also_path_;
};

// A socket on a plugins_registry/ path that serves only the plugin watcher's GetInfo, and refuses
// it: nothing registers from it. It tells when the plugin watcher has let go of an earlier
// registration from the same path. The watcher runs one operation at a time per socket path
// (operationexecutor: goroutinemap keyed by the path), and its reconciler unregisters a path's
// registered socket when that socket is gone or re-created before it registers the path's new one
// (reconciler.go). So the first GetInfo here comes after the earlier registration's
// DeRegisterPlugin has returned (docs/kubelet-behaviour.md §2.1). An edgeaccel that served on the
// path asks it too, the moment that deregistration has ended its stream, a pass before the
// watcher would (ResourceRegistrar::WaitForTheWatcherToLetGo).
class WatcherProbe {
 public:
  // `on_asked` runs on the probe's loop thread at each GetInfo; it must not block.
  WatcherProbe(std::string socket_path, std::function<void()> on_asked);
  ~WatcherProbe();
  WatcherProbe(const WatcherProbe&) = delete;
  WatcherProbe& operator=(const WatcherProbe&) = delete;

  // Binds and serves, replacing a stale socket at the path (a live one, or anything else there,
  // is an error that names it).
  absl::Status Start();
  // Stops serving and removes the socket (if still ours).
  void Stop();

 private:
  const std::string socket_path_;
  const std::function<void()> on_asked_;
  std::unique_ptr<pluginregistration::Registration::AsyncService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionLoop> loop_;
  ino_t inode_ = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_PLUGIN_SERVER_H_
