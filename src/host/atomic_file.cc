#include "edgeaccel/host/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "edgeaccel/host/backoff.h"
#include "glog/logging.h"

namespace edgeaccel {

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode) {
  return WriteFileAtomically(directory, name, content, mode, nullptr);
}

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode,
                                 const std::function<void(const struct stat&)>& before_rename) {
  const std::string path = absl::StrCat(directory, "/", name);
  const std::string temp = absl::StrCat(directory, "/.", name, ".tmp");
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temp, ": ", strerror(errno)));
  // open() applies the process's umask (the daemon's is 0077, for its sockets); readers such as
  // NFD's worker run as another user, so the mode is set outright.
  if (fchmod(fd, mode) != 0) {
    const int err = errno;
    close(fd);
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot set the mode of ", temp, ": ", strerror(err)));
  }
  const ssize_t written = write(fd, content.data(), content.size());
  const int write_errno = errno;
  const bool synced = fsync(fd) == 0;
  struct stat st;
  const bool stated = before_rename == nullptr || fstat(fd, &st) == 0;
  const int stat_errno = errno;
  close(fd);
  if (written != static_cast<ssize_t>(content.size()) || !synced) {
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", temp, ": ",
                                            strerror(written < 0 ? write_errno : ENOSPC)));
  }
  if (!stated) {
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot stat ", temp, ": ", strerror(stat_errno)));
  }
  if (before_rename != nullptr) before_rename(st);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

// Everything the writer's thread and a waiting Write() touch, so that either may outlive the
// RetryingFileWriter object (see the header).
struct RetryingFileWriter::State {
  State(std::string what_in, Options options_in)
      : what(std::move(what_in)),
        options(options_in),
        // No jitter: one writer per file, nobody to fall in step with.
        backoff(options_in.first_retry, options_in.max_retry, /*jitter=*/0) {}

  const std::string what;
  const Options options;
  absl::Mutex mu;  // never held while a write runs
  // The write to make next: a Write()'s (at once) or a failed one's retry (at next_retry).
  WriteFn next ABSL_GUARDED_BY(mu);
  bool next_is_first ABSL_GUARDED_BY(mu) = false;
  absl::Time next_retry ABSL_GUARDED_BY(mu);
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // bumped by every Write()
  // The result of the newest Write() whose write has run (its generation), for Write() to return.
  uint64_t answered ABSL_GUARDED_BY(mu) = 0;
  absl::Status answer ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;  // a write runs now, without mu
  bool failing ABSL_GUARDED_BY(mu) = false;  // a failed write awaits (or is in) its retry
  Backoff backoff ABSL_GUARDED_BY(mu);
  std::string last_error ABSL_GUARDED_BY(mu);
  int attempts ABSL_GUARDED_BY(mu) = 0;  // retries of the write now pending
  int64_t retries ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
};

RetryingFileWriter::RetryingFileWriter(std::string what, Options options)
    : state_(std::make_shared<State>(std::move(what), options)) {}

RetryingFileWriter::~RetryingFileWriter() {
  Stop();
  // A write abandoned by Stop() still runs on the thread; the write function may use what our
  // owner destroys next, so wait for it here (Stop() itself never does).
  if (thread_.joinable()) thread_.join();
}

absl::Status RetryingFileWriter::Write(WriteFn write) {
  // A copy: Stop() releases us, and our owner may destroy the writer before we get to return.
  const std::shared_ptr<State> s = state_;
  absl::MutexLock lock(&s->mu);
  if (s->stopping) {
    return absl::FailedPreconditionError(
        absl::StrCat("not writing ", s->what, ": its writer is stopped"));
  }
  const uint64_t generation = ++s->generation;
  s->next = std::move(write);
  s->next_is_first = true;
  s->failing = false;
  if (!thread_.joinable()) thread_ = std::thread([s] { Run(s); });
  State* const state = s.get();
  auto done = [state, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) {
    return state->stopping || state->answered >= generation;
  };
  s->mu.Await(absl::Condition(&done));
  if (s->answered >= generation) return s->answer;
  return absl::CancelledError(absl::StrCat(
      "stopped while writing ", s->what, "; the write was abandoned and may still land"));
}

void RetryingFileWriter::Run(const std::shared_ptr<State>& state) {
  State* s = state.get();
  s->mu.Lock();
  while (true) {
    auto stopping_or_next = [s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
      return s->stopping || s->next != nullptr;
    };
    s->mu.Await(absl::Condition(&stopping_or_next));
    if (s->stopping) break;
    const uint64_t generation = s->generation;
    const bool first = s->next_is_first;
    if (!first) {
      // Wait for the retry time, waking early only if stopped or a newer Write() came.
      auto stopping_or_superseded = [s, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
        return s->stopping || s->generation != generation;
      };
      if (s->mu.AwaitWithDeadline(absl::Condition(&stopping_or_superseded), s->next_retry)) {
        continue;
      }
      ++s->retries;
      ++s->attempts;
    }
    WriteFn write = std::move(s->next);
    s->next = nullptr;
    s->writing = true;
    s->mu.Unlock();
    absl::Status status = write();  // the disk's time, with no lock held
    s->mu.Lock();
    s->writing = false;
    if (first) {
      s->answered = generation;
      s->answer = status;
    }
    if (s->stopping) break;  // abandoned by Stop(): neither logged nor retried
    if (s->generation != generation) continue;  // a newer Write() came meanwhile and replaces it
    if (status.ok()) {
      if (!first) {
        LOG(INFO) << "wrote " << s->what << " on retry " << s->attempts << " (it had failed: "
                  << s->last_error << ")";
      }
      s->failing = false;
      s->last_error.clear();
      continue;
    }
    if (first) {
      // Write()'s caller logs the first failure.
      s->backoff.Reset();
      s->attempts = 0;
      s->last_error = std::string(status.message());
    } else if (status.message() != s->last_error) {
      // One line per new reason, not one per retry: a disk stays full for a while.
      LOG(ERROR) << "still cannot write " << s->what << ": " << status.message()
                 << "; retrying with backoff up to " << s->options.max_retry;
      s->last_error = std::string(status.message());
    }
    s->failing = true;
    s->next = std::move(write);
    s->next_is_first = false;
    s->next_retry = absl::Now() + s->backoff.Next();
  }
  s->mu.Unlock();
}

void RetryingFileWriter::Stop() {
  bool writing;
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->next = nullptr;
    state_->failing = false;
    writing = state_->writing;
  }
  // Not writing: the thread is waiting on a condition, sees `stopping` and ends at once. Writing:
  // it ends when the write returns, which may be never on a hung disk; the destructor joins it.
  if (!writing && thread_.joinable()) thread_.join();
}

int64_t RetryingFileWriter::retries() const {
  absl::MutexLock lock(&state_->mu);
  return state_->retries;
}

bool RetryingFileWriter::pending() const {
  absl::MutexLock lock(&state_->mu);
  return state_->failing;
}

}  // namespace edgeaccel
