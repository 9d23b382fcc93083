// What the driver publishes: the ResourceSlice (resource.k8s.io/v1) of its pool on this node,
// built from the device set. Attributes and capacities come from discovery's facts; the names
// and types are in docs/dra.md. An Unhealthy device is published with device taints (KEP-5055,
// DRADeviceTaints, beta and on in Kubernetes 1.36) saying why, so the scheduler does not
// allocate it and `kubectl get resourceslice` shows what is wrong; where the API server drops
// taints (the gate off) it is left out instead. A device that is unplugged is not there at all.
#ifndef EDGEACCEL_DRA_RESOURCE_SLICE_H_
#define EDGEACCEL_DRA_RESOURCE_SLICE_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

// ResourceSlice limits (k8s.io/api resource/v1 types.go, the same from 1.32 to 1.36).
inline constexpr size_t kResourceSliceMaxDevices = 128;
// From 1.35, a slice in which any device has taints holds at most 64 (ResourceSliceMaxDevices
// WithTaintsOrConsumesCounters, k8s.io/api resource/v1 types.go).
inline constexpr size_t kResourceSliceMaxDevicesWithTaints = 64;
inline constexpr size_t kMaxAttributesAndCapacities = 32;
inline constexpr size_t kMaxAttributeValueLength = 64;
// A taint's value is a label value (validateDeviceTaint in pkg/apis/resource/validation:
// validateLabelValue, IsValidLabelValue: at most 63 characters).
inline constexpr size_t kMaxTaintValueLength = 63;
// Taints per device: k8s.io/api resource/v1 types.go says DeviceTaintsMaxLength = 16;
// dra-facts.md §4 and the API server stand-in say 4. We never need more than 4 (one per kind, and
// a device rarely has more than two kinds at once), which both accept.
inline constexpr size_t kMaxTaintsPerDevice = 4;

// The taint keys, under our own domain, one per kind of problem (docs/dra.md).
inline constexpr char kTaintTemperature[] = "edgeaccel.io/temperature";
inline constexpr char kTaintDriverStatus[] = "edgeaccel.io/driver-status";
inline constexpr char kTaintDeviceNodeMissing[] = "edgeaccel.io/device-node-missing";
inline constexpr char kTaintNvmlXid[] = "edgeaccel.io/nvml-xid";
inline constexpr char kTaintNvmlUnresponsive[] = "edgeaccel.io/nvml-unresponsive";
// A device a device-plugin pod still holds (the node moved to DRA while it ran): NoSchedule, the
// value the pod's name; gone when the pod ends.
inline constexpr char kTaintHeldByDevicePlugin[] = "edgeaccel.io/in-use-by-device-plugin";
// A problem without a kind of its own (or an Unhealthy device without a classified problem).
inline constexpr char kTaintUnhealthy[] = "edgeaccel.io/unhealthy";

// Which GPUs several claims may share (--dra-shared): Jetsons' integrated GPUs (family tegra),
// discrete GPUs (family nvidia). An Edge TPU is never shared.
struct GpuSharing {
  bool integrated = false;
  bool discrete = false;
};
// The least memory one share of a shared GPU consumes (requestPolicy.validRange.min): a claim
// that asks for less, 0 included, is counted as this much, so it never fits beside a claim that
// holds the whole GPU.
inline constexpr char kDraMinimumShare[] = "1Mi";

// `mib` mebibytes as the API server writes the quantity (Quantity.String(): the largest binary
// suffix that keeps an integer, 3871 -> "3871Mi", 8192 -> "8Gi"), so a slice read back compares
// equal to the one written.
std::string MebibyteQuantity(int64_t mib);

// What SliceDevices does with an Unhealthy device.
enum class UnhealthyDevices {
  kTainted,   // in the slice, with a taint per kind of problem
  kLeftOut,   // not in the slice (the API server does not keep taints)
};

// `detail` made a label value: a device path loses its "/dev/", every character outside
// [A-Za-z0-9-_.] becomes '-', cut to 63, trimmed to start and end alphanumeric ("" if nothing
// is left: a taint without a value is valid).
std::string TaintValue(absl::string_view detail);

// spec.devices[].taints of an Unhealthy device: one {key, value, effect} per kind of problem
// (the first problem's detail), sorted by key, at most kMaxTaintsPerDevice; NoExecute where the
// device is gone or had a critical Xid (pods using it are evicted), NoSchedule where it may
// recover (temperature, driver status, NVML not answering, anything else). Empty when Healthy.
// No timeAdded: the API server sets it (SlicePublisher keeps the one it set).
nlohmann::json DeviceTaints(const Device& device);
// One device of the slice: {"name", "attributes", "capacity"}. `notes` gets a line for each
// fact left out because DRA cannot carry it (a version that is not semantic, a string too long).
//
// A GPU that `sharing` names is offered to several claims at once (KEP-5075, DRAConsumable
// Capacity: beta and on in Kubernetes 1.36): "allowMultipleAllocations": true, and its capacity
// `memory` is what the claims share, with a requestPolicy whose default is the whole memory and
// whose validRange.min is kDraMinimumShare. So a claim that asks for no memory takes the whole
// GPU (as an unshared one would), and claims that ask for part of it
// (`capacity.requests.memory`) share the GPU as long as their parts fit. The scheduler only
// counts: nothing on the node limits what a sharer uses. A shared GPU whose memory is not known
// (a discrete GPU without NVML) has nothing to count its shares in: it is offered unshared, with
// a note.
nlohmann::json SliceDevice(const Device& device, std::vector<std::string>* notes,
                           GpuSharing sharing = {});

// spec.devices for `snapshot`: the physical devices, sorted by name (so an unchanged set gives
// an identical list and no write), the Unhealthy ones tainted or left out as `unhealthy` says;
// at most kResourceSliceMaxDevices (64 when any device has taints, as the API server allows).
nlohmann::json SliceDevices(const Snapshot& snapshot, std::vector<std::string>* notes,
                            UnhealthyDevices unhealthy = UnhealthyDevices::kTainted,
                            GpuSharing sharing = {});

// The whole object to create: generateName "<node>-<driver>-", an ownerReference to the Node
// (when its UID is known) so the slice goes with it, one pool named after the node.
nlohmann::json ResourceSliceObject(absl::string_view driver, absl::string_view node_name,
                                   absl::string_view node_uid, int64_t generation,
                                   const nlohmann::json& devices);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_RESOURCE_SLICE_H_
