// Daemon: wires discovery -> inventory -> (plugin service, registration) for every resource.
// main.cc adds flags and signals; tests and benchmarks use it in-process.
#ifndef EDGEACCEL_DAEMON_DAEMON_H_
#define EDGEACCEL_DAEMON_DAEMON_H_

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/daemon/config.h"
#include "edgeaccel/daemon/metrics.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/dra/claim_preparer.h"
#include "edgeaccel/dra/driver_lock.h"
#include "edgeaccel/dra/dra_plugin_server.h"
#include "edgeaccel/dra/dra_plugin_service.h"
#include "edgeaccel/dra/slice_publisher.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/inventory/host_watcher.h"
#include "edgeaccel/kubelet/registrar.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/node/cdi_spec.h"
#include "edgeaccel/node/node_events.h"
#include "edgeaccel/node/node_labeler.h"
#include "edgeaccel/node/node_labels.h"
#include "edgeaccel/nvml/nvml_supervisor.h"

namespace edgeaccel {

class Daemon {
 public:
  explicit Daemon(DaemonConfig config);
  ~Daemon();

  // Scans the host, starts watching it, and registers every resource that has devices (a
  // resource without any is registered as soon as its first device appears). Binds the
  // /metrics address, which ServeUntil() answers.
  absl::Status Start();
  // Answers /metrics and /healthz on the calling thread (the process's main thread: no thread of
  // its own) until `stop_fd` is readable, which it leaves unread. Without a metrics address it
  // only waits for that.
  void ServeUntil(int stop_fd);
  // Ends streams, stops serving, removes our sockets.
  void Stop();

  // What --discover prints: every resource, its devices, their health, nodes and facts, and
  // the node labels they give.
  std::string Describe() const;

  // The node labels the current devices give.
  LabelSet Labels() const;

  // One scan of everything, without watching or serving (for --discover).
  void ScanOnce();
  // The NVML helper's process id while one runs, else -1: --discover kills it when it is stopped
  // in the middle of a scan (the helper may hang in NVML; it must not outlive the daemon).
  pid_t NvmlHelperPid() const;


 private:
  struct Resource {
    // Every family of the resource goes through DRA, but the kubelet still knows the resource as
    // a device plugin's (the node moved): registered with no devices and no PreStartContainer
    // (see the constructor), never with a device.
    bool placeholder = false;
    uint64_t labels_listener = 0;
    std::unique_ptr<DeviceSet> set;
    std::vector<std::unique_ptr<Discoverer>> discoverers;
    std::unique_ptr<ResourceRegistrar> registrar;
    std::unique_ptr<CdiSpecFile> cdi;  // with --cdi
    uint64_t listener = 0;
    uint64_t cdi_listener = 0;
    // The sink thread's own: the snapshot version last written, and last attempted (on disk, or
    // the write failed and is retried), the reason the last write failed and how many failed
    // since the last success.
    uint64_t cdi_written_version = 0;
    uint64_t cdi_attempted_version = 0;
    std::string cdi_error;
    int cdi_failures = 0;
    // Physical ids a CDI write has been attempted for (on disk, or the write failed): the ones
    // ListAndWatch may name (PluginOptions::advertise_now).
    absl::Mutex cdi_mu;
    absl::flat_hash_set<std::string> cdi_settled ABSL_GUARDED_BY(cdi_mu);
    // Health of each physical device in the last snapshot seen, for Node events.
    uint64_t events_listener = 0;
    absl::Mutex events_mu;
    bool events_seen_any ABSL_GUARDED_BY(events_mu) = false;
    std::map<std::string, std::pair<Health, std::string>> events_health ABSL_GUARDED_BY(events_mu);
  };

  // A DRA driver (--dra): its own device set, fed by the families it publishes, its
  // ResourceSlice, and its kubelet plugin.
  struct DraDriver {
    std::unique_ptr<DeviceSet> set;  // named after the driver
    std::vector<std::unique_ptr<Discoverer>> discoverers;
    DraCounters counters;
    std::unique_ptr<ClaimPreparer> preparer;
    std::unique_ptr<DraPluginService> service;
    std::unique_ptr<DraPluginServer> server;
    std::unique_ptr<SlicePublisher> publisher;
    // Some of its devices were held by device-plugin pods at the last look (RefreshHolds).
    bool holds_known = false;
    // Held (dra/driver_lock.h) before the checkpoint is read; waited for, on event_loop_, while
    // an earlier daemon of this node still drives the driver.
    std::unique_ptr<DriverLock> lock;
    absl::Mutex serve_mu;  // held while it starts, so it starts once
    bool serving ABSL_GUARDED_BY(serve_mu) = false;
    bool stopping ABSL_GUARDED_BY(serve_mu) = false;  // set by Stop(): nothing starts after

    // An earlier daemon of this node still drives it (a rollout with maxSurge).
    bool WaitingForEarlierDaemon() const { return lock != nullptr && !lock->waiting().empty(); }
    bool Serving() {
      absl::MutexLock hold(&serve_mu);
      return serving;
    }
    // Until it serves (no device and no prepared claim at start), this listener waits for its
    // first device, on the thread that publishes the set's changes (ea-hostwatch); 0 otherwise.
    uint64_t first_device_listener ABSL_GUARDED_BY(serve_mu) = 0;
  };

