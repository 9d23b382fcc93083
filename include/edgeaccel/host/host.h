// Host: the one way the daemon reads the machine it runs on.
//
// Callers always speak in host paths ("/dev/apex_0", "/sys/class/apex"), the paths the kubelet
// and the container runtime use. Host maps them under its root (--host-root) for reading. In a
// DaemonSet the host's / is mounted at e.g. /host; in tests the root is a fixture tree. Nothing
// else in the daemon opens a host file directly, so nothing reads the real machine by accident.
#ifndef EDGEACCEL_HOST_HOST_H_
#define EDGEACCEL_HOST_HOST_H_

#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace edgeaccel {

struct FileInfo {
  enum class Type { kRegular, kDirectory, kCharDevice, kBlockDevice, kSocket, kSymlink, kOther };
  Type type = Type::kOther;
  unsigned major = 0;  // for device nodes
  unsigned minor = 0;
  mode_t permissions = 0;
  uid_t uid = 0;  // owner and group
  gid_t gid = 0;
  ino_t inode = 0;
  nlink_t links = 1;  // 0 for a directory deleted while something (a bind mount) still holds it
  dev_t device = 0;   // the filesystem it is on (st_dev)
  off_t size = 0;
  struct timespec modified = {};  // st_mtim

  // Every field equal: the same file, unchanged as far as stat(2) tells.
  bool operator==(const FileInfo& other) const;
  bool operator!=(const FileInfo& other) const { return !(*this == other); }
};

class Host;
class HostDirectory;

// An entry of a directory listing: its name, inode number and type (a DT_ value).
struct DirectoryEntry {
  std::string name;
  ino_t inode = 0;
  unsigned char type = 0;
};

// A regular file read through a HostDirectory, held open so that reading it again need not open
// it: the probe reads the same sysfs attributes every few seconds. Empty until
// HostDirectory::ReadFile keeps a file in it. Owns its descriptor.
class KeptFile {
 public:
  KeptFile() = default;
  ~KeptFile() { Close(); }
  KeptFile(KeptFile&& other) noexcept;
  KeptFile& operator=(KeptFile&& other) noexcept;
  KeptFile(const KeptFile&) = delete;
  KeptFile& operator=(const KeptFile&) = delete;

  bool empty() const { return fd_ < 0; }
  void Close();

  // The content read again through the descriptor, without looking at the name, where the file
  // is a kernel attribute (sysfs, procfs): the kernel fails every read of one that was removed
  // (ENODEV, EIO), a device's or a driver's going with it, and never puts another file in place
  // of one that stays, so what the descriptor reads is what opening the name would. A change of
  // permissions is not seen here, which matters only to a reader without CAP_DAC_OVERRIDE.
  // nullopt where the file is on another filesystem (a file there can be replaced under its
  // name: HostDirectory::ReadFile looks first), or the read fails or gives nothing: then
  // HostDirectory::ReadFile answers.
  std::optional<std::string> ReadIfKernelFile(size_t max_bytes) const;
  // The same through the descriptor on any filesystem, for a caller that knows by other means
  // that the name still leads to this very file (HostWatches::WatchIdentity: no event since it
  // was kept).
  std::optional<std::string> ReadHeld(size_t max_bytes) const;

 private:
  friend class HostDirectory;
  // Holds `fd`, whose fstat(2) is `st`.
  void Keep(int fd, const struct stat& st);
  // Whether `st` (an fstatat of the entry now) is the file held, as an open would find it: the
  // same inode on the same filesystem, with the same type, permissions and owner.
  bool Holds(const struct stat& st) const;

  int fd_ = -1;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  mode_t mode_ = 0;
  uid_t uid_ = 0;
  gid_t gid_ = 0;
  off_t size_ = 0;
  bool kernel_file_ = false;  // on sysfs or procfs
};

// Asks an inotify descriptor to report whatever could change what looks at host paths find, for
// a series of paths (the reads of a scan): each directory is walked once. Owns the descriptors
// it keeps of them, not the inotify descriptor.
class HostWatches {
 public:
  // `host` must outlive this object.
  HostWatches(const Host* host, int inotify);
  ~HostWatches();
  HostWatches(const HostWatches&) = delete;
  HostWatches& operator=(const HostWatches&) = delete;

  // Watches every directory a look at `host_path` looks a name up in (symlinks followed inside
  // the root, the last one with `follow_last`) and the path itself where it is a directory, for
  // entries created, removed, renamed or changed in attributes, and with `content` for a file of
  // the last directory written. True where all of it is on filesystems whose every change
  // inotify reports (ext4, xfs, btrfs, f2fs, tmpfs, ramfs; squashfs and erofs, which never
  // change); a path that does not exist is watched up to where it stops. False where any of it
  // is elsewhere (sysfs and procfs values change with no event; network, FUSE and overlay
  // filesystems change beneath the mount), the walk fails or a watch cannot be added: then the
  // caller must look again itself. Events come only for what changes after the watches are in
  // place. A filesystem mounted over a watched directory sends none: mounts are not watched.
  bool Watch(absl::string_view host_path, bool follow_last, bool content);
  // Watches what would make `host_path` (symlinks followed) lead to another file or to none, or
  // change that file's owner or permissions: the directories a look walks through, for entries
  // and attributes; never the file's content. Unlike Watch(), under /sys and /proc too, where
  // their filesystem announces that: a fixture tree's copy of them, whose values are files
  // that can be replaced under their names; never the kernel's sysfs or procfs, which announce
  // nothing. True as Watch() answers (a missing file: watched up to where it stops).
  bool WatchIdentity(absl::string_view host_path);

