#include "edgeaccel/host/workers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "eventually.h"
#include "fixture_host.h"
#include "thread_limit.h"

namespace edgeaccel {
namespace {

TEST(WorkersTest, RunsTasksInTheOrderPosted) {
  Workers worker("test-worker");
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

TEST(WorkersTest, ASlowTaskNeverBlocksTheOneWhoPosts) {
  Workers worker("test-worker");
  absl::Notification started, release;
  worker.Post("slow", [&] {  // an fsync on a dying SD card
    started.Notify();
    release.WaitForNotification();
  });
  started.WaitForNotification();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) worker.Post("cdi", [] {});
  worker.Post("slow", [] {});
  // A Post that waited for the slow task would never return: it ends only when released below.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_FALSE(worker.Drain(absl::Milliseconds(50)));
  release.Notify();
  EXPECT_TRUE(worker.Drain(absl::Seconds(5)));
}

TEST(WorkersTest, AWaitingTaskIsReplacedByTheLatestOfItsKey) {
  Workers worker("test-worker");
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

TEST(WorkersTest, StopDropsWhatWaitsAndFinishesWhatRuns) {
  auto worker = std::make_unique<Workers>("test-worker");
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

TEST(WorkersTest, AnAttemptThatFailsIsRetriedWithBackoff) {
  Workers worker("test-worker");
  std::atomic<int> attempts{0};
  absl::Notification done;
  const absl::Time start = absl::Now();
  worker.PostRetrying(
      "labels",
      [&] {
        if (++attempts < 3) return Workers::Outcome::kRetry;
        done.Notify();
        return Workers::Outcome::kDone;
      },
      {.first = absl::Milliseconds(20), .max = absl::Milliseconds(40)});
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(60));  // 20 ms, then 40 ms
  EXPECT_EQ(attempts.load(), 3);
  EXPECT_EQ(worker.retries(), 2u);
  EXPECT_FALSE(worker.retrying("labels"));
}

TEST(WorkersTest, ARetryThatWaitsHoldsUpNoOtherKey) {
  Workers worker("test-worker");
  std::atomic<int> api{0};
  worker.PostRetrying(
      "api",
      [&] {
        api++;
        return Workers::Outcome::kRetry;  // an API server that never answers well
      },
      {.first = absl::Hours(1), .max = absl::Hours(1)});
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));  // a retry not yet due does not count
  EXPECT_TRUE(worker.retrying("api"));
  absl::Notification cdi;
  worker.Post("cdi", [&] { cdi.Notify(); });
  EXPECT_TRUE(cdi.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(api.load(), 1);
}

TEST(WorkersTest, ANewerTaskReplacesARetryAtOnceOrAtItsTime) {
  for (const bool waits : {false, true}) {
    SCOPED_TRACE(waits ? "newer waits for the retry" : "newer runs at once");
    Workers worker("test-worker");
    // A retry a second away: "at once" and "at its time" stay apart on a loaded machine.
    const Workers::Retry retry{.first = absl::Seconds(1),
                                    .max = absl::Seconds(1),
                                    .newer_waits_for_retry = waits};
    std::atomic<int> old_runs{0};
    absl::Time old_ran;  // the retry is due a second after this
    worker.PostRetrying(
        "file",
        [&] {
          old_ran = absl::Now();
          old_runs++;
          return Workers::Outcome::kRetry;
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
          return Workers::Outcome::kDone;
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

TEST(WorkersTest, StopCallsItsHooksSoARunningTaskEndsAtOnce) {
  Workers worker("test-worker");
  absl::Notification started, cancelled;
  worker.Post("request", [&] {  // a request to an API server that never answers
    started.Notify();
    cancelled.WaitForNotification();
  });
  worker.AddStopHook([&] { cancelled.Notify(); });  // ApiClient::Cancel
  started.WaitForNotification();
  const absl::Time start = absl::Now();
  worker.Stop();
  // Without its hook the task would never end, nor would Stop.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  bool late_hook = false;
  worker.AddStopHook([&] { late_hook = true; });  // after Stop: called at once
  EXPECT_TRUE(late_hook);
}

TEST(WorkersTest, AnIdleWorkerHoldsNoThreadAndStartsOneForTheNextTask) {
  Workers worker("test-idle", {.exit_when_idle = true});
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
      "api", [] { return Workers::Outcome::kRetry; },
      {.first = absl::Hours(1), .max = absl::Hours(1)});
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
  EXPECT_TRUE(worker.thread_running());
  EXPECT_EQ(worker.completed(), 4u);
}

// With a linger, a burst of tasks runs on one thread (none started per task), which ends once no
// task came for that long; a retry waiting after it keeps it, as without a linger.
TEST(WorkersTest, ALingeringThreadTakesTheNextTaskAndEndsAfterTheLinger) {
  Workers worker("test-linger", {.parallel = Workers::kUnbounded, .exit_when_idle = true,
                                 .linger = absl::Seconds(2)});
  std::set<pid_t> threads;
  absl::Mutex mu;
  for (int task = 0; task < 5; ++task) {
    absl::Notification ran;
    ASSERT_TRUE(worker.Start([&] {
                        absl::MutexLock lock(&mu);
                        threads.insert(static_cast<pid_t>(syscall(SYS_gettid)));
                        ran.Notify();
                      })
                    .ok());
    ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
    ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
    absl::SleepFor(absl::Milliseconds(20));  // a tenth of the linger: the kubelet's next call
  }
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(threads.size(), 1u) << "five tasks, one thread";
  }
  EXPECT_TRUE(worker.thread_running()) << "within its linger";
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return !worker.thread_running(); }))
      << "ends once its linger is over";
  worker.PostRetrying(
      "api", [] { return Workers::Outcome::kRetry; },
      {.first = absl::Hours(1), .max = absl::Hours(1)});
  ASSERT_TRUE(worker.Drain(absl::Seconds(5)));
  absl::SleepFor(absl::Seconds(3));  // past the linger
  EXPECT_TRUE(worker.thread_running()) << "the retry keeps it";
  EXPECT_EQ(worker.completed(), 6u);
}

TEST(WorkersTest, StopCanAbandonATaskStuckInTheKernel) {
  auto worker = std::make_unique<Workers>(
      "test-worker", Workers::Options{.stop_abandons_running_task = true});
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
  // A Stop that waited for the task would never return: it is released only below.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
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
TEST(WorkersTest, AThreadThatCannotStartLeavesTheWorkQueuedForTheNextPost) {
  const int code = ::edgeaccel::testing::RunWhereNoThreadStarts([] {
    Workers worker("ea-test", {.exit_when_idle = true});
    std::atomic<int> ran{0};
    worker.Post("a", [&] { ++ran; });
    if (worker.start_failures() != 1 || worker.thread_running() || ran.load() != 0) return false;
    if (!::edgeaccel::testing::AllowThreads()) return false;
    worker.Post("b", [&] { ran += 10; });
    return worker.Drain(absl::Seconds(30)) && ran.load() == 11;
  });
  EXPECT_EQ(code, 0) << "134 is std::terminate";
}

// The DRA calls' workers: a thread for each piece of work, alive only while it runs, so an idle
// driver has none.
TEST(WorkersTest, InParallelAThreadLivesOnlyWhileItsWorkRuns) {
  Workers threads("ea-test-work", {.parallel = Workers::kUnbounded, .exit_when_idle = true});
  const size_t before = ::edgeaccel::testing::ThreadNames().size();
  absl::Notification started, release;
  ASSERT_TRUE(threads.Start([&] {
    started.Notify();
    release.WaitForNotification();
  }).ok());
  started.WaitForNotification();
  EXPECT_EQ(threads.running(), 1);
  const std::vector<std::string> names = ::edgeaccel::testing::ThreadNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "ea-test-work"), 1) << "named as asked";
  release.Notify();
  ASSERT_TRUE(threads.Drain(absl::Seconds(30)));
  EXPECT_EQ(threads.running(), 0);
  // The thread ends once it finds nothing to run; the kernel may list its task in /proc a
  // moment after it is joined, so that listing is waited for.
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return !threads.thread_running(); }));
  EXPECT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return ::edgeaccel::testing::ThreadNames().size() == before; }))
      << "no thread is left once the work is done";
}

