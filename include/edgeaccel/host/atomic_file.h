// Writing files other programs read while we write them (CDI specs, NFD feature files).
#ifndef EDGEACCEL_HOST_ATOMIC_FILE_H_
#define EDGEACCEL_HOST_ATOMIC_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/backoff.h"

namespace edgeaccel {

// Replaces `directory`/`name` with `content` atomically: written to a dot-file in the same
// directory (readers skip dot-files), fsynced, then renamed over the old file. Readers see the
// old content or the new, never a part. The file gets `mode` whatever the process's umask. On
// error (disk full, read-only) nothing is left behind and the message names the file and the
// reason.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode = 0644);

// Keeps a file that other programs read (a CDI spec, the NFD feature file) up to date when a
// write fails. Write() writes at once, on the caller's thread; if that fails (disk full,
// directory gone, read-only remount) the same write is retried in the background with
// exponential backoff until it succeeds, a newer Write() replaces it, or Stop(). The kernel
// has no event for "there is room again", so this is the one place we wait on a timer, and
// only while a write is failing: the retry thread starts on the first failure and then sleeps
// until there is something to retry. Writes never overlap, and an older write never lands
// after a newer one.
class RetryingFileWriter {
 public:
  struct Options {
    absl::Duration first_retry = absl::Seconds(1);
    absl::Duration max_retry = absl::Seconds(60);
  };
  // `what` names the file in log lines ("the NFD feature file").
  RetryingFileWriter(std::string what, Options options);
  explicit RetryingFileWriter(std::string what) : RetryingFileWriter(std::move(what), Options{}) {}
  ~RetryingFileWriter();
  RetryingFileWriter(const RetryingFileWriter&) = delete;
  RetryingFileWriter& operator=(const RetryingFileWriter&) = delete;

  using WriteFn = std::function<absl::Status()>;
  // Runs `write` now and returns its status; on failure it is retried until it succeeds.
  absl::Status Write(WriteFn write);
  // Drops any pending retry and ends the retry thread. Write() after Stop() still writes once.
  void Stop();

  // Retries made so far, and whether one is pending (for tests and metrics).
  int64_t retries() const;
  bool pending() const;

 private:
  void RetryLoop();

  const std::string what_;
  const Options options_;
  mutable absl::Mutex mu_;  // held across every write, so writes never overlap
  WriteFn pending_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by every Write()
  Backoff backoff_ ABSL_GUARDED_BY(mu_);
  absl::Time next_retry_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;  // retries of the write now pending
  int64_t retries_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first failed write
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_ATOMIC_FILE_H_