 private:
  struct Directory {
    int fd = -1;  // O_PATH; -1: not all of the way to it announces changes, or it is not there
    dev_t device = 0;
    bool content = false;  // its files' writes are watched too
  };
  // Watch() for one path, walked from the root. With `found_fd`, where it answers true and
  // something is at the path, its O_PATH descriptor is handed over there.
  // Watch(), and with `kernel_tree` also under /sys and /proc (WatchIdentity).
  bool WatchLooks(absl::string_view host_path, bool follow_last, bool content, bool kernel_tree);
  // `kernel_tree`: also under /sys and /proc (WatchIdentity).
  bool WatchWalk(absl::string_view host_path, bool follow_last, bool content,
                 int* found_fd = nullptr, bool kernel_tree = false) const;
  // The directory at `host_path`, walked and watched once; null where WatchWalk fails for it.
  Directory* Walked(const std::string& host_path, bool kernel_tree = false);

  const Host* host_;
  int inotify_;
  std::map<std::string, Directory> directories_;
};

// One directory, resolved inside the root once, to read several entries of it again and again
// without resolving its path each time (the HostWatcher's probe). Every answer is what the Host
// call of the same name gives for "<directory>/<name>" at that moment: a regular file, or any
// entry for Lstat, directly in the directory is read through the directory's descriptor;
// anything else (a symlink to follow, a name with a slash, an error) is handed to Host whole.
// Owns its descriptor.
class HostDirectory {
 public:
  // `listable`: open the directory for reading (where it can be), so that ListDirectory() reads
  // its entries through the same descriptor.
  HostDirectory(const Host* host, std::string host_path, bool listable = false);
  ~HostDirectory();
  HostDirectory(HostDirectory&& other) noexcept;
  HostDirectory& operator=(HostDirectory&& other) = delete;
  HostDirectory(const HostDirectory&) = delete;
  HostDirectory& operator=(const HostDirectory&) = delete;

  absl::StatusOr<std::string> ReadFile(absl::string_view name, size_t max_bytes) const;
  // The same answer as ReadFile(name, max_bytes), read through `kept` where it holds the very
  // file that `name` is now (looked at with fstatat: the same inode, type, permissions and
  // owner) from offset 0, which gives what opening and reading it gives: a file's content, a
  // sysfs or procfs attribute's value formatted again. Otherwise, and where that read fails or
  // gives nothing (a removed sysfs attribute answers ENODEV), the name is read as ReadFile reads
  // it, and the regular file opened for that is kept in `kept` for the next call; `kept` is left
  // empty where nothing was opened here. A null `kept` is ReadFile(name, max_bytes): nothing kept.
  absl::StatusOr<std::string> ReadFile(absl::string_view name, size_t max_bytes,
                                       KeptFile* kept) const;
  absl::StatusOr<FileInfo> Stat(absl::string_view name) const;
  absl::StatusOr<FileInfo> Lstat(absl::string_view name) const;
  bool Exists(absl::string_view name) const;
  // Host::ListDirectory of the directory itself.
  absl::StatusOr<std::vector<std::string>> ListDirectory() const;
  // Whether the last ListDirectory() through the descriptor listed `name` with the inode number
  // and type `info` gives (a symlink, a directory or a regular file): for a filesystem that
  // never gives a removed file's inode number to a new one soon (sysfs: kernfs numbers its
  // nodes cyclically; not procfs, which reuses the lowest free one), the same entry still.
  bool ListedAs(absl::string_view name, const FileInfo& info) const;
  // Whether the directory is on sysfs (asked once).
  bool OnSysfs() const;

 private:
  std::string PathOf(absl::string_view name) const;
  // fstatat of `name` (no slash) without following a symlink; false when it cannot be done here.
  bool StatHere(absl::string_view name, struct stat* st) const;

  const Host* host_;
  std::string host_path_;
  // O_PATH, or open for reading where listable_; -1 when the directory could not be opened
  // (then Host answers).
  int fd_ = -1;
  bool listable_ = false;  // fd_ is open for reading (not O_PATH)
  mutable bool listed_ = false;  // its offset has moved
  mutable std::vector<DirectoryEntry> entries_;  // the last listing through fd_, by name
  // statfs f_type of fd_'s filesystem, asked once (0: unknown).
  uint64_t Filesystem() const;
  mutable std::optional<uint64_t> filesystem_;
};

