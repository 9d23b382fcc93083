#include "edgeaccel/kubelet/registration_record.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace edgeaccel {

RegistrationRecord::RegistrationRecord(std::string directory, std::string resource)
    : directory_(std::move(directory)),
      path_(directory_.empty()
                ? ""
                : absl::StrCat(directory_, "/", absl::StrReplaceAll(resource, {{"/", "_"}}))) {}

bool RegistrationRecord::RegisteredLast() const {
  if (known_ || path_.empty()) return in_memory_;
  return access(path_.c_str(), F_OK) == 0;
}

std::string RegistrationRecord::RegisteredVia() const {
  if (known_ || path_.empty()) return in_memory_ ? via_in_memory_ : "";
  const int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return "";
  char text[32];
  const ssize_t n = read(fd, text, sizeof(text));
  close(fd);
  return n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
}

absl::Status RegistrationRecord::Set(bool ours, const std::string& via) {
  in_memory_ = ours;
  via_in_memory_ = ours ? via : "";
  known_ = true;
  if (path_.empty()) return absl::OkStatus();
  if (ours) {
    if (mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(
          absl::StrCat("cannot create ", directory_, ": ", strerror(errno)));
    }
    const int fd =
        open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("cannot write ", path_, ": ", strerror(errno)));
    }
    const bool written = write(fd, via.data(), via.size()) == static_cast<ssize_t>(via.size());
    close(fd);
    if (!written) {
      return absl::InternalError(absl::StrCat("cannot write ", path_, ": ", strerror(errno)));
    }
  } else if (unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat("cannot remove ", path_, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace edgeaccel
