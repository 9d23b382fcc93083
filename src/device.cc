#include "edgeaccel/device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "edgeaccel/constants.h"
#include "edgeaccel/discovery.h"
#include "glog/logging.h"

namespace edgeaccel {

absl::string_view HealthName(Health health) {
  return health == Health::kHealthy ? kHealthy : kUnhealthy;
}

bool AdvertisementDiffers(const Device& a, const Device& b) {
  return a.id != b.id || a.health != b.health || a.numa_node != b.numa_node ||
         a.nodes != b.nodes || a.envs != b.envs;
}

void SetHealthFromProblems(const std::vector<std::string>& problems, Device* device) {
  device->health = problems.empty() ? Health::kHealthy : Health::kUnhealthy;
  device->unhealthy_reason = absl::StrJoin(problems, "; ");
}

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

void OnceLogger::Warn(const std::string& message) {
  if (seen_.size() > 1000) seen_.clear();  // bounded, whatever a broken host throws at us
  if (seen_.insert(message).second) LOG(WARNING) << message;
}

std::string SocketFileName(absl::string_view resource_name) {
  return absl::StrCat("edgeaccel-", absl::StrReplaceAll(resource_name, {{"/", "-"}}), ".sock");
}

}  // namespace edgeaccel
