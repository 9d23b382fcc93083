#include "edgeaccel/host/workers.h"

#include <pthread.h>

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel {

Workers::Workers(std::string thread_name, Options options)
    : thread_name_(std::move(thread_name)), options_(options) {}

Workers::~Workers() {
  Stop();
  // A task Stop() abandoned still runs; what it uses goes once we are gone, so wait for it here.
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads = TakeThreadsLocked();
  }
  for (std::thread& thread : threads) thread.join();
}

std::vector<std::thread> Workers::TakeThreadsLocked() {
  std::vector<std::thread> threads = std::move(ended_);
  ended_.clear();
  for (auto& [id, thread] : threads_) threads.push_back(std::move(thread));
  threads_.clear();  // a thread still in Run() finds itself gone and leaves its handle be
  return threads;
}

void Workers::Post(const std::string& key, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  SayStartFailure(Enqueue(
      key,
      [task = std::move(task)] {
        task();
        return Outcome::kDone;
      },
      Retry()));
}

absl::Status Workers::Start(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::CancelledError("stopping");
  // No key Post is given: those name what a task writes.
  const std::string key = absl::StrCat("\x01started ", next_start_++);
  absl::Status started = Enqueue(
      key,
      [task = std::move(task)] {
        task();
        return Outcome::kDone;
      },
      Retry());
  if (started.ok() || !threads_.empty()) return absl::OkStatus();  // a running thread takes it
  waiting_.erase(key);
  order_.erase(std::remove(order_.begin(), order_.end(), key), order_.end());
  return started;
}

void Workers::PostRetrying(const std::string& key, std::function<Outcome()> attempt,
                           Retry retry) {
  absl::MutexLock lock(&mu_);
  SayStartFailure(Enqueue(key, std::move(attempt), retry));
}

absl::Status Workers::Enqueue(const std::string& key, std::function<Outcome()> task,
                              const Retry& retry) {
  if (stopping_) return absl::OkStatus();
  Waiting waiting{std::move(task), retry};
  auto backoff = backoff_.find(key);
  if (backoff != backoff_.end() && backoff->second->retry.newer_waits_for_retry) {
    waiting.not_before = backoff->second->retry_at;
  }
  auto [it, fresh] = waiting_.insert_or_assign(key, std::move(waiting));
  if (fresh) order_.push_back(key);
  return StartThreadLocked();
}

absl::Status Workers::StartThreadLocked() {
  // Threads that ended when idle have left Run() and take mu_ no more: joining them is brief.
  for (std::thread& thread : ended_) thread.join();
  ended_.clear();
  // Each waiting key no thread runs may need a thread of its own, up to the limit; a thread that
  // waits for work takes one.
  if (Unclaimed() <= idle_ || static_cast<int>(threads_.size()) >= options_.parallel) {
    return absl::OkStatus();
  }
  const uint64_t id = next_thread_id_++;
  try {
    threads_.emplace(id, std::thread([this, id] {
                       pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
                       Run(id);
                     }));
  } catch (const std::system_error& e) {
    // EAGAIN: the process limit of the node or the pod's cgroup, or no memory for a stack.
    ++start_failures_;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread (", thread_name_, "): ", e.what()));
  }
  start_failure_said_ = false;
  return absl::OkStatus();
}

void Workers::SayStartFailure(const absl::Status& failure) {
  if (failure.ok() || start_failure_said_) return;
  LOG(ERROR) << failure.message() << "; its work waits for "
             << (threads_.empty() ? "the next change" : "a running thread");
  start_failure_said_ = true;
}

void Workers::AddStopHook(std::function<void()> hook) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stop_hooks_.push_back(std::move(hook));
      return;
    }
  }
  hook();
}

std::deque<std::string>::iterator Workers::NextReady(absl::Time now) {
  return std::find_if(order_.begin(), order_.end(),
                      [&](const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                        return waiting_.at(key).not_before <= now && !running_.contains(key);
                      });
}

int Workers::Unclaimed() const {
  int unclaimed = 0;
  for (const auto& [key, waiting] : waiting_) unclaimed += running_.contains(key) ? 0 : 1;
  return unclaimed;
}

absl::Time Workers::EarliestWaiting() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [key, waiting] : waiting_) {
    // A running key's next task is taken by the thread that runs it, when it is done.
    if (!running_.contains(key)) earliest = std::min(earliest, waiting.not_before);
  }
  return earliest;
}

void Workers::Run(uint64_t thread_id) {
  mu_.Lock();
  // Until when a thread with nothing to run waits for a task (Options::linger).
  absl::Time linger_until = absl::Now() + options_.linger;
  while (true) {
    // No deadline unless a retry waits (or, lingering, the linger's end): an idle worker never
    // wakes. A retry queued meanwhile that is due sooner (another thread's) ends the wait too, so
    // its time is kept.
    const bool lingering = options_.exit_when_idle && absl::Now() < linger_until;
    const absl::Time deadline = std::min(EarliestWaiting(), lingering ? linger_until : absl::InfiniteFuture());
    auto ready = [this, deadline, lingering]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (options_.exit_when_idle && !lingering && idle_ > Unclaimed()) ||
             NextReady(absl::Now()) != order_.end() || EarliestWaiting() < deadline;
    };
    ++idle_;
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (stopping_) {
      --idle_;
      break;
    }
    const absl::Time now = absl::Now();
    auto next = NextReady(now);
    if (next == order_.end()) {
      // More threads wait than there is work for (and this one's linger is over): it goes.
      const bool surplus = options_.exit_when_idle && idle_ > Unclaimed() && now >= linger_until;
      --idle_;
      if (surplus) break;
      continue;  // a retry's time, or the linger's end, has not come yet
    }
    --idle_;
    const std::string key = std::move(*next);
    order_.erase(next);
    auto it = waiting_.find(key);
    Waiting waiting = std::move(it->second);
    waiting_.erase(it);
    running_.insert(key);
    mu_.Unlock();
    const Outcome outcome = waiting.task();
    // What the task holds goes before it counts as done: Drain() returning means no task of
    // this worker holds anything.
    if (outcome == Outcome::kDone) waiting.task = nullptr;
    mu_.Lock();
    running_.erase(key);
    ++completed_;
    linger_until = absl::Now() + options_.linger;
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
  // Stop() or the destructor may have taken the handle already.
  if (auto self = threads_.find(thread_id); self != threads_.end()) {
    ended_.push_back(std::move(self->second));
    threads_.erase(self);
  }
  mu_.Unlock();
}

bool Workers::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (running_.empty() && NextReady(absl::Now()) == order_.end());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void Workers::Stop() {
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
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    // Abandoned: a task may be stuck in the kernel; the destructor joins its thread.
    if (options_.stop_abandons_running_task && !running_.empty()) return;
    threads = TakeThreadsLocked();
  }
  for (std::thread& thread : threads) thread.join();
}

uint64_t Workers::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

uint64_t Workers::retries() const {
  absl::MutexLock lock(&mu_);
  return retries_;
}

bool Workers::retrying(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = waiting_.find(key);
  return it != waiting_.end() && it->second.is_retry;
}

uint64_t Workers::start_failures() const {
  absl::MutexLock lock(&mu_);
  return start_failures_;
}

bool Workers::thread_running() const {
  absl::MutexLock lock(&mu_);
  return !threads_.empty();
}

int Workers::running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

}  // namespace edgeaccel
