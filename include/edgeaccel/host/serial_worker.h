// SerialWorker: the one worker primitive of the daemon's sinks. A named thread runs slow work
// (file writes with fsync, CDI specs, the NFD feature file, requests to the API server) in the
// order it was asked for, so that the thread asking (the host watcher, which feeds ListAndWatch
// and rescans) never waits for a disk or a server.
//
// Work is posted under a key; a task still waiting under the same key is replaced, not queued
// again. Tasks read the state they act on when they run, so replacing one loses nothing and a
// burst of changes costs one write. Tasks run one at a time, each key's in the order posted.
//
// A task posted with PostRetrying may ask to run again: it is re-run after its key's backoff
// (exponential, jittered), unless a newer task of its key replaces it first. Several sinks share
// one worker: a task waiting for its retry time holds up no other key.
//
// With Options::exit_when_idle the thread ends whenever nothing is queued and no retry is
// waiting, and the next Post starts a new one: a worker whose sinks are idle holds no thread.
//
// A thread that cannot be started (the process limit) ends nothing: the work stays queued, the
// failure is logged once, and the next Post starts the thread.
//
// Stop() drops what waits, calls the stop hooks (ApiClient::Cancel: a request in flight ends at
// once), and waits for a running task; with Options::stop_abandons_running_task it does not wait
// for one (a write stuck in the kernel on a dying disk), and the destructor waits for it instead.
#ifndef EDGEACCEL_HOST_SERIAL_WORKER_H_
#define EDGEACCEL_HOST_SERIAL_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/backoff.h"

namespace edgeaccel {

class SerialWorker {
 public:
  struct Options {
    // The thread ends when nothing is queued and no retry waits; the next Post starts it again.
    bool exit_when_idle = false;
    // Stop() returns without waiting for the task that runs (it may be stuck in the kernel); the
    // destructor waits for it, so what the task uses must outlive the worker.
    bool stop_abandons_running_task = false;
  };

  // What a task posted with PostRetrying says when it returns.
  enum class Outcome { kDone, kRetry };

  // A key's retries: the first after `first`, each next one twice as long, up to `max`, each
  // spread by +-`jitter` (Backoff). The key's backoff starts again after an attempt says kDone.
  struct Retry {
    absl::Duration first = absl::Seconds(1);
    absl::Duration max = absl::Seconds(60);
    double jitter = 0;
    // A newer task of the key, posted while a retry waits, replaces it and runs no sooner than
    // the retry would have (so a busy source cannot defeat the backoff: the API server's case).
    // Otherwise the newer one runs at once (a file: a new device must not wait for a retry).
    bool newer_waits_for_retry = false;
  };

  // `thread_name` shows in top -H (15 characters at most).
  explicit SerialWorker(std::string thread_name) : SerialWorker(std::move(thread_name), Options()) {}
  SerialWorker(std::string thread_name, Options options);
  ~SerialWorker();  // Stop(), then waits for a task Stop() abandoned
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task` under `key`, replacing a task of that key that has not started. Never blocks
  // on a running task. The thread starts with the first post. A task may post (its own key too).
  void Post(const std::string& key, std::function<void()> task);
  // The same for an attempt that may fail: kRetry runs it again after the key's backoff (see
  // Retry), unless a newer task of the key replaces it first.
  void PostRetrying(const std::string& key, std::function<Outcome()> attempt, Retry retry);

  // Called by Stop(), after it drops what waits and before it waits for the running task: each
  // ends what a task may be waiting for (ApiClient::Cancel). A hook added after Stop() is called
  // at once.
  void AddStopHook(std::function<void()> hook);

  // Waits until everything posted so far has run once, or the timeout passes; a retry not yet
  // due does not count. True if it all ran.
  bool Drain(absl::Duration timeout);

  // Runs nothing more: waiting tasks and retries are dropped, the stop hooks are called, a
  // running task finishes (unless abandoned, see Options), the thread exits. Idempotent.
  void Stop();

  uint64_t completed() const;  // tasks and attempts that have run
  uint64_t retries() const;    // attempts that asked to run again
  bool retrying(const std::string& key) const;  // an attempt of `key` waits for its retry time
  bool thread_running() const;  // the thread exists now (see Options::exit_when_idle)
  // Posts whose thread could not be started (the process limit): their work stayed queued for
  // the next Post.
  uint64_t start_failures() const;

 private:
  struct Waiting {
    std::function<Outcome()> task;
    Retry retry;                  // for an attempt that says kRetry
    absl::Time not_before = absl::InfinitePast();
    bool is_retry = false;        // re-queued by a failed attempt, not posted
  };
  struct KeyBackoff {
    explicit KeyBackoff(const Retry& r) : retry(r), backoff(r.first, r.max, r.jitter) {}
    Retry retry;
    Backoff backoff;
    absl::Time retry_at = absl::InfinitePast();
  };
  void Enqueue(const std::string& key, std::function<Outcome()> task, const Retry& retry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  // The first key in order_ whose task may run now; order_.end() if none.
  std::deque<std::string>::iterator NextReady(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time EarliestWaiting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string thread_name_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // keys waiting, oldest first
  absl::flat_hash_map<std::string, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // Keys posted with PostRetrying, while an attempt of theirs has failed and not yet succeeded.
  absl::flat_hash_map<std::string, std::unique_ptr<KeyBackoff>> backoff_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> stop_hooks_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool thread_live_ ABSL_GUARDED_BY(mu_) = false;  // thread_ runs Run() and has not left it
  uint64_t start_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool start_failure_said_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_SERIAL_WORKER_H_
