#include "edgeaccel/node/cdi_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

Snapshot TwoReplicasOfOneGpu() {
  Snapshot s;
  s.version = 1;
  for (int k = 0; k < 2; ++k) {
    Device d;
    d.id = "GPU-1::" + std::to_string(k);
    d.replica_of = "GPU-1";
    d.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}, {"/dev/nvidiactl", "/dev/nvidiactl", "rw"}};
    d.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-1";
    s.devices.push_back(d);
  }
  return s;
}

TEST(CdiTest, NamesUseOurOwnVendor) {
  EXPECT_EQ(CdiKind("coral.ai/edgetpu"), "edgeaccel.io/edgetpu");
  EXPECT_EQ(CdiDeviceName("nvidia.com/gpu", "GPU-1"), "edgeaccel.io/gpu=GPU-1");
}

TEST(CdiTest, SpecListsEachPhysicalDeviceOnce) {
  const std::string json = CdiSpecJson("nvidia.com/gpu", TwoReplicasOfOneGpu());
  EXPECT_THAT(json, HasSubstr("\"kind\": \"edgeaccel.io/gpu\""));
  EXPECT_THAT(json, HasSubstr("\"name\": \"GPU-1\""));
  EXPECT_EQ(json.find("\"name\": \"GPU-1\""), json.rfind("\"name\": \"GPU-1\""));
  EXPECT_THAT(json, HasSubstr("{\"path\": \"/dev/nvidia0\", \"hostPath\": \"/dev/nvidia0\", "
                              "\"permissions\": \"rw\"}"));
  EXPECT_THAT(json, HasSubstr("\"NVIDIA_VISIBLE_DEVICES=GPU-1\""));
}

TEST(CdiTest, StringsAreEscaped) {
  Snapshot s;
  Device d;
  d.id = "a\"b\\c\n";
  s.devices.push_back(d);
  EXPECT_THAT(CdiSpecJson("x/y", s), HasSubstr("\"a\\\"b\\\\c\\n\""));
}

TEST(CdiTest, FileIsWrittenAtomically) {
  TempDir dir;
  CdiSpecFile file(dir.path() + "/cdi", "nvidia.com/gpu");
  EXPECT_EQ(file.path(), dir.path() + "/cdi/edgeaccel.io-gpu.json");
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  std::ifstream in(file.path());
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_THAT(content.str(), HasSubstr("\"cdiVersion\""));
  EXPECT_NE(access((dir.path() + "/cdi/.edgeaccel.io-gpu.json.tmp").c_str(), F_OK), 0);
  struct stat st;
  ASSERT_EQ(stat(file.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644);
}

TEST(CdiTest, NamesOnlyWhatTheSpecOnDiskHolds) {
  TempDir dir;
  CdiSpecFile file(dir.path(), "nvidia.com/gpu");
  auto reason = [&](absl::string_view id) {
    return std::string(file.NameOnDisk(id).status().message());
  };
  EXPECT_THAT(reason("GPU-1"), HasSubstr("has not been written yet"));

  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  ASSERT_TRUE(file.NameOnDisk("GPU-1").ok());
  EXPECT_EQ(*file.NameOnDisk("GPU-1"), "edgeaccel.io/gpu=GPU-1");
  EXPECT_THAT(reason("GPU-1::0"), HasSubstr("does not hold GPU-1::0")) << "physical ids only";
  EXPECT_THAT(reason("GPU-b"), HasSubstr("does not hold GPU-b yet"));

  // Replaced by another writer (same name, other content).
  const std::string other = dir.path() + "/other.json";
  std::ofstream(other) << "{}";
  ASSERT_EQ(rename(other.c_str(), file.path().c_str()), 0);
  EXPECT_THAT(reason("GPU-1"), HasSubstr("was replaced by another writer"));

  // Removed (a tmpfs /var/run/cdi cleared under us).
  unlink(file.path().c_str());
  EXPECT_THAT(reason("GPU-1"), HasSubstr(file.path() + " is gone"));

  // Written again: named again.
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  EXPECT_TRUE(file.NameOnDisk("GPU-1").ok());
}

TEST(CdiTest, UnwritableDirectoryIsAClearError) {
  TempDir dir;
  const std::string blocker = dir.path() + "/cdi";
  FILE* f = fopen(blocker.c_str(), "w");  // a file where the directory should be
  fclose(f);
  CdiSpecFile file(blocker, "coral.ai/edgetpu");
  absl::Status status = file.Write(TwoReplicasOfOneGpu());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot write"));
}

}  // namespace
}  // namespace edgeaccel
