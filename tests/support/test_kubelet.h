// TestKubelet: the kubelet's device manager and plugin watcher, as far as a device plugin can
// tell, on real Unix sockets under a temporary kubelet root.
//
// It behaves like the real kubelet (../shared/kubelet-protocol.md):
//  * Start() deletes every file in device-plugins/ except kubelet_internal_checkpoint, then
//    serves v1beta1.Registration on device-plugins/kubelet.sock, and walks plugins_registry/ and
//    watches it with inotify.
//  * Register: checks version and resource name, dials the plugin's endpoint (a file name in
//    device-plugins/), calls GetDevicePluginOptions, answers, then opens ONE ListAndWatch stream.
//    A new registration of the same resource replaces the old endpoint.
//  * Plugin watcher: dials a new socket, GetInfo (1 s), validates, connects the endpoint (empty:
//    the same socket), NotifyRegistrationStatus (5 s), then GetDevicePluginOptions and
//    ListAndWatch. A failed validation is reported with NotifyRegistrationStatus(false) and
//    retried with backoff.
//  * When a ListAndWatch stream ends, every device of that resource turns unhealthy and the
//    stream is not reopened.
//  * A socket removed from plugins_registry/ is deregistered late (the reconciler's pass, about
//    0.6 s on a real node), by the resource name it registered: DeRegisterPlugin stops whatever
//    endpoint holds that name then, even one registered since through kubelet.sock.
//  * device-plugins/kubelet_internal_checkpoint is written as the kubelet writes it: after
//    every ListAndWatch update (RegisteredDevices: the healthy ids) and every Allocate
//    (PodDeviceEntries: ids per NUMA node, the answer as base64 protobuf).
//  * A container restart replays the cached Allocate answer (no new Allocate): PreStartContainer
//    first when the plugin's options ask for it, then what the runtime does with the answer:
//    every DeviceSpec host path must be a device node, or the container fails to start.
//  * Stop() is the process dying: connections drop, files stay on disk.
#ifndef EDGEACCEL_TESTS_SUPPORT_TEST_KUBELET_H_
#define EDGEACCEL_TESTS_SUPPORT_TEST_KUBELET_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel::testing {

// The kubelet's check of an extended resource name (v1helper.IsExtendedResourceName).
bool IsExtendedResourceName(const std::string& name);

class TestKubelet {
 public:
  explicit TestKubelet(std::string root);
  ~TestKubelet();
  TestKubelet(const TestKubelet&) = delete;
  TestKubelet& operator=(const TestKubelet&) = delete;

  const std::string& root() const { return root_; }
  std::string DevicePluginsDir() const;
  std::string PluginsRegistryDir() const;

  void Start();
  void Stop();
  void Restart() {
    Stop();
    Start();
  }

  // Node status as the real kubelet computes it: capacity = devices advertised, allocatable =
  // the healthy ones. -1 when the resource never registered.
  int Capacity(const std::string& resource);
  int Allocatable(const std::string& resource);
  std::vector<v1beta1::Device> Devices(const std::string& resource);
  // Successful registrations of this resource since construction (both ways).
  int Registrations(const std::string& resource);
  // How the resource last registered: "kubelet" or "plugin-watcher" ("" if never).
  std::string RegisteredVia(const std::string& resource);
  // ListAndWatch messages received for the resource since construction.
  int Updates(const std::string& resource);
  // Runs `hook` on the stream's thread as each ListAndWatch message arrives, before the kubelet
  // acts on it, with the device ids it names: for checks of what held at that moment.
  using ListAndWatchHook =
      std::function<void(const std::string& resource, const std::vector<std::string>& ids)>;
  void OnListAndWatch(ListAndWatchHook hook);
  bool StreamOpen(const std::string& resource);
  // The kubelet has a live endpoint for the resource (Allocate can reach the plugin).
  bool HasEndpoint(const std::string& resource);
  // When the last Register call for the resource arrived, and when kubelet.sock was last
  // created (for measuring re-registration after a restart).
  absl::Time LastRegisterReceived(const std::string& resource);
  absl::Time KubeletSocketCreated();
  // Every call the kubelet made or answered, in order: "Register coral.ai/edgetpu",
  // "GetDevicePluginOptions coral.ai/edgetpu", "ListAndWatch coral.ai/edgetpu", ...
  std::vector<std::string> CallLog();
  std::vector<std::string> Errors();

