// Writing files other programs read while we write them (CDI specs, NFD feature files).
#ifndef EDGEACCEL_HOST_ATOMIC_FILE_H_
#define EDGEACCEL_HOST_ATOMIC_FILE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace edgeaccel {

// Replaces `directory`/`name` with `content` atomically: written to a dot-file in the same
// directory (readers skip dot-files), fsynced, then renamed over the old file. Readers see the
// old content or the new, never a part. The file gets `mode` whatever the process's umask. On
// error (disk full, read-only) nothing is left behind and the message names the file and the
// reason.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode = 0644);
// The same, and calls `before_rename` with the new file's stat(2) once its content is on disk,
// just before the rename: its st_dev and st_ino are what `directory`/`name` has from the rename
// on, so a reader of the file can tell the new file from the old the moment it lands.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode,
                                 const std::function<void(const struct stat&)>& before_rename);

// Keeps a file that other programs read (a CDI spec, the NFD feature file) up to date when a
// write fails, and never lets a hung disk hold up whoever stops it.
//
// Every write runs on the writer's own thread (started by the first Write()), one at a time and
// in order, so writes never overlap and an older write never lands after a newer one. Write()
// hands its write to that thread and waits for the result, or for Stop(), whichever comes first.
// A write that fails (disk full, directory gone, read-only remount) is retried there with
// exponential backoff until it succeeds, a newer Write() replaces it, or Stop(). The kernel has
// no event for "there is room again", so this is the one place we wait on a timer, and only
// while a write is failing; otherwise the thread waits on a condition with no deadline.
//
// No lock is held while a write runs. Stop() never waits for the disk: a write in flight then
// (an fsync on a dying SD card) is abandoned: it may still land, its result is dropped, and it is
// never retried. Its thread is joined by the destructor, which therefore waits for that write to
// return: the write function may use objects its owner destroys next (the CdiSpecFile beside the
// writer), so it must never run after the writer is gone. The state the thread and a waiting
// Write() share is held by shared_ptr, so a Write() that Stop() released may return after the
// writer is destroyed.
class RetryingFileWriter {
 public:
  struct Options {
    absl::Duration first_retry = absl::Seconds(1);
    absl::Duration max_retry = absl::Seconds(60);
  };
  // `what` names the file in log lines ("the NFD feature file").
  RetryingFileWriter(std::string what, Options options);
  explicit RetryingFileWriter(std::string what) : RetryingFileWriter(std::move(what), Options{}) {}
  // Stop(), then waits for a write still in flight to return (see above).
  ~RetryingFileWriter();
  RetryingFileWriter(const RetryingFileWriter&) = delete;
  RetryingFileWriter& operator=(const RetryingFileWriter&) = delete;

  using WriteFn = std::function<absl::Status()>;
  // Runs `write` (on the writer's thread, after any write in flight) and returns its status; on
  // failure it is retried until it succeeds. Returns Cancelled at once if Stop() is called while
  // it waits (the write may still land), and FailedPrecondition without writing after Stop().
  // Meant to be called from one thread at a time; a write that a concurrent newer Write()
  // replaced before it started is not made, and its Write() returns the newer one's status.
  absl::Status Write(WriteFn write);
  // Drops any pending retry, releases a Write() waiting for its result, and ends the thread;
  // returns at once whatever the disk does (a write in flight is abandoned). Idempotent.
  void Stop();

  // Retries made so far, and whether a failed write is waiting for (or in) its retry.
  int64_t retries() const;
  bool pending() const;

 private:
  struct State;
  static void Run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;  // started by the first Write() (under state_->mu), joined by Stop or ~
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_ATOMIC_FILE_H_
