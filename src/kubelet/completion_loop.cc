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
  void* tag = nullptr;
  bool ok = false;
  // Next() with no deadline: this thread sleeps until gRPC has an event for it.
  while (cq_->Next(&tag, &ok)) static_cast<CompletionTag*>(tag)->Proceed(ok);
}

bool CompletionLoop::Request(const std::function<void()>& request) {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return false;
  request();  // only registers the wait: it never blocks
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
