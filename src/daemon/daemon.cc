#include "edgeaccel/daemon/daemon.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/discovery/tegra.h"
#include "edgeaccel/dra/dra_driver.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/inventory/replicas.h"
#include "edgeaccel/kubelet/cached_allocation_check.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/kubelet_checkpoint.h"
#include "edgeaccel/kubelet/kubelet_holdings.h"
#include "edgeaccel/dra/prepared_claims.h"
#include "edgeaccel/node/nfd_feature_file.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

// A file that cannot be written (disk full, directory gone, read-only remount) is written again
// after 1 s, doubling to 60 s. The kernel has no event for "there is room again", so this is the
// one place the daemon waits on a timer for a file, and only while a write is failing.
Workers::Retry FileRetry() {
  return {.first = absl::Seconds(1), .max = absl::Seconds(60), .jitter = 0};
}

// How long a stop waits for the kubelet's plugin watcher to unregister our plugins_registry/
// sockets: it unregisters on its next reconciler pass (1 s loop), a busy kubelet a little later.
// A kubelet that is down is not waited for longer than this.
constexpr absl::Duration kPluginWatcherLetGo = absl::Milliseconds(2500);

// edgeaccel-nvml-helper in the directory this executable is in (the images put both in
// /usr/bin; a build tree has both in build/).
std::string DefaultNvmlHelperPath() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "/usr/bin/edgeaccel-nvml-helper";
  const std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/')) + "/edgeaccel-nvml-helper";
}

}  // namespace

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)),
      host_(config_.host_root),
      watcher_(&host_, HostWatcher::Options{config_.probe_interval}) {
  CoralHealthPolicy coral_policy;
  if (config_.temperature_threshold_celsius.has_value()) {
    coral_policy.temperature_threshold_mc =
        static_cast<int64_t>(std::llround(*config_.temperature_threshold_celsius * 1000));
  }
  coral_policy.temperature_hysteresis_mc =
      static_cast<int64_t>(std::llround(config_.temperature_hysteresis_celsius * 1000));
  const NvidiaOptions nvidia_options{
      config_.nvidia_runtime_envs, config_.tegra_display_nodes, config_.nvidia_driver_libraries,
      ParseDriverCapabilities(config_.nvidia_driver_capabilities).value_or(kDefaultDriverCapabilities),
      config_.nvidia_driver_libraries_dir};

  auto enabled = [this](const std::string& family) { return LooksFor(config_, family); };
  // Families in a fixed order; each feeds the resource it serves.
  if (enabled("coral-pcie")) {
    AddDiscoverer("coral-pcie", std::make_unique<CoralPcieDiscoverer>(&host_, coral_policy));
  }
  if (enabled("coral-usb")) AddDiscoverer("coral-usb", std::make_unique<CoralUsbDiscoverer>(&host_));
  if (enabled("tegra")) {
    AddDiscoverer("tegra", std::make_unique<TegraGpuDiscoverer>(&host_, nvidia_options));
  }
  if (enabled("nvidia")) {
    if (config_.nvml) {
      NvmlOptions nvml;
      nvml.helper_path = config_.nvml_helper.empty() ? DefaultNvmlHelperPath() : config_.nvml_helper;
      nvml.timeout = config_.nvml_timeout;
      nvml.check_interval = config_.nvml_check_interval;
      nvml.xid_recovery = config_.nvml_xid_recovery;
      nvml.ignored_xids = config_.nvml_ignored_xids;
      nvml.on_change = [this] { watcher_.RequestRescan(nvidia_discoverer_); };
      nvml.loop = &event_loop_;
      nvml_ = std::make_unique<NvmlSupervisor>(&host_, std::move(nvml));
    }
    nvidia_discoverer_ =
        AddDiscoverer("nvidia", std::make_unique<NvidiaGpuDiscoverer>(&host_, nvidia_options, nvml_.get()));
  }
  for (auto& driver : dra_drivers_) {
    for (auto& discoverer : driver->discoverers) watcher_.Add(discoverer.get(), driver->set.get());
  }
  // A resource all of whose families go through DRA here, which the kubelet still knows as a
  // device plugin's (its checkpoint lists it: the node served it through the device plugin
  // before). Kubelets up to 1.36 call PreStartContainer for a container that asks for such a
  // resource, also when DRA allocated it (an extended resource backed by DRA), as long as the
  // endpoint they keep for it says PreStartRequired, which ours did (devicemanager
  // GetDeviceRunContainerOptions -> callPreStartContainerIfNeeded; fixed upstream in
  // kubernetes#141426): the container fails with "no devices found allocated in local cache".
  // The kubelet keeps that endpoint for 5 minutes after the plugin went (endpointStopGracePeriod),
  // and again after each of its restarts. Registering the resource with no devices and without
  // PreStartContainer replaces it: allocatable stays 0 (the scheduler hands the name to DRA), a
  // DRA pod's container starts, and a device-plugin pod still running keeps its devices.
  if (!dra_drivers_.empty()) {
    absl::StatusOr<KubeletCheckpoint> checkpoint = ReadKubeletCheckpoint(
        absl::StrCat(config_.device_plugin_dir, "/", kKubeletCheckpointName));
    for (const std::string& name : {std::string(kResourceEdgeTpu), std::string(kResourceNvidiaGpu)}) {
      if (!ServesThroughDra(config_, name) || ServesThroughTheDevicePlugin(config_, name) ||
          !checkpoint.ok() || checkpoint->registered_devices.count(name) == 0) {
        continue;
      }
      ResourceFor(name)->placeholder = true;
      LOG(INFO) << name << ": every family of it goes through DRA here, but the kubelet still knows it "
                << "as a device plugin's resource (" << kKubeletCheckpointName << "): registered with no "
                << "devices and without PreStartContainer, so that a pod given it through DRA starts";
    }
  }

  for (auto& resource : resources_) {
    DeviceSet* set = resource->set.get();
    for (auto& discoverer : resource->discoverers) watcher_.Add(discoverer.get(), set);
    auto replicas = config_.replicas.find(set->resource_name());
    if (replicas != config_.replicas.end()) watcher_.SetReplicas(set, replicas->second);
    ResourceRegistrar::Options options;
    options.loop = &event_loop_;
    options.kubelet_root = config_.kubelet_root;
    options.device_plugin_dir = config_.device_plugin_dir;
    options.mode = config_.registration;
    options.register_timeout = config_.register_timeout;
    if (config_.cdi) {
      resource->cdi = std::make_unique<CdiSpecFile>(config_.cdi_dir, set->resource_name());
      // Only names a runtime can resolve now: those in the spec on disk.
      options.plugin.cdi_device_name = [cdi = resource->cdi.get()](absl::string_view id) {
        return cdi->NameOnDisk(id);
      };
      // And the kubelet hears of a device only once its spec has been written (WriteCdi).
      options.plugin.advertise_now = [r = resource.get()](const Device& device) {
        absl::MutexLock lock(&r->cdi_mu);
        return r->cdi_settled.contains(PhysicalIdOf(device.id));
      };
    }
    // Every container start checks that the answer the kubelet cached still fits the devices.
    // Not where some family of the same resource goes through DRA (a placeholder is the case
    // where all do): the scheduler hands the name to DRA whenever the node's allocatable of it is
    // 0 (the shipped DeviceClass maps coral.ai/edgetpu), and kubelets up to 1.36 then fail the
    // container of such a pod while this endpoint asks for PreStartContainer (see above; seen on
    // the lab with coral-pcie through DRA and coral-usb through the device plugin).
    if (!ServesThroughDra(config_, set->resource_name())) {
      options.plugin.pre_start = CachedAllocationCheck(
          absl::StrCat(config_.device_plugin_dir, "/", kKubeletCheckpointName), set->resource_name());
    }
    options.take_over = config_.take_over.count(set->resource_name()) > 0;
    options.neighbour_grace = config_.neighbour_grace;
    options.warn = [this](const std::string& reason, const std::string& message) {
      RecordEvent({true, reason, message});
    };
    resource->registrar = std::make_unique<ResourceRegistrar>(options, set);
  }
}

