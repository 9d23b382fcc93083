#include "edgeaccel/host/serial_worker.h"

#include <pthread.h>

#include <utility>

namespace edgeaccel {

SerialWorker::SerialWorker(std::string thread_name) : thread_name_(std::move(thread_name)) {}

SerialWorker::~SerialWorker() { Stop(); }

void SerialWorker::Post(const std::string& key, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  auto [it, fresh] = waiting_.insert_or_assign(key, std::move(task));
  if (fresh) order_.push_back(key);
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
      Run();
    });
  }
}

void SerialWorker::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SerialWorker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
            return w->stopping_ || !w->order_.empty();
          },
          this));
      if (stopping_) return;
      const std::string key = std::move(order_.front());
      order_.pop_front();
      auto it = waiting_.find(key);
      task = std::move(it->second);
      waiting_.erase(it);
      running_task_ = true;
    }
    task();
    absl::MutexLock lock(&mu_);
    running_task_ = false;
    ++completed_;
  }
}

bool SerialWorker::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return order_.empty() && !running_task_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void SerialWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    order_.clear();
    waiting_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t SerialWorker::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

}  // namespace edgeaccel
