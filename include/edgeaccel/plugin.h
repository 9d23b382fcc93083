// The v1beta1 DevicePlugin service for one resource, and the gRPC server that carries it on a
// Unix socket.
//
// The service uses gRPC's callback API: a ListAndWatch stream is a reactor with its own state
// (last version sent, write in flight) that the DeviceSet wakes when the device list changes.
// No thread sleeps per stream, nothing polls, and every stream sees every change: state is never
// shared between streams, so an abandoned stream cannot swallow an update meant for a live one.
#ifndef EDGEACCEL_PLUGIN_H_
#define EDGEACCEL_PLUGIN_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory.h"

namespace edgeaccel {

// Counters a plugin keeps for logs, tests and metrics.
struct PluginCounters {
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> allocate_errors{0};
  std::atomic<uint64_t> list_and_watch_updates{0};
  std::atomic<uint64_t> streams_opened{0};
};

struct PluginOptions {
  // Also answer cdi_devices (edgeaccel.io/<class>=<physical id>, see cdi.h).
  bool cdi_devices = false;
};

// Builds the Allocate answer for one container from the current snapshot, or says which id is
// wrong: the device nodes of every requested device (each host path once, so replicas of one
// device give its nodes once), their envs (distinct values of one variable joined with ","),
// and with CDI on, their CDI names. Pure: exposed for tests and benchmarks.
absl::Status BuildContainerAllocation(const Snapshot& snapshot, const std::string& resource,
                                      const v1beta1::ContainerAllocateRequest& request,
                                      const PluginOptions& options,
                                      v1beta1::ContainerAllocateResponse* response);

// Picks `request.allocation_size()` devices: all of must_include, then healthy available devices
// from as few NUMA nodes as possible (the must_include devices' node first). Replicas are spread:
// the next pick is a replica of the physical device used least in this answer and with the most
// replicas still free. Deterministic.
std::vector<std::string> PreferredDevices(
    const Snapshot& snapshot, const v1beta1::ContainerPreferredAllocationRequest& request);

class DevicePluginService final : public v1beta1::DevicePlugin::CallbackService {
 public:
  DevicePluginService(DeviceSet* set, PluginCounters* counters, PluginOptions options);
  ~DevicePluginService() override;

  // Finishes every open ListAndWatch stream with OK (shutdown, socket re-created).
  void EndStreams();

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context,
                                                   const v1beta1::Empty* request,
                                                   v1beta1::DevicePluginOptions* response) override;
  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(
      grpc::CallbackServerContext* context, const v1beta1::Empty* request) override;
  grpc::ServerUnaryReactor* GetPreferredAllocation(
      grpc::CallbackServerContext* context, const v1beta1::PreferredAllocationRequest* request,
      v1beta1::PreferredAllocationResponse* response) override;
  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context,
                                     const v1beta1::AllocateRequest* request,
                                     v1beta1::AllocateResponse* response) override;
  grpc::ServerUnaryReactor* PreStartContainer(
      grpc::CallbackServerContext* context, const v1beta1::PreStartContainerRequest* request,
      v1beta1::PreStartContainerResponse* response) override;

  class Stream;  // one ListAndWatch call

 private:
  friend class Stream;
  void Forget(Stream* stream);

  DeviceSet* const set_;
  PluginCounters* const counters_;
  const PluginOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Stream*, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// A gRPC server on one Unix socket. Serves the DevicePlugin service and, when given, other
// services on the same socket (the plugin watcher's Registration service).
class PluginServer {
 public:
  // `socket_path` is the path this process binds.
  PluginServer(std::string socket_path, DeviceSet* set, PluginCounters* counters,
               grpc::Service* extra_service, PluginOptions options = {});
  ~PluginServer();

  // Binds and serves. A stale socket at the path is replaced; anything else there is an error
  // that names it. The socket is made owner-only (0600).
  absl::Status Start();

  // Ends streams, stops serving within `grace`, and removes our socket file (only if it is
  // still ours).
  void Stop(absl::Duration grace = absl::Milliseconds(200));

  // True while our socket file is still at the path (the kubelet deletes it when it restarts).
  bool SocketPresent() const;

  const std::string& socket_path() const { return socket_path_; }
  DevicePluginService* service() { return service_.get(); }

 private:
  const std::string socket_path_;
  DeviceSet* const set_;
  PluginCounters* const counters_;
  grpc::Service* const extra_service_;
  const PluginOptions options_;
  std::unique_ptr<DevicePluginService> service_;
  std::unique_ptr<grpc::Server> server_;
  ino_t inode_ = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_PLUGIN_H_
