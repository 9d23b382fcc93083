// TestKubelet: the kubelet's device manager, plugin watcher and pod-resources API, as far as a
// device plugin can tell, on real Unix sockets under a temporary kubelet root. Each behaviour is
// the real kubelet's, for the generation the profile names (docs/kubelet-behaviour.md gives the
// upstream file and function of each):
//  * Start() deletes the sockets in device-plugins/ (1.25+; 1.20-1.24 every file but the
//    checkpoint), reads the checkpoint: every resource in its RegisteredDevices is known with no
//    device until its plugin registers again, and the file is rewritten (with empty lists) on the
//    next device list or allocation. Then it serves v1beta1.Registration on
//    device-plugins/kubelet.sock and v1.PodResourcesLister on pod-resources/kubelet.sock, walks
//    plugins_registry/ and watches it.
//  * Register: checks version and resource name, dials the endpoint (blocking, 10 s), calls
//    GetDevicePluginOptions (1.25+; 1.20 takes the options from the request), answers, then opens
//    ONE ListAndWatch stream. A new registration of a name replaces the client; the replaced
//    one's stream stays open, and every stream's message rebuilds the device list (whichever
//    spoke last).
//  * A stream's end: v1.20 marks the devices unhealthy only if its endpoint is the current one;
//    v1.25-v1.36 disconnects the *current* client of the name, whichever stream ended
//    (runClient; kubernetes#121994); v1.37+ keys clients by socket path: only the stream's own
//    client is disconnected. Disconnected: every device unhealthy, the client gone.
//  * Plugin watcher and plugin manager: inotify on plugins_registry/ updates the desired state at
//    once (a created socket gets a new timestamp, a removed one leaves); a reconciler passes
//    every second (wait.Until), unregistering first every registered socket whose path left the
//    desired state or came back as a new socket, then registering every desired socket not
//    registered under its timestamp. One operation at a time per socket path (goroutinemap), a
//    failed one backed off 500 ms doubling: a path's old registration is always unregistered
//    before its new socket is asked GetInfo. Register: dial (10 s), GetInfo (1 s), validate,
//    connect the endpoint, NotifyRegistrationStatus (5 s). Unregister: DeRegisterPlugin, by
//    resource name up to 1.36: the endpoint that holds the name then is stopped, whatever its
//    socket (v1.37+: only the one registered from that socket).
//  * device-plugins/kubelet_internal_checkpoint is written as the kubelet writes it (a temporary
//    file renamed over it) after every device list (RegisteredDevices: the healthy ids) and every
//    allocation (PodDeviceEntries).
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
#include "edgeaccel/kubelet/registrar.h"
#include "pluginregistration_v1.grpc.pb.h"
#include "podresources_v1.grpc.pb.h"

namespace edgeaccel::testing {

// The kubelet's check of an extended resource name (v1helper.IsExtendedResourceName).
bool IsExtendedResourceName(const std::string& name);

// Kubelet generations whose device manager behaves differently (docs/kubelet-behaviour.md).
enum class KubeletProfile { kV1_20, kV1_25ToV1_36, kV1_37 };
std::string KubeletProfileName(KubeletProfile profile);
// The profile's name as a GoogleTest parameter name ("v1.20" -> "v120"): letters and digits only.
std::string KubeletProfileTestName(KubeletProfile profile);
inline constexpr KubeletProfile kAllKubeletProfiles[] = {
    KubeletProfile::kV1_20, KubeletProfile::kV1_25ToV1_36, KubeletProfile::kV1_37};

class TestKubelet {
 public:
  explicit TestKubelet(std::string root, KubeletProfile profile = KubeletProfile::kV1_25ToV1_36);
  KubeletProfile profile() const { return profile_; }
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
  // A pod admitted as the kubelet admits it (devicesToAllocate, then Allocate): refused with the
  // kubelet's UnexpectedAdmissionError when the resource is not registered, has no healthy
  // device, or too few free ones. Returns the pod uid.
  absl::StatusOr<std::string> Admit(const std::string& resource, int count);
  // Serve the pod-resources API (on by default; off: the socket is not there, as when it is not
  // mounted or the kubelet predates it).
  void ServePodResources(bool serve);
  // A pod admitted: Allocate, and the answer cached (and checkpointed) under a new pod uid
  // ("pod-N"), which this returns. DeletePod drops the pod and its cached answer.
  absl::StatusOr<std::string> AdmitPod(const std::string& resource,
                                       const std::vector<std::string>& ids);
  void DeletePod(const std::string& pod_uid);
  // A pod whose one container uses a ResourceClaim a DRA driver prepared, as 1.36's pod-resources
  // List shows it (pkg/kubelet/apis/podresources/server_v1.go: each container's DynamicResources,
  // from the DRA manager's claim cache: claim name and namespace, and per device its driver,
  // pool and device name).
  void AddDraPod(const std::string& namespace_name, const std::string& pod, const std::string& claim,
                 const std::string& driver, const std::string& pool, const std::string& device);
  // The pod's container status allocatedResourcesStatus (ResourceHealthStatus, beta and on in
  // 1.36) for its device-plugin devices, "<id>=<Healthy|Unhealthy>" in the order allocated, as
  // kubelet 1.36.2's device manager computes it (pkg/kubelet/cm/devicemanager/manager.go
  // UpdateAllocatedResourcesStatus): each allocated id takes the health its plugin last listed
  // for it (allDevices, rebuilt from every ListAndWatch message, and not touched when the plugin
  // disconnects: markResourceUnhealthy changes only the healthy/unhealthy sets admission uses);
  // an id the plugin no longer lists is Healthy; anything but "Healthy" is Unhealthy. Empty for
  // an unknown pod.
  std::vector<std::string> AllocatedResourcesStatus(const std::string& pod_uid);
  // (Re)starts the pod's container as the kubelet does: with the cached answer, PreStartContainer
  // when the plugin's options ask for it, and the runtime's check of every device node (under
  // the host root, see SetHostRoot). The error is what the pod's events would show.
  absl::Status StartContainer(const std::string& pod_uid);
  // Starts the container of a pod that DRA gave `resource` to (an extended resource backed by a
  // DeviceClass, KEP-5004) as kubelet 1.36.2's device manager lets it
  // (pkg/kubelet/cm/devicemanager/manager.go: GetDeviceRunContainerOptions does not skip DRA
  // resources; isDevicePluginResource is true while the name is a key of healthyDevices, and
  // callPreStartContainerIfNeeded then fails a container with no device-plugin devices when the
  // endpoint's options say PreStartRequired: "no devices found allocated in local cache for pod
  // ..."). The kubelet keeps a gone plugin's endpoint, with its options, for
  // endpointStopGracePeriod (5 min); the double keeps it while it runs. Kubelets with
  // kubernetes#141426 skip DRA resources there; a resource never registered is not the device
  // manager's.
  absl::Status StartDraExtendedResourceContainer(const std::string& resource);
  // Where the runtime finds host paths (a fixture host's root); "/" by default.
  void SetHostRoot(const std::string& root);
  // The plugin manager's reconciler loop period (loopSleepDuration, 1 s), and its passes so far
  // (a test that waits for one knows the next is a whole period away).
  void SetReconcilePeriod(absl::Duration period);
  uint64_t ReconcilerPasses();
  // Times the kubelet lost the endpoint that held the resource and marked every device of it
  // Unhealthy ("Mark all resources Unhealthy"): a stream's end, a deregistration by name.
  int Disconnections(const std::string& resource);
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
    std::string socket;
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
    int disconnections = 0;
    std::string via;
    absl::Time last_register_received;
    uint64_t generation = 0;  // of the endpoint that owns the state now
    // The device manager's allDevices: id -> health as the last ListAndWatch message listed it.
    std::map<std::string, std::string> listed_health;
  };

