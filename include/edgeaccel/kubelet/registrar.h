// ResourceRegistrar: puts a resource's socket in place and makes the kubelet use it, and keeps
// it that way across kubelet restarts.
//
// Two ways, one binary (--registration):
//  * kubelet: serve DevicePlugin on <device-plugin-dir>/<ours>.sock and call Register on
//    <device-plugin-dir>/kubelet.sock. The directory is the kubelet's fixed
//    /var/lib/kubelet/device-plugins, whatever its --root-dir (--device-plugin-dir). A restarting kubelet deletes our socket and re-creates
//    kubelet.sock; inotify tells us both, and we serve again and register within milliseconds.
//  * plugin-watcher: serve the pluginregistration Registration service and DevicePlugin on one
//    socket in <kubelet-root>/plugins_registry/. The kubelet finds it (at start and by inotify),
//    calls GetInfo and NotifyRegistrationStatus, and re-finds it after its own restarts.
//  * auto: kubelet when device-plugins/ exists (every kubelet since 1.10, k3s and microk8s
//    included), else plugin-watcher when only plugins_registry/ exists; with neither, wait.
//
// Beside other plugins (neighbour_arbiter.h): a resource another plugin serves, or served
// before a kubelet restart and has not re-registered yet, is left to it unless
// Options::take_over; if another plugin registers a resource we serve, we step back: our stream
// stays open but silent (ending it would make a kubelet 1.25-1.36 disconnect that plugin). Who
// serves what is learnt from the kubelet (pod-resources API, checkpoint) and unary GetInfo calls,
// never from another plugin's streams (neighbours.h). An earlier edgeaccel still serving the
// resource (a rollout with maxSurge) is waited for, and replaced the moment its socket goes (or,
// for kubelet.sock after one on the plugin watcher, once the watcher has let go of it).
//
// What to do on each event is decided by a RegistrationMachine (registration_machine.h), which
// this class steps on a PollLoop's thread (host/poll_loop.h: the daemon's one, shared by every
// resource) and serves as the machine's ports: inotify on the two kubelet directories,
// eventfds for a finished Register call (register_call.h), a stream's end and the watcher
// probe's question, and the loop's wait until the machine's wake time.
//
// From the plugin watcher to kubelet.sock (a restart with another --registration, auto mode
// seeing device-plugins/ appear, a rollout): the watcher's deregistration of the old socket,
// by name up to kubelet 1.36, comes up to a second late and would drop a newer registration, so
// the machine waits for the watcher to let go of the path first (registration_machine.h).
// Towards the plugin watcher after an earlier edgeaccel, the machine also registers through
// kubelet.sock for the handover, naming a second link to our plugins_registry/ server in
// device-plugins/ (PluginServer::LinkAlso): the watcher would register us only on its next pass.
//
// A lost endpoint: the kubelet can stop our endpoint without restarting (a plugin-watcher
// deregistration of another plugin's socket for the same resource arrives late and stops
// whatever endpoint holds the name; on 1.25-1.36 the end of a replaced plugin's stream
// disconnects the client that replaced it). Our ListAndWatch stream then
// ends while kubelet.sock is unchanged. That is noticed, logged, reported by registered() and
// endpoint_lost(), and we register again with backoff, or leave the resource to the plugin that
// took it.
#ifndef EDGEACCEL_KUBELET_REGISTRAR_H_
#define EDGEACCEL_KUBELET_REGISTRAR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/directory_watcher.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/neighbour_arbiter.h"
#include "edgeaccel/kubelet/neighbours.h"
#include "edgeaccel/kubelet/plugin_options.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "edgeaccel/kubelet/register_call.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/kubelet/registration_machine.h"
#include "edgeaccel/kubelet/registration_record.h"

