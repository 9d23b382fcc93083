// DraKubelet: the kubelet's DRA side as a DRA driver's kubelet plugin meets it (plugin watcher,
// DRAPlugin client, health stream), on real Unix sockets and real inotify under a temporary
// kubelet root. It models one of two kubelet generations (DraKubeletGeneration), each behaviour
// as the upstream file named says (kubernetes/kubernetes; /work/shared/dra-facts.md §1-§3 has
// the facts and the branches):
//
//  Plugin watcher (pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go):
//  * Start() makes <root>/plugins_registry/ if missing (MkdirAll), watches it and its
//    subdirectories with inotify (create and moved-to = Create, delete = Remove; a rename away is
//    not a Remove, as in fsnotify) and walks it once: the "initial scan". A name starting with
//    '.' and anything that is not a socket is ignored. A socket found is put in the desired
//    state with the time it was seen; a socket removed leaves it.
//  Reconciler (pluginmanager/reconciler/reconciler.go, pluginmanager.go: loop 1 s): every pass
//    first unregisters the plugins whose socket left the desired state or was re-created (a new
//    timestamp), then registers every socket of the desired state that is not registered with
//    its timestamp. One operation per socket at a time (goroutinemap); an operation that fails
//    is not started again for that socket before a backoff of 500 ms, doubling to 2 min 2 s
//    (goroutinemap exponentialbackoff), reset by a success. So a refused plugin is retried, but
//    never in a busy loop; a socket re-created is registered again (after any backoff).
//  Registration (pluginmanager/operationexecutor/operation_generator.go): dial with a 10 s
//    timeout, GetInfo with a 1 s deadline; a type with no handler is refused with
//    NotifyRegistrationStatus(false, "RegisterPlugin error -- no handler registered for plugin
//    type: T at socket S"); endpoint "" means the registration socket itself; ValidatePlugin
//    (the service choice below) refused: NotifyRegistrationStatus(false, "RegisterPlugin error --
//    plugin validation failed with err: ..."). Past validation the plugin is in the actual state
//    (so later failures are NOT retried until the socket is re-created); RegisterPlugin refused
//    (an endpoint already registered by another instance of the driver):
//    NotifyRegistrationStatus(false, "RegisterPlugin error -- plugin registration failed with
//    err: ..."); else NotifyRegistrationStatus(true) with a 5 s deadline. The driver name is not
//    checked at registration (an empty one registers and is unusable: GetPlugin refuses it).
//  Service choice (ValidatePlugin and RegisterPlugin):
//  * v1.36 (1.34-1.36; pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go validateSupportedServices,
//    servicesSupportedByKubelet = [v1.DRAPlugin, v1beta1.DRAPlugin] in dra_plugin.go): the first
//    entry of the plugin's list that the kubelet supports, in the plugin's order; an empty list
//    or no match is refused.
//  * v1.33 (1.32-1.33; pkg/kubelet/cm/dra/plugin/registration.go validateSupportedServices): in
//    the kubelet's order [v1beta1.DRAPlugin, v1alpha3.NodeService]; an empty list is refused; a
//    list with neither falls back to v1alpha3.NodeService ("plugins at that time didn't advertise
//    gRPC services"): registered, and its calls go to /v1alpha3.Node/..., which a plugin without
//    that service answers Unimplemented.
//  Plugin store (dra_plugin_manager.go add/remove/get; 1.33 plugins_store.go): several instances
//    per driver, in registration order; an endpoint already registered for the driver is
//    refused ("endpoint E already registered for DRA driver plugin D"; 1.33: "... for plugin
//    D"); deregistration (socket removed) removes the instance with the driver name and
//    endpoint the socket registered, closes its connection and cancels its health stream. Calls
//    go to the newest instance, on v1.36 the newest whose connection is up if any (connection
//    state watched, reconnecting when it drops, as the kubelet's stats handler does).
//  Calls (pkg/kubelet/cm/dra/manager.go prepareResources/unprepareResources, dra_plugin.go
//    defaultClientCallTimeout): NodePrepareResources / NodeUnprepareResources on the chosen
//    service with a 45 s deadline. The kubelet fails the whole call, in its words ("prepare
//    dynamic resources: ..."), on a gRPC error ("NodePrepareResources: rpc error: code = C desc
//    = D"), an answer for a UID it did not ask about ("... returned result for unknown claim UID
//    U"), an answer with an error ("... failed for ResourceClaim NAME: ERR") and a claim without
//    an answer ("... skipped N ResourceClaims"); a driver with no instance: "DRA driver D is not
//    registered".
//  Health (v1.36 with gate ResourceHealthStatus on, the default here; dra_plugin_manager.go add,
//    manager.go HandleWatchResourcesStream): after registration, on the instance's connection,
//    /v1alpha1.DRAResourceHealth/NodeWatchResources is opened whether or not the plugin
//    advertised the service (1.34-1.36, kubernetes#141855), and opened again 5 s after it ends
//    for any reason (wait.UntilWithContext), Unimplemented included. Each message replaces the
//    driver's device list; the list is cleared when the stream ends (clearDriver). v1.33 never
//    opens it (no such API before 1.34).
//  * Stop() is the process dying: every connection drops, in-memory state is gone (what tests
//    observe - registrations(), refusals(), events() - is kept). Start() again is a kubelet
//    restart: the initial scan registers every socket still there.
// Left out: the connection monitor of pluginwatcher/monitor.go (on master; no release
// confirmed, dra-facts §10.2), ResourceSlice wiping (no API server here), the kubelet's claim
// cache and checkpoint (tests call Prepare again as a kubelet that lost it would), 1.32's
// deregistration by name alone. The health timeout that turns a silent device Unknown is
// HealthAt's (what the pod's allocatedResourcesStatus shows at a given time).
#ifndef EDGEACCEL_TESTS_SUPPORT_DRA_KUBELET_H_
#define EDGEACCEL_TESTS_SUPPORT_DRA_KUBELET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace edgeaccel::testing {

