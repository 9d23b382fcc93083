// The v1beta1 DevicePlugin service for one resource.
//
// The service runs on a CompletionLoop (gRPC's async API, one thread of ours; see
// completion_loop.h). A ListAndWatch stream is an object with its own state (last version sent,
// write in flight) that the DeviceSet wakes when the device list changes: it starts the write
// from whichever thread delivered the change, and the loop thread starts the next one when a
// write completes. No thread sleeps per stream, nothing polls, and every stream sees every
// change: state is never shared between streams, so an abandoned stream cannot swallow an
// update meant for a live one. The unary methods are answered inline on the loop thread.
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
#include "edgeaccel/kubelet/completion_loop.h"
#include "edgeaccel/kubelet/plugin_options.h"

namespace edgeaccel {

// Counters a plugin keeps for logs, tests and metrics.
struct PluginCounters {
  std::atomic<uint64_t> allocations{0};
  std::atomic<uint64_t> allocate_errors{0};
  std::atomic<uint64_t> list_and_watch_updates{0};
  std::atomic<uint64_t> streams_opened{0};
};

class DevicePluginService final {
 public:
  // `on_stream_cancelled`, when set, runs (on the loop thread) whenever the kubelet ends a
  // ListAndWatch stream: it restarted, or it dropped our endpoint.
  DevicePluginService(DeviceSet* set, PluginCounters* counters, PluginOptions options,
                      std::function<void()> on_stream_cancelled = nullptr);
  ~DevicePluginService();

  // Starts answering every method of `service` (registered with a started server) on `loop`.
  void Serve(v1beta1::DevicePlugin::AsyncService* service, CompletionLoop* loop);

  // Finishes every open ListAndWatch stream with OK (shutdown, socket re-created).
  void EndStreams();
  // ListAndWatch streams open now.
  int OpenStreams() const;
  // Sends nothing more on any stream, open or new, while the streams stay open: another plugin
  // now feeds the kubelet's list for the resource, and ending our stream would make a kubelet
  // 1.25-1.36 disconnect that plugin (runClient disconnects the current client).
  void Silence() { silenced_.store(true); }
  // Sends every stream the current list again if what PluginOptions::advertise_now allows has
  // changed since its last message.
  void Readvertise();

  // The unary methods, as answered on the loop.
  grpc::Status GetDevicePluginOptions(const v1beta1::Empty& request,
                                      v1beta1::DevicePluginOptions* response);
  grpc::Status GetPreferredAllocation(const v1beta1::PreferredAllocationRequest& request,
                                      v1beta1::PreferredAllocationResponse* response);
  grpc::Status Allocate(const v1beta1::AllocateRequest& request,
                        v1beta1::AllocateResponse* response);
  grpc::Status PreStartContainer(const v1beta1::PreStartContainerRequest& request,
                                 v1beta1::PreStartContainerResponse* response);

  class Stream;  // one ListAndWatch call

 private:
  friend class Stream;
  // Waits for the next ListAndWatch call.
  void ArmStream();
  // A stream's call arrived: keep it (the map owns it from here) and start it.
  void Adopt(Stream* stream);
  void Forget(Stream* stream);

  DeviceSet* const set_;
  PluginCounters* const counters_;
  const PluginOptions options_;
  const std::function<void()> on_stream_cancelled_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Stream*, std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> silenced_{false};
  v1beta1::DevicePlugin::AsyncService* async_service_ = nullptr;
  CompletionLoop* loop_ = nullptr;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_
