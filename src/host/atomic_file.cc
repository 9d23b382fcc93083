#include "edgeaccel/host/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace edgeaccel {

namespace {

absl::Status Write(const std::string& directory, const std::string& name, absl::string_view content,
                   mode_t mode, FileSync sync,
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
  const bool synced = sync == FileSync::kPageCache || fsync(fd) == 0;
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

}  // namespace

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode, FileSync sync) {
  return Write(directory, name, content, mode, sync, nullptr);
}

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode,
                                 const std::function<void(const struct stat&)>& before_rename) {
  return Write(directory, name, content, mode, FileSync::kDurable, before_rename);
}

}  // namespace edgeaccel