enum class DraKubeletGeneration {
  kV1_33,  // 1.32-1.33: v1beta1.DRAPlugin (fallback v1alpha3.NodeService), no health stream
  kV1_36,  // 1.34-1.36: v1.DRAPlugin or v1beta1.DRAPlugin, health stream for every plugin
};
// "1.33" / "1.36".
std::string DraKubeletGenerationName(DraKubeletGeneration generation);
// For GoogleTest's names of parameterized tests.
inline void PrintTo(DraKubeletGeneration generation, std::ostream* os) {
  *os << DraKubeletGenerationName(generation);
}
// Parses "1.33" (or "1.32") / "1.36" (or "1.34", "1.35").
std::optional<DraKubeletGeneration> ParseDraKubeletGeneration(const std::string& text);

struct DraKubeletOptions {
  DraKubeletGeneration generation = DraKubeletGeneration::kV1_36;
  // Feature gate ResourceHealthStatus (beta, on in 1.36; alpha, off before). Only v1.36 streams.
  bool resource_health_status = true;
  // The reconciler's loop period (pluginmanager.go loopSleepDuration).
  absl::Duration reconcile_period = absl::Seconds(1);
  // The pause before a health stream is opened again (wait.UntilWithContext period).
  absl::Duration health_retry_interval = absl::Seconds(5);
  // NodePrepareResources / NodeUnprepareResources deadline (defaultClientCallTimeout).
  absl::Duration call_timeout = absl::Seconds(45);
  // Plugin types the real kubelet has other handlers for: the double neither registers nor
  // refuses them (a TestKubelet on the same root may be handling device plugins).
  std::set<std::string> other_handler_types = {"CSIPlugin", "DevicePlugin"};
};

class DraKubelet {
 public:
  // The kubelet's drapb.Claim.
  struct Claim {
    std::string namespace_;
    std::string name;
    std::string uid;
  };
  struct PreparedDevice {
    std::vector<std::string> request_names;
    std::string pool;
    std::string device;
    std::vector<std::string> cdi_device_ids;
    std::optional<std::string> share_id;  // v1 only
  };
  struct ClaimResult {
    std::vector<PreparedDevice> devices;
    std::string error;
  };
  struct PrepareAnswer {
    std::string service;   // the service called, "v1.DRAPlugin"
    std::string endpoint;  // the instance called
    std::map<std::string, ClaimResult> claims;  // by claim UID, as the plugin answered
  };
  struct UnprepareAnswer {
    std::string service;
    std::string endpoint;
    std::map<std::string, std::string> claims;  // claim UID -> error ("" = done)
  };
  struct Registration {
    std::string driver;
    std::string service;   // chosen: "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha3.NodeService"
    std::string endpoint;  // what the kubelet dials
    std::string socket;    // the registration socket
    std::vector<std::string> supported_versions;  // as advertised
    absl::Time at;
  };
  // One device of the driver's latest NodeWatchResources message (state.DeviceHealth).
  struct HealthEntry {
    std::string pool;
    std::string device;
    std::string health;  // "Healthy", "Unhealthy", "Unknown"
    int64_t last_updated = 0;  // Unix seconds
    int64_t health_check_timeout_seconds = 0;
    std::string message;
  };

