#include "edgeaccel/host/host.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace edgeaccel {
namespace {

// The C locale's text of `err`, as strerror(3) gives it in the daemon (which never sets a
// locale), without strerror's look-up of a translation on every call: the probe makes a few
// such errors (a family's files not there) every few seconds.
const char* ErrnoText(int err) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
  if (const char* text = strerrordesc_np(err); text != nullptr) return text;
#endif
  return strerror(err);
}

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view path) {
  std::string message = absl::StrCat(what, " ", path, ": ", ErrnoText(err));
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

// Owns an fd; closes it on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = other.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// The same status with its leading verb replaced ("cannot open x" -> "cannot stat x").
absl::Status ErrnoStatusRenamed(const absl::Status& status, absl::string_view verb) {
  absl::string_view message = status.message();
  if (absl::ConsumePrefix(&message, "cannot open")) {
    return absl::Status(status.code(), absl::StrCat(verb, message));
  }
  return status;
}

FileInfo InfoOf(const struct stat& st) {
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
  info.uid = st.st_uid;
  info.gid = st.st_gid;
  info.inode = st.st_ino;
  info.links = st.st_nlink;
  info.device = st.st_dev;
  info.size = st.st_size;
  info.modified = st.st_mtim;
  return info;
}

// Reads the regular file `fd`, whose fstat(2) gave `size`, from its start to its end, with pread
// (the descriptor's offset is neither used nor moved, so a kept descriptor reads it all again);
// an error, or more than `max_bytes`, is nullopt. A read that returns less than asked, of a file
// that says how big it is, has reached its end: a file on disk or tmpfs gives what it holds, a
// sysfs attribute (which says 4096) all its value at once. A file that says 0 (procfs, whose
// seq_files give a page at a time) is read until a read returns nothing.
std::optional<std::string> ReadRegularFile(int fd, off_t size, size_t max_bytes) {
  std::string content;
  char buffer[4096];
  while (true) {
    ssize_t n = pread(fd, buffer, sizeof(buffer), static_cast<off_t>(content.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    if (n == 0) return content;
    content.append(buffer, static_cast<size_t>(n));
    if (content.size() > max_bytes) return std::nullopt;
    if (static_cast<size_t>(n) < sizeof(buffer) && size > 0 &&
        content.size() <= static_cast<size_t>(size)) {
      return content;
    }
  }
}

// A directory entry's name, NUL-terminated on the stack: the probe looks at a dozen names every
// few seconds, and "trip_point0_temp" is one character too long for std::string's own buffer.
// A name longer than any entry's is the empty name, which no *at call finds.
class NameBuffer {
 public:
  explicit NameBuffer(absl::string_view name) {
    text_[0] = '\0';
    if (name.size() > NAME_MAX) return;
    memcpy(text_, name.data(), name.size());
    text_[name.size()] = '\0';
  }
  const char* c_str() const { return text_; }

 private:
  char text_[NAME_MAX + 1];
};

// The entries of the directory open for reading as `fd`, from its start, sorted, without "." and
// "..", and where `entries` is given, each one's inode number and type (d_ino, d_type) there.
// `fills_buffer`: the filesystem stops a getdents64 only where the next entry does not fit, so
// an answer that leaves room for the largest entry is the directory's last, and the call that
// would answer 0 is not made.
// getdents64 directly: readdir's DIR would cost an fstat, two fcntl and a 32 KiB allocation on
// every probe's list of a class directory.
absl::StatusOr<std::vector<std::string>> ListOpenDirectory(
    int fd, absl::string_view host_path, std::vector<DirectoryEntry>* entries = nullptr,
    bool fills_buffer = false) {
  // The largest record getdents64 makes: a NAME_MAX name and its NUL, 8-byte aligned.
  constexpr size_t kLargestEntry = (offsetof(struct dirent64, d_name) + NAME_MAX + 1 + 7) & ~size_t{7};
  std::vector<DirectoryEntry> found;
  alignas(8) char buffer[8192];
  while (true) {
    // The system call itself: glibc before 2.30 has no getdents64().
    const ssize_t n = syscall(SYS_getdents64, fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot list", host_path);
    }
    if (n == 0) break;
    for (ssize_t at = 0; at < n;) {
      const auto* entry = reinterpret_cast<const struct dirent64*>(buffer + at);
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") {
        found.push_back({std::string(name), static_cast<ino_t>(entry->d_ino), entry->d_type});
      }
      at += entry->d_reclen;
    }
    if (fills_buffer && sizeof(buffer) - static_cast<size_t>(n) >= kLargestEntry) break;
  }
  std::sort(found.begin(), found.end(),
            [](const DirectoryEntry& a, const DirectoryEntry& b) { return a.name < b.name; });
  std::vector<std::string> names;
  names.reserve(found.size());
  for (const DirectoryEntry& entry : found) names.push_back(entry.name);
  if (entries != nullptr) *entries = std::move(found);
  return names;
}

int OpenRoot(const std::string& root) {
  return open(root.empty() ? "/" : root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
}

// Path components without empty ones and ".", except that a trailing slash becomes a final "."
// (as for the kernel, "name/" must be a directory).
std::deque<std::string> Components(absl::string_view path) {
  std::deque<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part != ".") parts.emplace_back(part);
  }
  if (!parts.empty() && (absl::EndsWith(path, "/") || absl::EndsWith(path, "/."))) {
    parts.emplace_back(".");
  }
  return parts;
}

// "/a/../b" -> "/b", ".." stopping at "/", without looking at the filesystem.
std::string Lexical(absl::string_view host_path) {
  std::vector<std::string> done;
  for (std::string& part : Components(host_path)) {
    if (part == ".") continue;
    if (part == "..") {
      if (!done.empty()) done.pop_back();
    } else {
      done.push_back(std::move(part));
    }
  }
  return absl::StrCat("/", absl::StrJoin(done, "/"));
}

// What openat2 resolves relative to the root descriptor: the path as given ("dev/.." must fail
// when dev is missing, as it does on the host), without its leading slashes.
std::string RelativePath(absl::string_view host_path) {
  while (absl::ConsumePrefix(&host_path, "/")) {
  }
  return host_path.empty() ? "." : std::string(host_path);
}

// openat2 is Linux 5.6+, and a container's seccomp profile may refuse it (ENOSYS, or EPERM
// from older runtimes' default profiles). Asked once.
bool KernelResolvesInRoot() {
  static const bool available = [] {
    struct open_how how = {};
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT;
    int fd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, "/", &how, sizeof(how)));
    if (fd >= 0) close(fd);
    return fd >= 0;
  }();
  return available;
}

