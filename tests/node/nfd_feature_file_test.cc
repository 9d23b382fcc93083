#include "edgeaccel/node/nfd_feature_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;

TEST(NfdFeatureFileTest, NfdFeatureFileIsWrittenWhole) {
  TempDir dir;
  ASSERT_TRUE(WriteNfdFeatureFile(dir.path(), {{"coral.ai/edgetpu.count", "2"},
                                               {"coral.ai/edgetpu.present", "true"}}).ok());
  std::ifstream in(dir.path() + "/edgeaccel");
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), "coral.ai/edgetpu.count=2\ncoral.ai/edgetpu.present=true\n");
  EXPECT_FALSE(WriteNfdFeatureFile(dir.path() + "/missing", {}).ok());
}

TEST(NfdFeatureFileTest, ReadableByAnyoneWhateverTheUmask) {
  TempDir dir;
  const mode_t old = umask(0077);  // the daemon's
  ASSERT_TRUE(WriteNfdFeatureFile(dir.path(), {{"coral.ai/edgetpu.count", "2"}}).ok());
  umask(old);
  struct stat st;
  ASSERT_EQ(stat((dir.path() + "/edgeaccel").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644);
}

// GFD writes its own feature file, "gfd", with nvidia.com/gpu.* keys. NFD would take the value
// of the file later by name for a key both define; ours leaves such keys to it instead.
TEST(NfdFeatureFileTest, KeysAnotherFeatureFileDefinesAreLeftToIt) {
  TempDir dir;
  std::ofstream(dir.path() + "/gfd") << "nvidia.com/gpu.product=NVIDIA-Jetson-AGX-Orin\n"
                                        "nvidia.com/gpu.count=1\n";
  ASSERT_TRUE(WriteNfdFeatureFile(dir.path(), {{"nvidia.com/gpu.product", "Orin"},
                                               {"nvidia.com/gpu.count", "1"},
                                               {"nvidia.com/jetson.soc", "tegra234"}})
                  .ok());
  std::ifstream in(dir.path() + "/edgeaccel");
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), "nvidia.com/jetson.soc=tegra234\n");
}

}  // namespace
}  // namespace edgeaccel
