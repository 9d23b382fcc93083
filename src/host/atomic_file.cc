#include "edgeaccel/host/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace edgeaccel {

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode) {
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
  close(fd);
  if (written != static_cast<ssize_t>(content.size()) || !synced) {
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", temp, ": ",
                                            strerror(written < 0 ? write_errno : ENOSPC)));
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

RetryingFileWriter::RetryingFileWriter(std::string what, Options options)
    : what_(std::move(what)),
      options_(options),
      // No jitter: one writer per file, nobody to fall in step with.
      backoff_(options.first_retry, options.max_retry, /*jitter=*/0) {}

RetryingFileWriter::~RetryingFileWriter() { Stop(); }

absl::Status RetryingFileWriter::Write(WriteFn write) {
  absl::MutexLock lock(&mu_);
  ++generation_;
  pending_ = nullptr;
  absl::Status status = write();
  if (status.ok()) {
    last_error_.clear();
    return status;
  }
  if (stopping_) return status;
  pending_ = std::move(write);
  backoff_.Reset();
  attempts_ = 0;
  next_retry_ = absl::Now() + backoff_.Next();
  last_error_ = std::string(status.message());
  if (!thread_.joinable()) thread_ = std::thread([this] { RetryLoop(); });
  return status;
}

void RetryingFileWriter::RetryLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    auto stopping_or_pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || pending_ != nullptr;
    };
    if (pending_ == nullptr) {
      mu_.Await(absl::Condition(&stopping_or_pending));
      continue;
    }
    // Wait for the retry time, waking early only if stopped or a newer Write() came.
    const uint64_t generation = generation_;
    auto stopping_or_superseded = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || generation_ != generation;
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&stopping_or_superseded), next_retry_)) continue;
    ++retries_;
    ++attempts_;
    absl::Status status = pending_();
    if (status.ok()) {
      LOG(INFO) << "wrote " << what_ << " on retry " << attempts_ << " (it had failed: "
                << last_error_ << ")";
      pending_ = nullptr;
      last_error_.clear();
      continue;
    }
    // One line per new reason, not one per retry: a disk stays full for a while.
    if (status.message() != last_error_) {
      LOG(ERROR) << "still cannot write " << what_ << ": " << status.message()
                 << "; retrying with backoff up to " << options_.max_retry;
      last_error_ = std::string(status.message());
    }
    next_retry_ = absl::Now() + backoff_.Next();
  }
}

void RetryingFileWriter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    pending_ = nullptr;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t RetryingFileWriter::retries() const {
  absl::MutexLock lock(&mu_);
  return retries_;
}

bool RetryingFileWriter::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_ != nullptr;
}

}  // namespace edgeaccel
