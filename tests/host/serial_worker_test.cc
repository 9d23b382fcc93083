#include "edgeaccel/host/serial_worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace edgeaccel {
namespace {

TEST(SerialWorkerTest, RunsTasksInTheOrderPosted) {
  SerialWorker worker("test-worker");
  absl::Mutex mu;
  std::vector<std::string> ran;
  for (const char* key : {"a", "b", "c"}) {
    worker.Post(key, [&, key] {
      absl::MutexLock lock(&mu);
      ran.push_back(key);
    });
  }
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
  EXPECT_THAT(ran, ::testing::ElementsAre("a", "b", "c"));
}

TEST(SerialWorkerTest, ASlowTaskNeverBlocksTheOneWhoPosts) {
  SerialWorker worker("test-worker");
  absl::Notification started, release;
  worker.Post("slow", [&] {  // an fsync on a dying SD card
    started.Notify();
    release.WaitForNotification();
  });
  started.WaitForNotification();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) worker.Post("cdi", [] {});
  worker.Post("slow", [] {});
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_FALSE(worker.Drain(absl::Milliseconds(50)));
  release.Notify();
  EXPECT_TRUE(worker.Drain(absl::Seconds(5)));
}

TEST(SerialWorkerTest, AWaitingTaskIsReplacedByTheLatestOfItsKey) {
  SerialWorker worker("test-worker");
  absl::Notification release;
  worker.Post("block", [&] { release.WaitForNotification(); });
  std::atomic<int> runs{0};
  std::atomic<int> last{0};
  for (int i = 1; i <= 50; ++i) {
    worker.Post("labels", [&, i] {
      runs++;
      last = i;
    });
  }
  release.Notify();
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(last.load(), 50);
  EXPECT_EQ(worker.completed(), 2u);
}

TEST(SerialWorkerTest, StopDropsWhatWaitsAndFinishesWhatRuns) {
  auto worker = std::make_unique<SerialWorker>("test-worker");
  absl::Notification started, release;
  std::atomic<bool> finished{false}, dropped_ran{false};
  worker->Post("running", [&] {
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  worker->Post("waiting", [&] { dropped_ran = true; });
  started.WaitForNotification();
  std::thread stopper([&] { worker->Stop(); });
  absl::SleepFor(absl::Milliseconds(20));
  release.Notify();
  stopper.join();
  EXPECT_TRUE(finished);
  EXPECT_FALSE(dropped_ran);
  worker->Post("after", [&] { dropped_ran = true; });  // ignored once stopped
  worker.reset();
  EXPECT_FALSE(dropped_ran);
}

}  // namespace
}  // namespace edgeaccel
