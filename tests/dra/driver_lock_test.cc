// DriverLock: a DRA driver is one process's at a time, taken over the moment the holder lets go
// or dies (SIGKILL included), and a predecessor from before the lock is known by its socket.
#include "edgeaccel/dra/driver_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::MakeStaleSocket;
using ::edgeaccel::testing::PathExists;
using ::edgeaccel::testing::TempDir;

// A socket listening at `path` that never accepts: a driver serving there, as far as connect()
// can tell.
int Listen(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0) << strerror(errno);
  EXPECT_EQ(listen(fd, 8), 0);
  return fd;
}

class DriverLockTest : public ::testing::Test {
 protected:
  // Not made: the lock makes plugins/ and plugins/<driver>/ as the DRA server does.
  std::string PluginDir() const { return absl::StrCat(root_.path(), "/plugins/edgetpu.edgeaccel.io"); }
  std::string Socket() const { return PluginDir() + "/dra.sock"; }
  void MakePluginDir() const {
    mkdir(absl::StrCat(root_.path(), "/plugins").c_str(), 0750);
    mkdir(PluginDir().c_str(), 0750);
  }
  // A lock that counts its takeovers (in `takeovers`, takeovers_ unless given).
  std::unique_ptr<DriverLock> NewLock(const std::string& plugin_dir = "",
                                      std::atomic<int>* takeovers = nullptr) {
    if (takeovers == nullptr) takeovers = &takeovers_;
    return std::make_unique<DriverLock>(plugin_dir.empty() ? PluginDir() : plugin_dir,
                                        [takeovers] { ++*takeovers; });
  }
  // `lock`, which TryAcquire found taken, waits on the loop. One step first, as the loop's own
  // first: the driver is still someone else's, so it takes nothing over.
  void WaitsBehindTheHolder(DriverLock* lock) {
    lock->Step(PollLoop::Events{});
    EXPECT_EQ(takeovers_.load(), 0) << "not while the holder holds it";
    EXPECT_FALSE(lock->held());
    loop_.Add(lock);
  }

  TempDir root_;
  PollLoop loop_{"test-lock"};
  std::atomic<int> takeovers_{0};
};

TEST_F(DriverLockTest, NobodyDrivesTheDriverSoItIsOursAtOnce) {
  auto lock = NewLock();
  absl::StatusOr<bool> ours = lock->TryAcquire();
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_TRUE(*ours);
  EXPECT_TRUE(lock->held());
  EXPECT_TRUE(PathExists(PluginDir() + "/" + kDriverLockName));
  EXPECT_EQ(lock->waiting(), "");
}

TEST_F(DriverLockTest, AStaleSocketOfADeadDriverIsNoHolder) {
  MakePluginDir();
  MakeStaleSocket(Socket());
  auto lock = NewLock();
  absl::StatusOr<bool> ours = lock->TryAcquire();
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_TRUE(*ours);
}

TEST_F(DriverLockTest, TheNextDaemonTakesOverWhenTheHolderLetsGo) {
  auto holder = NewLock();
  ASSERT_TRUE(holder->TryAcquire().value_or(false));
  auto next = NewLock();
  absl::StatusOr<bool> ours = next->TryAcquire();
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_FALSE(*ours);
  EXPECT_NE(next->waiting().find("another process holds"), std::string::npos) << next->waiting();
  WaitsBehindTheHolder(next.get());
  holder->Release();
  ASSERT_TRUE(Eventually([&] { return takeovers_.load() == 1; }));
  EXPECT_TRUE(next->held());
  EXPECT_FALSE(holder->held());
  EXPECT_FALSE(holder->TryAcquire().value_or(true)) << "the old one cannot take it back";
  loop_.Remove(next.get());
}