namespace {

// The entry of `entries` whose device set is named `name`, made (with its set) if there is none.
template <typename Entry>
Entry* FindOrAddBySetName(std::vector<std::unique_ptr<Entry>>* entries, const std::string& name) {
  for (auto& entry : *entries) {
    if (entry->set->resource_name() == name) return entry.get();
  }
  auto entry = std::make_unique<Entry>();
  entry->set = std::make_unique<DeviceSet>(name);
  entries->push_back(std::move(entry));
  return entries->back().get();
}

}  // namespace

Daemon::Resource* Daemon::ResourceFor(const std::string& name) {
  return FindOrAddBySetName(&resources_, name);
}

Daemon::DraDriver* Daemon::DraDriverFor(const std::string& driver) {
  return FindOrAddBySetName(&dra_drivers_, driver);
}

Discoverer* Daemon::AddDiscoverer(const std::string& family, std::unique_ptr<Discoverer> discoverer) {
  // A family goes one way only: never offered through both APIs.
  if (config_.dra_families.count(family) > 0) {
    auto& discoverers = DraDriverFor(DraDriverForFamily(family))->discoverers;
    discoverers.push_back(std::move(discoverer));
    return discoverers.back().get();
  }
  auto& discoverers = ResourceFor(KnownFamilies().at(family))->discoverers;
  discoverers.push_back(std::move(discoverer));
  return discoverers.back().get();
}

GpuSharing Daemon::DraSharing() const {
  return GpuSharing{.integrated = config_.dra_shared.count("tegra") > 0,
                    .discrete = config_.dra_shared.count("nvidia") > 0};
}

absl::StatusOr<ApiServerConfig> Daemon::ApiConfig() const {
  return config_.kubeconfig.empty()
             ? InClusterConfig(config_.node_name, config_.api_server, config_.api_token_file,
                               config_.api_ca_file)
             : KubeconfigConfig(config_.node_name, config_.kubeconfig);
}

