// What the driver publishes: the ResourceSlice (resource.k8s.io/v1) of its pool on this node,
// built from the device set. Attributes and capacities come from discovery's facts; the names
// and types are in docs/dra.md. Only Healthy physical devices are published: the scheduler must
// not allocate one that is unplugged or failing.
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
inline constexpr size_t kMaxAttributesAndCapacities = 32;
inline constexpr size_t kMaxAttributeValueLength = 64;

// One device of the slice: {"name", "attributes", "capacity"}. `notes` gets a line for each
// fact left out because DRA cannot carry it (a version that is not semantic, a string too long).
nlohmann::json SliceDevice(const Device& device, std::vector<std::string>* notes);

// spec.devices for `snapshot`: the Healthy physical devices, sorted by name (so an unchanged
// set gives an identical list and no write), at most kResourceSliceMaxDevices.
nlohmann::json SliceDevices(const Snapshot& snapshot, std::vector<std::string>* notes);

// The whole object to create: generateName "<node>-<driver>-", an ownerReference to the Node
// (when its UID is known) so the slice goes with it, one pool named after the node.
nlohmann::json ResourceSliceObject(absl::string_view driver, absl::string_view node_name,
                                   absl::string_view node_uid, int64_t generation,
                                   const nlohmann::json& devices);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_RESOURCE_SLICE_H_
