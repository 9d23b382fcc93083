// Time-slicing (--replicas): several pods share one physical device, each holding a replica.
#ifndef EDGEACCEL_INVENTORY_REPLICAS_H_
#define EDGEACCEL_INVENTORY_REPLICAS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "edgeaccel/discovery/device.h"

namespace edgeaccel {

// `replicas` copies of every device, ids "<id>::0" .. "<id>::<replicas-1>", sharing the physical
// device's nodes, envs and health. replicas <= 1 returns `devices` as is.
std::vector<Device> ExpandReplicas(std::vector<Device> devices, int replicas);

// The physical device an advertised id stands for: "GPU-a::3" -> "GPU-a", "GPU-a" -> "GPU-a".
// For ids that come as strings (from the kubelet, or another plugin), not as Devices.
std::string PhysicalIdOf(absl::string_view advertised_id);

}  // namespace edgeaccel

#endif  // EDGEACCEL_INVENTORY_REPLICAS_H_