// Resolves `host_path` inside the directory `root` the way RESOLVE_IN_ROOT does, one component
// at a time, holding an O_PATH descriptor per resolved component: ".." pops a descriptor (it is
// never looked up, so it cannot climb above the root), and a symlink's target is walked from the
// root (absolute) or from its directory (relative). Race-free: nothing already resolved is
// looked up again by name. Sets *resolved to the host path reached: the missing tail, if any,
// is appended as written (for inotify's stand-in watches). With `chain`, the descriptors
// (outermost first) are handed over; then a missing component is an error. With `looked_in`, it
// is called with each directory a component is about to be looked up in (`last`: nothing is
// left to look up after it but what a symlink found there may add); its false ends the walk.
using LookupVisitor = std::function<bool(int directory, bool last)>;
absl::Status WalkInRoot(int root, absl::string_view host_path, bool follow_last,
                        std::string* resolved, std::vector<Fd>* chain = nullptr,
                        const LookupVisitor* looked_in = nullptr) {
  std::vector<Fd> fds;
  std::vector<std::string> names;    // parallel to fds
  std::vector<std::string> missing;  // the part that does not exist, lexically
  std::deque<std::string> todo = Components(host_path);
  int links = 0;
  while (!todo.empty()) {
    std::string part = std::move(todo.front());
    todo.pop_front();
    if (part == ".") {  // from a trailing slash: what came before must be a directory
      struct stat st;
      if (missing.empty() && fstat(fds.empty() ? root : fds.back().get(), &st) == 0 &&
          !S_ISDIR(st.st_mode)) {
        return ErrnoStatus(ENOTDIR, "cannot open", host_path);
      }
      continue;
    }
    if (part == "..") {
      if (!missing.empty()) {
        missing.pop_back();
      } else if (!fds.empty()) {
        fds.pop_back();
        names.pop_back();
      }
      continue;
    }
    if (!missing.empty()) {
      missing.push_back(std::move(part));
      continue;
    }
    const int dir = fds.empty() ? root : fds.back().get();
    if (looked_in != nullptr && !(*looked_in)(dir, todo.empty())) {
      return absl::CancelledError(absl::StrCat("stopped walking ", host_path));
    }
    Fd fd(openat(dir, part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno != ENOENT || chain != nullptr) return ErrnoStatus(errno, "cannot open", host_path);
      missing.push_back(std::move(part));
      continue;
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot open", host_path);
    if (S_ISLNK(st.st_mode) && (follow_last || !todo.empty())) {
      if (++links > 40) return ErrnoStatus(ELOOP, "cannot open", host_path);
      char target[PATH_MAX];
      ssize_t n = readlinkat(fd.get(), "", target, sizeof(target));
      if (n < 0) return ErrnoStatus(errno, "cannot open", host_path);
      absl::string_view link(target, static_cast<size_t>(n));
      if (absl::StartsWith(link, "/")) {
        fds.clear();
        names.clear();
      }
      std::deque<std::string> parts = Components(link);
      todo.insert(todo.begin(), parts.begin(), parts.end());
      continue;
    }
    if (!todo.empty() && !S_ISDIR(st.st_mode)) return ErrnoStatus(ENOTDIR, "cannot open", host_path);
    fds.push_back(std::move(fd));
    names.push_back(std::move(part));
  }
  names.insert(names.end(), missing.begin(), missing.end());
  *resolved = absl::StrCat("/", absl::StrJoin(names, "/"));
  if (chain != nullptr) *chain = std::move(fds);
  return absl::OkStatus();
}

}  // namespace

