// The extended resource names the devices are advertised as: what pods ask for in
// resources.limits and what `kubectl describe node` shows. One place, so discovery, labels,
// metrics and the flags never drift apart.
#ifndef EDGEACCEL_DISCOVERY_RESOURCE_NAMES_H_
#define EDGEACCEL_DISCOVERY_RESOURCE_NAMES_H_

#include "absl/strings/string_view.h"

namespace edgeaccel {

inline constexpr absl::string_view kResourceEdgeTpu = "coral.ai/edgetpu";
inline constexpr absl::string_view kResourceNvidiaGpu = "nvidia.com/gpu";

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_RESOURCE_NAMES_H_
