// DeviceSet: the current devices of one resource, as an immutable versioned snapshot.
//
// Discovery writes it; the plugin service, labels, DRA slices and metrics read it. Readers never
// block writers for longer than a pointer swap. Listeners are told about every change to what the
// kubelet sees (ids, health, topology, nodes) and, where they ask for it, about a change of the
// devices' facts alone (NVML answering after the first scan), which the kubelet never sees.
#ifndef EDGEACCEL_INVENTORY_DEVICE_SET_H_
#define EDGEACCEL_INVENTORY_DEVICE_SET_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/discovery/device.h"

namespace edgeaccel {

struct Snapshot {
  // Increases whenever the kubelet-visible device list changes; starts at 1. A change of facts
  // or telemetry alone publishes a new snapshot under the same version.
  uint64_t version = 0;
  std::vector<Device> devices;  // sorted by id

  const Device* Find(absl::string_view id) const;
  int HealthyCount() const;
};

class DeviceSet {
 public:
  using Listener = std::function<void(std::shared_ptr<const Snapshot>)>;

  // Which changes a listener is told of.
  enum class Changes {
    // What the kubelet sees (AdvertisementDiffers, devices coming or going): each such change
    // raises the version. For ListAndWatch, the DRA health stream, CDI specs, registration and
    // health Events: a change of facts alone must not send the kubelet a new list.
    kAdvertised,
    // Those, and a change of the devices' facts alone (FactsDiffer), under the same version. For
    // what describes the devices: node labels (NFD file, Node, --seed-labels), DRA slices.
    kAdvertisedOrFacts,
  };

  explicit DeviceSet(std::string resource_name);

  const std::string& resource_name() const { return resource_name_; }

  // Replaces the device list. Returns true when what the kubelet sees changed (the version went
  // up), and tells every listener; when only facts changed, tells only the kAdvertisedOrFacts
  // listeners; telemetry alone is updated silently. Logs every device that appears, disappears
  // or changes health, with the reason.
  bool Update(std::vector<Device> devices);

  // Who holds a device through the other API.
  struct Holder {
    std::string name;  // the pod's or ResourceClaim's name: the problem's detail
    std::string description;  // "pod default/infer-0 (coral.ai/edgetpu, device plugin)"
    bool operator==(const Holder& other) const {
      return name == other.name && description == other.description;
    }
  };
  // Devices that the other API has given out, by physical id, each with who holds it. Each such
  // device is published Unhealthy ("held by <description>") with a ProblemKind::kHeldElsewhere
  // problem whose detail is the holder's name (a DNS subdomain; DRA cuts it to a taint value),
  // whatever discovery says, until it is no longer held: so neither API hands a device to a
  // second pod while a node moves between them. Replaces the last list; the devices are published
  // again (and the listeners told) when that changes them.
  void SetHeldElsewhere(std::map<std::string, Holder> held);

  std::shared_ptr<const Snapshot> Current() const;

  // Listeners run on the thread that called Update, without any DeviceSet lock held, so they
  // may call back into the set. A listener may still be running, or run once, after Unsubscribe
  // returns: what it reaches must stay valid until the owner has closed that way in (a weak_ptr
  // is not enough where locking it keeps an object whose owner is being destroyed; see the
  // ListAndWatch stream's gate in device_plugin_service.cc).
  uint64_t Subscribe(Listener listener, Changes changes = Changes::kAdvertised);
  void Unsubscribe(uint64_t id);

 private:
  using Listeners = std::vector<std::shared_ptr<Listener>>;
  // The devices with the held ones marked, published; `to_notify` gets the listeners to tell.
  bool Publish(std::vector<Device> devices, Listeners* to_notify) ABSL_EXCLUSIVE_LOCKS_REQUIRED(publish_mu_);
  // Tells `listeners` of the newest snapshot, with no lock of the set held.
  void Notify(const Listeners& listeners) ABSL_LOCKS_EXCLUDED(publish_mu_, mu_);

  const std::string resource_name_;
  // Held while an Update or SetHeldElsewhere computes and swaps the snapshot (not while the
  // listeners run), so the two publish in order.
  absl::Mutex publish_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<Device> discovered_ ABSL_GUARDED_BY(publish_mu_);  // the last Update's list
  bool updated_ ABSL_GUARDED_BY(publish_mu_) = false;
  std::map<std::string, Holder> held_ ABSL_GUARDED_BY(publish_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> current_ ABSL_GUARDED_BY(mu_);
  uint64_t next_listener_id_ ABSL_GUARDED_BY(mu_) = 1;
  struct Subscription {
    Changes changes;
    std::shared_ptr<Listener> listener;
  };
  absl::flat_hash_map<uint64_t, Subscription> listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_INVENTORY_DEVICE_SET_H_
