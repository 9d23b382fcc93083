#include "edgeaccel/host/host.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace edgeaccel {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(what, " ", path, ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Closes an fd on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

Host::Host(std::string root) {
  // Normalise: "/" -> "", "/host/" -> "/host".
  while (!root.empty() && root.back() == '/') root.pop_back();
  root_ = std::move(root);
}

std::string Host::Resolve(absl::string_view host_path) const {
  std::string out = root_;
  for (absl::string_view part : absl::StrSplit(host_path, '/', absl::SkipEmpty())) {
    if (part == "." || part == "..") continue;
    absl::StrAppend(&out, "/", part);
  }
  if (out.empty()) out = "/";
  return out;
}

absl::StatusOr<std::string> Host::ReadFile(absl::string_view host_path, size_t max_bytes) const {
  const std::string path = Resolve(host_path);
  // Never open a device node or FIFO: opening /dev/apex_N resets the Edge TPU, and a FIFO
  // blocks. Check before opening, and again on what was opened.
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", host_path, ": not a regular file"));
  }
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", host_path);
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", host_path, ": not a regular file"));
  }
  std::string content;
  char buffer[4096];
  while (true) {
    ssize_t n = read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", host_path);
    }
    if (n == 0) break;
    content.append(buffer, static_cast<size_t>(n));
    if (content.size() > max_bytes) {
      return absl::OutOfRangeError(
          absl::StrCat(host_path, " is larger than ", max_bytes, " bytes"));
    }
  }
  return content;
}

absl::StatusOr<std::string> Host::ReadAttribute(absl::string_view host_path) const {
  absl::StatusOr<std::string> content = ReadFile(host_path);
  if (!content.ok()) return content.status();
  absl::string_view value = *content;
  // Device-tree strings end in NUL; sysfs values end in a newline.
  while (!value.empty() && (value.back() == '\0' || absl::ascii_isspace(value.back()))) {
    value.remove_suffix(1);
  }
  return std::string(absl::StripLeadingAsciiWhitespace(value));
}

absl::StatusOr<int64_t> Host::ReadInteger(absl::string_view host_path) const {
  absl::StatusOr<std::string> value = ReadAttribute(host_path);
  if (!value.ok()) return value.status();
  int64_t number;
  if (!absl::SimpleAtoi(*value, &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat(host_path, " does not hold an integer (read \"",
                     absl::CHexEscape(value->substr(0, 32)), "\")"));
  }
  return number;
}

absl::StatusOr<std::vector<std::string>> Host::ListDirectory(absl::string_view host_path) const {
  const std::string path = Resolve(host_path);
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, "cannot list", host_path);
  std::vector<std::string> names;
  while (struct dirent* entry = readdir(dir)) {
    absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<FileInfo> Host::Stat(absl::string_view host_path) const {
  const std::string path = Resolve(host_path);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  FileInfo info;
  if (S_ISREG(st.st_mode)) {
    info.type = FileInfo::Type::kRegular;
  } else if (S_ISDIR(st.st_mode)) {
    info.type = FileInfo::Type::kDirectory;
  } else if (S_ISCHR(st.st_mode)) {
    info.type = FileInfo::Type::kCharDevice;
  } else if (S_ISBLK(st.st_mode)) {
    info.type = FileInfo::Type::kBlockDevice;
  } else if (S_ISSOCK(st.st_mode)) {
    info.type = FileInfo::Type::kSocket;
  } else if (S_ISLNK(st.st_mode)) {
    info.type = FileInfo::Type::kSymlink;
  }
  info.major = major(st.st_rdev);
  info.minor = minor(st.st_rdev);
  info.permissions = st.st_mode & 07777;
  info.inode = st.st_ino;
  return info;
}

bool Host::Exists(absl::string_view host_path) const {
  const std::string path = Resolve(host_path);
  return access(path.c_str(), F_OK) == 0;
}

absl::string_view FileTypeName(FileInfo::Type type) {
  switch (type) {
    case FileInfo::Type::kRegular:
      return "a regular file";
    case FileInfo::Type::kDirectory:
      return "a directory";
    case FileInfo::Type::kCharDevice:
      return "a character device";
    case FileInfo::Type::kBlockDevice:
      return "a block device";
    case FileInfo::Type::kSocket:
      return "a socket";
    case FileInfo::Type::kSymlink:
      return "a symlink";
    case FileInfo::Type::kOther:
      break;
  }
  return "a special file";
}

}  // namespace edgeaccel