class Host {
 public:
  enum class Resolution {
    kKernel,  // openat2 RESOLVE_IN_ROOT where the kernel has it, else the walk
    kWalk,    // always the walk (tests compare the two)
  };

  // `root` is where the host's / is visible to this process: "/" on the node itself. The root
  // directory is opened here (O_PATH), or by the first call that finds it where it was not there
  // yet, and that descriptor is what every path is resolved from for the Host's life: a
  // directory mounted over `root` afterwards is not seen (mounts below it are).
  explicit Host(std::string root, Resolution resolution = Resolution::kKernel);
  ~Host();
  // A copy holds its own descriptor of the same root directory.
  Host(const Host& other);
  Host& operator=(const Host& other);

  const std::string& root() const { return root_; }

  // The path this process opens for `host_path` (which must be absolute), with every symlink in
  // it resolved inside the root. The part that does not exist yet is appended as written, with
  // "." and ".." applied. Never names anything outside the root. For inotify, which needs a path;
  // reads go through file descriptors resolved by the kernel.
  std::string Resolve(absl::string_view host_path) const;

  // The host path `host_path` names once every symlink in it is resolved inside the root: what
  // Resolve gives, without the root in front. That is the path a process on the host itself (a
  // container runtime mounting it) opens.
  std::string ResolveHostPath(absl::string_view host_path) const;

  // Opens `host_path` resolved inside the root, with `flags` (O_CLOEXEC is added). The caller
  // owns the descriptor.
  absl::StatusOr<int> Open(absl::string_view host_path, int flags) const;

  // Reads a whole small file (sysfs attribute, /proc entry). Files larger than `max_bytes` are
  // an error: host files we read are tiny, and a huge one means we are reading the wrong thing.
  // A file replaced between the look and the open (a device removed and added again, which
  // gives its sysfs attributes new inodes) is Aborted: read again later, it is the new one.
  absl::StatusOr<std::string> ReadFile(absl::string_view host_path,
                                       size_t max_bytes = 64 * 1024) const;

  // A sysfs-style attribute: the file's text with surrounding whitespace and NULs trimmed.
  absl::StatusOr<std::string> ReadAttribute(absl::string_view host_path) const;

  // An attribute holding one decimal integer.
  absl::StatusOr<int64_t> ReadInteger(absl::string_view host_path) const;

  // What ReadAttribute and ReadInteger make of what ReadFile gave for `host_path`.
  static absl::StatusOr<std::string> AttributeOf(absl::StatusOr<std::string> content);
  static absl::StatusOr<int64_t> IntegerOf(absl::string_view host_path,
                                           absl::StatusOr<std::string> content);

  // Entry names in a directory, sorted, without "." and "..".
  absl::StatusOr<std::vector<std::string>> ListDirectory(absl::string_view host_path) const;

  // stat(2) of the path (following symlinks, inside the root).
  absl::StatusOr<FileInfo> Stat(absl::string_view host_path) const;

  // lstat(2): the entry itself, a symlink reported as kSymlink and never followed. Symlinks in
  // the directories above it are followed inside the root.
  absl::StatusOr<FileInfo> Lstat(absl::string_view host_path) const;

  bool Exists(absl::string_view host_path) const;

  // True where nothing is at the path now: the kernel resolves it in the root (openat2) and
  // answers ENOENT. `follow_last`: a symlink at the end is followed (as ReadFile, Stat and
  // ListDirectory look), or not (as Lstat). No status is made, so asking again and again about a
  // path that stays missing is cheap (the probe does, every few seconds). False where it cannot
  // tell (the kernel resolves nothing in a root: the walk answers every call).
  bool Absent(absl::string_view host_path, bool follow_last = true) const;
  // Whether `status` is the answer of a look that found nothing at its path (ENOENT): what any of
  // the calls above answers where Absent() holds for that path.
  static bool IsAbsence(const absl::Status& status);

  // True where the kernel sends no inotify events for changes it makes itself: anything under
  // /sys or /proc (by host path, so fixture trees behave as a node does), and anything whose
  // filesystem is sysfs, procfs, debugfs or tracefs. Such paths are read on the probe.
  bool IsSilentToInotify(absl::string_view host_path) const;

 private:
  friend class HostWatches;
  // The walk, from the already opened root directory `root_fd`.
  absl::StatusOr<int> OpenWithWalk(int root_fd, absl::string_view host_path, int flags) const;
  // openat2 RESOLVE_IN_ROOT from `root_fd`, tried again on EAGAIN and EINTR (at most 3 times):
  // the descriptor, or -1 with errno set. Only where KernelResolvesInRoot().
  int OpenByKernel(int root_fd, absl::string_view host_path, int flags) const;
  // The root's O_PATH descriptor, opened now if it was not yet; -1 (errno set) while it cannot be.
  int RootFd() const;

  std::string root_;  // without trailing slash; empty for "/"
  Resolution resolution_;
  mutable std::atomic<int> root_fd_{-1};
};

// Human-readable name of a file type, for log lines ("a regular file").
absl::string_view FileTypeName(FileInfo::Type type);

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_HOST_H_
