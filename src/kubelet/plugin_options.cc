#include "edgeaccel/kubelet/plugin_options.h"

namespace edgeaccel {

v1beta1::DevicePluginOptions AdvertisedOptions(const PluginOptions& options) {
  v1beta1::DevicePluginOptions advertised;
  advertised.set_pre_start_required(static_cast<bool>(options.pre_start));
  advertised.set_get_preferred_allocation_available(
      static_cast<bool>(options.preferred_allocation));
  return advertised;
}

}  // namespace edgeaccel
