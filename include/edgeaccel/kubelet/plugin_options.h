// What a device plugin offers beyond the calls every plugin answers, and the
// DevicePluginOptions the kubelet is told, derived from it in one place.
//
// The kubelet reads DevicePluginOptions twice: in the Register request (classic registration)
// and from GetDevicePluginOptions (both ways). Deriving both from the hooks that are set, as
// Intel's pkg/deviceplugin does (PreStartRequired: preStart != nil), means the options can never
// promise a call the plugin does not implement.
#ifndef EDGEACCEL_KUBELET_PLUGIN_OPTIONS_H_
#define EDGEACCEL_KUBELET_PLUGIN_OPTIONS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "deviceplugin_v1beta1.pb.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/allocation.h"

namespace edgeaccel {

using PreferredAllocator = std::function<std::vector<std::string>(
    const Snapshot&, const v1beta1::ContainerPreferredAllocationRequest&)>;
using PreStartHook =
    std::function<absl::Status(const Snapshot&, const std::vector<std::string>& device_ids)>;

struct PluginOptions {
  // Also answer cdi_devices in Allocate. Unset: DeviceSpecs and envs only.
  CdiNamer cdi_device_name;
  // Answers GetPreferredAllocation. Unset: the kubelet picks devices itself.
  PreferredAllocator preferred_allocation = PreferredDevices;
  // Runs before every container start (restarts included) with the devices the kubelet assigned;
  // an error fails the start. Unset: the kubelet never calls PreStartContainer.
  PreStartHook pre_start;
  // Whether ListAndWatch may name this device yet. Unset: every device at once. With CDI, a new
  // device is named only once the spec holding it is on disk (or its write failed, and Allocate
  // names no CDI device for it), so the kubelet never hears of a device a runtime cannot resolve.
  // Removals and health changes are never held. When the answer changes, call Readvertise.
  std::function<bool(const Device&)> advertise_now;
};

// The options the kubelet is told: each optional call is offered exactly when its hook is set.
v1beta1::DevicePluginOptions AdvertisedOptions(const PluginOptions& options);

}  // namespace edgeaccel

#endif  // EDGEACCEL_KUBELET_PLUGIN_OPTIONS_H_
