#include "edgeaccel/kubelet/completion_loop.h"

#include <pthread.h>

#include <utility>

namespace edgeaccel {

CompletionLoop::CompletionLoop(std::unique_ptr<grpc::ServerCompletionQueue> cq,
                               std::string thread_name)
    : cq_(std::move(cq)), thread_name_(std::move(thread_name)) {}

CompletionLoop::~CompletionLoop() { Drain(); }

void CompletionLoop::Start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
    Run();
  });
}

void CompletionLoop::Run() {
  loop_thread_.store(std::this_thread::get_id());
  void* tag = nullptr;
  bool ok = false;
  // Next() with no deadline: this thread sleeps until gRPC has an event for it.
  while (cq_->Next(&tag, &ok)) static_cast<CompletionTag*>(tag)->Proceed(ok);
}

bool CompletionLoop::StartOperation(const std::function<void()>& operation) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return false;
  operation();  // only starts it: it never blocks
  return true;
}

bool CompletionLoop::Post(grpc::Alarm* alarm, CompletionTag* tag) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return false;  // gRPC aborts on an operation begun on a shut-down queue
  // A deadline already past fires inside Set (timer_init runs a timer whose deadline is <= now
  // at once); "now" would be rounded up to the next millisecond and go through gRPC's timer
  // thread instead, a wake-up of another thread for every device change.
  alarm->Set(cq_.get(), gpr_inf_past(GPR_CLOCK_MONOTONIC), tag);
  return true;
}

void CompletionLoop::Drain() {
  if (drained_) return;
  drained_ = true;
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
  }
  cq_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    Run();  // never started: free what waits on the queue here
  }
}

}  // namespace edgeaccel
