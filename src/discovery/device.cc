#include "edgeaccel/discovery/device.h"

#include "absl/strings/str_join.h"
#include "edgeaccel/host/host.h"

namespace edgeaccel {

absl::string_view HealthName(Health health) {
  return health == Health::kHealthy ? kHealthy : kUnhealthy;
}

bool AdvertisementDiffers(const Device& a, const Device& b) {
  return a.id != b.id || a.health != b.health || a.numa_node != b.numa_node ||
         a.nodes != b.nodes || a.mounts != b.mounts || a.envs != b.envs;
}

bool FactsDiffer(const Device& a, const Device& b) {
  auto describing = [](const std::map<std::string, std::string>& facts) {
    std::map<std::string, std::string> out = facts;
    out.erase(std::string(kTemperatureFact));
    return out;
  };
  return describing(a.facts) != describing(b.facts) || a.problems != b.problems;
}

void LookUpHostModes(const Host& host, std::vector<Device>* devices) {
  for (Device& device : *devices) {
    for (DeviceNode& node : device.nodes) {
      absl::StatusOr<FileInfo> info = host.Stat(node.host_path);
      if (info.ok()) {
        node.host_mode = HostNodeMode{static_cast<mode_t>(info->permissions & 0777), info->uid,
                                      info->gid};
        node.host_stat_error.clear();
      } else {
        node.host_mode.reset();
        node.host_stat_error = std::string(info.status().message());
      }
    }
  }
}

void SetHealthFromProblems(const std::vector<std::string>& problems, Device* device) {
  device->health = problems.empty() ? Health::kHealthy : Health::kUnhealthy;
  device->unhealthy_reason = absl::StrJoin(problems, "; ");
  if (problems.empty()) device->problems.clear();
}

}  // namespace edgeaccel
