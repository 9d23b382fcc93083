#include "edgeaccel/kubelet/kubelet_holdings.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "fixture_host.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using testing::TestKubelet;

// The pod-resources API of a 1.36 kubelet names, per DRA driver, the claims its pods use (the
// cleanup of prepared claims reads only the others from the API server), beside the devices of
// device-plugin pods.
TEST(KubeletHoldingsTest, PodResourcesNameTheClaimsEachDriversPodsUse) {
  testing::TempDir dir;
  TestKubelet kubelet(dir.path() + "/kubelet");
  kubelet.Start();
  kubelet.AddDraPod("team-a", "infer-0", "infer-0-tpu-x2k4", "edgetpu.edgeaccel.io", "node-1", "tpu-0000-03-00-0");
  kubelet.AddDraPod("team-b", "train", "shared-gpu", "gpu.edgeaccel.io", "node-1", "gpu-0");
  kubelet.AddDraPod("team-b", "nv", "nv-claim", "gpu.nvidia.com", "node-1", "gpu-1");
  absl::StatusOr<KubeletHoldings> holdings =
      AskPodResources(absl::StrCat(kubelet.root(), "/", kPodResourcesSocket), absl::Seconds(2));
  ASSERT_TRUE(holdings.ok()) << holdings.status();
  EXPECT_EQ(holdings->claims_in_use["edgetpu.edgeaccel.io"], std::set<std::string>{"team-a/infer-0-tpu-x2k4"});
  EXPECT_EQ(holdings->claims_in_use["gpu.edgeaccel.io"], std::set<std::string>{"team-b/shared-gpu"});
  EXPECT_EQ(holdings->claims_in_use["gpu.nvidia.com"], std::set<std::string>{"team-b/nv-claim"});
  EXPECT_TRUE(holdings->allocated.empty()) << "no device-plugin pod";
}

}  // namespace
}  // namespace edgeaccel