  explicit DraKubelet(std::string root, DraKubeletOptions options = {});
  ~DraKubelet();
  DraKubelet(const DraKubelet&) = delete;
  DraKubelet& operator=(const DraKubelet&) = delete;

  const std::string& root() const { return root_; }
  const DraKubeletOptions& options() const { return options_; }
  std::string PluginsRegistryDir() const { return root_ + "/plugins_registry"; }

  void Start();
  void Stop();
  void Restart() {
    Stop();
    Start();
  }

  // --- registration ---
  // The instance calls go to now, once there is one; DeadlineExceeded after `timeout`.
  absl::StatusOr<Registration> WaitForRegistration(const std::string& driver,
                                                   absl::Duration timeout = absl::Seconds(10));
  // Every successful registration of the driver since construction, in order.
  std::vector<Registration> registrations(const std::string& driver);
  // The drivers with an instance registered now.
  std::vector<std::string> Drivers();
  // The driver's instances registered now, oldest first.
  std::vector<Registration> Registered(const std::string& driver);
  // The driver registered at some point and has no instance now (its sockets were removed).
  bool Deregistered(const std::string& driver);
  int deregistrations(const std::string& driver);
  // The error of every NotifyRegistrationStatus(false, error) sent, in order.
  std::vector<std::string> refusals();
  // Every failed registration operation's error (also those the plugin is not told of: dial,
  // GetInfo), in order.
  std::vector<std::string> registration_errors();
  // GetInfo calls made to the registration socket at `socket`.
  int get_info_calls(const std::string& socket);

  // --- calls ---
  // NodePrepareResources as the kubelet makes it for one pod's claims of one driver, with the
  // kubelet's checks of the answer: fails where the kubelet's PrepareResources fails, in its words.
  absl::StatusOr<PrepareAnswer> Prepare(const std::string& driver,
                                        const std::vector<Claim>& claims);
  // The same call without the checks of the answer (fails only on no instance or a gRPC error):
  // what the plugin said.
  absl::StatusOr<PrepareAnswer> CallNodePrepareResources(const std::string& driver,
                                                         const std::vector<Claim>& claims);
  // The kubelet's checks of an answer alone (what Prepare / Unprepare add to the call).
  static absl::Status CheckPrepareAnswer(const std::vector<Claim>& claims,
                                         const PrepareAnswer& answer);
  static absl::Status CheckUnprepareAnswer(const std::vector<Claim>& claims,
                                           const UnprepareAnswer& answer);
  absl::StatusOr<UnprepareAnswer> Unprepare(const std::string& driver,
                                            const std::vector<Claim>& claims);
  absl::StatusOr<UnprepareAnswer> CallNodeUnprepareResources(const std::string& driver,
                                                             const std::vector<Claim>& claims);

  // --- health (v1.36) ---
  // The driver's latest complete device list (empty: none, or the stream ended).
  std::vector<HealthEntry> Health(const std::string& driver);
  bool WaitForHealth(const std::string& driver,
                     const std::function<bool(const std::vector<HealthEntry>&)>& predicate,
                     absl::Duration timeout = absl::Seconds(10));
  // What the 1.36 kubelet puts in a pod's allocatedResourcesStatus for one device of a prepared
  // claim at time `now` (healthinfo.go getHealthInfo, manager.go buildDeviceHealth and
  // buildResourceHealth): the device's last reported health and message, or "Unknown" and no
  // message once `now` is more than its health_check_timeout_seconds (30 s, DefaultHealthTimeout,
  // where it is 0 or negative) past its last_updated_time, or when it was never reported.
  HealthEntry HealthAt(const std::string& driver, const std::string& pool, const std::string& device,
                       absl::Time now);
  // NodeWatchResources streams opened for the driver, and those that ended with an error other
  // than the kubelet's own cancellation (Unimplemented, Unavailable, ...).
  int health_streams_opened(const std::string& driver);
  int health_stream_errors(const std::string& driver);
  // The status of the driver's last stream that ended ("" if none): "Unimplemented: ...".
  std::string last_health_stream_error(const std::string& driver);