absl::Status Daemon::StartDra() {
  if (dra_drivers_.empty()) return absl::OkStatus();
  absl::StatusOr<ApiServerConfig> api = ApiConfig();
  if (!api.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--dra publishes ResourceSlices through the API server, which cannot be reached: ",
        api.status().message()));
  }
  dra_api_ = std::make_unique<ApiClient>(*api);
  // A kept connection the API server closes (its 90 s idle timeout) is closed here at once.
  dra_api_->WatchIdleConnections(&event_loop_);
  dra_grpc_ = std::make_unique<DraGrpcServer>(&event_loop_);
  node_slices_ = std::make_unique<NodeSlices>(NodeSlices::Options{.node_name = config_.node_name,
                                                                  .resync = config_.dra_resync,
                                                                  .loop = &event_loop_},
                                              dra_api_.get());
  // A claim prepared in another boot has its spec written again before the kubelet can ask.
  absl::StatusOr<std::string> boot_id = host_.ReadAttribute(kDraBootIdPath);
  if (!boot_id.ok()) {
    LOG(WARNING) << "cannot read the node's boot id (" << boot_id.status().message()
                 << "): after a reboot only the prepared claims' missing CDI specs are written again; mount "
                 << kDraBootIdPath << " under --host-root";
  }
  for (auto& owned : dra_drivers_) {
    DraDriver* driver = owned.get();
    const std::string& name = driver->set->resource_name();
    ClaimPreparer::Options prepare;
    prepare.driver = name;
    prepare.pool = config_.node_name;
    prepare.cdi_dir = config_.cdi_dir;
    const std::string plugin_dir = DraPluginDir(config_.kubelet_root, name);
    prepare.state_dir = plugin_dir;
    prepare.fetch_claim = [client = dra_api_.get()](const ClaimRef& claim) {
      return FetchClaim(*client, claim);
    };
    prepare.boot_id = boot_id.value_or("");
    prepare.on_event = [this](const std::string& reason, const std::string& message) {
      RecordEvent({true, reason, message});
    };
    prepare.counters = &driver->counters;
    // The kubelet's pod-resources API names the claims its pods use: the cleanup reads only the
    // others from the API server.
    prepare.claims_in_use = [socket = absl::StrCat(config_.kubelet_root, "/", kPodResourcesSocket),
                             name]() -> absl::StatusOr<std::set<std::string>> {
      absl::StatusOr<KubeletHoldings> holdings = AskPodResources(socket, absl::Seconds(2));
      if (!holdings.ok()) return holdings.status();
      auto claims = holdings->claims_in_use.find(name);
      return claims == holdings->claims_in_use.end() ? std::set<std::string>() : claims->second;
    };
    driver->preparer = std::make_unique<ClaimPreparer>(std::move(prepare), driver->set.get());
    SlicePublisher::Options publish;
    publish.driver = name;
    publish.node_name = config_.node_name;
    publish.resync = config_.dra_resync;
    publish.no_execute_after = config_.dra_no_execute_after;
    publish.sharing = DraSharing();
    // Claims the kubelet will never unprepare: at start and then at most every --dra-resync, on
    // the publisher's worker.
    publish.chore = [preparer = driver->preparer.get()] { preparer->Cleanup(); };
    publish.chore_interval = config_.dra_resync;
    publish.loop = &event_loop_;
    publish.slices = node_slices_.get();
    driver->publisher = std::make_unique<SlicePublisher>(publish, dra_api_.get(), driver->set.get());
    driver->service = std::make_unique<DraPluginService>(driver->preparer.get(), driver->set.get(),
                                                         config_.node_name, &driver->counters);
    DraPluginServer::Options serve;
    serve.driver = name;
    serve.kubelet_root = config_.kubelet_root;
    serve.grpc = dra_grpc_.get();
    // A kubelet that (re)starts deletes its node's slices: publish again once it registered us.
    serve.on_registered = [publisher = driver->publisher.get()] { publisher->Resync(); };
    serve.on_refused = [this, name](const std::string& error) {
      RecordEvent({true, "DRADriverRefused",
                   absl::StrCat("the kubelet refused DRA driver ", name, ": ", error)});
    };
    driver->server = std::make_unique<DraPluginServer>(serve, driver->service.get());
    // The driver's checkpoint, sockets and slices are one process's at a time (dra/driver_lock.h).
    // The lock is ours at once but during a rollout with maxSurge, when the daemon being replaced
    // still drives the driver: then this one starts it (on the sink thread: the lock's wait ends
    // on the loop's, which a publisher joining the loop must not run on) once that one is gone.
    // Meanwhile the kubelet keeps calling the other, and a claim's prepare that finds no driver
    // is retried by the kubelet: pods wait, none fails.
    driver->lock = std::make_unique<DriverLock>(plugin_dir, [this, driver, name] {
      sinks_.Post(absl::StrCat("dra-takeover ", name), [this, driver, name] {
        if (absl::Status started = StartDraDriver(driver); !started.ok()) {
          LOG(ERROR) << name << ": " << started.message() << "; tried again when its devices change";
          absl::MutexLock lock(&driver->serve_mu);
          ServeOnFirstDevice(driver);
        }
      });
    });
    absl::StatusOr<bool> ours = driver->lock->TryAcquire();
    if (!ours.ok()) {
      LOG(WARNING) << name << ": " << ours.status().message()
                   << "; going on without the lock that keeps a second daemon of this node (a "
                      "rollout with maxSurge) from driving the DRA driver at the same time";
    } else if (!*ours) {
      LOG(INFO) << name << ": an earlier edgeaccel still drives this DRA driver ("
                << driver->lock->waiting() << "; a rollout with maxSurge): this one takes over "
                << "the moment it goes";
      event_loop_.Add(driver->lock.get());
      continue;
    }
    if (absl::Status started = StartDraDriver(driver); !started.ok()) return started;
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartDraDriver(DraDriver* driver) {
  const std::string& name = driver->set->resource_name();
  absl::MutexLock lock(&driver->serve_mu);
  if (driver->stopping) return absl::OkStatus();
  // An unreadable checkpoint is logged by Start(); the driver still serves.
  (void)driver->preparer->Start();
  // A driver with nothing to offer and nothing prepared stays away from the kubelet and the
  // API server, as a device plugin resource does, until its first device appears (a Coral USB
  // Accelerator plugged in): the shipped --dra names every family, and most nodes have one
  // kind. Its slice from an earlier run, if any, is the kubelet's to delete (it does, 30 s after
  // the plugin went). A driver holding prepared claims serves at once, so the kubelet can
  // unprepare them.
  if (driver->set->Current()->devices.empty() && driver->preparer->Prepared().empty()) {
    LOG(INFO) << name << ": no device yet; the DRA driver registers with the kubelet and publishes "
              << "its ResourceSlice when the first one appears";
    ServeOnFirstDevice(driver);
    return absl::OkStatus();
  }
  return ServeDraLocked(driver);
}

void Daemon::ServeOnFirstDevice(DraDriver* driver) {
  if (driver->first_device_listener != 0 || driver->stopping) return;
  auto serve_once_found = [this, driver](const Snapshot& snapshot) {
    if (snapshot.devices.empty()) return;
    if (absl::Status serving = ServeDra(driver); !serving.ok()) {
      // The next change of its devices tries again.
      LOG(ERROR) << driver->set->resource_name() << ": " << serving.message();
    }
  };
  driver->first_device_listener = driver->set->Subscribe(
      [serve_once_found](std::shared_ptr<const Snapshot> snapshot) { serve_once_found(*snapshot); });
  // A device that came between the look and the subscription: on the sink thread, since the
  // caller holds serve_mu, which ServeDra takes.
  sinks_.Post(absl::StrCat("dra-first-device ", driver->set->resource_name()),
              [driver, serve_once_found] { serve_once_found(*driver->set->Current()); });
}

absl::Status Daemon::ServeDra(DraDriver* driver) {
  absl::MutexLock lock(&driver->serve_mu);
  return ServeDraLocked(driver);
}

absl::Status Daemon::ServeDraLocked(DraDriver* driver) {
  if (driver->serving || driver->stopping) return absl::OkStatus();
  if (absl::Status serving = driver->server->Start(); !serving.ok()) {
    return absl::UnavailableError(absl::StrCat(driver->set->resource_name(), ": ", serving.message()));
  }
  // Serving first: the kubelet can prepare its waiting pods' claims while the API server is slow
  // to take the slice.
  driver->publisher->Start();
  driver->serving = true;
  // Serving, it stays so: the first device's listener has done its work.
  if (driver->first_device_listener != 0) {
    driver->set->Unsubscribe(driver->first_device_listener);
    driver->first_device_listener = 0;
  }
  return absl::OkStatus();
}

Daemon::~Daemon() { Stop(); }

absl::Status Daemon::Start() {
  for (auto& resource : resources_) {
    Resource* r = resource.get();
    // The CDI spec is rewritten whenever the devices change, on the sink thread. ListAndWatch
    // names a new device only after that write (advertise_now), whatever order listeners run in.
    if (r->cdi != nullptr) {
      r->cdi_listener =
          r->set->Subscribe([this, r](std::shared_ptr<const Snapshot>) { PostCdi(r); });
    }
  }
  if (config_.label_node) {
    absl::StatusOr<ApiServerConfig> api = ApiConfig();
    if (!api.ok()) return api.status();
    node_labeler_ = std::make_unique<NodeLabeler>(*api, &api_sinks_);
    node_labeler_->Start();
    if (config_.node_events) {
      node_events_ = std::make_unique<NodeEventRecorder>(*api, &api_sinks_);
      node_events_->Start();
      // Before the first scan, so a device that is Unhealthy from the start is told too.
      for (auto& resource : resources_) {
        Resource* r = resource.get();
        r->events_listener = r->set->Subscribe(
            [this, r](std::shared_ptr<const Snapshot> snapshot) { RecordHealthEvents(r, *snapshot); });
      }
    }
  }
  absl::Status status = watcher_.Start();  // the first scan of every family happens in here
  if (!status.ok()) return status;
  // Devices the other API gave out before this start (a node moved between the device plugin and
  // DRA) are held before any slice is published or resource registered, and looked at again
  // until they are free.
  if (RefreshHolds()) PostHolds();
  // The DRA drivers after the first scan: the first slice holds every device found, and a
  // prepared claim's missing CDI spec can be written again from them.
  if (absl::Status dra = StartDra(); !dra.ok()) return dra;
  // The first specs before any registration, so the first ListAndWatch already names every
  // device (on the sink thread, as every other write of them).
  for (auto& resource : resources_) {
    Resource* r = resource.get();
    if (r->cdi != nullptr) PostCdi(r);
  }
  sinks_.Drain(absl::Seconds(10));  // a hung disk only delays the first ListAndWatch's devices
  // Registrars start when a resource first has devices, from whichever thread sees that, and
  // only from here on: subscribed before the first scan, they would start on it, before the
  // specs above are on disk, and the first ListAndWatch would hold back every device. A change
  // between the scan and the subscription is seen by the check after it.
  for (auto& resource : resources_) {
    Resource* r = resource.get();
    const uint64_t listener = r->set->Subscribe([this, r](std::shared_ptr<const Snapshot> snapshot) {
      if (!snapshot->devices.empty()) StartRegistrar(r);
    });
    {
      absl::MutexLock lock(&mu_);  // StartRegistrar reads it on discovery's threads
      r->listener = listener;
    }
    if (r->placeholder || !r->set->Current()->devices.empty()) StartRegistrar(r);
  }
  // Labels follow the devices only once every family has been scanned: subscribing earlier
  // would hand the node labeller (and the NFD file) the half-scanned sets in between, and on a
  // daemon restart the node would briefly lose the labels of the families not yet scanned.
  // RefreshLabels after subscribing covers any change that came between the scan and here.
  // Refreshes run one at a time on the sink thread, each from the sets as they are when it runs,
  // so the last one applied is always the newest. Labels are made of facts too (NVML's memory,
  // compute capability, CUDA version), so a change of facts alone refreshes them: NVML answering
  // after the first scan reaches every label sink at once.
  for (auto& resource : resources_) {
    resource->labels_listener = resource->set->Subscribe(
        [this](std::shared_ptr<const Snapshot>) { PostLabels(); },
        DeviceSet::Changes::kAdvertisedOrFacts);
  }
  PostLabels();
  if (!config_.metrics_address.empty()) {
    metrics_ = std::make_unique<MetricsServer>(
        config_.metrics_address, [this] { return RenderMetrics(); },
        [this](std::string* why) { return Healthy(why); },
        [this](std::string* why) { return Live(why); });
    if (absl::Status listening = metrics_->Listen(); !listening.ok()) {
      // Devices are still served; only the metrics are missing.
      LOG(ERROR) << listening.message();
      metrics_.reset();
    }
  }
  return absl::OkStatus();
}

void Daemon::ServeUntil(int stop_fd) {
  // Where /metrics cannot be served (said in the log), the devices still are: wait all the same.
  if (metrics_ != nullptr && metrics_->Serve(stop_fd)) return;
  struct pollfd wait = {stop_fd, POLLIN, 0};
  while (poll(&wait, 1, -1) < 0 && errno == EINTR) {
  }
}

LabelSet Daemon::Labels() const {
  std::map<std::string, std::shared_ptr<const Snapshot>> snapshots;
  for (const auto& resource : resources_) {
    snapshots[resource->set->resource_name()] = resource->set->Current();
  }
  LabelOptions options;
  options.seed_labels = config_.seed_labels;
  if (nvml_ != nullptr) options.nvml_gpus = nvml_->AllGpuFacts();
  return DeriveLabels(snapshots, options);
}

void Daemon::PostLabels() {
  sinks_.PostRetrying("labels", [this] { return RefreshLabels(); }, FileRetry());
}

Workers::Outcome Daemon::RefreshLabels() {
  LabelSet labels = Labels();
  if (node_labeler_ != nullptr) node_labeler_->Set(labels);  // patches only on change
  absl::MutexLock lock(&labels_mu_);
  const bool changed = !(labels == labels_ && labels_logged_);
  if (!changed && nfd_error_.empty()) return Workers::Outcome::kDone;
  labels_ = labels;
  labels_logged_ = true;
  // Write first, then say so: with an NFD sink, the line below comes after the file holds these
  // labels, or after the error line that says it could not be written.
  bool failed = false;
  if (!config_.nfd_features_dir.empty()) {
    absl::Status status = WriteNfdFeatureFile(config_.nfd_features_dir, labels);
    if (status.ok()) {
      if (!nfd_error_.empty()) {
        LOG(INFO) << "wrote the NFD feature file in " << config_.nfd_features_dir << " on retry "
                  << nfd_failures_ << " (it had failed: " << nfd_error_ << ")";
      }
      nfd_error_.clear();
      nfd_failures_ = 0;
    } else {
      failed = true;
      ++nfd_failures_;
      // One line per new reason, not one per retry: a disk stays full for a while.
      if (status.message() != nfd_error_) {
        LOG(ERROR) << "cannot write the NFD feature file: " << status.message()
                   << "; Node Feature Discovery will not show these labels until a retry succeeds";
        nfd_error_ = std::string(status.message());
      }
    }
  }
  if (changed) {
    std::vector<std::string> pairs;
    for (const auto& [key, value] : labels) pairs.push_back(absl::StrCat(key, "=", value));
    LOG(INFO) << "node labels: " << (pairs.empty() ? "(none)" : absl::StrJoin(pairs, " "));
  }
  return failed ? Workers::Outcome::kRetry : Workers::Outcome::kDone;
}

std::string Daemon::RenderMetrics() const {
  std::vector<ResourceMetrics> metrics;
  for (const auto& resource : resources_) {
    const ResourceRegistrar& r = *resource->registrar;
    ResourceMetrics m;
    m.resource = resource->set->resource_name();
    m.snapshot = resource->set->Current();
    m.counters = &r.counters();
    m.registered = r.registered();
    m.registrations = r.registrations();
    m.kubelet_restarts = r.kubelet_restarts();
    m.left_to_other_plugin = !r.left_to().empty();
    m.registration_failures = r.registration_failures();
    m.neighbour_looks = r.neighbour_looks();
    m.longest_look = r.longest_look();
    m.holdings_unreadable = r.holdings_unreadable();
    m.checkpoint_unreadable = r.checkpoint_unreadable();
    metrics.push_back(std::move(m));
  }
  std::vector<DraMetrics> dra;
  for (const auto& driver : dra_drivers_) {
    if (driver->preparer == nullptr) continue;  // not started
    DraMetrics d;
    d.driver = driver->set->resource_name();
    d.counters = &driver->counters;
    for (const PreparedClaim& claim : driver->preparer->Prepared()) {
      ++d.prepared_claims;
      d.prepared_devices += claim.devices.size();
    }
    // The extended resource its families are known by (the shipped DeviceClasses map it).
    for (const auto& [family, resource] : KnownFamilies()) {
      if (DraDriverForFamily(family) == d.driver) d.resource = resource;
    }
    d.snapshot = driver->set->Current();
    d.serving = driver->Serving();
    d.registered = d.serving && driver->server->registered();
    d.waiting = driver->WaitingForEarlierDaemon();
    d.slice = driver->publisher->status();
    dra.push_back(std::move(d));
  }
  if (nvml_ != nullptr && nvml_->started()) {
    // Read now (at most a second old), waiting a bounded time for a slow or hung NVML.
    NvmlMetrics gpus{nvml_->Status(), nvml_->Telemetry(absl::Seconds(2)),
                     config_.dra_families.count("nvidia") > 0 ? "dra" : "device-plugin"};
    return edgeaccel::RenderMetrics(metrics, &gpus, dra);
  }
  return edgeaccel::RenderMetrics(metrics, nullptr, dra);
}

bool Daemon::Check(std::string* why, bool for_liveness) const {
  std::vector<std::string> problems;
  auto look_for_stale_views = [&](const std::vector<std::unique_ptr<Discoverer>>& discoverers) {
    for (const auto& discoverer : discoverers) {
      if (std::string stale = discoverer->StaleHostView(); !stale.empty()) {
        problems.push_back(absl::StrCat(discoverer->Family(), ": ", stale));
      }
    }
  };
  for (const auto& resource : resources_) look_for_stale_views(resource->discoverers);
  // A family published through DRA sees the host through the same mounts.
  for (const auto& driver : dra_drivers_) look_for_stale_views(driver->discoverers);
  for (const auto& resource : resources_) {
    // A resource without devices is not registered on purpose, nor one left to another plugin.
    if (resource->set->Current()->devices.empty()) continue;
    if (!resource->registrar->left_to().empty()) continue;
    if (resource->registrar->endpoint_lost()) {
      problems.push_back(absl::StrCat(resource->set->resource_name(),
                                      ": the kubelet dropped our endpoint; registering again"));
    } else if (!resource->registrar->registered()) {
      problems.push_back(absl::StrCat(resource->set->resource_name(),
                                      " is not registered with the kubelet"));
    }
  }
  // A DRA driver as a device plugin resource: one with nothing to offer is not served on
  // purpose, nor one an earlier daemon still drives (a rollout: this pod must be Ready for the
  // old one to go).
  for (const auto& driver : dra_drivers_) {
    const std::string& name = driver->set->resource_name();
    if (driver->WaitingForEarlierDaemon() || !driver->Serving()) continue;
    if (!driver->server->registered()) {
      problems.push_back(absl::StrCat("DRA driver ", name, " is not registered with the kubelet"));
    }
    if (for_liveness) continue;
    const SlicePublisher::Status slice = driver->publisher->status();
    if (!slice.published && !slice.last_error.empty()) {
      problems.push_back(absl::StrCat("DRA driver ", name, " cannot publish its ResourceSlice: ",
                                      slice.last_error));
    }
  }
  *why = absl::StrJoin(problems, "; ");
  return problems.empty();
}

void Daemon::PostCdi(Resource* resource) {
  sinks_.PostRetrying(absl::StrCat("cdi ", resource->set->resource_name()),
                      [this, resource] { return WriteCdi(resource); }, FileRetry());
}

Workers::Outcome Daemon::WriteCdi(Resource* resource) {
  CdiSpecFile* cdi = resource->cdi.get();
  std::shared_ptr<const Snapshot> snapshot = resource->set->Current();
  // Already on disk: one write per change.
  if (snapshot->version == resource->cdi_written_version) return Workers::Outcome::kDone;
  absl::Status status = cdi->Write(*snapshot);
  if (status.ok()) {
    resource->cdi_written_version = snapshot->version;
    if (!resource->cdi_error.empty()) {
      LOG(INFO) << "wrote the CDI spec " << cdi->path() << " on retry " << resource->cdi_failures
                << " (it had failed: " << resource->cdi_error << ")";
    }
    resource->cdi_error.clear();
    resource->cdi_failures = 0;
  } else {
    ++resource->cdi_failures;
    // One line per new reason, not one per retry: a disk stays full for a while.
    if (status.message() != resource->cdi_error) {
      LOG(ERROR) << resource->set->resource_name() << ": cannot write the CDI spec: "
                 << status.message()
                 << "; CDI-aware runtimes will not find these devices until a retry succeeds "
                    "(Allocate answers their device nodes, without CDI names, meanwhile)";
      resource->cdi_error = std::string(status.message());
    }
  }
  if (snapshot->version != resource->cdi_attempted_version) {
    resource->cdi_attempted_version = snapshot->version;
    {
      // On disk now, or the write failed and Allocate names none of them (NameOnDisk): either
      // way the kubelet may hear of them.
      absl::MutexLock lock(&resource->cdi_mu);
      resource->cdi_settled.clear();
      for (const Device& device : snapshot->devices) {
        resource->cdi_settled.insert(std::string(PhysicalIdOf(device.id)));
      }
    }
    if (resource->registrar != nullptr) resource->registrar->Readvertise();
  }
  return status.ok() ? Workers::Outcome::kDone : Workers::Outcome::kRetry;
}

void Daemon::StartRegistrar(Resource* resource) {
  absl::MutexLock lock(&mu_);
  if (stopped_ || resource->listener == 0) return;
  resource->set->Unsubscribe(resource->listener);
  resource->listener = 0;
  absl::Status status = resource->registrar->Start();
  if (!status.ok()) {
    LOG(ERROR) << resource->set->resource_name() << ": cannot start registration: " << status;
  }
}

void Daemon::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // Bounded whatever the API server does: first what the kubelet sees go (the registrations and
  // sockets), then every API request is cancelled, and only then are threads joined.
  if (metrics_ != nullptr) metrics_->Stop();
  watcher_.Stop();
  if (nvml_ != nullptr) nvml_->Stop();  // after the scans that start it
  if (dra_api_ != nullptr) dra_api_->Cancel();  // a prepare reading a claim ends now
  // A resource the plugin watcher registered keeps serving until the watcher has unregistered
  // it (its next pass, within a second), each in parallel: pods admitted meanwhile still get a
  // device, and a successor registering through kubelet.sock is not dropped by that late
  // deregistration (ResourceRegistrar::LeavePluginWatcher).
  bool leaving_watcher = false;
  for (auto& resource : resources_) {
    if (resource->registrar->LeavePluginWatcher()) leaving_watcher = true;
  }
  if (leaving_watcher) {
    const absl::Time by = absl::Now() + kPluginWatcherLetGo;
    for (auto& resource : resources_) resource->registrar->WaitForTheWatcherToLetGo(by);
  }
  for (auto& resource : resources_) resource->registrar->Stop();
  // The DRA plugin deregisters (its registration socket goes first); the slices and prepared
  // claims stay: running pods keep their devices, and the next daemon takes over both.
  for (auto& driver : dra_drivers_) {
    // A wait for an earlier daemon's lock ends here; a takeover it posted finds `stopping`.
    if (driver->lock != nullptr) event_loop_.Remove(driver->lock.get());
    {
      absl::MutexLock lock(&driver->serve_mu);
      driver->stopping = true;
      if (driver->first_device_listener != 0) {
        driver->set->Unsubscribe(driver->first_device_listener);
        driver->first_device_listener = 0;
      }
    }
    if (driver->server != nullptr) driver->server->Stop();
  }
  // Then their one gRPC server, once every driver deregistered: the calls still being answered
  // (claim reads cancelled above) are joined once its loop drained.
  if (dra_grpc_ != nullptr) {
    dra_grpc_->Stop(absl::Milliseconds(500), [this] {
      for (auto& driver : dra_drivers_) {
        if (driver->server != nullptr) driver->server->JoinCalls();
      }
    });
  }
  for (auto& driver : dra_drivers_) {
    if (driver->publisher != nullptr) driver->publisher->Stop();
    // Waits for claim reads still under way (cancelled above), while dra_api_ still exists.
    if (driver->preparer != nullptr) driver->preparer->Stop();
    // Nothing of ours writes the checkpoint now: a daemon waiting to take over may.
    if (driver->lock != nullptr) driver->lock->Release();
  }
  if (node_slices_ != nullptr) node_slices_->Stop();
  // The file sinks never wait for the disk: a write in flight on a hung disk is abandoned (the
  // destructor waits for it). The CDI specs stay on disk (see CdiSpecFile): containers that
  // restart while we are away resolve their cached CDI names from them.
  sinks_.Stop();
  // Cancels the labeller's and the recorder's request in flight (their stop hooks), then joins.
  // After everything that records has stopped; what is still queued is dropped.
  api_sinks_.Stop();
  if (node_labeler_ != nullptr) node_labeler_->Stop();
  if (node_events_ != nullptr) node_events_->Stop();
}

