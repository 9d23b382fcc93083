// RegistrationMachine: what the registrar decides, as a state machine with its clock and its
// transport injected.
//
// Events in (kubelet.sock created or removed, another socket came or went, inotify events missed,
// one of our streams ended, a Register call finished, time passed), actions out through
// RegistrationPorts (serve on our socket, stop serving, silence our streams, call Register,
// cancel it, look at the neighbours, write the registration record, warn the operator). It does
// no I/O of its own and never sleeps: ResourceRegistrar drives it from one thread with inotify,
// eventfds and real gRPC; its tests drive it with a fake clock and recorded ports, stepping
// through kubelet behaviours (docs/kubelet-behaviour.md) without sockets or sleeps.
//
// The shape follows the kubelet's own device manager: the Register call (register_call.h, like
// its client.go), our socket's lifecycle (PluginServer, like server.go) and the decisions
// (this, and neighbour_arbiter.h for who serves a resource) are separate.
//
// From the plugin watcher to kubelet.sock: up to 1.36 the plugin watcher unregisters a removed
// plugins_registry/ socket on its reconciler's next pass (1 s loop) by resource name, stopping
// whichever endpoint holds the name then: a registration through kubelet.sock made before that
// pass would be dropped. So when our plugins_registry/ path may still be registered (we served
// there earlier in this process, an earlier edgeaccel did: the registration record says so, or
// one still serving there has just gone), we first put a WatcherProbe on that path and register
// through kubelet.sock once the watcher asks it GetInfo: it runs one operation at a time per
// path and unregisters the path's old registration before asking its new socket, so by then the
// deregistration by name has happened (docs/kubelet-behaviour.md §2.1). If the watcher does not
// ask within Options::watcher_probe_timeout we register anyway, and a dropped endpoint is
// repaired.
//
// From one edgeaccel to the next where the new one registers through the plugin watcher (a
// rollout, or a change of --registration towards plugin-watcher): the watcher registers a new
// socket only on its next 1 s pass, and the old plugin-watcher registration's path stays busy
// until the pass after its deregistration, while the kubelet counts every device Unhealthy from
// the old stream's end. So the new one also registers through kubelet.sock at the handover
// (the old stream gone, or for an old plugin-watcher registration, the watcher's deregistration
// of it done: the old daemon says so with a GetInfo on our path). The watcher's registration
// then replaces that client without disconnecting it (1.25-1.36 connectClient, 1.20
// registerEndpoint), and its stream stays open: its end would make a 1.25-1.36 kubelet
// disconnect the watcher's client (docs/kubelet-behaviour.md §11).
//
// Not thread-safe, but for the accessors marked as readable from any thread: one thread calls
// the events and Step().
#ifndef EDGEACCEL_KUBELET_REGISTRATION_MACHINE_H_
#define EDGEACCEL_KUBELET_REGISTRATION_MACHINE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/once_logger.h"
#include "edgeaccel/kubelet/neighbour_arbiter.h"
#include "edgeaccel/kubelet/neighbours.h"

namespace edgeaccel {

enum class RegistrationMode { kAuto, kPluginWatcher, kKubelet };

absl::string_view RegistrationModeName(RegistrationMode mode);
bool ParseRegistrationMode(absl::string_view text, RegistrationMode* mode);

// One incarnation of kubelet.sock: a re-created socket may reuse the inode number, but not the
// change time as well.
struct KubeletSocketId {
  ino_t inode = 0;
  int64_t ctime_ns = 0;
  bool operator==(const KubeletSocketId& o) const {
    return inode == o.inode && ctime_ns == o.ctime_ns;
  }
  bool operator!=(const KubeletSocketId& o) const { return !(*this == o); }
};

// Our socket as it is now.
struct EndpointState {
  bool serving = false;         // a server of ours is up
  bool socket_present = false;  // its socket file is still at its path
  int open_streams = 0;         // ListAndWatch streams open on it
  RegistrationMode mode = RegistrationMode::kAuto;  // the directory it serves in
  std::string path;
};

// How a Register call on kubelet.sock ended.
struct RegisterOutcome {
  KubeletSocketId kubelet;  // the kubelet.sock it was made on
  absl::Time started;
  bool ok = false;
  bool cancelled_by_us = false;
  bool deadline_exceeded = false;
  std::string message;
};

// What the machine observes and does. ResourceRegistrar implements these with real files,
// sockets and gRPC; the machine's tests with a script.
class RegistrationPorts {
 public:
  virtual ~RegistrationPorts() = default;

