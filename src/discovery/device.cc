#include "edgeaccel/discovery/device.h"

#include "absl/strings/str_join.h"

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

}  // namespace edgeaccel