void Daemon::RecordEvent(NodeEvent event) {
  if (node_events_ != nullptr) node_events_->Record(std::move(event));
}

namespace {

// The word for a resource's devices in an Event's reason ("EdgeTPUUnhealthy").
std::string EventNoun(const std::string& resource) {
  if (resource == kResourceEdgeTpu) return "EdgeTPU";
  if (resource == kResourceNvidiaGpu) return "GPU";
  return "Device";
}

}  // namespace

void Daemon::RecordHealthEvents(Resource* resource, const Snapshot& snapshot) {
  const std::string noun = EventNoun(resource->set->resource_name());
  std::map<std::string, std::pair<Health, std::string>> now;
  for (const Device& device : snapshot.devices) {
    if (!device.replica_of.empty()) continue;  // a replica's health is its device's
    now[device.id] = {device.health, device.unhealthy_reason};
  }
  std::vector<NodeEvent> events;
  {
    absl::MutexLock lock(&resource->events_mu);
    const bool first = !resource->events_seen_any;
    resource->events_seen_any = true;
    for (const auto& [id, health] : now) {
      auto before = resource->events_health.find(id);
      const bool was_healthy = before == resource->events_health.end()
                                   ? true
                                   : before->second.first == Health::kHealthy;
      if (health.first != Health::kHealthy &&
          (was_healthy || before->second.second != health.second)) {
        events.push_back({true, noun + "Unhealthy", absl::StrCat(id, ": ", health.second)});
      } else if (health.first == Health::kHealthy && !was_healthy) {
        events.push_back({false, noun + "Healthy", absl::StrCat(id, ": healthy again")});
      }
    }
    if (!first) {
      for (const auto& [id, health] : resource->events_health) {
        if (!now.count(id)) {
          events.push_back({true, noun + "Removed",
                            absl::StrCat(id, ": no longer found on the node (unplugged, or its "
                                             "driver unloaded); ",
                                         resource->set->resource_name(), " drops by one")});
        }
      }
    }
    resource->events_health = std::move(now);
  }
  for (NodeEvent& event : events) RecordEvent(std::move(event));
}

