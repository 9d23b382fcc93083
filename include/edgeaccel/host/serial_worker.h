// SerialWorker: one background thread that runs slow work (file writes with fsync, CDI specs,
// the NFD feature file) in the order it was asked for, so that the thread asking (the host
// watcher, which feeds ListAndWatch and rescans) never waits for a disk.
//
// Work is posted under a key; a task still waiting under the same key is replaced, not queued
// again. Tasks read the state they act on when they run, so replacing one loses nothing and a
// burst of changes costs one write. Tasks run one at a time, each key's in the order posted.
#ifndef EDGEACCEL_HOST_SERIAL_WORKER_H_
#define EDGEACCEL_HOST_SERIAL_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace edgeaccel {

class SerialWorker {
 public:
  // `thread_name` shows in top -H (15 characters at most).
  explicit SerialWorker(std::string thread_name);
  ~SerialWorker();  // Stop()
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task` under `key`, replacing a task of that key that has not started. Never blocks
  // on a running task. The thread starts with the first post.
  void Post(const std::string& key, std::function<void()> task);

  // Waits until everything posted so far has run, or the timeout passes. True if it all ran.
  bool Drain(absl::Duration timeout);

  // Runs nothing more: waiting tasks are dropped, a running one finishes, the thread exits.
  void Stop();

  uint64_t completed() const;

 private:
  void Run();

  const std::string thread_name_;
  mutable absl::Mutex mu_;
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // keys waiting, oldest first
  absl::flat_hash_map<std::string, std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_SERIAL_WORKER_H_
