// Host: the one way the daemon reads the machine it runs on.
//
// Callers always speak in host paths ("/dev/apex_0", "/sys/class/apex"), the paths the kubelet
// and the container runtime use. Host maps them under its root (--host-root) for reading. In a
// DaemonSet the host's / is mounted at e.g. /host; in tests the root is a fixture tree. Nothing
// else in the daemon opens a host file directly, so nothing reads the real machine by accident.
#ifndef EDGEACCEL_HOST_HOST_H_
#define EDGEACCEL_HOST_HOST_H_

#include <sys/types.h>

#include <cstdint>
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
  ino_t inode = 0;
};

class Host {
 public:
  // `root` is where the host's / is visible to this process: "/" on the node itself.
  explicit Host(std::string root);

  const std::string& root() const { return root_; }

  // The path this process opens for `host_path` (which must be absolute). Any ".." component is
  // dropped, so a host path can never name something outside the root.
  std::string Resolve(absl::string_view host_path) const;

  // Reads a whole small file (sysfs attribute, /proc entry). Files larger than `max_bytes` are
  // an error: host files we read are tiny, and a huge one means we are reading the wrong thing.
  absl::StatusOr<std::string> ReadFile(absl::string_view host_path,
                                       size_t max_bytes = 64 * 1024) const;

  // A sysfs-style attribute: the file's text with surrounding whitespace and NULs trimmed.
  absl::StatusOr<std::string> ReadAttribute(absl::string_view host_path) const;

  // An attribute holding one decimal integer.
  absl::StatusOr<int64_t> ReadInteger(absl::string_view host_path) const;

  // Entry names in a directory, sorted, without "." and "..".
  absl::StatusOr<std::vector<std::string>> ListDirectory(absl::string_view host_path) const;

  // stat(2) of the path (following symlinks).
  absl::StatusOr<FileInfo> Stat(absl::string_view host_path) const;

  bool Exists(absl::string_view host_path) const;

 private:
  std::string root_;  // without trailing slash; empty for "/"
};

// Human-readable name of a file type, for log lines ("a regular file").
absl::string_view FileTypeName(FileInfo::Type type);

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_HOST_H_