void Daemon::ScanOnce() {
  watcher_.ScanAll();
  RefreshHolds();
  // A discrete GPU started NVML's helper: what it says belongs in the report too.
  if (nvml_ != nullptr && nvml_->started()) {
    nvml_->WaitSettled(config_.nvml_timeout + absl::Seconds(1));
    watcher_.ScanAll();
  }
}

bool Daemon::RefreshHolds() {
  // Which devices each set has, by physical id.
  auto present = [](const DeviceSet& set) {
    std::set<std::string> ids;
    for (const Device& device : set.Current()->devices) ids.insert(PhysicalId(device));
    return ids;
  };
  bool any = false;
  // A DRA driver's devices that device-plugin pods hold, as the kubelet says (its pod-resources
  // API: the device manager's allocations; a DRA claim is not listed there by default). Asked
  // only where the device manager knows a resource of a DRA family (its checkpoint names it: the
  // node served it through a device plugin); elsewhere no such pod can exist, and no gRPC client
  // is made at start (it would leave gRPC an executor thread more).
  bool device_plugin_resource_known = false;
  if (!dra_drivers_.empty()) {
    absl::StatusOr<KubeletCheckpoint> checkpoint =
        ReadKubeletCheckpoint(absl::StrCat(config_.device_plugin_dir, "/", kKubeletCheckpointName));
    device_plugin_resource_known =
        checkpoint.ok() &&
        std::any_of(config_.dra_families.begin(), config_.dra_families.end(), [&](const std::string& family) {
          const std::string& resource = KnownFamilies().at(family);
          return checkpoint->registered_devices.count(resource) > 0 ||
                 std::any_of(checkpoint->entries.begin(), checkpoint->entries.end(),
                             [&](const KubeletCheckpoint::Entry& e) { return e.resource_name == resource; });
        });
  }
  if (device_plugin_resource_known) {
    const std::string socket = absl::StrCat(config_.kubelet_root, "/", kPodResourcesSocket);
    absl::StatusOr<KubeletHoldings> holdings = AskPodResources(socket, absl::Seconds(2));
    {
      absl::MutexLock lock(&mu_);
      const std::string error(holdings.status().message());
      if (!holdings.ok() && error != holds_error_) {
        LOG(WARNING) << "cannot ask the kubelet which devices device-plugin pods hold (" << error
                     << "): a device such a pod still uses could be published through DRA; mount "
                     << config_.kubelet_root << "/pod-resources (the manifests do)";
      }
      holds_error_ = error;
    }
    for (auto& driver : dra_drivers_) {
      const std::string& name = driver->set->resource_name();
      if (!holdings.ok()) {  // the kubelet restarting: what was held stays held
        any = any || driver->holds_known;
        continue;
      }
      const std::set<std::string> ids = present(*driver->set);
      std::map<std::string, DeviceSet::Holder> held;
      for (const std::string& family : config_.dra_families) {
        if (DraDriverForFamily(family) != name) continue;
        const std::string& resource = KnownFamilies().at(family);
        auto holders = holdings->holders.find(resource);
        if (holders == holdings->holders.end()) continue;
        for (const auto& [id, pod] : holders->second) {
          const std::string physical = PhysicalIdOf(id);
          if (ids.count(physical) == 0) continue;
          held[physical] = {pod.name, absl::StrCat("pod ", pod.namespace_name,
                                                   pod.namespace_name.empty() ? "" : "/", pod.name,
                                                   " (", resource, ", device plugin)")};
        }
      }
      driver->holds_known = !held.empty();
      any = any || !held.empty();
      driver->set->SetHeldElsewhere(std::move(held));
    }
  }
  // A device-plugin resource's devices that prepared DRA claims hold: the checkpoint of each DRA
  // driver of its families (ours: <kubelet-root>/plugins/<driver>/checkpoint.json), where the
  // daemon can read it.
  for (auto& resource : resources_) {
    const std::set<std::string> ids = present(*resource->set);
    std::map<std::string, DeviceSet::Holder> held;
    std::set<std::string> drivers;
    for (const auto& [family, family_resource] : KnownFamilies()) {
      if (family_resource == resource->set->resource_name()) drivers.insert(DraDriverForFamily(family));
    }
    for (const std::string& driver : drivers) {
      // None, or unreadable: the driver's own start keeps an unreadable one aside and says so.
      absl::StatusOr<std::map<std::string, PreparedClaim>> claims =
          ReadPreparedClaims(DraPluginDir(config_.kubelet_root, driver), driver);
      if (!claims.ok()) continue;
      for (const auto& [uid, claim] : *claims) {
        for (const PreparedDevice& device : claim.devices) {
          if (ids.count(device.physical_id) == 0) continue;
          held[device.physical_id] = {claim.claim.name,
                                      absl::StrCat("ResourceClaim ", claim.claim.namespace_name, "/",
                                                   claim.claim.name, " (", driver, ", DRA)")};
        }
      }
    }
    any = any || !held.empty();
    resource->set->SetHeldElsewhere(std::move(held));
  }
  return any;
}