  // One device's lines in Describe().
  static void DescribeDevice(const Device& device, std::string* out);
  Resource* ResourceFor(const std::string& name);
  DraDriver* DraDriverFor(const std::string& driver);
  // Where a family's discoverer goes: its DRA driver (--dra) or its device plugin resource.
  // Returns the discoverer as the watcher knows it (what RequestRescan takes).
  Discoverer* AddDiscoverer(const std::string& family, std::unique_ptr<Discoverer> discoverer);
  // Marks the devices the other API holds (DeviceSet::SetHeldElsewhere): a DRA driver's devices
  // that device-plugin pods hold (the kubelet's pod-resources API), and a device-plugin
  // resource's devices that prepared DRA claims hold (our DRA drivers' checkpoints). True while
  // any device is held.
  bool RefreshHolds();
  // Runs RefreshHolds on the sink thread every 10 s until nothing is held.
  void PostHolds();
  // The GPUs --dra-shared offers to several claims.
  GpuSharing DraSharing() const;
  absl::StatusOr<ApiServerConfig> ApiConfig() const;
  bool Check(std::string* why, bool for_liveness) const;
  absl::Status StartDra();
  // Reads the driver's checkpoint and serves it, or waits for its first device (see StartDra).
  absl::Status StartDraDriver(DraDriver* driver);
  // Serves the driver once it has a device (a listener on its set).
  void ServeOnFirstDevice(DraDriver* driver) ABSL_EXCLUSIVE_LOCKS_REQUIRED(driver->serve_mu);
  // Starts the driver's kubelet plugin and slice publisher unless they run already (see
  // StartDra).
  absl::Status ServeDra(DraDriver* driver);
  absl::Status ServeDraLocked(DraDriver* driver) ABSL_EXCLUSIVE_LOCKS_REQUIRED(driver->serve_mu);
  // Recomputes the node labels; logs and writes them (NFD) when they changed. kRetry when the
  // NFD file could not be written (the sink worker retries with backoff).
  Workers::Outcome RefreshLabels();
  std::string RenderMetrics() const;
  bool Healthy(std::string* why) const { return Check(why, /*for_liveness=*/false); }
  // /livez: the same, less what a restart cannot cure (a slice the API server refuses).
  bool Live(std::string* why) const { return Check(why, /*for_liveness=*/true); }
  void StartRegistrar(Resource* resource);
  // Writes the CDI spec for the resource's current devices, then lets ListAndWatch name them.
  // kRetry when the write failed (the sink worker retries with backoff).
  Workers::Outcome WriteCdi(Resource* resource);
  void PostCdi(Resource* resource);
  void PostLabels();
  // Events on our Node for what changed between `resource`'s last snapshot and `snapshot`.
  void RecordHealthEvents(Resource* resource, const Snapshot& snapshot);
  void RecordEvent(NodeEvent event);

  const DaemonConfig config_;
  Host host_;
  // The one thread every resource's registration, NVML's supervisor and every DRA driver's
  // ResourceSlice watch run on ("ea-loop"; declared before what uses it: it outlives them).
  PollLoop event_loop_{"ea-loop"};
  HostWatcher watcher_;
  // With --nvml, where the nvidia family is looked for: started by the first scan that finds a
  // discrete GPU. Its changes rescan nvidia_discoverer_.
  std::unique_ptr<NvmlSupervisor> nvml_;
  Discoverer* nvidia_discoverer_ = nullptr;
  std::vector<std::unique_ptr<Resource>> resources_;
  std::unique_ptr<ApiClient> dra_api_;  // with --dra
  // This node's ResourceSlices as the API server has them: one LIST and WATCH for every driver.
  std::unique_ptr<NodeSlices> node_slices_;
  std::vector<std::unique_ptr<DraDriver>> dra_drivers_;
  // Every DRA driver's connections, accepted on event_loop_; started by the first that serves.
  std::unique_ptr<DraGrpcServer> dra_grpc_;
  absl::Mutex mu_;  // guards starting registrars (from the watcher thread) against Stop()
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string holds_error_ ABSL_GUARDED_BY(mu_);  // the last pod-resources error RefreshHolds said
  absl::Mutex labels_mu_;
  LabelSet labels_ ABSL_GUARDED_BY(labels_mu_);
  bool labels_logged_ ABSL_GUARDED_BY(labels_mu_) = false;
  // With --nfd-features-dir: why the last write of the file failed (empty: it did not), and how
  // many failed since the last success.
  std::string nfd_error_ ABSL_GUARDED_BY(labels_mu_);
  int nfd_failures_ ABSL_GUARDED_BY(labels_mu_) = 0;
  std::unique_ptr<MetricsServer> metrics_;
  std::unique_ptr<NodeLabeler> node_labeler_;
  // With --label-node and --node-events; set in Start() before any thread that records.
  std::unique_ptr<NodeEventRecorder> node_events_;
  // The sinks' two workers, last so that they go first: a task they still run (one Stop()
  // abandoned on a hung disk) uses everything above. Each holds a thread only while it has work.
  // Requests to the API server (the node labels, Events) run on ea-api, so a server that hangs
  // never delays a file; Stop() cancels their request in flight (ApiClient::Cancel).
  Workers api_sinks_{"ea-api", {.exit_when_idle = true}};
  // The files (CDI specs, the NFD file) and label refreshes run on ea-sinks, in order, so the
  // host watcher's thread, which feeds ListAndWatch and rescans, never waits for a disk. A
  // failed write is retried with backoff; Stop() never waits for the disk.
  Workers sinks_{"ea-sinks", {.exit_when_idle = true, .stop_abandons_running_task = true}};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DAEMON_DAEMON_H_
