// Another vendor's device plugin on the node, built the way the real ones are, not like ours:
// whatever a client does to its streams has the effect it has on the real plugin.
//
//  * kNvidiaLike, as NVIDIA's k8s-device-plugin (internal/plugin/server.go): ListAndWatch sends
//    the list, then loops on `case d := <-plugin.health:` over ONE unbuffered channel shared by
//    all its streams, without watching the stream's context. Each health event reaches whichever
//    stream takes it first; a send that fails (the stream was cancelled) loses the event. A
//    device marked Unhealthy never recovers.
//  * kIntelLike, as Intel's device plugins (pkg/deviceplugin/server.go): ListAndWatch ranges over
//    ONE update channel shared by all its streams (`for srv.devices = range srv.updatesCh`), not
//    watching the context either; when a send fails the whole gRPC server is stopped. The first
//    list goes on the same channel once the plugin is serving.
// Both serve on a socket in device-plugins/ and register through kubelet.sock.
#ifndef EDGEACCEL_TESTS_SUPPORT_NEIGHBOUR_PLUGIN_H_
#define EDGEACCEL_TESTS_SUPPORT_NEIGHBOUR_PLUGIN_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"

namespace edgeaccel::testing {

enum class NeighbourKind { kNvidiaLike, kIntelLike };

class NeighbourPlugin {
 public:
  NeighbourPlugin(NeighbourKind kind, const std::string& device_plugin_dir,
                  const std::string& socket_name, const std::string& resource,
                  const std::vector<std::string>& ids);
  ~NeighbourPlugin();
  NeighbourPlugin(const NeighbourPlugin&) = delete;
  NeighbourPlugin& operator=(const NeighbourPlugin&) = delete;

  // Serves and registers with the kubelet.sock in its directory.
  absl::Status Start();
  // Exits: its server stops and its socket goes.
  void Stop();

  // A health event: `id` turns Unhealthy. NVIDIA-like: handed over the shared unbuffered channel
  // (blocks until a stream takes it); Intel-like: the whole list put on the shared update
  // channel. False if no stream took it within `timeout`.
  bool MarkUnhealthy(const std::string& id, absl::Duration timeout = absl::Seconds(5));

  // Still serving (an Intel-like plugin stops when a send fails).
  bool serving();
  // Sends that failed on a stream (each a lost event, or for Intel-like the server stopped).
  int failed_sends() const { return failed_sends_.load(); }
  const std::string& socket() const { return socket_; }

 private:
  class Service;
  // An unbuffered Go channel: Send blocks until a receiver takes the item.
  class Channel {
   public:
    bool Send(std::vector<v1beta1::Device> item, absl::Duration timeout);
    // Blocks until an item or Close(); nullopt when closed.
    std::optional<std::vector<v1beta1::Device>> Receive();
    void Close();

   private:
    absl::Mutex mu_;
    std::optional<std::vector<v1beta1::Device>> slot_ ABSL_GUARDED_BY(mu_);
    uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
    uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
    bool closed_ ABSL_GUARDED_BY(mu_) = false;
  };

  std::vector<v1beta1::Device> List();
  void StopServerFromHandler();

  const NeighbourKind kind_;
  const std::string directory_;
  const std::string socket_name_;
  const std::string socket_;
  const std::string resource_;
  absl::Mutex mu_;
  std::vector<v1beta1::Device> devices_ ABSL_GUARDED_BY(mu_);
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  Channel channel_;
  std::atomic<int> failed_sends_{0};
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread first_list_;
  std::thread stopper_;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_NEIGHBOUR_PLUGIN_H_
