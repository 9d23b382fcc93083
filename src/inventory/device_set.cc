#include "edgeaccel/inventory/device_set.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace edgeaccel {

const Device* Snapshot::Find(absl::string_view id) const {
  auto it = std::lower_bound(devices.begin(), devices.end(), id,
                             [](const Device& d, absl::string_view key) { return d.id < key; });
  if (it == devices.end() || it->id != id) return nullptr;
  return &*it;
}

int Snapshot::HealthyCount() const {
  return static_cast<int>(std::count_if(devices.begin(), devices.end(), [](const Device& d) {
    return d.health == Health::kHealthy;
  }));
}

DeviceSet::DeviceSet(std::string resource_name)
    : resource_name_(std::move(resource_name)), current_(std::make_shared<Snapshot>()) {}

bool DeviceSet::Update(std::vector<Device> devices) {
  Listeners to_notify;
  bool changed;
  {
    absl::MutexLock publish(&publish_mu_);
    discovered_ = devices;
    updated_ = true;
    changed = Publish(std::move(devices), &to_notify);
  }
  Notify(to_notify);
  return changed;
}

void DeviceSet::Notify(const Listeners& listeners) {
  // Outside every lock of the set. Two publishers (the host watcher, SetHeldElsewhere) may
  // notify at once: each hands over the newest snapshot, so no listener is left with an older
  // one than the last published.
  if (listeners.empty()) return;
  const std::shared_ptr<const Snapshot> newest = Current();
  for (const auto& listener : listeners) (*listener)(newest);
}

void DeviceSet::SetHeldElsewhere(std::map<std::string, Holder> held) {
  Listeners to_notify;
  {
    absl::MutexLock publish(&publish_mu_);
    if (held == held_) return;
    for (const auto& [id, holder] : held) {
      if (held_.count(id) == 0) {
        LOG(INFO) << resource_name_ << ": device " << id << " is held by " << holder.description;
      }
    }
    for (const auto& [id, holder] : held_) {
      if (held.count(id) == 0) {
        LOG(INFO) << resource_name_ << ": device " << id << " is no longer held by " << holder.description;
      }
    }
    held_ = std::move(held);
    if (updated_) Publish(discovered_, &to_notify);
  }
  Notify(to_notify);
}

bool DeviceSet::Publish(std::vector<Device> devices, Listeners* to_notify) {
  for (Device& device : devices) {
    auto held = held_.find(PhysicalId(device));
    if (held == held_.end()) continue;
    device.health = Health::kUnhealthy;
    const std::string reason = absl::StrCat("held by ", held->second.description);
    device.unhealthy_reason = device.unhealthy_reason.empty()
                                  ? reason
                                  : absl::StrCat(device.unhealthy_reason, "; ", reason);
    device.problems.push_back({ProblemKind::kHeldElsewhere, held->second.name});
  }
  std::sort(devices.begin(), devices.end(),
            [](const Device& a, const Device& b) { return a.id < b.id; });
  // Two discoverers of one resource could in principle report the same id: keep the first.
  devices.erase(std::unique(devices.begin(), devices.end(),
                            [](const Device& a, const Device& b) { return a.id == b.id; }),
                devices.end());

  bool changed;                // what the kubelet sees: a new version, every listener
  bool facts_changed = false;  // facts alone: the kAdvertisedOrFacts listeners
  {
    absl::MutexLock lock(&mu_);
    const Snapshot& old = *current_;
    changed = old.version == 0 || old.devices.size() != devices.size();
    // Log transitions: what happened, and why. Replicas of one device change together: one
    // line for the device ("<id> (N replicas)"), not one per replica.
    absl::flat_hash_map<std::string, int> replicas;
    for (const Device& d : devices) {
      if (!d.replica_of.empty()) replicas[d.replica_of]++;
    }
    auto loggable = [](const Device& d) {
      return d.replica_of.empty() || d.id == absl::StrCat(d.replica_of, "::0");
    };
    auto name = [&](const Device& d) {
      return d.replica_of.empty() ? d.id
                                  : absl::StrCat(d.replica_of, " (", replicas[d.replica_of], " replicas)");
    };
    absl::flat_hash_map<absl::string_view, const Device*> before;
    for (const Device& d : old.devices) before[d.id] = &d;
    for (const Device& d : devices) {
      auto it = before.find(d.id);
      if (it == before.end()) {
        changed = true;
        LOG_IF(INFO, loggable(d)) << resource_name_ << ": device " << name(d) << " found, "
                                  << HealthName(d.health) << (d.unhealthy_reason.empty() ? "" : ": ")
                                  << d.unhealthy_reason;
        continue;
      }
      const Device& was = *it->second;
      before.erase(it);
      if (AdvertisementDiffers(was, d)) changed = true;
      if (FactsDiffer(was, d)) facts_changed = true;
      if (was.health != d.health && loggable(d)) {
        if (d.health == Health::kUnhealthy) {
          LOG(WARNING) << resource_name_ << ": device " << name(d)
                       << " is now Unhealthy: " << d.unhealthy_reason;
        } else {
          LOG(INFO) << resource_name_ << ": device " << name(d) << " is Healthy again";
        }
      }
    }
    for (const auto& [id, d] : before) {
      changed = true;
      LOG_IF(WARNING, loggable(*d)) << resource_name_ << ": device "
                                    << (d->replica_of.empty() ? d->id : d->replica_of) << " is gone";
    }
    auto next = std::make_shared<Snapshot>();
    next->version = changed ? old.version + 1 : old.version;
    next->devices = std::move(devices);
    current_ = next;
    if (changed || facts_changed) {
      for (const auto& [id, subscription] : listeners_) {
        if (changed || subscription.changes == Changes::kAdvertisedOrFacts) {
          to_notify->push_back(subscription.listener);
        }
      }
    }
  }
  return changed;
}

std::shared_ptr<const Snapshot> DeviceSet::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

uint64_t DeviceSet::Subscribe(Listener listener, Changes changes) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_listener_id_++;
  listeners_[id] = Subscription{changes, std::make_shared<Listener>(std::move(listener))};
  return id;
}

void DeviceSet::Unsubscribe(uint64_t id) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(id);
}

}  // namespace edgeaccel
