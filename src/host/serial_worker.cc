#include "edgeaccel/host/serial_worker.h"

#include <pthread.h>

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel {

SerialWorker::SerialWorker(std::string thread_name, Options options)
    : thread_name_(std::move(thread_name)), options_(options) {}

SerialWorker::~SerialWorker() {
  Stop();
  // A task Stop() abandoned still runs; what it uses goes once we are gone, so wait for it here.
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void SerialWorker::Post(const std::string& key, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  Enqueue(
      key,
      [task = std::move(task)] {
        task();
        return Outcome::kDone;
      },
      Retry());
}

void SerialWorker::PostRetrying(const std::string& key, std::function<Outcome()> attempt,
                                Retry retry) {
  absl::MutexLock lock(&mu_);
  Enqueue(key, std::move(attempt), retry);
}

void SerialWorker::Enqueue(const std::string& key, std::function<Outcome()> task,
                           const Retry& retry) {
  if (stopping_) return;
  Waiting waiting{std::move(task), retry};
  auto backoff = backoff_.find(key);
  if (backoff != backoff_.end() && backoff->second->retry.newer_waits_for_retry) {
    waiting.not_before = backoff->second->retry_at;
  }
  auto [it, fresh] = waiting_.insert_or_assign(key, std::move(waiting));
  if (fresh) order_.push_back(key);
  StartThreadLocked();
}

void SerialWorker::StartThreadLocked() {
  if (thread_live_) return;
  // A thread that ended when idle has left Run() and takes mu_ no more: joining is brief.
  if (thread_.joinable()) thread_.join();
  try {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
      Run();
    });
  } catch (const std::system_error& e) {
    // EAGAIN: the process limit of the node or the pod's cgroup. What was posted stays queued
    // and the next Post tries again; said once until a thread starts.
    if (!start_failure_said_) {
      LOG(ERROR) << "cannot start the " << thread_name_ << " thread (" << e.what()
                 << "); its work waits for the next change";
      start_failure_said_ = true;
    }
    ++start_failures_;
    return;
  }
  start_failure_said_ = false;
  thread_live_ = true;
}

void SerialWorker::AddStopHook(std::function<void()> hook) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stop_hooks_.push_back(std::move(hook));
      return;
    }
  }
  hook();
}

std::deque<std::string>::iterator SerialWorker::NextReady(absl::Time now) {
  return std::find_if(order_.begin(), order_.end(), [&](const std::string& key)
                                                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                                          return waiting_.at(key).not_before <= now;
                                                        });
}

absl::Time SerialWorker::EarliestWaiting() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [key, waiting] : waiting_) earliest = std::min(earliest, waiting.not_before);
  return earliest;
}

void SerialWorker::Run() {
  mu_.Lock();
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (options_.exit_when_idle && waiting_.empty()) ||
             NextReady(absl::Now()) != order_.end();
    };
    // No deadline unless a retry waits: an idle worker never wakes.
    mu_.AwaitWithDeadline(absl::Condition(&ready), EarliestWaiting());
    if (stopping_) break;
    if (options_.exit_when_idle && waiting_.empty()) break;
    const absl::Time now = absl::Now();
    auto next = NextReady(now);
    if (next == order_.end()) continue;  // a retry's time has not come yet
    const std::string key = std::move(*next);
    order_.erase(next);
    auto it = waiting_.find(key);
    Waiting waiting = std::move(it->second);
    waiting_.erase(it);
    running_task_ = true;
    mu_.Unlock();
    const Outcome outcome = waiting.task();
    mu_.Lock();
    running_task_ = false;
    ++completed_;
    if (stopping_) break;
    if (outcome == Outcome::kDone) {
      backoff_.erase(key);
      continue;
    }
    ++retries_;
    std::unique_ptr<KeyBackoff>& backoff = backoff_[key];
    if (backoff == nullptr) backoff = std::make_unique<KeyBackoff>(waiting.retry);
    backoff->retry_at = absl::Now() + backoff->backoff.Next();
    auto newer = waiting_.find(key);
    if (newer != waiting_.end()) {
      // Posted while this attempt ran: it replaces the retry.
      if (backoff->retry.newer_waits_for_retry) {
        newer->second.not_before = std::max(newer->second.not_before, backoff->retry_at);
      }
      continue;
    }
    waiting.not_before = backoff->retry_at;
    waiting.is_retry = true;
    waiting_.emplace(key, std::move(waiting));
    order_.push_back(key);
  }
  thread_live_ = false;
  mu_.Unlock();
}

bool SerialWorker::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!running_task_ && NextReady(absl::Now()) == order_.end());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void SerialWorker::Stop() {
  std::vector<std::function<void()>> hooks;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    order_.clear();
    waiting_.clear();
    backoff_.clear();
    hooks.swap(stop_hooks_);
  }
  for (const auto& hook : hooks) hook();
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    // Abandoned: the task may be stuck in the kernel; the destructor joins it.
    if (options_.stop_abandons_running_task && running_task_) return;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

uint64_t SerialWorker::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

uint64_t SerialWorker::retries() const {
  absl::MutexLock lock(&mu_);
  return retries_;
}

bool SerialWorker::retrying(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(key);
  return it != waiting_.end() && it->second.is_retry;
}

uint64_t SerialWorker::start_failures() const {
  absl::MutexLock lock(&mu_);
  return start_failures_;
}

bool SerialWorker::thread_running() const {
  absl::MutexLock lock(&mu_);
  return thread_live_;
}

}  // namespace edgeaccel
