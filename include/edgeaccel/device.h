// Device: what discovery found, and everything Allocate and ListAndWatch answer from.
#ifndef EDGEACCEL_DEVICE_H_
#define EDGEACCEL_DEVICE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace edgeaccel {

enum class Health { kHealthy, kUnhealthy };

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
  // Facts for humans and labels (pci_address, driver_version, ...). Ordered for stable output.
  std::map<std::string, std::string> facts;
  // Readings that change all the time (temperature); never part of what the kubelet sees.
  std::map<std::string, double> telemetry;
};

// True when the kubelet-visible parts differ: id, health, topology or device nodes. Facts and
// telemetry changes are not worth a ListAndWatch message.
bool AdvertisementDiffers(const Device& a, const Device& b);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DEVICE_H_