  // --- everything ---
  // One line per thing the kubelet did: "GetInfo <socket>", "registered <driver> <service>
  // <endpoint>", "refused <socket>: <error>", "registration failed <socket>: <error>",
  // "deregistered <driver> <endpoint>", "health <driver>: <pool>/<device>=<health> ...",
  // "health stream <driver> ended: <status>", "NodePrepareResources <driver> ...".
  std::vector<std::string> events();
  // Called (on the kubelet's threads, outside its lock) with each event line as it happens.
  void OnEvent(std::function<void(const std::string&)> callback);
  // Calls `condition` whenever the double's state changes, until it is true or `timeout`.
  bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(10));

 private:
  // One call of `method` (NodePrepareResources or NodeUnprepareResources) with `claims`, on the
  // service the driver registered: what it answered, or why nothing (`what` starts the error, as
  // the kubelet's does).
  template <typename Answer, typename V1Request, typename V1Response, typename V1beta1Request,
            typename V1beta1Response>
  absl::StatusOr<Answer> CallWithClaims(absl::string_view method, absl::string_view what,
                                        const std::string& driver, const std::vector<Claim>& claims);
  struct Instance;     // one registered plugin instance (DRAPlugin + its connection)
  struct Operation;    // goroutinemap entry, per socket
  struct AswEntry {    // actual state of world, per socket
    absl::Time timestamp;
    std::string type;
    std::string name;
    std::string endpoint;
    bool dra = false;  // handled by the DRA handler (else by an "other" handler)
  };

  // The watcher's event loop and the reconciler, on inotify `fd` with its `watches` (Start made
  // both).
  void WatchLoop(int fd, std::map<int, std::string> watches);
  void AddWatchTree(int fd, const std::string& dir, std::map<int, std::string>* watches);
  void HandleCreate(int fd, const std::string& path, std::map<int, std::string>* watches);
  void Reconcile();
  // Starts `body` as the operation of `socket` unless one runs or its backoff forbids it.
  void RunOperation(const std::string& socket, std::function<absl::Status()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RegisterOperation(const std::string& socket, absl::Time timestamp);
  absl::Status UnregisterOperation(const std::string& socket);
  // The DRA handler.
  absl::StatusOr<std::string> ValidateSupportedServices(const std::vector<std::string>& services);
  absl::Status ValidatePlugin(const std::string& name, const std::string& endpoint,
                              const std::vector<std::string>& services);
  absl::Status RegisterPlugin(const std::string& name, const std::string& endpoint,
                              const std::vector<std::string>& services, const std::string& socket);
  void DeRegisterPlugin(const std::string& name, const std::string& endpoint);
  void WatchConnection(Instance* instance);
  void HealthLoop(Instance* instance);
  std::shared_ptr<Instance> PluginFor(const std::string& driver, std::string* error);
  void RetireLocked(std::shared_ptr<Instance> instance) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void Event(const std::string& line);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++version_; }

  const std::string root_;
  const DraKubeletOptions options_;

  std::thread watcher_;
  int stop_fd_ = -1;

  absl::Mutex mu_;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, absl::Time> desired_ ABSL_GUARDED_BY(mu_);  // socket -> seen at
  std::map<std::string, AswEntry> actual_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Operation>> operations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::shared_ptr<Instance>>> store_ ABSL_GUARDED_BY(mu_);
  // Instances deregistered whose threads are still to be joined.
  std::vector<std::shared_ptr<Instance>> retired_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<HealthEntry>> health_ ABSL_GUARDED_BY(mu_);

  // What tests observe; kept across Stop/Start.
  std::map<std::string, std::vector<Registration>> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> deregistrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> refusals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> registration_errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> get_info_calls_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> health_streams_opened_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> health_stream_errors_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> last_health_stream_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_event_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_DRA_KUBELET_H_
