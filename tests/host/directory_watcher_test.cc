// DirectoryWatcher on real directories with real inotify.
#include "edgeaccel/host/directory_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;

// Waits (poll on the inotify fd) for events and drains them.
std::vector<DirectoryWatcher::Event> Next(DirectoryWatcher& watcher, bool* rearm) {
  struct pollfd pfd = {watcher.fd(), POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 5000), 1) << "no inotify event within 5 s";
  return watcher.Drain(rearm);
}

TEST(DirectoryWatcherTest, ReportsEntriesOfWatchedDirectories) {
  TempDir dir;
  DirectoryWatcher watcher;
  ASSERT_TRUE(watcher.ok());
  watcher.Arm({dir.path()});
  EXPECT_TRUE(watcher.Watching(0));
  close(creat((dir.path() + "/apex_0").c_str(), 0644));
  bool rearm = false;
  std::vector<DirectoryWatcher::Event> events = Next(watcher, &rearm);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].directory, 0u);
  EXPECT_EQ(events[0].name, "apex_0");
  EXPECT_TRUE(events[0].mask & IN_CREATE);
  EXPECT_FALSE(rearm);
}

TEST(DirectoryWatcherTest, MissingDirectoryIsCoveredByItsAncestor) {
  TempDir dir;
  const std::string target = dir.path() + "/sys/class/apex";
  DirectoryWatcher watcher;
  watcher.Arm({target});
  EXPECT_FALSE(watcher.Watching(0));
  mkdir((dir.path() + "/sys").c_str(), 0755);
  bool rearm = false;
  Next(watcher, &rearm);
  EXPECT_TRUE(rearm) << "an ancestor changed: the caller must re-arm";
  // Re-arming as directories appear reaches the real one.
  mkdir((dir.path() + "/sys/class").c_str(), 0755);
  mkdir(target.c_str(), 0755);
  watcher.Arm({target});
  EXPECT_TRUE(watcher.Watching(0));
  watcher.Drain(&rearm);
  close(creat((target + "/apex_0").c_str(), 0644));
  rearm = false;
  std::vector<DirectoryWatcher::Event> events = Next(watcher, &rearm);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "apex_0");
}

TEST(DirectoryWatcherTest, RemovedDirectoryAsksForReArm) {
  TempDir dir;
  const std::string target = dir.path() + "/device-plugins";
  mkdir(target.c_str(), 0755);
  DirectoryWatcher watcher;
  watcher.Arm({target});
  ASSERT_TRUE(watcher.Watching(0));
  rmdir(target.c_str());
  bool rearm = false;
  Next(watcher, &rearm);
  EXPECT_TRUE(rearm);
  watcher.Arm({target});
  EXPECT_FALSE(watcher.Watching(0));
  mkdir(target.c_str(), 0755);
  rearm = false;
  Next(watcher, &rearm);
  EXPECT_TRUE(rearm);
  watcher.Arm({target});
  EXPECT_TRUE(watcher.Watching(0));
}

TEST(DirectoryWatcherTest, SeveralDirectoriesAreToldApart) {
  TempDir a, b;
  DirectoryWatcher watcher;
  watcher.Arm({a.path(), b.path()});
  close(creat((b.path() + "/x").c_str(), 0644));
  bool rearm = false;
  std::vector<DirectoryWatcher::Event> events = Next(watcher, &rearm);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].directory, 1u);
}

}  // namespace
}  // namespace edgeaccel