Host::Host(std::string root, Resolution resolution) : resolution_(resolution) {
  // Normalise: "/" -> "", "/host/" -> "/host".
  while (!root.empty() && root.back() == '/') root.pop_back();
  root_ = std::move(root);
  root_fd_.store(OpenRoot(root_));
}

Host::~Host() {
  const int fd = root_fd_.load();
  if (fd >= 0) close(fd);
}

Host::Host(const Host& other) : root_(other.root_), resolution_(other.resolution_) {
  const int fd = other.root_fd_.load(std::memory_order_acquire);
  root_fd_.store(fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : OpenRoot(root_));
}

Host& Host::operator=(const Host& other) {
  if (this == &other) return *this;
  const int other_fd = other.root_fd_.load(std::memory_order_acquire);
  const int fd = other_fd >= 0 ? fcntl(other_fd, F_DUPFD_CLOEXEC, 0) : OpenRoot(other.root_);
  root_ = other.root_;
  resolution_ = other.resolution_;
  const int old = root_fd_.exchange(fd);
  if (old >= 0) close(old);
  return *this;
}

int Host::RootFd() const {
  const int kept = root_fd_.load(std::memory_order_acquire);
  if (kept >= 0) return kept;
  const int fd = OpenRoot(root_);
  if (fd < 0) return -1;
  int expected = -1;
  if (!root_fd_.compare_exchange_strong(expected, fd, std::memory_order_acq_rel)) {
    close(fd);  // another thread opened it first
    return expected;
  }
  return fd;
}

std::string Host::Resolve(absl::string_view host_path) const {
  const int root = RootFd();
  std::string resolved;
  if (root < 0 || !WalkInRoot(root, host_path, /*follow_last=*/true, &resolved).ok()) {
    resolved = Lexical(host_path);  // unreadable root or a symlink loop: no links to follow
  }
  if (resolved == "/") return root_.empty() ? "/" : root_;
  return root_ + resolved;
}

std::string Host::ResolveHostPath(absl::string_view host_path) const {
  std::string path = Resolve(host_path).substr(root_.size());
  return path.empty() ? "/" : path;
}

int Host::OpenByKernel(int root_fd, absl::string_view host_path, int flags) const {
  const std::string relative = RelativePath(host_path);
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  for (int attempt = 0; attempt < 3; ++attempt) {
    // EAGAIN: a rename or mount anywhere on the host raced with a ".." step (the kernel's check
    // is global). On a busy node that can repeat; the walk never needs to retry.
    const int fd =
        static_cast<int>(syscall(SYS_openat2, root_fd, relative.c_str(), &how, sizeof(how)));
    if (fd >= 0 || (errno != EAGAIN && errno != EINTR)) return fd;
  }
  return -1;  // errno: EAGAIN or EINTR
}