namespace edgeaccel {

class ResourceRegistrar : private RegistrationPorts, private PollLoop::Member {
 public:
  struct Options {
    // The thread the registration runs on, shared with the daemon's other resources and NVML's
    // supervisor; null: a loop of this registrar's own ("ea-register"). Must outlive the
    // registrar.
    PollLoop* loop = nullptr;
    // As this process sees them: plugins_registry/ is under kubelet_root; device-plugins/ is
    // the kubelet's fixed directory.
    std::string kubelet_root = std::string(kDefaultKubeletRoot);
    std::string device_plugin_dir = std::string(kDefaultDevicePluginDir);
    RegistrationMode mode = RegistrationMode::kAuto;
    absl::Duration register_timeout = absl::Seconds(10);
    absl::Duration max_backoff = absl::Seconds(30);
    PluginOptions plugin;
    // Register even where another plugin serves the resource (--take-over).
    bool take_over = false;
    // Looking at neighbours: each call's deadline, and the whole look's (it never holds the
    // registration thread for longer).
    absl::Duration neighbour_call_timeout = absl::Milliseconds(250);
    absl::Duration look_budget = absl::Seconds(1);
    // A resource the kubelet knows from another plugin that has not registered it again (after a
    // kubelet restart or a reboot) is left to that plugin for this long (--neighbour-grace).
    absl::Duration neighbour_grace = absl::Minutes(5);
    // Before registering through kubelet.sock where the plugin watcher may hold our
    // plugins_registry/ path: how long to wait for it to let go (RegistrationMachine::Options).
    absl::Duration watcher_probe_timeout = absl::Seconds(5);
    // Keep the registration record (registration_record.h) under device_plugin_dir.
    bool keep_record = true;
    // After a ListAndWatch stream ends, how long to wait for the kubelet's next move (a new
    // stream after a re-registration) before calling the endpoint lost.
    absl::Duration lost_endpoint_settle = absl::Milliseconds(300);
    // What an operator should see on the Node (the daemon records it as a Warning Event): the
    // kubelet refused our registration, or the resource is left to another plugin. `reason` is
    // CamelCase. Called on the registrar's thread, or the server's for the plugin watcher's
    // answer; it must not block.
    std::function<void(const std::string& reason, const std::string& message)> warn;
  };

  ResourceRegistrar(Options options, DeviceSet* set);
  ~ResourceRegistrar();
  ResourceRegistrar(const ResourceRegistrar&) = delete;
  ResourceRegistrar& operator=(const ResourceRegistrar&) = delete;

  // Starts the registration on its loop. Returns at once: a missing kubelet is waited for.
  absl::Status Start();
  // Ends streams, stops serving, removes our socket. Returns within a fraction of a second.
  void Stop();

  // Going for good, before Stop(), where the kubelet's plugin watcher registered us and the
  // kubelet's stream is open: stops acting on events, removes our plugins_registry/ socket (and
  // a handover registration's link in device-plugins/) and keeps serving. The watcher
  // unregisters a removed socket on its next reconciler pass (1 s loop) by resource name,
  // dropping whichever endpoint holds the name then (up to 1.36): had our stream ended first, the
  // kubelet would count every device Unhealthy until a successor registered, and a successor
  // registering through kubelet.sock before that pass would be dropped by it. True when there is
  // such a deregistration to wait for.
  bool LeavePluginWatcher();
  // After LeavePluginWatcher: waits until the kubelet has ended a stream of ours (the
  // deregistration), or `by`, then ends any other (a handover registration's: its client was
  // replaced, and with the name deregistered its end disconnects nothing). Then whatever a
  // successor serves on our former path, a WatcherProbe or its own server, is told
  // (TellWatcherLetGo), a pass before the watcher would ask it: the successor registers through
  // kubelet.sock now (docs/kubelet-behaviour.md §11).
  void WaitForTheWatcherToLetGo(absl::Time by);

  // Registered with the kubelet and serving (either way).
  bool registered() const;
  // What PluginOptions::advertise_now allows has changed: tell the open ListAndWatch streams.
  void Readvertise();
  // Successful registrations so far (kubelet mode: Register calls; watcher: notifications).
  uint64_t registrations() const;
  // kubelet.sock re-creations seen after a first registration.
  uint64_t kubelet_restarts() const { return machine_.kubelet_restarts(); }
  // The kubelet dropped our endpoint and we are not registered again yet.
  bool endpoint_lost() const { return machine_.endpoint_lost() && !registered(); }
  // Whom we leave the resource to now (a socket, or a description); "" when we do not.
  std::string left_to() const { return machine_.left_to(); }
  // Looks now, as the registrar would, and says what it would decide (for --discover).
  ArbiterDecision LookNow();
  // Looks at neighbours so far, and the longest one took.
  uint64_t neighbour_looks() const { return machine_.neighbour_looks(); }
  absl::Duration longest_look() const { return machine_.longest_look(); }
  // Where the last look learnt what the kubelet holds: "pod-resources", "checkpoint", or "".
  std::string holdings_source() const { return machine_.holdings_source(); }
  // Looks that could read neither the pod-resources API nor the checkpoint.
  uint64_t holdings_unreadable() const { return machine_.holdings_unreadable(); }
  // Looks that found the kubelet's checkpoint (or some of its entries) in a shape we do not know.
  uint64_t checkpoint_unreadable() const { return machine_.checkpoint_unreadable(); }
  // Attempts to start registration that found no inotify instance or no fd (each retried).
  uint64_t start_failures() const { return start_failures_.load(); }
  // Register calls the kubelet refused or did not answer in time (each retried with backoff).
  uint64_t registration_failures() const { return machine_.registration_failures(); }
  // The socket we serve on now ("" before the first start).
  std::string socket_path() const;
  const PluginCounters& counters() const { return counters_; }

