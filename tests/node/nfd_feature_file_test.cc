#include "edgeaccel/node/nfd_feature_file.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace edgeaccel
