// Device: what discovery found, and everything Allocate and ListAndWatch answer from.
#ifndef EDGEACCEL_DISCOVERY_DEVICE_H_
#define EDGEACCEL_DISCOVERY_DEVICE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace edgeaccel {

enum class Health { kHealthy, kUnhealthy };

// The names the kubelet expects in ListAndWatch (v1beta1 Healthy / Unhealthy).
inline constexpr absl::string_view kHealthy = "Healthy";
inline constexpr absl::string_view kUnhealthy = "Unhealthy";

// "Healthy" / "Unhealthy", as the kubelet expects them.
absl::string_view HealthName(Health health);

// A device node a container needs. host_path is the path on the host (never under
// --host-root), which is what the container runtime opens.
struct DeviceNode {
  std::string host_path;
  std::string container_path;
  std::string permissions;  // any of "r", "w", "m"

  bool operator==(const DeviceNode& other) const {
    return host_path == other.host_path && container_path == other.container_path &&
           permissions == other.permissions;
  }
};

struct Device {
  // Stable id: PCI address, USB port path or driver index; always built from kernel-provided
  // names, never from a user-controlled string.
  std::string id;
  Health health = Health::kHealthy;
  // Why the device is Unhealthy, for logs and --discover ("device node /dev/apex_0 is missing").
  std::string unhealthy_reason;
  std::optional<int> numa_node;
  std::vector<DeviceNode> nodes;
  // Environment a container using this device needs (e.g. NVIDIA_VISIBLE_DEVICES). When several
  // devices set the same variable, Allocate joins their distinct values with ",".
  std::map<std::string, std::string> envs;
  // For a time-sliced replica ("<id>::<n>"): the physical device's id. Empty for a physical one.
  std::string replica_of;
  // Facts for humans and labels (pci_address, driver_version, ...). Ordered for stable output.
  std::map<std::string, std::string> facts;
  // Readings that change all the time (temperature); never part of what the kubelet sees.
  std::map<std::string, double> telemetry;
};

// Sets the device Unhealthy with every problem found, joined with "; ", or leaves it Healthy
// when there is none.
void SetHealthFromProblems(const std::vector<std::string>& problems, Device* device);

// The physical device behind `device` (itself, or what it is a replica of).
inline const std::string& PhysicalId(const Device& device) {
  return device.replica_of.empty() ? device.id : device.replica_of;
}

// True when the kubelet-visible parts differ: id, health, topology or device nodes. Facts and
// telemetry changes are not worth a ListAndWatch message.
bool AdvertisementDiffers(const Device& a, const Device& b);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_DEVICE_H_
