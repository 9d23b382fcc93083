#include "edgeaccel/daemon.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "edgeaccel/coral.h"
#include "glog/logging.h"

namespace edgeaccel {

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

  auto coral = std::make_unique<Resource>();
  coral->discoverers.push_back(std::make_unique<CoralPcieDiscoverer>(&host_, coral_policy));
  coral->set = std::make_unique<DeviceSet>(coral->discoverers.front()->ResourceName());
  resources_.push_back(std::move(coral));

  for (auto& resource : resources_) {
    for (auto& discoverer : resource->discoverers) watcher_.Add(discoverer.get(), resource->set.get());
    ResourceRegistrar::Options options;
    options.kubelet_root = config_.kubelet_root;
    options.mode = config_.registration;
    options.register_timeout = config_.register_timeout;
    resource->registrar = std::make_unique<ResourceRegistrar>(options, resource->set.get());
  }
}

Daemon::~Daemon() { Stop(); }

absl::Status Daemon::Start() {
  // Registrars start when a resource first has devices, from whichever thread sees that.
  for (auto& resource : resources_) {
    Resource* r = resource.get();
    r->listener = r->set->Subscribe([this, r](std::shared_ptr<const Snapshot> snapshot) {
      if (!snapshot->devices.empty()) StartRegistrar(r);
    });
  }
  absl::Status status = watcher_.Start();
  if (!status.ok()) return status;
  for (auto& resource : resources_) {
    if (!resource->set->Current()->devices.empty()) StartRegistrar(resource.get());
  }
  return absl::OkStatus();
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
  watcher_.Stop();
  for (auto& resource : resources_) resource->registrar->Stop();
}

void Daemon::ScanOnce() { watcher_.ScanAll(); }

DeviceSet* Daemon::device_set(absl::string_view name) const {
  for (const auto& resource : resources_) {
    if (resource->set->resource_name() == name) return resource->set.get();
  }
  return nullptr;
}

ResourceRegistrar* Daemon::registrar(absl::string_view name) const {
  for (const auto& resource : resources_) {
    if (resource->set->resource_name() == name) return resource->registrar.get();
  }
  return nullptr;
}

std::string Daemon::Describe() const {
  std::string out;
  for (const auto& resource : resources_) {
    std::shared_ptr<const Snapshot> snapshot = resource->set->Current();
    absl::StrAppendFormat(&out, "%s: %d device(s), %d healthy\n", resource->set->resource_name(),
                          snapshot->devices.size(), snapshot->HealthyCount());
    if (snapshot->devices.empty()) {
      for (const auto& discoverer : resource->discoverers) {
        absl::StrAppend(&out, "  ", discoverer->NothingFoundHint(), "\n");
      }
    }
    for (const Device& device : snapshot->devices) {
      absl::StrAppendFormat(&out, "  %s  %s", device.id, HealthName(device.health));
      if (!device.unhealthy_reason.empty()) absl::StrAppend(&out, " (", device.unhealthy_reason, ")");
      absl::StrAppend(&out, "\n    numa node: ",
                      device.numa_node.has_value() ? absl::StrCat(*device.numa_node) : "unknown",
                      "\n");
      for (const DeviceNode& node : device.nodes) {
        absl::StrAppendFormat(&out, "    device node: %s -> %s (%s)\n", node.host_path,
                              node.container_path, node.permissions);
      }
      for (const auto& [key, value] : device.facts) {
        absl::StrAppendFormat(&out, "    %s: %s\n", key, value);
      }
      for (const auto& [key, value] : device.telemetry) {
        absl::StrAppendFormat(&out, "    %s: %.2f\n", key, value);
      }
    }
  }
  return out;
}

}  // namespace edgeaccel
