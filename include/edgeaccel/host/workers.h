// Workers: the daemon's one worker primitive. Named threads run slow work (file writes with
// fsync, CDI specs, the NFD feature file, requests to the API server, the kubelet's DRA calls)
// so that the threads that wait for events (the host watcher, the PollLoops, the gRPC completion
// loops) never wait for a disk or a server.
//
// Work is posted under a key. A key's tasks run one at a time, in the order posted, and a task
// still waiting under the same key is replaced, not queued again: tasks read the state they act
// on when they run, so replacing one loses nothing and a burst of changes costs one write.
// Options::parallel says how many keys' tasks run at once, each on a thread of its own: 1 for the
// sinks (one write at a time, in order), unbounded for the DRA calls and claim reads (one key a
// call: one slow call holds up no other).
//
// A task posted with PostRetrying may ask to run again: it is re-run after its key's backoff
// (exponential, jittered), unless a newer task of its key replaces it first. Several sinks share
// one worker: a task waiting for its retry time holds up no other key.
//
// With Options::exit_when_idle a thread ends whenever it has nothing to run and no retry waits,
// and the next Post starts a new one: a worker whose sinks are idle holds no thread. With
// Options::linger it first waits that long for the next task (one wake-up at its end), so a burst
// of work (the kubelet's calls as pods start) starts no thread per task.
//
// A thread that cannot be started (the process limit) ends nothing. Post leaves the work queued
// (the failure is logged once) for a running thread or the next Post; Start refuses it, so a
// caller that answers someone (a DRA call) answers at once.
//
// Stop() drops what waits, calls the stop hooks (ApiClient::Cancel: a request in flight ends at
// once), and waits for the running tasks; with Options::stop_abandons_running_task it does not
// wait for them (a write stuck in the kernel on a dying disk), and the destructor waits instead.
#ifndef EDGEACCEL_HOST_WORKERS_H_
#define EDGEACCEL_HOST_WORKERS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/backoff.h"

namespace edgeaccel {

class Workers {
 public:
  // Options::parallel for as many keys at once as are posted.
  static constexpr int kUnbounded = std::numeric_limits<int>::max();

  struct Options {
    // How many keys' tasks run at once, each on a thread of its own.
    int parallel = 1;
    // A thread ends when it has nothing to run and no retry waits; the next Post starts another.
    bool exit_when_idle = false;
    // With exit_when_idle: how long a thread with nothing to run waits for a task before it ends.
    absl::Duration linger = absl::ZeroDuration();
    // Stop() returns without waiting for the tasks that run (one may be stuck in the kernel); the
    // destructor waits for them, so what a task uses must outlive the worker.
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
  explicit Workers(std::string thread_name) : Workers(std::move(thread_name), Options()) {}
  Workers(std::string thread_name, Options options);
  ~Workers();  // Stop(), then waits for the tasks Stop() abandoned
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Queues `task` under `key`, replacing a task of that key that has not started. Never blocks
  // on a running task. A thread starts where none is free to take it (up to Options::parallel).
  // A task may post (its own key too).
  void Post(const std::string& key, std::function<void()> task);
  // The same for an attempt that may fail: kRetry runs it again after the key's backoff (see
  // Retry), unless a newer task of the key replaces it first.
  void PostRetrying(const std::string& key, std::function<Outcome()> attempt, Retry retry);
  // Runs `task` under a key of its own (so, with Options::parallel, beside everything else), for
  // work someone waits for an answer to: instead of waiting in the queue where no thread runs and
  // none can be started (the process limit, or no memory for a stack), it is refused, with
  // ResourceExhausted naming the worker; after Stop(), Cancelled. Not queued then.
  absl::Status Start(std::function<void()> task);

  // Called by Stop(), after it drops what waits and before it waits for the running task: each
  // ends what a task may be waiting for (ApiClient::Cancel). A hook added after Stop() is called
  // at once.
  void AddStopHook(std::function<void()> hook);

  // Waits until everything posted so far has run once, or the timeout passes; a retry not yet
  // due does not count. True if it all ran.
  bool Drain(absl::Duration timeout);

  // Runs nothing more: waiting tasks and retries are dropped, the stop hooks are called, the
  // running tasks finish (unless abandoned, see Options), the threads exit. Idempotent.
  void Stop();

  uint64_t completed() const;  // tasks and attempts that have run
  uint64_t retries() const;    // attempts that asked to run again
  bool retrying(const std::string& key) const;  // an attempt of `key` waits for its retry time
  int running() const;          // tasks running now
  bool thread_running() const;  // a thread exists now (see Options::exit_when_idle)
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
  // Queues the task (nothing after Stop()) and starts a thread where one is needed. Returns why
  // no thread could be started, if one could not; the task stays queued.
  absl::Status Enqueue(const std::string& key, std::function<Outcome()> task, const Retry& retry)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every thread's handle, running or ended, for joining.
  std::vector<std::thread> TakeThreadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Post whose thread could not start: said once until a thread starts.
  void SayStartFailure(const absl::Status& failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(uint64_t thread_id);
  // The first key in order_ whose task may run now (not running, and due); order_.end() if none.
  std::deque<std::string>::iterator NextReady(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waiting keys whose task no thread runs: each may need a thread of its own.
  int Unclaimed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the first of them may run.
  absl::Time EarliestWaiting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string thread_name_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // keys waiting, oldest first
  absl::flat_hash_map<std::string, Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  // Keys posted with PostRetrying, while an attempt of theirs has failed and not yet succeeded.
  absl::flat_hash_map<std::string, std::unique_ptr<KeyBackoff>> backoff_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> stop_hooks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> running_ ABSL_GUARDED_BY(mu_);  // keys whose task runs now
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a task
  uint64_t next_thread_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_start_ ABSL_GUARDED_BY(mu_) = 0;  // Start()'s keys
  // Threads in Run(); one that leaves it moves its handle to ended_, joined by the next start.
  std::map<uint64_t, std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> ended_ ABSL_GUARDED_BY(mu_);
  uint64_t start_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool start_failure_said_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_WORKERS_H_