void Daemon::PostHolds() {
  // While a device is held: its holder ends when its pod does, which neither the kubelet nor a
  // file tells; looked at every 10 s until nothing is held, then never again (nothing new can be
  // held: a family goes one way only).
  sinks_.PostRetrying("holds", [this] { return RefreshHolds() ? Workers::Outcome::kRetry : Workers::Outcome::kDone; },
                      {.first = absl::Seconds(10), .max = absl::Seconds(10)});
}

pid_t Daemon::NvmlHelperPid() const { return nvml_ != nullptr ? nvml_->helper_pid() : -1; }

std::string Daemon::Describe() const {
  std::string out;
  LabelSet labels = Labels();
  absl::StrAppend(&out, "node labels:", labels.empty() ? " (none)" : "", "\n");
  for (const auto& [key, value] : labels) absl::StrAppend(&out, "  ", key, "=", value, "\n");
  for (const auto& resource : resources_) {
    std::shared_ptr<const Snapshot> snapshot = resource->set->Current();
    const std::string& name = resource->set->resource_name();
    absl::StrAppendFormat(&out, "%s: %d device(s), %d healthy\n", name, snapshot->devices.size(),
                          snapshot->HealthyCount());
    if (!snapshot->devices.empty()) {
      const ArbiterDecision decision = resource->registrar->LookNow();
      switch (decision.verdict) {
        case ArbiterDecision::kServe:
          absl::StrAppend(&out, "  registration: edgeaccel serves ", name,
                          decision.why.empty() ? "" : absl::StrCat(" (", decision.why, ")"),
                          "\n");
          break;
        case ArbiterDecision::kWait:
          absl::StrAppend(&out, "  registration: waiting: ", decision.why, "\n");
          break;
        case ArbiterDecision::kLeave:
        case ArbiterDecision::kStepBack:
          if (decision.to_edgeaccel) {
            absl::StrAppend(&out, "  registration: served by the edgeaccel-device-plugin already "
                                  "running on this node (",
                            decision.to, ")\n");
            break;
          }
          absl::StrAppend(&out, "  registration: left to ", decision.to, ": ", decision.why,
                          " (--take-over=", name, " to take it)\n");
          break;
      }
      const std::string source = resource->registrar->holdings_source();
      if (!source.empty()) {
        absl::StrAppend(&out, "  what the kubelet holds comes from its ", source, "\n");
      }
    }
    if (snapshot->devices.empty()) {
      for (const auto& discoverer : resource->discoverers) {
        absl::StrAppend(&out, "  ", discoverer->NothingFoundHint(), "\n");
      }
    }
    for (const auto& discoverer : resource->discoverers) {
      for (const std::string& remark : discoverer->Remarks()) {
        absl::StrAppend(&out, "  ", remark, "\n");
      }
    }
    for (const Device& device : snapshot->devices) DescribeDevice(device, &out);
  }
  for (const auto& driver : dra_drivers_) {
    std::shared_ptr<const Snapshot> snapshot = driver->set->Current();
    std::vector<std::string> notes;
    const nlohmann::json published =
        SliceDevices(*snapshot, &notes, UnhealthyDevices::kTainted, DraSharing());
    std::vector<std::string> families;
    for (const auto& discoverer : driver->discoverers) families.push_back(discoverer->Family());
    absl::StrAppendFormat(&out, "%s (DRA driver, from %s): %d device(s), %d healthy, %d in the ResourceSlice\n",
                          driver->set->resource_name(), absl::StrJoin(families, ", "),
                          snapshot->devices.size(), snapshot->HealthyCount(), published.size());
    absl::StrAppend(&out, "  pool ", config_.node_name.empty() ? "(no --node-name)" : config_.node_name,
                    "; not offered through the device plugin API\n");
    if (driver->publisher != nullptr) {
      const SlicePublisher::Status status = driver->publisher->status();
      absl::StrAppend(&out, "  ResourceSlice ", status.slice_name.empty() ? "(none yet)" : status.slice_name,
                      ", generation ", status.generation,
                      status.last_error.empty() ? "" : absl::StrCat(", last error: ", status.last_error), "\n");
    }
    if (driver->preparer != nullptr) {
      for (const PreparedClaim& claim : driver->preparer->Prepared()) {
        absl::StrAppend(&out, "  prepared claim ", claim.claim.namespace_name, "/", claim.claim.name,
                        " (", claim.claim.uid, "): ",
                        absl::StrJoin(claim.devices, ", ", [](std::string* o, const PreparedDevice& d) {
                          absl::StrAppend(o, d.device, d.share_id.empty() ? "" : " (share ",
                                          d.share_id, d.share_id.empty() ? "" : ")");
                        }), "\n");
      }
    }
    for (const std::string& note : notes) absl::StrAppend(&out, "  ", note, "\n");
    if (snapshot->devices.empty()) {
      for (const auto& discoverer : driver->discoverers) {
        absl::StrAppend(&out, "  ", discoverer->NothingFoundHint(), "\n");
      }
    }
    for (const auto& discoverer : driver->discoverers) {
      for (const std::string& remark : discoverer->Remarks()) absl::StrAppend(&out, "  ", remark, "\n");
    }
    for (const Device& device : snapshot->devices) {
      DescribeDevice(device, &out);
      // What the slice holds for it (computed once, above, for the whole slice).
      const std::string name = DraDeviceName(device);
      const nlohmann::json* published_entry = nullptr;
      for (const nlohmann::json& candidate : published) {
        if (candidate["name"] == name) published_entry = &candidate;
      }
      if (published_entry == nullptr) {
        absl::StrAppend(&out, "    DRA device: ", name, ", not in the ResourceSlice (see above)\n");
        continue;
      }
      const nlohmann::json& entry = *published_entry;
      absl::StrAppend(&out, "    DRA device: ", name, "\n");
      for (const auto& [key, value] : entry["attributes"].items()) {
        absl::StrAppend(&out, "      attribute ", key, ": ", value.begin().value().dump(), " (",
                        value.begin().key(), ")\n");
      }
      if (entry.contains("capacity")) {
        for (const auto& [key, value] : entry["capacity"].items()) {
          absl::StrAppend(&out, "      capacity ", key, ": ", value["value"].get<std::string>(),
                          value.contains("requestPolicy")
                              ? absl::StrCat(" (a claim takes ", value["requestPolicy"]["default"].get<std::string>(),
                                             " unless it asks for less)")
                              : "",
                          "\n");
        }
      }
      if (entry.value("allowMultipleAllocations", false)) {
        absl::StrAppend(&out, "      shared (--dra-shared): several claims may hold it at once\n");
      }
      for (const nlohmann::json& taint : entry.value("taints", nlohmann::json::array())) {
        absl::StrAppend(&out, "      taint ", taint.value("key", ""), "=", taint.value("value", ""), ":",
                        taint.value("effect", ""), " (a claim that does not tolerate it is not given the device)\n");
      }
    }
  }
  return out;
}

void Daemon::DescribeDevice(const Device& device, std::string* out_ptr) {
  std::string& out = *out_ptr;
  {
    {
      absl::StrAppendFormat(&out, "  %s  %s", device.id, HealthName(device.health));
      if (!device.unhealthy_reason.empty()) absl::StrAppend(&out, " (", device.unhealthy_reason, ")");
      absl::StrAppend(&out, "\n    numa node: ",
                      device.numa_node.has_value() ? absl::StrCat(*device.numa_node) : "unknown",
                      "\n");
      for (const DeviceNode& node : device.nodes) {
        absl::StrAppendFormat(&out, "    device node: %s -> %s (%s)\n", node.host_path,
                              node.container_path, node.permissions);
      }
      for (const auto& [key, value] : device.envs) {
        absl::StrAppendFormat(&out, "    env: %s=%s\n", key, value);
      }
      for (const auto& [key, value] : device.facts) {
        absl::StrAppendFormat(&out, "    %s: %s\n", key, value);
      }
      for (const auto& [key, value] : device.telemetry) {
        absl::StrAppendFormat(&out, "    %s: %.2f\n", key, value);
      }
    }
  }
}

}  // namespace edgeaccel