  // kubelet or plugin-watcher from the directories present; kAuto while neither is there.
  virtual RegistrationMode EffectiveMode() = 0;
  // kubelet.sock now; nullopt when it is not there.
  virtual std::optional<KubeletSocketId> KubeletSocket() = 0;
  // kubelet.sock accepts a connection.
  virtual bool KubeletAnswers() = 0;

  virtual EndpointState Endpoint() = 0;
  // Serves on our socket in `mode`'s directory.
  virtual absl::Status Serve(RegistrationMode mode) = 0;
  // Stops serving; our socket goes.
  virtual void StopServing() = 0;
  // Our open streams stay open and hear nothing more.
  virtual void Silence() = 0;

  // Starts a Register call on `kubelet`; its end comes back as RegistrationMachine::RegisterDone.
  virtual void StartRegister(const KubeletSocketId& kubelet) = 0;
  // While we serve in plugins_registry/: makes the same server reachable from device-plugins/
  // under our socket's name, so that a Register through kubelet.sock can name it (the handover
  // registration, see the top of this file).
  virtual absl::Status LinkForKubeletSock() = 0;
  // Cancels the call in flight (it still ends through RegisterDone, cancelled_by_us).
  virtual void CancelRegister() = 0;

  // Looks at the neighbours (bounded by its budget). `reuse_holdings_of`: see NeighbourQuery.
  virtual NeighbourView Look(const NeighbourView* reuse_holdings_of) = 0;
  // The ids we advertise now, and every id we held since we started.
  virtual std::vector<std::string> OwnIds() = 0;

  // The plugin watcher's registration of our socket.
  virtual bool WatcherRegistered() = 0;
  virtual void WatcherEndpointLost() = 0;
  virtual void WatcherSteppedBack(bool stepped_back) = 0;

  // The registration record (registration_record.h): ours or not, and whether our registration
  // may have gone through the plugin watcher (the record says so, or predates saying how).
  virtual bool RecordSaysOurs() = 0;
  virtual bool RecordSaysWatcher() = 0;
  virtual absl::Status Record(bool ours, RegistrationMode via) = 0;

  // Puts a WatcherProbe (plugin_server.h) on our plugins_registry/ path; the plugin watcher's
  // first GetInfo on it comes back as RegistrationMachine::WatcherProbeAsked. NotFound when
  // plugins_registry/ does not exist (no plugin watcher can hold a registration there).
  virtual absl::Status StartWatcherProbe() = 0;
  // The probe's socket goes.
  virtual void StopWatcherProbe() = 0;

