#include "edgeaccel/host/serial_worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "eventually.h"
#include "thread_limit.h"

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

TEST(SerialWorkerTest, AnAttemptThatFailsIsRetriedWithBackoff) {
  SerialWorker worker("test-worker");
  std::atomic<int> attempts{0};
  absl::Notification done;
  const absl::Time start = absl::Now();
  worker.PostRetrying(
      "labels",
      [&] {
        if (++attempts < 3) return SerialWorker::Outcome::kRetry;
        done.Notify();
        return SerialWorker::Outcome::kDone;
      },
      {.first = absl::Milliseconds(20), .max = absl::Milliseconds(40)});
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));  // 20 ms, then 40 ms
  EXPECT_EQ(attempts.load(), 3);
  EXPECT_EQ(worker.retries(), 2u);
  EXPECT_FALSE(worker.retrying("labels"));
}

TEST(SerialWorkerTest, ARetryThatWaitsHoldsUpNoOtherKey) {
  SerialWorker worker("test-worker");
  std::atomic<int> api{0};
  worker.PostRetrying(
      "api",
      [&] {
        api++;
        return SerialWorker::Outcome::kRetry;  // an API server that never answers well
      },
      {.first = absl::Hours(1), .max = absl::Hours(1)});
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));  // a retry not yet due does not count
  EXPECT_TRUE(worker.retrying("api"));
  absl::Notification cdi;
  worker.Post("cdi", [&] { cdi.Notify(); });
  EXPECT_TRUE(cdi.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(api.load(), 1);
}

TEST(SerialWorkerTest, ANewerTaskReplacesARetryAtOnceOrAtItsTime) {
  for (const bool waits : {false, true}) {
    SCOPED_TRACE(waits ? "newer waits for the retry" : "newer runs at once");
    SerialWorker worker("test-worker");
    // A retry a second away: "at once" and "at its time" stay apart on a loaded machine.
    const SerialWorker::Retry retry{.first = absl::Seconds(1),
                                    .max = absl::Seconds(1),
                                    .newer_waits_for_retry = waits};
    std::atomic<int> old_runs{0};
    absl::Time old_ran;  // the retry is due a second after this
    worker.PostRetrying(
        "file",
        [&] {
          old_ran = absl::Now();
          old_runs++;
          return SerialWorker::Outcome::kRetry;
        },
        retry);
    ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
    const absl::Time posted = absl::Now();
    absl::Notification newer;
    absl::Time newer_ran;
    worker.PostRetrying(
        "file",
        [&] {
          newer_ran = absl::Now();
          newer.Notify();
          return SerialWorker::Outcome::kDone;
        },
        retry);
    ASSERT_TRUE(newer.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_EQ(old_runs.load(), 1);  // replaced, never retried
    if (waits) {
      EXPECT_GE(newer_ran - old_ran, absl::Milliseconds(900));  // at the retry's time
    } else {
      EXPECT_LT(newer_ran - posted, absl::Milliseconds(900));
    }
    EXPECT_FALSE(worker.retrying("file"));
  }
}

TEST(SerialWorkerTest, StopCallsItsHooksSoARunningTaskEndsAtOnce) {
  SerialWorker worker("test-worker");
  absl::Notification started, cancelled;
  worker.Post("request", [&] {  // a request to an API server that never answers
    started.Notify();
    cancelled.WaitForNotification();
  });
  worker.AddStopHook([&] { cancelled.Notify(); });  // ApiClient::Cancel
  started.WaitForNotification();
  const absl::Time start = absl::Now();
  worker.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  bool late_hook = false;
  worker.AddStopHook([&] { late_hook = true; });  // after Stop: called at once
  EXPECT_TRUE(late_hook);
}

TEST(SerialWorkerTest, AnIdleWorkerHoldsNoThreadAndStartsOneForTheNextTask) {
  SerialWorker worker("test-idle", {.exit_when_idle = true});
  EXPECT_FALSE(worker.thread_running());
  for (int round = 0; round < 3; ++round) {
    absl::Notification ran;
    std::string name;
    worker.Post("cdi", [&] {
      char buffer[16] = {};
      pthread_getname_np(pthread_self(), buffer, sizeof(buffer));
      name = buffer;
      ran.Notify();
    });
    ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
    EXPECT_EQ(name, "test-idle");
    ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
    // The thread ends on its own once idle: up to 10 s (a sanitizer build is slow to end one).
    EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return !worker.thread_running(); }));
  }
  // A retry waiting keeps the thread: it is the one that runs it.
  worker.PostRetrying(
      "api", [] { return SerialWorker::Outcome::kRetry; },
      {.first = absl::Hours(1), .max = absl::Hours(1)});
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
  EXPECT_TRUE(worker.thread_running());
  EXPECT_EQ(worker.completed(), 4u);
}

TEST(SerialWorkerTest, StopCanAbandonATaskStuckInTheKernel) {
  auto worker = std::make_unique<SerialWorker>(
      "test-worker", SerialWorker::Options{.stop_abandons_running_task = true});
  absl::Notification started, release;
  std::atomic<bool> finished{false};
  worker->Post("fsync", [&] {  // an fsync on a dying SD card
    started.Notify();
    release.WaitForNotification();
    finished = true;
  });
  started.WaitForNotification();
  const absl::Time start = absl::Now();
  worker->Stop();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_FALSE(finished);
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  worker.reset();  // waits for the task: what it uses goes next
  EXPECT_TRUE(finished);
  releaser.join();
}

// At the process limit a worker that exits when idle cannot start its thread: what was posted
// waits (nothing terminates), and runs once a later post can start it.
TEST(SerialWorkerTest, AThreadThatCannotStartLeavesTheWorkQueuedForTheNextPost) {
  const int code = ::edgeaccel::testing::RunWhereNoThreadStarts([] {
    SerialWorker worker("ea-test", {.exit_when_idle = true});
    std::atomic<int> ran{0};
    worker.Post("a", [&] { ++ran; });
    if (worker.start_failures() != 1 || worker.thread_running() || ran.load() != 0) return false;
    if (!::edgeaccel::testing::AllowThreads()) return false;
    worker.Post("b", [&] { ran += 10; });
    return worker.Drain(absl::Seconds(30)) && ran.load() == 11;
  });
  EXPECT_EQ(code, 0) << "134 is std::terminate";
}

}  // namespace
}  // namespace edgeaccel
