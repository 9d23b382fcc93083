// The v1beta1 DevicePlugin service for one resource.
//
// The service uses gRPC's callback API: a ListAndWatch stream is a reactor with its own state
// (last version sent, write in flight) that the DeviceSet wakes when the device list changes.
// No thread sleeps per stream, nothing polls, and every stream sees every change: state is never
// shared between streams, so an abandoned stream cannot swallow an update meant for a live one.
#ifndef EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_
#define EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/plugin_options.h"

namespace edgeaccel {

// Counters a plugin keeps for logs, tests and metrics.
struct PluginCounters {
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> allocate_errors{0};
  std::atomic<uint64_t> list_and_watch_updates{0};
  std::atomic<uint64_t> streams_opened{0};
};

class DevicePluginService final : public v1beta1::DevicePlugin::CallbackService {
 public:
  // `on_stream_cancelled`, when set, runs (on a gRPC thread) whenever the kubelet ends a
  // ListAndWatch stream: it restarted, or it dropped our endpoint.
  DevicePluginService(DeviceSet* set, PluginCounters* counters, PluginOptions options,
                      std::function<void()> on_stream_cancelled = nullptr);
  ~DevicePluginService() override;

  // Finishes every open ListAndWatch stream with OK (shutdown, socket re-created).
  void EndStreams();
  // ListAndWatch streams open now.
  int OpenStreams() const;
  // Sends every stream the current list again if what PluginOptions::advertise_now allows has
  // changed since its last message.
  void Readvertise();

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
  const std::function<void()> on_stream_cancelled_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Stream*, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_
