#include "edgeaccel/dra/transient_threads.h"

#include <pthread.h>

#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace edgeaccel {

TransientThreads::TransientThreads(std::string thread_name) : thread_name_(std::move(thread_name)) {}

TransientThreads::~TransientThreads() { Join(); }

absl::Status TransientThreads::Run(std::function<void()> work) {
  JoinFinished();
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::CancelledError("stopping");
  const uint64_t id = next_id_++;
  // The thread hands its own handle over to finished_ under mu_, which this call holds until the
  // handle is stored.
  try {
    std::thread thread([this, id, work = std::move(work)] {
      pthread_setname_np(pthread_self(), thread_name_.c_str());
      work();
      absl::MutexLock done(&mu_);
      auto it = running_.find(id);
      finished_.push_back(std::move(it->second));
      running_.erase(it);
    });
    running_.emplace(id, std::move(thread));
  } catch (const std::system_error& e) {
    // EAGAIN: the node's (or the pod's cgroup's) process limit, or no memory for a stack.
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread (", thread_name_, "): ", e.what()));
  }
  return absl::OkStatus();
}

void TransientThreads::JoinFinished() {
  std::vector<std::thread> finished;
  {
    absl::MutexLock lock(&mu_);
    finished.swap(finished_);
  }
  for (std::thread& thread : finished) thread.join();
}

void TransientThreads::Join() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::map<uint64_t, std::thread>* running) { return running->empty(); }, &running_));
  }
  JoinFinished();
}

void TransientThreads::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  Join();
}

int TransientThreads::running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

}  // namespace edgeaccel
