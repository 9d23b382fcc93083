// CompletionLoop: the one thread that drives gRPC's completion queue, and the guard that keeps
// any operation from reaching the queue once it is shut down (gRPC aborts the process on that).
#include "edgeaccel/kubelet/completion_loop.h"

#include <gtest/gtest.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"

namespace edgeaccel {
namespace {

// Records the thread its event ran on.
class Probe final : public CompletionTag {
 public:
  void Proceed(bool ok) override {
    ok_ = ok;
    on_loop_thread_ = loop_->OnLoopThread();
    ran_.Notify();
  }
  CompletionLoop* loop_ = nullptr;
  bool ok_ = false;
  bool on_loop_thread_ = false;
  absl::Notification ran_;
};

class CompletionLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    loop_ = std::make_unique<CompletionLoop>(std::move(cq), "test-loop");
    loop_->Start();
  }
  void TearDown() override { ShutDown(); }
  void ShutDown() {
    if (server_ == nullptr) return;
    server_->Shutdown();
    loop_->Drain();
    server_->Wait();
    server_.reset();
  }

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CompletionLoop> loop_;
};

TEST_F(CompletionLoopTest, WorkPostedFromAnotherThreadRunsOnTheLoopThread) {
  Probe probe;
  probe.loop_ = loop_.get();
  grpc::Alarm alarm;
  EXPECT_FALSE(loop_->OnLoopThread());
  std::thread other([&] { EXPECT_TRUE(loop_->Post(&alarm, &probe)); });
  other.join();
  ASSERT_TRUE(probe.ran_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(probe.ok_);
  EXPECT_TRUE(probe.on_loop_thread_);
}

// Once Drain has begun, nothing starts: the caller is told so and undoes what it prepared. (A
// RequestX re-armed by a call that arrived during shutdown, a late Write, a Post: each would
// abort in grpc_cq_begin_op.)
TEST_F(CompletionLoopTest, NothingStartsOnceTheQueueIsShutDown) {
  ShutDown();
  bool ran = false;
  EXPECT_FALSE(loop_->StartOperation([&] { ran = true; }));
  EXPECT_FALSE(ran);
  Probe probe;
  probe.loop_ = loop_.get();
  grpc::Alarm alarm;
  EXPECT_FALSE(loop_->Post(&alarm, &probe));
  EXPECT_FALSE(probe.ran_.HasBeenNotified());
}

}  // namespace
}  // namespace edgeaccel
