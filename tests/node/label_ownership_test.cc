#include "edgeaccel/node/label_ownership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(LabelOwnershipTest, AKeyOnTheNodeIsOursOnlyIfWeSetItAndNobodyChangedIt) {
  const LabelSet want = {{"nvidia.com/gpu.product", "Orin"},
                         {"nvidia.com/gpu.count", "1"},
                         {"nvidia.com/jetson.soc", "tegra234"},
                         {"coral.ai/edgetpu.count", "2"}};
  const LabelSet node = {{"nvidia.com/gpu.product", "NVIDIA-Orin"},  // GFD's, not ours
                         {"nvidia.com/gpu.count", "1"},              // ours, unchanged
                         {"nvidia.com/jetson.soc", "t234"},          // ours, changed since
                         {"kubernetes.io/os", "linux"}};
  const std::set<std::string> ours = {"nvidia.com/gpu.count", "nvidia.com/jetson.soc"};
  const LabelSet applied = {{"nvidia.com/gpu.count", "1"}, {"nvidia.com/jetson.soc", "tegra234"}};
  EXPECT_THAT(KeysHeldByOthers(want, node, ours, applied),
              ElementsAre("nvidia.com/gpu.product", "nvidia.com/jetson.soc"));
  // After a restart we know which keys are ours, not what we wrote: ours stay ours.
  EXPECT_THAT(KeysHeldByOthers(want, node, ours, {}), ElementsAre("nvidia.com/gpu.product"));
  EXPECT_THAT(KeysHeldByOthers(want, {}, {}, {}), IsEmpty());
}

TEST(LabelOwnershipTest, KeysOfTheOtherFeatureFilesAsNfdReadsThem) {
  TempDir dir;
  std::ofstream(dir.path() + "/gfd") << "nvidia.com/gpu.product=Orin\n"
                                        "# a comment\n"
                                        "# +expiry-time=2030-01-01T00:00:00Z\n"
                                        "  nvidia.com/gpu.memory = 30000  \n"
                                        "nvidia.com/mig.capable\n"
                                        "\n";
  std::ofstream(dir.path() + "/edgeaccel") << "ours.example/key=1\n";
  std::ofstream(dir.path() + "/.gfd.tmp") << "hidden.example/key=1\n";
  std::ofstream(dir.path() + "/huge") << std::string(70 * 1024, '#') << "\nbig.example/key=1\n";
  mkdir((dir.path() + "/subdir").c_str(), 0755);
  EXPECT_THAT(KeysInOtherFeatureFiles(dir.path(), "edgeaccel"),
              ElementsAre("nvidia.com/gpu.memory", "nvidia.com/gpu.product", "nvidia.com/mig.capable"));
  EXPECT_THAT(KeysInOtherFeatureFiles(dir.path() + "/missing", "edgeaccel"), IsEmpty());
}

}  // namespace
}  // namespace edgeaccel