// The kernel lets go of a dead process's flock: a daemon killed at the end of its grace period
// hands over as one that stopped.
TEST_F(DriverLockTest, AHolderKilledWithSigkillHandsOver) {
  MakePluginDir();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const std::string lock_path = PluginDir() + "/" + kDriverLockName;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // async-signal-safe calls only
    const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  close(ready[1]);
  char byte;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  close(ready[0]);
  auto next = NewLock();
  ASSERT_FALSE(next->TryAcquire().value_or(true));
  WaitsBehindTheHolder(next.get());
  kill(child, SIGKILL);
  int status;
  waitpid(child, &status, 0);
  EXPECT_TRUE(Eventually([&] { return takeovers_.load() == 1; }));
  loop_.Remove(next.get());
}

// edgeaccel up to stop 46 holds no lock: its service socket answering is what says it drives the
// driver. It stops (removes its socket), or dies (leaves it).
TEST_F(DriverLockTest, APredecessorWithoutTheLockIsWaitedForUntilItStops) {
  MakePluginDir();
  const int predecessor = Listen(Socket());
  auto next = NewLock();
  ASSERT_FALSE(next->TryAcquire().value_or(true));
  EXPECT_NE(next->waiting().find("serves " + Socket()), std::string::npos) << next->waiting();
  WaitsBehindTheHolder(next.get());
  unlink(Socket().c_str());
  close(predecessor);
  EXPECT_TRUE(Eventually([&] { return takeovers_.load() == 1; }));
  EXPECT_TRUE(next->held());
  loop_.Remove(next.get());
}

TEST_F(DriverLockTest, APredecessorWithoutTheLockThatDiesLeavingItsSocketIsNoLongerWaitedFor) {
  MakePluginDir();
  const int predecessor = Listen(Socket());
  auto next = NewLock();
  ASSERT_FALSE(next->TryAcquire().value_or(true));
  WaitsBehindTheHolder(next.get());
  close(predecessor);  // the file stays: no inotify event, the held connection hangs up
  EXPECT_TRUE(Eventually([&] { return takeovers_.load() == 1; }));
  EXPECT_TRUE(PathExists(Socket())) << "the stale socket is the DRA server's to replace";
  loop_.Remove(next.get());
}

// A wait removed from its loop (the daemon stopping) takes nothing over when the holder lets go:
// a witness, waiting on the same loop for another driver whose holder lets go after, has taken
// its own over by then.
TEST_F(DriverLockTest, AWaitRemovedFromItsLoopNeverTakesOver) {
  auto holder = NewLock();
  ASSERT_TRUE(holder->TryAcquire().value_or(false));
  auto next = NewLock();
  ASSERT_FALSE(next->TryAcquire().value_or(true));
  const std::string other_dir = absl::StrCat(root_.path(), "/plugins/gpu.edgeaccel.io");
  std::atomic<int> witness_takeovers{0};
  auto other_holder = NewLock(other_dir, &witness_takeovers);
  ASSERT_TRUE(other_holder->TryAcquire().value_or(false));
  auto witness = NewLock(other_dir, &witness_takeovers);
  ASSERT_FALSE(witness->TryAcquire().value_or(true));
  loop_.Add(next.get());
  loop_.Add(witness.get());
  loop_.Remove(next.get());
  holder->Release();
  other_holder->Release();
  ASSERT_TRUE(Eventually([&] { return witness_takeovers.load() == 1; }));
  EXPECT_EQ(takeovers_.load(), 0);
  EXPECT_FALSE(next->held());
  loop_.Remove(witness.get());
}

TEST_F(DriverLockTest, APluginDirectoryThatCannotBeMadeIsAnError) {
  // plugins/ is a regular file: nothing can be made under it.
  ASSERT_TRUE(std::ofstream(absl::StrCat(root_.path(), "/plugins")).good());
  auto lock = NewLock();
  absl::StatusOr<bool> ours = lock->TryAcquire();
  ASSERT_FALSE(ours.ok());
  EXPECT_NE(ours.status().message().find("cannot make"), std::string::npos) << ours.status();
  EXPECT_FALSE(lock->held());
}

}  // namespace
}  // namespace edgeaccel