  // Calls `condition` whenever the kubelet's state changes, until it is true or `timeout`.
  bool WaitFor(const std::function<bool()>& condition,
               absl::Duration timeout = absl::Seconds(10));

  // One Allocate call, as the kubelet makes when it admits a pod.
  absl::StatusOr<v1beta1::AllocateResponse> Allocate(const std::string& resource,
                                                     const std::vector<std::string>& ids);
  // A pod admitted: Allocate, and the answer cached (and checkpointed) under a new pod uid
  // ("pod-N"), which this returns. DeletePod drops the pod and its cached answer.
  absl::StatusOr<std::string> AdmitPod(const std::string& resource,
                                       const std::vector<std::string>& ids);
  void DeletePod(const std::string& pod_uid);
  // (Re)starts the pod's container as the kubelet does: with the cached answer, PreStartContainer
  // when the plugin's options ask for it, and the runtime's check of every device node (under
  // the host root, see SetHostRoot). The error is what the pod's events would show.
  absl::Status StartContainer(const std::string& pod_uid);
  // Where the runtime finds host paths (a fixture host's root); "/" by default.
  void SetHostRoot(const std::string& root);
  // How late a plugins_registry/ socket's removal deregisters its resource (default 600 ms).
  void SetDeregistrationDelay(absl::Duration delay);
  absl::StatusOr<std::vector<std::string>> GetPreferredAllocation(
      const std::string& resource, const std::vector<std::string>& available,
      const std::vector<std::string>& must_include, int size);
  absl::Status PreStartContainer(const std::string& resource, const std::vector<std::string>& ids);

  // When set, registrations are refused with this error instead of accepted (to test refusals):
  // Register answers it; the plugin watcher sends NotifyRegistrationStatus(false, error).
  void RefuseRegistrations(const std::string& error);

 private:
  class RegistrationService;
  struct Endpoint {
    std::string resource;
    std::string via;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    std::unique_ptr<grpc::ClientContext> stream_context;
    std::thread reader;
    uint64_t generation = 0;
  };
  struct CachedContainer {
    std::string resource;
    std::vector<std::string> ids;
    v1beta1::ContainerAllocateResponse response;
  };
  struct ResourceState {
    v1beta1::DevicePluginOptions options;
    std::vector<v1beta1::Device> devices;
    bool ever_registered = false;
    bool stream_open = false;
    int registrations = 0;
    int updates = 0;
    std::string via;
    absl::Time last_register_received;
    uint64_t generation = 0;  // of the endpoint that owns the state now
  };

  grpc::Status HandleRegister(const v1beta1::RegisterRequest& request);
  // Dials `socket`, calls GetDevicePluginOptions, and opens ListAndWatch in the background.
  absl::Status Connect(const std::string& resource, const std::string& socket,
                       const std::string& via);
  void ReadStream(Endpoint* endpoint);
  void WatchPluginsRegistry();
  // The resource it registered.
  absl::StatusOr<std::string> RegisterFromWatcher(const std::string& socket);
  ListAndWatchHook list_and_watch_hook_ ABSL_GUARDED_BY(mu_);
  void Note(const std::string& entry);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }
  void WriteCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DeRegisterPlugin(resource): stops the endpoint that holds the name now.
  void Deregister(const std::string& resource);
  std::unique_ptr<v1beta1::DevicePlugin::Stub> StubFor(const std::string& resource);

  const std::string root_;
  std::unique_ptr<RegistrationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread watcher_;
  int watcher_stop_fd_ = -1;

  absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time socket_created_ ABSL_GUARDED_BY(mu_);
  std::string refuse_with_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ResourceState> resources_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Endpoint>> retired_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> call_log_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CachedContainer> containers_ ABSL_GUARDED_BY(mu_);  // by pod uid
  int next_pod_ ABSL_GUARDED_BY(mu_) = 1;
  std::string host_root_ ABSL_GUARDED_BY(mu_) = "/";
  absl::Duration deregistration_delay_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(600);
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_TEST_KUBELET_H_
