// PluginServer owns one Unix socket: it serves there, replaces a stale socket, refuses a path
// that another process serves on or that is not a socket, and never deletes what is not its own.
#include "edgeaccel/kubelet/plugin_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

TEST(PluginServerTest, SocketIsOwnerOnlyAndItsDisappearanceIsSeen) {
  TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  PluginServer server(path, &set, &counters, nullptr);
  ASSERT_TRUE(server.Start().ok());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_TRUE(server.SocketPresent());
  unlink(path.c_str());
  EXPECT_FALSE(server.SocketPresent());
}

TEST(PluginServerTest, PathTakenByAFileIsAClearError) {
  TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  FILE* f = fopen(path.c_str(), "w");
  fclose(f);
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  PluginServer server(path, &set, &counters, nullptr);
  absl::Status status = server.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("taken by a regular file"));
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0) << "a file we do not own must not be deleted";

  unlink(path.c_str());
  mkdir(path.c_str(), 0755);
  EXPECT_THAT(std::string(server.Start().message()), HasSubstr("taken by a directory"));
}

TEST(PluginServerTest, StaleSocketIsReplacedLiveOneIsNot) {
  TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  {
    // A live server holds the path.
    PluginServer first(path, &set, &counters, nullptr);
    ASSERT_TRUE(first.Start().ok());
    PluginServer second(path, &set, &counters, nullptr);
    EXPECT_EQ(second.Start().code(), absl::StatusCode::kAlreadyExists);
  }
  // A socket file nobody serves on (a crashed earlier run).
  ::edgeaccel::testing::MakeStaleSocket(path);
  PluginServer third(path, &set, &counters, nullptr);
  EXPECT_TRUE(third.Start().ok());
}

}  // namespace
}  // namespace edgeaccel
