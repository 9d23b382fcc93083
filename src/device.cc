#include "edgeaccel/device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "edgeaccel/constants.h"

namespace edgeaccel {

absl::string_view HealthName(Health health) {
  return health == Health::kHealthy ? kHealthy : kUnhealthy;
}

bool AdvertisementDiffers(const Device& a, const Device& b) {
  return a.id != b.id || a.health != b.health || a.numa_node != b.numa_node || a.nodes != b.nodes;
}

std::string SocketFileName(absl::string_view resource_name) {
  return absl::StrCat("edgeaccel-", absl::StrReplaceAll(resource_name, {{"/", "-"}}), ".sock");
}

}  // namespace edgeaccel
