#include "edgeaccel/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace edgeaccel {

absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content) {
  const std::string path = absl::StrCat(directory, "/", name);
  const std::string temp = absl::StrCat(directory, "/.", name, ".tmp");
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", temp, ": ", strerror(errno)));
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

}  // namespace edgeaccel
