// Device: what discovery found, and everything Allocate and ListAndWatch answer from.
#ifndef EDGEACCEL_DISCOVERY_DEVICE_H_
#define EDGEACCEL_DISCOVERY_DEVICE_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace edgeaccel {

class Host;

enum class Health { kHealthy, kUnhealthy };

// What kind of problem makes a device Unhealthy, for consumers that must say it in a structured
// form rather than as text (the DRA driver's device taints: one key per kind). kOther is a
// problem with no kind of its own yet (a stale device node, firmware not loaded).
enum class ProblemKind {
  kOther,
  kDeviceNodeMissing,  // the device node is not there (the device is gone)
  kDriverStatus,       // the kernel driver says the device is not usable (may recover)
  kTemperature,        // over its temperature threshold (recovers when it cools)
  kNvmlXid,            // NVML reported a critical Xid error
  kNvmlUnresponsive,   // NVML does not answer for it, or cannot watch it for Xid errors
  // Given out through the other API: a device-plugin pod holds it while a DRA driver publishes
  // it, or a prepared DRA claim while the device plugin serves it (a node moved between the two).
  // Not a fault of the device: it is left out of what can be allocated until the holder ends.
  kHeldElsewhere,
};

// One problem of an Unhealthy device: its kind and a short detail that fits a Kubernetes label
// value (at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric), e.g. the
// driver status "DEAD", the node "apex_0", the Xid "79"; the text is in unhealthy_reason.
struct HealthProblem {
  ProblemKind kind = ProblemKind::kOther;
  std::string detail;

  bool operator==(const HealthProblem& other) const {
    return kind == other.kind && detail == other.detail;
  }
  bool operator!=(const HealthProblem& other) const { return !(*this == other); }
};

// The names the kubelet expects in ListAndWatch (v1beta1 Healthy / Unhealthy).
inline constexpr absl::string_view kHealthy = "Healthy";
inline constexpr absl::string_view kUnhealthy = "Unhealthy";

// "Healthy" / "Unhealthy", as the kubelet expects them.
absl::string_view HealthName(Health health);

// The mode bits and owner of a device node on the host, as stat(2) gives them.
struct HostNodeMode {
  mode_t permissions = 0;  // st_mode & 0777
  uid_t uid = 0;
  gid_t gid = 0;

  bool operator==(const HostNodeMode& other) const {
    return permissions == other.permissions && uid == other.uid && gid == other.gid;
  }
  bool operator!=(const HostNodeMode& other) const { return !(*this == other); }
};

// A device node a container needs. host_path is the path on the host (never under
// --host-root), which is what the container runtime opens.
struct DeviceNode {
  std::string host_path;
  std::string container_path;
  std::string permissions;  // any of "r", "w", "m"
  // The host node's mode and owner, looked up (under --host-root) each time the device set is
  // published (HostWatcher), so a chmod or chown by udev after the node appears is seen too.
  // The CDI spec hands them to the runtime, which otherwise makes the node with its own
  // defaults (crw-rw-rw- on containerd 2.1.9, where the host node is crw-rw----). Unset when it
  // could not be stat'ed; host_stat_error then says why (not compared: it changes nothing).
  std::optional<HostNodeMode> host_mode = std::nullopt;
  std::string host_stat_error = {};

  bool operator==(const DeviceNode& other) const {
    return host_path == other.host_path && container_path == other.container_path &&
           permissions == other.permissions && host_mode == other.host_mode;
  }
  bool operator!=(const DeviceNode& other) const { return !(*this == other); }
};

// A host file or directory a container needs besides its device nodes (the driver's user-space
// libraries), bind-mounted read-only. host_path is the path on the host (never under
// --host-root), which is what the runtime mounts; for a file, the file itself, symlinks resolved.
struct Mount {
  std::string host_path;
  std::string container_path;

  bool operator==(const Mount& other) const {
    return host_path == other.host_path && container_path == other.container_path;
  }
  bool operator!=(const Mount& other) const { return !(*this == other); }
};

// The CDI mount options of every Mount: read-only, and no set-uid programs or device nodes
// through it (what a library directory never needs).
inline constexpr absl::string_view kMountOptions[] = {"ro", "nosuid", "nodev", "bind"};

struct Device {
  // Stable id: PCI address, USB port path or driver index; always built from kernel-provided
  // names, never from a user-controlled string.
  std::string id;
  Health health = Health::kHealthy;
  // Why the device is Unhealthy, for logs and --discover ("device node /dev/apex_0 is missing").
  std::string unhealthy_reason;
  // The same problems, kind and detail, for those a discoverer can classify (empty when Healthy).
  // Set beside the text where the problem is found, so nothing parses unhealthy_reason.
  std::vector<HealthProblem> problems;
  std::optional<int> numa_node;
  std::vector<DeviceNode> nodes;
  // Read-only mounts a container using this device needs (the driver's libraries, so that a
  // runtime without a vendor hook runs CUDA). Allocate and the CDI specs give each host path once.
  std::vector<Mount> mounts;
  // Environment a container using this device needs (NVIDIA_VISIBLE_DEVICES, LD_LIBRARY_PATH).
  // When several devices set the same variable, Allocate joins their distinct values with ","
  // (":" for a search path, a variable whose name ends in PATH).
  std::map<std::string, std::string> envs;
  // For a time-sliced replica ("<id>::<n>"): the physical device's id. Empty for a physical one.
  std::string replica_of;
  // Facts for humans, labels and DRA slices (pci_address, driver_version, memory_mib, ...): what
  // describes the device, stable from scan to scan unless the device or its driver changed (the
  // one exception, kTemperatureFact, is a reading). Ordered for stable output.
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

// Sets each device node's host_mode from stat(2) of its host path inside `host`'s root (symlinks
// followed), or its host_stat_error when that fails.
void LookUpHostModes(const Host& host, std::vector<Device>* devices);

// The one fact that is a reading, not a description: coral-pcie's temperature as --discover
// shows it ("45.05 °C", or why it is unknown). It changes on its own between scans, so
// FactsDiffer passes over it; its number is also in telemetry, for /metrics.
inline constexpr absl::string_view kTemperatureFact = "temperature";

// True when the facts that describe the devices differ (every fact but kTemperatureFact), or
// their classified problems do: what labels and DRA slices (device taints) are made of changed
// (NVML's answer arriving, a driver upgrade, an Unhealthy device's problem changing kind).
bool FactsDiffer(const Device& a, const Device& b);

// True when the kubelet-visible parts differ: id, health, topology, device nodes (including
// the host node's mode and owner, which the CDI spec carries: a change must rewrite it), mounts
// and envs (what Allocate and the CDI spec hand a container). Facts
// and telemetry changes are not worth a ListAndWatch message (FactsDiffer tells facts apart).
bool AdvertisementDiffers(const Device& a, const Device& b);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_DEVICE_H_
