// The one-thread EventEngine gRPC runs its deferred work and timers on: everything on its one
// thread, timers in deadline order and not before their time, Cancel before the deadline wins,
// and with it installed gRPC still serves and calls (on a real Unix socket).
#include "edgeaccel/kubelet/grpc_event_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using grpc_event_engine::experimental::EventEngine;
using std::chrono::milliseconds;
using std::chrono::seconds;

using ::edgeaccel::testing::ThreadNames;

// Which way the build went (cmake/grpc_internals.cmake): our engine where it compiles against
// the installed gRPC's EventEngine interface, gRPC's own otherwise.
#if EDGEACCEL_GRPC_EVENT_ENGINE
TEST(OneThreadEventEngineTest, EverythingRunsOnItsOneThreadTimersInDeadlineOrder) {
  std::unique_ptr<EventEngine> engine = MakeOneThreadEventEngine("test-engine");
  absl::Mutex mu;
  std::vector<std::string> order;
  std::vector<std::thread::id> threads;
  absl::Notification done;
  auto record = [&](std::string what) {
    return [&, what] {
      absl::MutexLock lock(&mu);
      order.push_back(what);
      threads.push_back(std::this_thread::get_id());
    };
  };
  const auto start = std::chrono::steady_clock::now();
  engine->RunAfter(milliseconds(60), record("60ms"));
  engine->RunAfter(milliseconds(20), record("20ms"));
  engine->Run(record("now"));
  engine->RunAfter(milliseconds(90), [&] {
    record("90ms")();
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(90)) << "never before its time";
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<std::string>{"now", "20ms", "60ms", "90ms"}));
  for (const std::thread::id& id : threads) EXPECT_EQ(id, threads.front());
  EXPECT_NE(threads.front(), std::this_thread::get_id());
}

TEST(OneThreadEventEngineTest, ACancelledTimerNeverRunsAndCancelSaysWhetherItWon) {
  std::unique_ptr<EventEngine> engine = MakeOneThreadEventEngine("test-engine");
  std::atomic<bool> ran{false};
  EventEngine::TaskHandle handle = engine->RunAfter(milliseconds(50), [&] { ran = true; });
  EXPECT_TRUE(engine->Cancel(handle));
  EXPECT_FALSE(engine->Cancel(handle)) << "already cancelled";
  absl::Notification later;
  engine->RunAfter(milliseconds(100), [&] { later.Notify(); });  // past the cancelled deadline
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(ran.load());
  absl::Notification ran_once;
  EventEngine::TaskHandle run = engine->RunAfter(milliseconds(1), [&] { ran_once.Notify(); });
  ASSERT_TRUE(ran_once.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(engine->Cancel(run)) << "it ran: too late to cancel";
}

// The loop waits until its earliest timer's deadline; cancelling that timer while it waits frees
// the entry the deadline was read from. The wait must not read it again (AddressSanitizer's
// heap-use-after-free in the old loop, which waited on a reference into the entry).
TEST(OneThreadEventEngineTest, CancellingTheTimerTheLoopWaitsForIsSafe) {
  std::unique_ptr<EventEngine> engine = MakeOneThreadEventEngine("test-engine");
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) {
    // Far enough away that a stalled test thread still cancels it before it is due.
    EventEngine::TaskHandle earliest = engine->RunAfter(seconds(60), [&] { ++ran; });
    std::this_thread::sleep_for(milliseconds(2));  // the loop is waiting for it now
    EXPECT_TRUE(engine->Cancel(earliest));
  }
  absl::Notification after;
  engine->RunAfter(milliseconds(1), [&] { after.Notify(); });
  ASSERT_TRUE(after.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(ran.load(), 0);
}

TEST(OneThreadEventEngineTest, ClosuresMayScheduleMoreAndTheEngineMayGoFromItsOwnThread) {
  std::unique_ptr<EventEngine> engine = MakeOneThreadEventEngine("test-engine");
  EventEngine* raw = engine.get();
  absl::Notification done;
  raw->Run([&] {
    EXPECT_TRUE(raw->IsWorkerThread());
    raw->RunAfter(milliseconds(5), [&] { done.Notify(); });
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(raw->IsWorkerThread());
  // Destroyed from a closure it runs (gRPC may drop its last reference there): no self-join.
  absl::Notification destroyed;
  EventEngine* released = engine.release();
  released->Run([released, &destroyed] {
    delete released;
    destroyed.Notify();
  });
  ASSERT_TRUE(destroyed.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// With the engine installed before anything gRPC is made, as the daemon does: a server on a Unix
// socket answers, a call with a deadline on a socket nobody answers ends at its deadline, and no
// thread of gRPC's own engine (named "event_engine"/"timer_manager") exists.
TEST(OneThreadEventEngineTest, InstalledGrpcServesAndCallsWithDeadlines) {
  UseOneThreadGrpcEventEngine();
  ::edgeaccel::testing::TempDir dir;
  const std::string path = dir.path() + "/plugin.sock";
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  PluginServer server(path, &set, &counters, nullptr);
  ASSERT_TRUE(server.Start().ok());
  auto stub = v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1beta1::DevicePluginOptions options;
  EXPECT_TRUE(stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());

  // A hung peer: the call's deadline is what ends it.
  ::edgeaccel::testing::HungSocket hung(dir.path() + "/hung.sock");
  auto hung_stub = v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + dir.path() + "/hung.sock", grpc::InsecureChannelCredentials()));
  grpc::ClientContext hung_context;
  hung_context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status =
      hung_stub->GetDevicePluginOptions(&hung_context, v1beta1::Empty(), &options);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(took, std::chrono::seconds(3));

  const std::vector<std::string> names = ThreadNames();
  EXPECT_THAT(names, ::testing::Contains("ea-grpc-timer"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("event_engine")));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("timer_manager")));
  server.Stop();
}
#else
TEST(OneThreadEventEngineTest, WhereItDoesNotFitThisGrpcThereIsNone) {
  EXPECT_EQ(MakeOneThreadEventEngine("test-engine"), nullptr);
  EXPECT_EQ(UseOneThreadGrpcEventEngine(), nullptr);
}
#endif

}  // namespace
}  // namespace edgeaccel
