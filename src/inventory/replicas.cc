#include "edgeaccel/inventory/replicas.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace edgeaccel {

std::vector<Device> ExpandReplicas(std::vector<Device> devices, int replicas) {
  if (replicas <= 1) return devices;
  std::vector<Device> out;
  out.reserve(devices.size() * static_cast<size_t>(replicas));
  for (const Device& device : devices) {
    for (int k = 0; k < replicas; ++k) {
      Device replica = device;
      replica.id = absl::StrCat(device.id, "::", k);
      replica.replica_of = device.id;
      out.push_back(std::move(replica));
    }
  }
  return out;
}

std::string PhysicalIdOf(absl::string_view advertised_id) {
  return std::string(advertised_id.substr(0, advertised_id.rfind("::")));
}

}  // namespace edgeaccel