absl::StatusOr<int> Host::Open(absl::string_view host_path, int flags) const {
  const int root = RootFd();
  if (root < 0) return ErrnoStatus(errno, "cannot open the host root", root_.empty() ? "/" : root_);
  if (resolution_ == Resolution::kKernel && KernelResolvesInRoot()) {
    const int fd = OpenByKernel(root, host_path, flags);
    if (fd >= 0) return fd;
    if (errno != EAGAIN && errno != EINTR) return ErrnoStatus(errno, "cannot open", host_path);
  }
  return OpenWithWalk(root, host_path, flags);
}

absl::StatusOr<int> Host::OpenWithWalk(int root_fd, absl::string_view host_path, int flags) const {
  std::string resolved;
  std::vector<Fd> chain;
  const bool follow_last = (flags & O_NOFOLLOW) == 0;
  if (absl::Status walked = WalkInRoot(root_fd, host_path, follow_last, &resolved, &chain);
      !walked.ok()) {
    return walked;
  }
  if (flags & O_PATH) {
    if (chain.empty()) {
      int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return ErrnoStatus(errno, "cannot open", host_path);
      return fd;
    }
    struct stat st;
    if ((flags & O_DIRECTORY) && (fstat(chain.back().get(), &st) != 0 || !S_ISDIR(st.st_mode))) {
      return ErrnoStatus(ENOTDIR, "cannot open", host_path);
    }
    return chain.back().release();
  }
  // Open the last entry by name from its (already resolved) directory. O_NOFOLLOW: had it been
  // swapped for a symlink since the walk, the open fails instead of following it.
  const int parent = chain.size() >= 2 ? chain[chain.size() - 2].get() : root_fd;
  const std::string name = chain.empty() ? "." : resolved.substr(resolved.find_last_of('/') + 1);
  int fd = openat(parent, name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", host_path);
  return fd;
}

absl::StatusOr<std::string> Host::ReadFile(absl::string_view host_path, size_t max_bytes) const {
  // Never open a device node or FIFO: opening /dev/apex_N resets the Edge TPU, and a FIFO
  // blocks. Look at what the path names first (O_PATH opens nothing), then open it and check
  // that the same file was opened.
  absl::StatusOr<int> looked = Open(host_path, O_PATH);
  if (!looked.ok()) return looked.status();
  struct stat seen;
  {
    Fd path_fd(*looked);
    if (fstat(path_fd.get(), &seen) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  }
  if (!S_ISREG(seen.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", host_path, ": not a regular file"));
  }
  absl::StatusOr<int> opened = Open(host_path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!opened.ok()) return opened.status();
  Fd fd(*opened);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  if (!S_ISREG(st.st_mode) || st.st_ino != seen.st_ino || st.st_dev != seen.st_dev) {
    return absl::AbortedError(
        absl::StrCat("cannot read ", host_path, ": it changed while being opened"));
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
  return AttributeOf(ReadFile(host_path));
}

absl::StatusOr<std::string> Host::AttributeOf(absl::StatusOr<std::string> content) {
  if (!content.ok()) return content.status();
  absl::string_view value = *content;
  // Device-tree strings end in NUL; sysfs values end in a newline.
  while (!value.empty() && (value.back() == '\0' || absl::ascii_isspace(value.back()))) {
    value.remove_suffix(1);
  }
  return std::string(absl::StripLeadingAsciiWhitespace(value));
}

absl::StatusOr<int64_t> Host::ReadInteger(absl::string_view host_path) const {
  return IntegerOf(host_path, ReadFile(host_path));
}

absl::StatusOr<int64_t> Host::IntegerOf(absl::string_view host_path,
                                        absl::StatusOr<std::string> content) {
  absl::StatusOr<std::string> value = AttributeOf(std::move(content));
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
  absl::StatusOr<int> opened = Open(host_path, O_RDONLY | O_DIRECTORY);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrReplaceAll(opened.status().message(), {{"cannot open", "cannot list"}}));
  }
  Fd fd(*opened);
  return ListOpenDirectory(fd.get(), host_path);
}

absl::StatusOr<FileInfo> Host::Stat(absl::string_view host_path) const {
  absl::StatusOr<int> opened = Open(host_path, O_PATH);
  if (!opened.ok()) return ErrnoStatusRenamed(opened.status(), "cannot stat");
  Fd fd(*opened);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  return InfoOf(st);
}

absl::StatusOr<FileInfo> Host::Lstat(absl::string_view host_path) const {
  absl::StatusOr<int> opened = Open(host_path, O_PATH | O_NOFOLLOW);
  if (!opened.ok()) return ErrnoStatusRenamed(opened.status(), "cannot stat");
  Fd fd(*opened);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", host_path);
  return InfoOf(st);
}

bool Host::Exists(absl::string_view host_path) const {
  absl::StatusOr<int> opened = Open(host_path, O_PATH);
  if (!opened.ok()) return false;
  close(*opened);
  return true;
}

bool Host::Absent(absl::string_view host_path, bool follow_last) const {
  const int root = RootFd();
  if (root < 0 || resolution_ != Resolution::kKernel || !KernelResolvesInRoot()) return false;
  const int fd = OpenByKernel(root, host_path, O_PATH | (follow_last ? 0 : O_NOFOLLOW));
  if (fd >= 0) {
    close(fd);
    return false;
  }
  return errno == ENOENT;
}

namespace {

// Under /sys or /proc by its host path: what the kernel changes there sends no inotify event. A
// fixture tree's copy of them (on another filesystem) is taken for what it stands for.
bool InKernelTree(absl::string_view lexical_path) {
  return lexical_path == "/sys" || lexical_path == "/proc" ||
         absl::StartsWith(lexical_path, "/sys/") || absl::StartsWith(lexical_path, "/proc/");
}

// The type (statfs f_type, a *_MAGIC) of the filesystem `fd` is on; 0 where it cannot be told.
uint64_t FilesystemType(int fd) {
  struct statfs fs;
  return fstatfs(fd, &fs) == 0 ? static_cast<uint64_t>(fs.f_type) : 0;
}

// Whether inotify reports every change on the filesystem of `fd`, whoever makes it: local
// filesystems that keep their own inodes, and read-only images that never change (a driver's
// squashfs). Not sysfs, procfs, debugfs (values change with no event), nor network, FUSE or
// overlay filesystems (changed beneath the mount with no event).
bool AnnouncesChanges(int fd) {
  switch (FilesystemType(fd)) {
    case EXT4_SUPER_MAGIC:  // ext2, ext3 and ext4 share it
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case F2FS_SUPER_MAGIC:
    case TMPFS_MAGIC:
    case RAMFS_MAGIC:
    case SQUASHFS_MAGIC:
    case EROFS_SUPER_MAGIC_V1:
      return true;
    default:
      return false;
  }
}

// What a change of an entry's name or attributes in a watched directory sends, and of the
// directory itself (removed, moved, unmounted: IN_IGNORED comes too).
constexpr uint32_t kEntryChanges = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                                   IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;
// And of a file's content, for a directory whose file is read.
constexpr uint32_t kContentChanges = IN_MODIFY | IN_CLOSE_WRITE;

bool AddWatch(int inotify, int directory, uint32_t mask) {
  if (!AnnouncesChanges(directory)) return false;
  // The descriptor's own path: inotify_add_watch takes a path, and this one is the very
  // directory resolved (a magic link to it), whatever happens to its name.
  const std::string path = absl::StrCat("/proc/self/fd/", directory);
  return inotify_add_watch(inotify, path.c_str(), mask | IN_ONLYDIR | IN_MASK_ADD) >= 0;
}

}  // namespace

HostWatches::HostWatches(const Host* host, int inotify) : host_(host), inotify_(inotify) {}

HostWatches::~HostWatches() {
  for (auto& [path, directory] : directories_) {
    if (directory.fd >= 0) close(directory.fd);
  }
}

bool HostWatches::WatchWalk(absl::string_view host_path, bool follow_last, bool content,
                            int* found_fd, bool kernel_tree) const {
  const int root = host_->RootFd();
  if (root < 0 || inotify_ < 0) return false;
  const LookupVisitor watch = [&](int directory, bool last) {
    return AddWatch(inotify_, directory, kEntryChanges | (content && last ? kContentChanges : 0));
  };
  std::string resolved;
  if ((!kernel_tree && InKernelTree(Lexical(host_path))) ||
      !WalkInRoot(root, host_path, follow_last, &resolved, /*chain=*/nullptr, &watch).ok() ||
      (!kernel_tree && InKernelTree(resolved))) {
    return false;
  }
  // What was found, if anything: on such a filesystem too (a mount point, a file bind-mounted),
  // and a directory is watched itself, for what is listed or looked up in it.
  absl::StatusOr<int> opened =
      host_->OpenWithWalk(root, host_path, O_PATH | (follow_last ? 0 : O_NOFOLLOW));
  if (!opened.ok()) return Host::IsAbsence(opened.status());  // watched up to where it stops
  Fd found(*opened);
  struct stat st;
  if (fstat(found.get(), &st) != 0 || !AnnouncesChanges(found.get())) return false;
  if (S_ISDIR(st.st_mode) && !AddWatch(inotify_, found.get(), kEntryChanges)) return false;
  if (found_fd != nullptr) *found_fd = found.release();
  return true;
}

HostWatches::Directory* HostWatches::Walked(const std::string& host_path, bool kernel_tree) {
  auto [it, added] = directories_.try_emplace(host_path);
  Directory& directory = it->second;
  if (!added) return directory.fd >= 0 ? &directory : nullptr;
  // The directory's own walk: every lookup on the way to it, and itself.
  int opened = -1;
  if (!WatchWalk(host_path, /*follow_last=*/true, /*content=*/false, &opened, kernel_tree)) {
    return nullptr;
  }
  Fd fd(opened);  // -1: nothing there
  struct stat st;
  if (fd.get() < 0 || fstat(fd.get(), &st) != 0 || !S_ISDIR(st.st_mode)) return nullptr;
  directory.fd = fd.release();
  directory.device = st.st_dev;
  return &directory;
}

bool HostWatches::Watch(absl::string_view host_path, bool follow_last, bool content) {
  return WatchLooks(host_path, follow_last, content, /*kernel_tree=*/false);
}

bool HostWatches::WatchIdentity(absl::string_view host_path) {
  return WatchLooks(host_path, /*follow_last=*/true, /*content=*/false, /*kernel_tree=*/true);
}

bool HostWatches::WatchLooks(absl::string_view host_path, bool follow_last, bool content,
                             bool kernel_tree) {
  const std::string path = Lexical(host_path);
  if (!kernel_tree && InKernelTree(path)) return false;  // changes there come unannounced
  const size_t slash = path.rfind('/');
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = path.substr(slash + 1);
  if (name.empty()) {  // the root itself
    return WatchWalk(host_path, follow_last, content, /*found_fd=*/nullptr, kernel_tree);
  }
  Directory* directory = Walked(parent, kernel_tree);
  if (directory == nullptr) {
    // Not there, or not all of it announces changes: the walk of the whole path says which.
    return WatchWalk(host_path, follow_last, content, /*found_fd=*/nullptr, kernel_tree);
  }
  if (content && !directory->content) {
    if (!AddWatch(inotify_, directory->fd, kEntryChanges | kContentChanges)) return false;
    directory->content = true;
  }
  struct stat st;
  if (fstatat(directory->fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT;  // its creation comes as an event of the directory's watch
  }
  if (S_ISLNK(st.st_mode) && follow_last) {
    return WatchWalk(host_path, follow_last, content, /*found_fd=*/nullptr, kernel_tree);
  }
  if (!S_ISDIR(st.st_mode) && st.st_dev == directory->device) return true;
  // A directory (watched itself, for what is listed or looked up in it), or a mount point.
  Fd entry(openat(directory->fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (entry.get() < 0 || !AnnouncesChanges(entry.get())) return false;
  return !S_ISDIR(st.st_mode) || AddWatch(inotify_, entry.get(), kEntryChanges);
}

bool Host::IsAbsence(const absl::Status& status) {
  return absl::IsNotFound(status) && absl::EndsWith(status.message(), ErrnoText(ENOENT));
}

bool Host::IsSilentToInotify(absl::string_view host_path) const {
  if (InKernelTree(Lexical(host_path))) return true;
  absl::StatusOr<int> opened = Open(host_path, O_PATH);
  if (!opened.ok()) return false;  // not there yet: its ancestor stands in, and is checked then
  Fd fd(*opened);
  switch (FilesystemType(fd.get())) {
    case SYSFS_MAGIC:
    case PROC_SUPER_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
      return true;
    default:
      return false;
  }
}

bool FileInfo::operator==(const FileInfo& other) const {
  return type == other.type && major == other.major && minor == other.minor &&
         permissions == other.permissions && uid == other.uid && gid == other.gid &&
         inode == other.inode && links == other.links && device == other.device &&
         size == other.size && modified.tv_sec == other.modified.tv_sec &&
         modified.tv_nsec == other.modified.tv_nsec;
}

HostDirectory::HostDirectory(const Host* host, std::string host_path, bool listable)
    : host_(host), host_path_(std::move(host_path)) {
  if (listable) {
    absl::StatusOr<int> opened = host_->Open(host_path_, O_RDONLY | O_DIRECTORY);
    if (opened.ok()) {
      fd_ = *opened;
      listable_ = true;
      return;
    }
  }
  absl::StatusOr<int> opened = host_->Open(host_path_, O_PATH | O_DIRECTORY);
  if (opened.ok()) fd_ = *opened;
}

HostDirectory::~HostDirectory() {
  if (fd_ >= 0) close(fd_);
}

HostDirectory::HostDirectory(HostDirectory&& other) noexcept
    : host_(other.host_),
      host_path_(std::move(other.host_path_)),
      fd_(other.fd_),
      listable_(other.listable_),
      listed_(other.listed_),
      entries_(std::move(other.entries_)),
      filesystem_(other.filesystem_) {
  other.fd_ = -1;
}

absl::StatusOr<std::vector<std::string>> HostDirectory::ListDirectory() const {
  entries_.clear();  // ListedAs() answers for this listing only
  if (!listable_) return host_->ListDirectory(host_path_);
  if (listed_ && lseek(fd_, 0, SEEK_SET) != 0) return host_->ListDirectory(host_path_);
  listed_ = true;
  // These fill getdents64's buffer until the next entry does not fit (kernfs_fop_readdir,
  // proc_readdir_de and proc_pid_readdir, tmpfs's offset_readdir or dcache_readdir): a buffer
  // left with room for any entry holds the rest of the directory.
  const uint64_t filesystem = Filesystem();
  const bool fills_buffer =
      filesystem == SYSFS_MAGIC || filesystem == PROC_SUPER_MAGIC || filesystem == TMPFS_MAGIC;
  return ListOpenDirectory(fd_, host_path_, &entries_, fills_buffer);
}

bool HostDirectory::ListedAs(absl::string_view name, const FileInfo& info) const {
  auto it = std::lower_bound(
      entries_.begin(), entries_.end(), name,
      [](const DirectoryEntry& entry, absl::string_view n) { return entry.name < n; });
  if (it == entries_.end() || it->name != name || it->inode != info.inode) return false;
  switch (info.type) {
    case FileInfo::Type::kRegular:
      return it->type == DT_REG;
    case FileInfo::Type::kDirectory:
      return it->type == DT_DIR;
    case FileInfo::Type::kSymlink:
      return it->type == DT_LNK;
    default:
      return false;
  }
}

bool HostDirectory::OnSysfs() const {
  return Filesystem() == SYSFS_MAGIC;
}

uint64_t HostDirectory::Filesystem() const {
  if (!filesystem_.has_value()) filesystem_ = fd_ >= 0 ? FilesystemType(fd_) : 0;
  return *filesystem_;
}

std::string HostDirectory::PathOf(absl::string_view name) const {
  return absl::StrCat(host_path_ == "/" ? "" : host_path_, "/", name);
}

bool HostDirectory::StatHere(absl::string_view name, struct stat* st) const {
  if (fd_ < 0 || name.empty() || name == "." || name == ".." ||
      name.find('/') != absl::string_view::npos) {
    return false;
  }
  return fstatat(fd_, NameBuffer(name).c_str(), st, AT_SYMLINK_NOFOLLOW) == 0;
}

absl::StatusOr<std::string> HostDirectory::ReadFile(absl::string_view name,
                                                    size_t max_bytes) const {
  return ReadFile(name, max_bytes, /*kept=*/nullptr);
}

absl::StatusOr<std::string> HostDirectory::ReadFile(absl::string_view name, size_t max_bytes,
                                                    KeptFile* kept) const {
  // As Host::ReadFile: look first (a device node is never opened: that resets an Edge TPU), then
  // open without following a link, and check that the file looked at is the one opened.
  struct stat seen;
  const bool here = StatHere(name, &seen) && S_ISREG(seen.st_mode);
  if (kept != nullptr) {
    if (here && !kept->empty() && kept->Holds(seen)) {
      std::optional<std::string> content = ReadRegularFile(kept->fd_, seen.st_size, max_bytes);
      if (content.has_value() && !content->empty()) return *std::move(content);
    }
    kept->Close();
  }
  if (here) {
    Fd fd(openat(fd_, NameBuffer(name).c_str(),
                 O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (fd.get() >= 0 && fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_ino == seen.st_ino && st.st_dev == seen.st_dev) {
      std::optional<std::string> content = ReadRegularFile(fd.get(), st.st_size, max_bytes);
      if (content.has_value()) {
        if (kept != nullptr) kept->Keep(fd.release(), st);
        return *std::move(content);
      }
    }
  }
  return host_->ReadFile(PathOf(name), max_bytes);
}

KeptFile::KeptFile(KeptFile&& other) noexcept
    : fd_(other.fd_),
      device_(other.device_),
      inode_(other.inode_),
      mode_(other.mode_),
      uid_(other.uid_),
      gid_(other.gid_),
      size_(other.size_),
      kernel_file_(other.kernel_file_) {
  other.fd_ = -1;
}

KeptFile& KeptFile::operator=(KeptFile&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    device_ = other.device_;
    inode_ = other.inode_;
    mode_ = other.mode_;
    uid_ = other.uid_;
    gid_ = other.gid_;
    size_ = other.size_;
    kernel_file_ = other.kernel_file_;
    other.fd_ = -1;
  }
  return *this;
}

void KeptFile::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void KeptFile::Keep(int fd, const struct stat& st) {
  Close();
  fd_ = fd;
  device_ = st.st_dev;
  inode_ = st.st_ino;
  mode_ = st.st_mode;
  uid_ = st.st_uid;
  gid_ = st.st_gid;
  size_ = st.st_size;
  const uint64_t filesystem = FilesystemType(fd);
  kernel_file_ = filesystem == SYSFS_MAGIC || filesystem == PROC_SUPER_MAGIC;
}

std::optional<std::string> KeptFile::ReadIfKernelFile(size_t max_bytes) const {
  if (fd_ < 0 || !kernel_file_) return std::nullopt;
  std::optional<std::string> content = ReadRegularFile(fd_, size_, max_bytes);
  if (!content.has_value() || content->empty()) return std::nullopt;
  return content;
}

std::optional<std::string> KeptFile::ReadHeld(size_t max_bytes) const {
  if (fd_ < 0) return std::nullopt;
  return ReadRegularFile(fd_, size_, max_bytes);
}

bool KeptFile::Holds(const struct stat& st) const {
  return fd_ >= 0 && st.st_dev == device_ && st.st_ino == inode_ && st.st_mode == mode_ &&
         st.st_uid == uid_ && st.st_gid == gid_;
}

absl::StatusOr<FileInfo> HostDirectory::Stat(absl::string_view name) const {
  struct stat st;
  if (StatHere(name, &st) && !S_ISLNK(st.st_mode)) return InfoOf(st);
  return host_->Stat(PathOf(name));
}

absl::StatusOr<FileInfo> HostDirectory::Lstat(absl::string_view name) const {
  struct stat st;
  if (StatHere(name, &st)) return InfoOf(st);
  return host_->Lstat(PathOf(name));
}

bool HostDirectory::Exists(absl::string_view name) const {
  struct stat st;
  if (StatHere(name, &st) && !S_ISLNK(st.st_mode)) return true;
  return host_->Exists(PathOf(name));
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