  // A Warning Event for the operator (reason CamelCase).
  virtual void Warn(const std::string& reason, const std::string& message) = 0;
};

class RegistrationMachine {
 public:
  struct Options {
    std::string resource;
    // For log lines only.
    std::string kubelet_socket_path;
    // For log lines, and a predecessor whose socket is under plugins_registry_dir registered
    // through the plugin watcher.
    std::string device_plugin_dir;
    std::string plugins_registry_dir;
    absl::Duration max_backoff = absl::Seconds(30);
    absl::Duration register_timeout = absl::Seconds(10);
    bool take_over = false;
    absl::Duration neighbour_grace = absl::Minutes(5);
    absl::Duration look_budget = absl::Seconds(1);
    // How long to wait for the plugin watcher to ask our probe before registering through
    // kubelet.sock anyway. It asks within two reconciler passes (1 s loop: the old socket is
    // unregistered on one pass, the probe registered on that pass or the next), unless it backs
    // off after failures on the path (500 ms, doubling) or the kubelet is down.
    absl::Duration watcher_probe_timeout = absl::Seconds(5);
    absl::Duration lost_endpoint_settle = absl::Milliseconds(300);
    double backoff_jitter = 0.2;
  };
  // The least time between two looks at the neighbours: a directory that never settles must not
  // turn the look into a busy loop.
  static constexpr absl::Duration kLookInterval = absl::Milliseconds(20);
  // How long after an event that may mean another plugin registered the resource we look: its
  // first ListAndWatch answer must have reached the kubelet.
  static constexpr absl::Duration kLookSettle = absl::Milliseconds(100);
  static constexpr absl::Duration kInitialBackoff = absl::Milliseconds(100);
  // How old the last look made while an earlier edgeaccel served may be for the look that finds
  // it gone to take its holdings instead of asking the kubelet again (NeighbourQuery). On a busy
  // node every allocation writes the kubelet's checkpoint and so brings a look: the last one is
  // a few hundred milliseconds old at most.
  static constexpr absl::Duration kHoldingsReuse = absl::Seconds(2);

  RegistrationMachine(Options options, RegistrationPorts* ports, std::function<absl::Time()> clock);

  // Events.
  void KubeletSocketCreated();
  void KubeletSocketRemoved();
  // A socket other than kubelet.sock and ours came or went in either directory, or the
  // kubelet's checkpoint was written.
  void NeighbourChanged();
  // inotify may have missed events (overflow, a directory re-created, one not watchable).
  void EventsMissed();
  // One of our ListAndWatch streams ended.
  void StreamEnded();
  void RegisterDone(const RegisterOutcome& outcome);
  // The plugin watcher asked our probe for its info, or an earlier edgeaccel told our server on
  // its former plugins_registry/ path that the watcher's deregistration of it is done: the
  // watcher has let go of the path's old registration.
  void WatcherProbeAsked();

  // Acts on what the events and the clock call for, until there is nothing to do but wait.
  // Returns when to be stepped again at the latest (InfiniteFuture: at the next event).
  absl::Time Step();

  // A Register call is in flight (its RegisterDone is still to come).
  bool call_in_flight() const { return call_kubelet_.has_value(); }

  // Readable from any thread.
  bool registered_kubelet() const { return registered_kubelet_.load(); }
  uint64_t registrations() const { return registrations_.load(); }
  uint64_t kubelet_restarts() const { return kubelet_restarts_.load(); }
  bool endpoint_lost() const { return endpoint_lost_.load(); }
  std::string left_to() const;
  std::string holdings_source() const;
  uint64_t neighbour_looks() const { return neighbour_looks_.load(); }
  absl::Duration longest_look() const { return absl::Nanoseconds(longest_look_ns_.load()); }
  uint64_t holdings_unreadable() const { return holdings_unreadable_.load(); }
  uint64_t checkpoint_unreadable() const { return checkpoint_unreadable_.load(); }
  uint64_t registration_failures() const { return registration_failures_.load(); }
  // What the arbiter is told about us beside `view` (also for --discover, from its thread).
  ArbiterInput InputFor(const NeighbourView& view);
  // A look made outside the machine (--discover): holdings_source() tells where it read.
  void NoteLook(const NeighbourView& view);

