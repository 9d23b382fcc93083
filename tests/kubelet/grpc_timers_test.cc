// gRPC's iomgr timers on the one event-engine thread: call deadlines still end calls at their
// time (not before), a cancelled call's timer goes with it, gRPC's `grpc_global_timer` and
// resolver executor threads are gone, and an idle process with a served socket and a connected channel
// has no timer wake-ups at all (gRPC's own timer threads wake once a second). Each test case runs
// in a process of its own (CTest runs one case per process), as the daemon, which makes this
// choice once before anything of gRPC exists.
#include "edgeaccel/kubelet/grpc_timers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin_v1beta1.grpc.pb.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/grpc_event_engine.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

using ::edgeaccel::testing::ThreadNames;
using ::edgeaccel::testing::WakeUpsByThread;

class GrpcTimersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As the daemon's main does: the client channel's backup poller (a timer every 5 s) is off.
    setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", /*overwrite=*/0);
    said_ = new std::string(RunGrpcTimersOn(UseOneThreadGrpcEventEngine()));
  }

  // A stub on a socket nobody answers: only the call's deadline (or a cancel) ends its calls.
  std::unique_ptr<v1beta1::DevicePlugin::Stub> HungStub() {
    hung_ = std::make_unique<::edgeaccel::testing::HungSocket>(dir_.path() + "/hung.sock");
    return v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + dir_.path() + "/hung.sock", grpc::InsecureChannelCredentials()));
  }

  // A plugin socket served, and one call to it through a new channel (which makes every thread
  // of gRPC's that a call makes); nullptr when either failed.
  std::unique_ptr<PluginServer> ServeAndCallOnce() {
    auto server = std::make_unique<PluginServer>(dir_.path() + "/plugin.sock", &set_, &counters_, nullptr);
    if (!server->Start().ok()) return nullptr;
    auto stub = v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix:" + dir_.path() + "/plugin.sock", grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1beta1::DevicePluginOptions options;
    if (!stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok()) return nullptr;
    return server;
  }

  static std::string* said_;
  DeviceSet set_{"coral.ai/edgetpu"};
  PluginCounters counters_;
  ::edgeaccel::testing::TempDir dir_;
  std::unique_ptr<::edgeaccel::testing::HungSocket> hung_;
};

std::string* GrpcTimersTest::said_ = nullptr;

// Which way the build went (cmake/grpc_internals.cmake: the configure-time probe of gRPC's
// internals). Each way has its own figures; both keep every deadline.
#if EDGEACCEL_GRPC_TIMERS
TEST_F(GrpcTimersTest, GrpcsTimerAndResolverThreadsAreGoneAndTheEngineRunsTheTimers) {
  EXPECT_THAT(*said_, ::testing::HasSubstr("timers on the event engine's thread")) << *said_;
  std::unique_ptr<PluginServer> server = ServeAndCallOnce();
  ASSERT_NE(server, nullptr);

  // comm names are cut at 15 characters: "default-executo", "resolver-execut". The default
  // executor stays (it runs the TCP write backup poller, which blocks). Its thread names itself
  // once it runs, which may be just after the call returns.
  ASSERT_TRUE(::edgeaccel::testing::Eventually([] {
    for (const std::string& name : ThreadNames()) {
      if (name.rfind("default-execut", 0) == 0) return true;
    }
    return false;
  })) << ::testing::PrintToString(ThreadNames());
  const std::vector<std::string> names = ThreadNames();
  EXPECT_THAT(names, ::testing::Contains("ea-grpc-timer"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("grpc_global_tim")));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains(::testing::StartsWith("resolver-execu"))));
  EXPECT_THAT(names, ::testing::Contains(::testing::StartsWith("default-execut")));
  server->Stop();
}
#else
TEST_F(GrpcTimersTest, WithoutTheProbeGrpcKeepsItsOwnTimerThreadsAndSaysSo) {
  EXPECT_THAT(*said_, ::testing::HasSubstr("own timer threads")) << *said_;
  std::unique_ptr<PluginServer> server = ServeAndCallOnce();
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(ThreadNames(), ::testing::Contains("grpc_global_tim"));
  EXPECT_EQ(PendingGrpcTimers(), 0);
  server->Stop();
}
#endif

