// Allocation policy: what Allocate answers for a container, and which devices
// GetPreferredAllocation suggests. Both are pure functions of a snapshot, so tests and benchmarks
// call them directly.
#ifndef EDGEACCEL_KUBELET_ALLOCATION_H_
#define EDGEACCEL_KUBELET_ALLOCATION_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "deviceplugin_v1beta1.pb.h"
#include "edgeaccel/inventory/device_set.h"

namespace edgeaccel {

// Names a physical device as a CDI device ("edgeaccel.io/edgetpu=0000:03:00.0"), or says why it
// cannot be named now (the spec that would define the name is not on disk).
using CdiNamer = std::function<absl::StatusOr<std::string>(absl::string_view physical_id)>;

// Builds the Allocate answer for one container from the current snapshot, or says which id is
// wrong: the device nodes of every requested device (each host path once, so replicas of one
// device give its nodes once), their read-only mounts (each container path once), their envs
// (distinct values of one variable joined with ",", or ":" for a variable named *PATH),
// and, when `cdi_device_name` is set, their CDI names (each physical device once). A runtime
// fails a container whose CDI name it cannot resolve, so the names come all or none: when one
// cannot be named, the answer has DeviceSpecs and envs alone and `cdi_fallback` (if given) says
// why.
absl::Status BuildContainerAllocation(const Snapshot& snapshot, const std::string& resource,
                                      const v1beta1::ContainerAllocateRequest& request,
                                      const CdiNamer& cdi_device_name,
                                      v1beta1::ContainerAllocateResponse* response,
                                      std::string* cdi_fallback = nullptr);

// Picks `request.allocation_size()` devices: all of must_include, then healthy available devices
// from as few NUMA nodes as possible (the must_include devices' node first). Replicas are spread:
// the next pick is a replica of the physical device used least in this answer and with the most
// replicas still free. Deterministic.
std::vector<std::string> PreferredDevices(
    const Snapshot& snapshot, const v1beta1::ContainerPreferredAllocationRequest& request);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_ALLOCATION_H_