 private:
  absl::Time Now() const { return clock_(); }
  // One pass: `again` to pass again at once, else wait until `wake` (or the next event).
  struct Pass {
    bool again = false;
    absl::Time wake = absl::InfiniteFuture();
  };
  Pass RunOnce();
  // Looks at the neighbours and decides; true when we must not serve or register now (left to
  // another plugin, waiting for one, or stepped back). Logs and warns once per change of mind.
  bool Arbitrate();
  bool RegisteredNow();
  void StopServing();
  // Our server is about to stop: if it served in plugins_registry/, the watcher may hold it.
  void NoteServerGoing(const EndpointState& endpoint);
  // Before registering through kubelet.sock while the plugin watcher may hold our path: probes
  // the path. Returns when to look again; watcher_may_hold_ is false once it is done.
  absl::Time WaitForTheWatcherToLetGo();
  void EndWatcherProbe();
  // Once we serve in plugins_registry/ after an earlier edgeaccel: the handover registration.
  void PlanHandover();
  // Step 2 for the handover registration; returns when to step again.
  absl::Time StepHandover();
  void RecordOurs(RegistrationMode via);
  // The resource is left to another plugin: the record says so (a failed write is complained of).
  void RecordNotOurs();
  void CheckEndpoint(RegistrationMode mode);
  // Cancels the Register call in flight, if any, and a handover registration still to be made.
  void CancelRegister();
  // Logs `message` at WARNING unless it is the same as the last one (no log storms on retry).
  void Complain(const std::string& message);
  void SetLeftTo(const std::string& to);

  const Options options_;
  RegistrationPorts* const ports_;
  const std::function<absl::Time()> clock_;
  NeighbourArbiter arbiter_;
  Backoff backoff_;

  std::optional<KubeletSocketId> call_kubelet_;  // the Register call in flight
  bool need_register_ = false;
  KubeletSocketId registered_kubelet_id_;
  KubeletSocketId restart_counted_for_;
  absl::Time retry_at_ = absl::InfinitePast();
  std::string last_complaint_;
  absl::Time check_endpoint_at_ = absl::InfiniteFuture();
  bool recheck_other_ = false;  // something changed while we leave it to another
  absl::Time recheck_other_at_ = absl::InfiniteFuture();
  absl::Time settle_look_at_ = absl::InfiniteFuture();
  absl::Time last_other_look_ = absl::InfinitePast();
  // While registered: look again at this time (set by events that may mean another plugin
  // registered the resource: a new socket, the kubelet's checkpoint written).
  absl::Time look_at_ = absl::InfiniteFuture();
  // The plugin watcher may still hold a registration of our plugins_registry/ path (see the
  // top of this file); read from the registration record on the first pass.
  bool watcher_may_hold_ = false;
  bool record_read_ = false;
  // A WatcherProbe is up, waiting for the watcher until probe_deadline_.
  bool probing_ = false;
  absl::Time probe_deadline_ = absl::InfiniteFuture();
  // We left the resource to an earlier edgeaccel registered through the plugin watcher.
  bool predecessor_was_watcher_ = false;
  // We left the resource to an earlier edgeaccel, and the look that found it gone made it ours.
  bool predecessor_left_ = false;
  // The handover registration through kubelet.sock while we serve in plugins_registry/ (see the
  // top of this file): waiting for the watcher to let go of the earlier registration (until
  // handover_deadline_), due, its Register in flight, or none.
  enum class Handover { kNone, kAwaitLetGo, kDue, kCalling };
  Handover handover_ = Handover::kNone;
  absl::Time handover_deadline_ = absl::InfiniteFuture();
  // The last look that found an earlier edgeaccel serving, and when it was made.
  std::optional<NeighbourView> predecessor_look_;
  absl::Time predecessor_look_at_ = absl::InfinitePast();

  std::atomic<bool> registered_kubelet_{false};
  std::atomic<bool> endpoint_lost_{false};
  std::atomic<uint64_t> registrations_{0};
  std::atomic<uint64_t> kubelet_restarts_{0};
  std::atomic<uint64_t> neighbour_looks_{0};
  std::atomic<int64_t> longest_look_ns_{0};
  std::atomic<uint64_t> holdings_unreadable_{0};
  std::atomic<uint64_t> checkpoint_unreadable_{0};
  std::atomic<uint64_t> registration_failures_{0};
  OnceLogger holdings_warnings_;
  OnceLogger checkpoint_warnings_;
  mutable absl::Mutex mu_;
  std::string left_to_ ABSL_GUARDED_BY(mu_);
  std::string holdings_source_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_REGISTRATION_MACHINE_H_
