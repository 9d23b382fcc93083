// TransientThreads: threads that exist only while their work runs, so a driver that is idle has
// none (docs/footprint.md counts idle threads and their wake-ups). Run() starts one thread for one
// piece of work; a thread whose work is done is joined by the next Run() or by Join(), so none is
// left unjoined, and Join() waits for every one still running.
#ifndef EDGEACCEL_DRA_TRANSIENT_THREADS_H_
#define EDGEACCEL_DRA_TRANSIENT_THREADS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace edgeaccel {

class TransientThreads {
 public:
  // `thread_name` shows in top -H (15 characters at most).
  explicit TransientThreads(std::string thread_name);
  ~TransientThreads();  // Join()
  TransientThreads(const TransientThreads&) = delete;
  TransientThreads& operator=(const TransientThreads&) = delete;

  // Runs `work` on a new thread. Otherwise `work` is not run, and the error says why: Cancelled
  // after Close(); ResourceExhausted when no thread can be started (the process limit of the node
  // or the pod's cgroup, or no memory for its stack), which the caller answers as a failed call:
  // the daemon keeps serving.
  absl::Status Run(std::function<void()> work);
  // Waits until no work runs, and joins every thread.
  void Join();
  // Refuses every later Run(), then Join()s.
  void Close();
  // Work running now.
  int running() const;

 private:
  void JoinFinished() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string thread_name_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> finished_ ABSL_GUARDED_BY(mu_);  // work done; the thread is ending
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_TRANSIENT_THREADS_H_