  class PodResourcesService;
  grpc::Status HandleRegister(const v1beta1::RegisterRequest& request);
  // The device manager's answer to one stream's end, for this profile.
  void StreamEndedLocked(Endpoint* endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DisconnectLocked(const std::string& resource) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pod-resources answers.
  void AllocatableLocked(v1::AllocatableResourcesResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ListLocked(v1::ListPodResourcesResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Dials `socket`, calls GetDevicePluginOptions, and opens ListAndWatch in the background.
  absl::Status Connect(const std::string& resource, const std::string& socket,
                       const std::string& via,
                       const v1beta1::DevicePluginOptions* request_options = nullptr);
  void ReadStream(Endpoint* endpoint);
  // The plugin watcher (inotify into the desired state) and the reconciler, on one thread.
  void WatchPluginsRegistry(int fd);  // on the inotify `fd` Start() made and walked
  void ReconcileLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `operation` on a thread of its own unless one is pending on `socket` or its backoff
  // has not run out (false then).
  bool StartOperationLocked(const std::string& socket, std::function<absl::Status()> operation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The register operation for the socket created as `incarnation`.
  absl::Status RegisterFromWatcher(const std::string& socket, uint64_t incarnation);
  ListAndWatchHook list_and_watch_hook_ ABSL_GUARDED_BY(mu_);
  void Note(const std::string& entry);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }
  void WriteCheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DeRegisterPlugin(resource, endpoint): disconnects the client that holds the name now
  // (v1.37+: only if it is the one on `endpoint`).
  void Deregister(const std::string& resource, const std::string& endpoint);
  std::unique_ptr<v1beta1::DevicePlugin::Stub> StubFor(const std::string& resource);

  const std::string root_;
  const KubeletProfile profile_;
  std::unique_ptr<RegistrationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PodResourcesService> pod_resources_service_;
  std::unique_ptr<grpc::Server> pod_resources_server_;
  bool serve_pod_resources_ = true;
  struct DraPod {
    std::string namespace_name, pod, claim, driver, pool, device;
  };
  std::vector<DraPod> dra_pods_ ABSL_GUARDED_BY(mu_);
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
  // v1.20's Register answers at once and connects in the background (go m.addEndpoint).
  std::vector<std::thread> connecting_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> call_log_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CachedContainer> containers_ ABSL_GUARDED_BY(mu_);  // by pod uid
  int next_pod_ ABSL_GUARDED_BY(mu_) = 1;
  std::string host_root_ ABSL_GUARDED_BY(mu_) = "/";
  // The plugin manager: desired state (socket path -> the timestamp it was created with, here a
  // counter), actual state (what each path registered), the operation per path.
  struct RegisteredSocket {
    uint64_t incarnation = 0;
    std::string name;  // "" for a plugin type other than DevicePlugin
    std::string endpoint;
  };
  struct PathOperation {
    bool pending = false;
    absl::Duration backoff;
    absl::Time retry_after = absl::InfinitePast();
  };
  std::map<std::string, uint64_t> desired_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, RegisteredSocket> actual_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, PathOperation> operations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> operation_threads_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t reconciler_passes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration reconcile_period_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
};

// Options for a ResourceRegistrar that reaches `kubelet` (its root and device-plugins/),
// registering `mode`, with retries no more than 400 ms apart.
ResourceRegistrar::Options RegistrarOptionsFor(const TestKubelet& kubelet, RegistrationMode mode);

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_TEST_KUBELET_H_
