// The v1beta1 DevicePlugin service for one resource.
//
// The service runs on a CompletionLoop (gRPC's async API, one thread of ours; see
// completion_loop.h). ListAndWatch is a SnapshotStreams method (snapshot_stream.h): every stream
// has its own state and sees every change, from whichever thread delivered it, and its writes
// start on the loop thread. The unary methods are answered inline on the loop thread.
#ifndef EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_
#define EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/completion_loop.h"
#include "edgeaccel/kubelet/plugin_options.h"
#include "edgeaccel/kubelet/snapshot_stream.h"

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
  void EndStreams() { streams_.EndStreams(); }
  // ListAndWatch streams open now.
  int OpenStreams() const { return streams_.OpenStreams(); }
  // Waits, at most until `deadline`, until at most `most` streams are open (the others' ends
  // written).
  bool WaitForStreamsAtMost(int most, absl::Time deadline) const {
    return streams_.WaitForStreamsAtMost(most, deadline);
  }
  // Sends nothing more on any stream, open or new, while the streams stay open: another plugin
  // now feeds the kubelet's list for the resource, and ending our stream would make a kubelet
  // 1.25-1.36 disconnect that plugin (runClient disconnects the current client).
  void Silence() { silenced_.store(true); }
  // Sends every stream the current list again if what PluginOptions::advertise_now allows has
  // changed since its last message.
  void Readvertise() { streams_.Recheck(); }

  // The unary methods, as answered on the loop.
  grpc::Status GetDevicePluginOptions(const v1beta1::Empty& request,
                                      v1beta1::DevicePluginOptions* response);
  grpc::Status GetPreferredAllocation(const v1beta1::PreferredAllocationRequest& request,
                                      v1beta1::PreferredAllocationResponse* response);
  grpc::Status Allocate(const v1beta1::AllocateRequest& request,
                        v1beta1::AllocateResponse* response);
  grpc::Status PreStartContainer(const v1beta1::PreStartContainerRequest& request,
                                 v1beta1::PreStartContainerResponse* response);

 private:
  DeviceSet* const set_;
  PluginCounters* const counters_;
  const PluginOptions options_;
  std::atomic<bool> silenced_{false};
  SnapshotStreams<v1beta1::Empty, v1beta1::ListAndWatchResponse> streams_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_DEVICE_PLUGIN_SERVICE_H_
