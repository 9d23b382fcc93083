// The options the kubelet is told follow exactly the hooks a plugin sets.
#include "edgeaccel/kubelet/plugin_options.h"

#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

TEST(PluginOptionsTest, EachOptionalCallIsOfferedExactlyWhenItsHookIsSet) {
  PluginOptions defaults;
  v1beta1::DevicePluginOptions advertised = AdvertisedOptions(defaults);
  EXPECT_TRUE(advertised.get_preferred_allocation_available());
  EXPECT_FALSE(advertised.pre_start_required());

  PluginOptions none;
  none.preferred_allocation = nullptr;
  advertised = AdvertisedOptions(none);
  EXPECT_FALSE(advertised.get_preferred_allocation_available());
  EXPECT_FALSE(advertised.pre_start_required());

  PluginOptions pre_start;
  pre_start.pre_start = [](const Snapshot&, const std::vector<std::string>&) {
    return absl::OkStatus();
  };
  advertised = AdvertisedOptions(pre_start);
  EXPECT_TRUE(advertised.pre_start_required());
  EXPECT_TRUE(advertised.get_preferred_allocation_available());

  // CDI changes what Allocate answers, not which calls exist.
  PluginOptions cdi;
  cdi.cdi_device_name = [](absl::string_view id) -> absl::StatusOr<std::string> {
    return std::string(id);
  };
  EXPECT_EQ(AdvertisedOptions(cdi).SerializeAsString(),
            AdvertisedOptions(defaults).SerializeAsString());
}

}  // namespace
}  // namespace edgeaccel