 private:
  // RegistrationPorts: what the machine observes and does, with real files, sockets and gRPC.
  RegistrationMode EffectiveMode() override;
  std::optional<KubeletSocketId> KubeletSocket() override;
  bool KubeletAnswers() override;
  EndpointState Endpoint() override;
  absl::Status Serve(RegistrationMode mode) override;
  void StopServing() override;
  void Silence() override;
  void StartRegister(const KubeletSocketId& kubelet) override;
  absl::Status LinkForKubeletSock() override;
  void CancelRegister() override;
  NeighbourView Look(const NeighbourView* reuse_holdings_of) override;
  std::vector<std::string> OwnIds() override;
  bool WatcherRegistered() override { return watcher_service_.registered(); }
  void WatcherEndpointLost() override { watcher_service_.EndpointLost(); }
  void WatcherSteppedBack(bool stepped_back) override {
    watcher_service_.SetSteppedBack(stepped_back);
  }
  bool RecordSaysOurs() override;
  bool RecordSaysWatcher() override;
  absl::Status Record(bool ours, RegistrationMode via) override;
  absl::Status StartWatcherProbe() override;
  void StopWatcherProbe() override;
  void Warn(const std::string& reason, const std::string& message) override;

  // PollLoop::Member, on the loop's thread: the first steps get what registering needs
  // (retried with backoff while it cannot be had); then each hands the machine what arrived on
  // inotify and the eventfds, and steps it.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  // Gets the inotify instance and the eventfds; false (logged when the reason is new) where one
  // cannot be had yet.
  bool SetUp();
  // Hands the machine what arrived: `ready` in WaitFds' order.
  void Receive(const PollLoop::Events& ready);
  // The socket we serve on, and its handover registration's second link (each "" when none).
  void OurSocketPaths(std::string* serving_on, std::string* also) const;
  NeighbourQuery NeighbourQueryNow() const;
  // No step runs after this, and no Register call is in flight.
  void StopStepping();
  std::string DirectoryFor(RegistrationMode mode) const;
  std::string KubeletSocketPath() const;

  const Options options_;
  DeviceSet* const set_;
  PluginCounters counters_;
  PluginWatcherService watcher_service_;
  DirectoryWatcher inotify_;
  std::unique_ptr<PollLoop> own_loop_;  // where Options::loop is null
  PollLoop* const loop_;
  bool started_ = false;  // Start() to Stop(), on the caller's thread
  // The loop thread's own, until Stop() has removed us from the loop.
  bool set_up_ = false;
  Backoff set_up_backoff_;
  std::string set_up_error_;
  int call_done_fd_ = -1;
  // Written by gRPC threads: one of our ListAndWatch streams was cancelled by the kubelet.
  int stream_event_fd_ = -1;
  // Written by the probe's loop thread: the plugin watcher asked our WatcherProbe.
  int probe_asked_fd_ = -1;
  std::atomic<uint64_t> start_failures_{0};
  RegistrationMachine machine_;
  // Written by the registration thread only; read by LookNow from others.
  mutable absl::Mutex record_mu_;
  RegistrationRecord record_ ABSL_GUARDED_BY(record_mu_);
  // Every id the resource's DeviceSet has held since this registrar was made. The kubelet's list
  // lags our hot-plug (an unplugged device stays in it until our next message lands, and in the
  // checkpoint until the kubelet writes it again): a device we no longer have is still ours, not
  // a sign that another plugin registered the resource. Held by the DeviceSet listener too.
  struct OwnIdHistory {
    absl::Mutex mu;
    absl::flat_hash_set<std::string> ids ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<OwnIdHistory> own_id_history_ = std::make_shared<OwnIdHistory>();
  uint64_t own_id_listener_ = 0;

  mutable absl::Mutex mu_;
  std::unique_ptr<PluginServer> server_ ABSL_GUARDED_BY(mu_);
  RegistrationMode server_mode_ ABSL_GUARDED_BY(mu_) = RegistrationMode::kAuto;
  std::unique_ptr<RegisterCall> call_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<WatcherProbe> probe_ ABSL_GUARDED_BY(mu_);
  // LeavePluginWatcher removed our socket and the deregistration is to be waited for.
  bool leaving_watcher_ ABSL_GUARDED_BY(mu_) = false;
  // Our ListAndWatch streams open when LeavePluginWatcher removed the socket.
  int leaving_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_REGISTRAR_H_
