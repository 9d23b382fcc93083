#include "edgeaccel/dra/transient_threads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "absl/synchronization/notification.h"
#include "eventually.h"
#include "fixture_host.h"
#include "thread_limit.h"

namespace edgeaccel {
namespace {

TEST(TransientThreadsTest, AThreadLivesOnlyWhileItsWorkRuns) {
  TransientThreads threads("ea-test-work");
  const size_t before = testing::ThreadNames().size();
  absl::Notification started, release;
  ASSERT_TRUE(threads.Run([&] {
    started.Notify();
    release.WaitForNotification();
  }).ok());
  started.WaitForNotification();
  EXPECT_EQ(threads.running(), 1);
  const std::vector<std::string> names = testing::ThreadNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "ea-test-work"), 1) << "named as asked";
  release.Notify();
  threads.Join();
  EXPECT_EQ(threads.running(), 0);
  // Joined means the thread has ended; the kernel may list its task in /proc a moment longer
  // (it is released after the join's wake-up), so that listing is waited for.
  EXPECT_TRUE(testing::Eventually([&] { return testing::ThreadNames().size() == before; }))
      << "no thread is left once the work is done";
}

TEST(TransientThreadsTest, JoinWaitsForEveryPieceOfWorkAndCloseRefusesMore) {
  TransientThreads threads("ea-test-work");
  std::atomic<int> done{0};
  absl::Notification go;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(threads.Run([&] {
      go.WaitForNotification();
      ++done;
    }).ok());
  }
  EXPECT_EQ(threads.running(), 8);
  go.Notify();
  threads.Join();
  EXPECT_EQ(done.load(), 8);
  threads.Close();
  EXPECT_TRUE(absl::IsCancelled(threads.Run([&] { ++done; })));
  EXPECT_EQ(done.load(), 8);
}

// At the process limit a thread cannot start: the work is refused with the reason, nothing
// terminates, and the next Run once threads can start again works.
TEST(TransientThreadsTest, AThreadThatCannotStartIsAnErrorTheCallerAnswers) {
  const int code = testing::RunWhereNoThreadStarts([] {
    TransientThreads threads("ea-test-work");
    std::atomic<int> done{0};
    absl::Status refused = threads.Run([&] { ++done; });
    if (!absl::IsResourceExhausted(refused) || refused.message().find("ea-test-work") == std::string::npos) {
      fprintf(stderr, "refused: %s\n", refused.ToString().c_str());
      return false;
    }
    if (threads.running() != 0 || !testing::AllowThreads()) return false;
    if (!threads.Run([&] { ++done; }).ok()) return false;
    threads.Join();
    return done.load() == 1;
  });
  EXPECT_EQ(code, 0) << "134 is std::terminate";
}

}  // namespace
}  // namespace edgeaccel
