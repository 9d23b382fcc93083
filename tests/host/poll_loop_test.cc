// PollLoop: one thread steps several members, each on its descriptors and wake time; Remove
// waits for a step in progress and ends its steps. Real eventfds and a real thread.
#include "edgeaccel/host/poll_loop.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "eventually.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::Eventually;

// A member that waits on one eventfd, and counts its steps by what woke it.
class CountingMember : public PollLoop::Member {
 public:
  CountingMember() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~CountingMember() override { close(fd_); }

  PollLoop::Fds WaitFds() override { return {-1, fd_, -1, -1}; }
  absl::Time Step(const PollLoop::Events& ready) override {
    thread_name_ = ThreadName();
    if (ready[1] & POLLIN) {
      uint64_t count;
      (void)!read(fd_, &count, sizeof(count));
      signalled_.fetch_add(1);
    } else {
      woken_.fetch_add(1);
    }
    if (block_ != nullptr) {
      in_step_.Notify();
      block_->WaitForNotification();
      blocked_step_done_ = true;
    }
    return next_wake_.load() == 0 ? absl::InfiniteFuture()
                                  : absl::Now() + absl::Milliseconds(next_wake_.load());
  }

  void Signal() {
    uint64_t one = 1;
    (void)!write(fd_, &one, sizeof(one));
  }
  static std::string ThreadName() {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return name;
  }

  std::atomic<int> signalled_{0};
  std::atomic<int> woken_{0};  // the first step, and each wake time
  std::atomic<int> next_wake_{0};  // ms; 0: none
  absl::Notification* block_ = nullptr;  // set before Add: the step waits for it
  absl::Notification in_step_;
  std::atomic<bool> blocked_step_done_{false};
  std::string thread_name_;

 private:
  const int fd_;
};

int ThreadsNamed(const std::string& name) {
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  while (dirent* task = readdir(tasks)) {
    std::ifstream comm(std::string("/proc/self/task/") + task->d_name + "/comm");
    std::string comm_name;
    if (std::getline(comm, comm_name) && comm_name == name) ++count;
  }
  closedir(tasks);
  return count;
}

TEST(PollLoopTest, OneThreadStepsEachMemberOnItsDescriptorsAndItsWakeTime) {
  PollLoop loop("ea-test-loop");
  CountingMember a, b;
  b.next_wake_ = 50;
  loop.Add(&a);
  loop.Add(&b);
  // Each is stepped once at once.
  ASSERT_TRUE(Eventually([&] { return a.woken_ == 1 && b.woken_ >= 1; }));
  EXPECT_EQ(a.thread_name_, "ea-test-loop");
  EXPECT_EQ(ThreadsNamed("ea-test-loop"), 1);
  // b's wake time comes again and again; a, with none, is not stepped.
  ASSERT_TRUE(Eventually([&] { return b.woken_ >= 4; }));
  EXPECT_EQ(a.woken_, 1);
  // a's descriptor wakes a alone.
  a.Signal();
  ASSERT_TRUE(Eventually([&] { return a.signalled_ == 1; }));
  EXPECT_EQ(b.signalled_, 0);
  b.next_wake_ = 0;
  loop.Remove(&a);
  loop.Remove(&b);
}

TEST(PollLoopTest, RemoveWaitsForTheStepInProgressAndEndsTheSteps) {
  PollLoop loop("ea-test-loop");
  CountingMember slow, other;
  absl::Notification release;
  slow.block_ = &release;
  loop.Add(&slow);
  slow.in_step_.WaitForNotification();
  std::atomic<bool> removing{false};
  std::atomic<bool> step_done_when_removed{false};
  std::thread remover([&] {
    removing = true;
    loop.Remove(&slow);
    step_done_when_removed = slow.blocked_step_done_.load();
  });
  ASSERT_TRUE(Eventually([&] { return removing.load(); }));
  release.Notify();  // the step ends now, with Remove called (or about to be) meanwhile
  remover.join();
  EXPECT_TRUE(step_done_when_removed) << "Remove returned while the member's step ran";
  // No more steps of it, whatever its descriptor says; the loop goes on for the others.
  slow.Signal();
  loop.Add(&other);
  ASSERT_TRUE(Eventually([&] { return other.woken_ == 1; }));
  other.Signal();
  ASSERT_TRUE(Eventually([&] { return other.signalled_ == 1; }));
  EXPECT_EQ(slow.signalled_, 0);
  loop.Remove(&other);
}

TEST(PollLoopTest, NoThreadUntilTheFirstMember) {
  const int before = ThreadsNamed("ea-test-loop");
  {
    PollLoop loop("ea-test-loop");
    EXPECT_EQ(ThreadsNamed("ea-test-loop"), before);
  }
  EXPECT_EQ(ThreadsNamed("ea-test-loop"), before);
}

// The daemon's main thread serves /metrics on a loop of its own while it waits for a stop
// signal: no thread is started, the members are stepped on the caller's thread, and the loop
// returns when the caller's descriptor is readable (left unread) or its last member is removed.
TEST(PollLoopTest, ALoopOnTheCallersThreadRunsUntilItsDescriptorOrItsLastMemberGoes) {
  PollLoop loop(PollLoop::CallersThread{}, "the test's loop");
  EXPECT_FALSE(loop.RunOnCallersThread(-1)) << "with no member it returns at once";
  CountingMember member;
  const int until = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(until, 0);
  char caller_name[16] = {};
  pthread_getname_np(pthread_self(), caller_name, sizeof(caller_name));
  pthread_setname_np(pthread_self(), "ea-caller");
  loop.Add(&member);
  EXPECT_EQ(member.woken_, 0) << "stepped before the caller runs the loop";
  std::thread other([&] {
    ASSERT_TRUE(Eventually([&] { return member.woken_ == 1; }));
    member.Signal();
    ASSERT_TRUE(Eventually([&] { return member.signalled_ == 1; }));
    const uint64_t one = 1;
    ASSERT_EQ(write(until, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  });
  EXPECT_TRUE(loop.RunOnCallersThread(until));
  other.join();
  EXPECT_EQ(member.thread_name_, "ea-caller");
  uint64_t left = 0;
  EXPECT_EQ(read(until, &left, sizeof(left)), static_cast<ssize_t>(sizeof(left))) << "read by the loop";
  EXPECT_EQ(left, 1u);

  // Again, ended by the member's removal from another thread.
  std::thread remover([&] {
    member.Signal();
    ASSERT_TRUE(Eventually([&] { return member.signalled_ == 2; }));
    loop.Remove(&member);
  });
  EXPECT_FALSE(loop.RunOnCallersThread(until));
  remover.join();
  close(until);
  pthread_setname_np(pthread_self(), caller_name);
}

}  // namespace
}  // namespace edgeaccel