TEST_F(GrpcTimersTest, EachDeadlineEndsItsCallAtItsTimeAndACancelledCallsTimerGoes) {
  auto stub = HungStub();
  {
    // A first call makes the channel's connection attempt, with timers of its own (its connect
    // timeout, keepalive, the backup poller) that outlive the calls; counted from here.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + milliseconds(50));
    v1beta1::DevicePluginOptions options;
    ASSERT_EQ(stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  const int channel_timers = PendingGrpcTimers();
  struct Call {
    milliseconds deadline;
    grpc::StatusCode code = grpc::StatusCode::OK;
    steady_clock::duration took{};
  };
  // Out of order, so the engine's tick must move earlier as later calls start; more than a second
  // apart, so a tick that did not move would make a call over a second late.
  std::vector<Call> calls{{milliseconds(2700)}, {milliseconds(150)}, {milliseconds(1400)}};
  std::vector<std::thread> threads;
  for (Call& call : calls) {
    threads.emplace_back([&stub, &call] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + call.deadline);
      v1beta1::DevicePluginOptions options;
      const auto start = steady_clock::now();
      call.code = stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).error_code();
      call.took = steady_clock::now() - start;
    });
  }
  // And one call cancelled long before its deadline: it ends at the cancel, with its timer.
  grpc::ClientContext cancelled;
  cancelled.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::thread canceller([&cancelled] {
    std::this_thread::sleep_for(milliseconds(200));
    cancelled.TryCancel();
  });
  v1beta1::DevicePluginOptions options;
  const auto start = steady_clock::now();
  const grpc::Status status = stub->GetDevicePluginOptions(&cancelled, v1beta1::Empty(), &options);
  const auto cancel_took = steady_clock::now() - start;
  canceller.join();
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(cancel_took, std::chrono::seconds(30)) << "the cancel ended it, not its deadline";
  for (const Call& call : calls) {
    SCOPED_TRACE(call.deadline.count());
    EXPECT_EQ(call.code, grpc::StatusCode::DEADLINE_EXCEEDED);
    // Not before its time (gRPC rounds deadlines to milliseconds), and not a whole second late
    // (the engine sleeps to the earliest deadline; a tick left at a later one is over a second off).
    EXPECT_GE(call.took, call.deadline - milliseconds(5));
    EXPECT_LT(call.took, call.deadline + std::chrono::seconds(1));
  }
  EXPECT_EQ(PendingGrpcTimers(), channel_timers) << "every call's deadline timer went with it";
}

#if EDGEACCEL_GRPC_TIMERS
TEST_F(GrpcTimersTest, AnIdleServerAndConnectedChannelWakeNoThreadOfGrpcs) {
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  PluginServer server(dir_.path() + "/plugin.sock", &set, &counters, nullptr);
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel("unix:" + dir_.path() + "/plugin.sock", grpc::InsecureChannelCredentials());
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  grpc::ClientContext context;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
  ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);

  // Settle (the call's own work done: 300 ms in which no thread but this one woke, looked for
  // for up to 10 s), then count over a window longer than gRPC's 1 s timer tick.
  auto others_woke = [](const std::map<std::string, int64_t>& from,
                        const std::map<std::string, int64_t>& to) {
    for (const auto& [name, switches] : to) {
      auto it = from.find(name);
      if (name != "grpc_timers_tes" && switches != (it == from.end() ? 0 : it->second)) return true;
    }
    return false;
  };
  for (const auto give_up = steady_clock::now() + std::chrono::seconds(10);
       steady_clock::now() < give_up;) {
    const std::map<std::string, int64_t> start = WakeUpsByThread();
    std::this_thread::sleep_for(milliseconds(300));
    if (!others_woke(start, WakeUpsByThread())) break;
  }
  const std::map<std::string, int64_t> before = WakeUpsByThread();
  std::this_thread::sleep_for(milliseconds(2500));
  const std::map<std::string, int64_t> after = WakeUpsByThread();
  for (const auto& [name, switches] : after) {
    if (name == "grpc_timers_tes") continue;  // the main thread: this test's own sleeps
    auto it = before.find(name);
    const int64_t woke = switches - (it == before.end() ? 0 : it->second);
    EXPECT_EQ(woke, 0) << name << " woke " << woke << " times while idle (" << PendingGrpcTimers()
                       << " gRPC timer(s) pending)";
  }
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  server.Stop();
}
#else
// gRPC's own timer threads wake at least once a second with nothing pending: the figure this
// way has (docs/footprint.md).
TEST_F(GrpcTimersTest, WithoutTheProbeGrpcsTimerThreadsWakeWhileIdle) {
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  PluginServer server(dir_.path() + "/plugin.sock", &set, &counters, nullptr);
  ASSERT_TRUE(server.Start().ok());
  std::this_thread::sleep_for(milliseconds(300));
  const std::map<std::string, int64_t> before = WakeUpsByThread();
  std::this_thread::sleep_for(milliseconds(2500));
  const std::map<std::string, int64_t> after = WakeUpsByThread();
  ASSERT_TRUE(after.count("grpc_global_tim"));
  const int64_t woke = after.at("grpc_global_tim") -
                       (before.count("grpc_global_tim") ? before.at("grpc_global_tim") : 0);
  EXPECT_GE(woke, 2) << "gRPC's timer threads, 2.5 s idle";
  server.Stop();
}
#endif

}  // namespace
}  // namespace edgeaccel