TEST(WorkersTest, InParallelEveryKeyRunsAtOnceDrainWaitsForAllAndStopRefusesMore) {
  Workers threads("ea-test-work", {.parallel = Workers::kUnbounded, .exit_when_idle = true});
  std::atomic<int> done{0};
  absl::Notification go;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(threads.Start([&] {
      go.WaitForNotification();
      ++done;
    }).ok());
  }
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return threads.running() == 8; }))
      << "each key on a thread of its own, none waiting for another";
  go.Notify();
  ASSERT_TRUE(threads.Drain(absl::Seconds(30)));
  EXPECT_EQ(done.load(), 8);
  threads.Stop();
  EXPECT_TRUE(absl::IsCancelled(threads.Start([&] { ++done; })));
  EXPECT_EQ(done.load(), 8);
}

// In parallel too, a key's tasks run one at a time and in order, and a waiting one is replaced;
// another key runs beside them at once.
TEST(WorkersTest, InParallelAKeyStillRunsOneTaskAtATime) {
  Workers threads("ea-test-work", {.parallel = Workers::kUnbounded, .exit_when_idle = true});
  absl::Notification first_running, release_first, other_ran;
  std::atomic<int> first_done{0};
  std::vector<std::string> order;
  absl::Mutex order_mu;
  threads.Post("k", [&] {
    first_running.Notify();
    release_first.WaitForNotification();
    absl::MutexLock lock(&order_mu);
    order.push_back("first");
  });
  first_running.WaitForNotification();
  threads.Post("k", [&] { absl::MutexLock lock(&order_mu); order.push_back("replaced"); });
  threads.Post("k", [&] { absl::MutexLock lock(&order_mu); order.push_back("second"); });
  threads.Post("other", [&] { other_ran.Notify(); });
  EXPECT_TRUE(other_ran.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "another key waited for a running one";
  {
    absl::MutexLock lock(&order_mu);
    EXPECT_TRUE(order.empty()) << "the key's next task ran beside its first";
  }
  release_first.Notify();
  ASSERT_TRUE(threads.Drain(absl::Seconds(30)));
  absl::MutexLock lock(&order_mu);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
}

// A retry queued by one thread while another waits with no deadline is run at its time: the
// waiting thread's deadline follows the earliest retry, whichever thread goes idle first.
TEST(WorkersTest, InParallelARetryRunsAtItsTimeWhateverThreadWaits) {
  Workers threads("ea-test-work", {.parallel = 2});
  absl::Notification busy_running, release_busy;
  threads.Post("busy", [&] {
    busy_running.Notify();
    release_busy.WaitForNotification();
  });
  busy_running.WaitForNotification();
  std::atomic<int> attempts{0};
  threads.PostRetrying("flaky", [&] {
    return ++attempts == 1 ? Workers::Outcome::kRetry : Workers::Outcome::kDone;
  }, {.first = absl::Milliseconds(50), .max = absl::Milliseconds(50)});
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return attempts.load() == 2; }))
      << "the retry never ran";
  release_busy.Notify();
  ASSERT_TRUE(threads.Drain(absl::Seconds(30)));
}

// At the process limit a thread cannot start: Start refuses the work with the reason (nothing
// terminates, nothing is left queued), and the next Start once threads can start again works.
TEST(WorkersTest, AThreadThatCannotStartIsAnErrorTheCallerOfStartAnswers) {
  const int code = ::edgeaccel::testing::RunWhereNoThreadStarts([] {
    Workers threads("ea-test-work", {.parallel = Workers::kUnbounded, .exit_when_idle = true});
    std::atomic<int> done{0};
    absl::Status refused = threads.Start([&] { ++done; });
    if (!absl::IsResourceExhausted(refused) || refused.message().find("ea-test-work") == std::string::npos) {
      fprintf(stderr, "refused: %s\n", refused.ToString().c_str());
      return false;
    }
    if (threads.running() != 0 || !::edgeaccel::testing::AllowThreads()) return false;
    if (!threads.Start([&] { ++done; }).ok()) return false;
    return threads.Drain(absl::Seconds(30)) && done.load() == 1;
  });
  EXPECT_EQ(code, 0) << "134 is std::terminate";
}

}  // namespace
}  // namespace edgeaccel
