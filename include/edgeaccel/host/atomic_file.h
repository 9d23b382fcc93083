// Writing files other programs read while we write them (CDI specs, NFD feature files).
#ifndef EDGEACCEL_HOST_ATOMIC_FILE_H_
#define EDGEACCEL_HOST_ATOMIC_FILE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace edgeaccel {

// Whether a file written atomically is on disk before it replaces the old one.
enum class FileSync {
  kDurable,    // fsync before the rename: it survives a power loss whole or not at all
  kPageCache,  // no fsync: after a power loss it may be empty; for a file its writer rebuilds
               // after every boot from a durable one (a DRA claim's CDI spec, from the
               // checkpoint), where an fsync on an SD card costs a pod's start tens of ms
};

// Replaces `directory`/`name` with `content` atomically: written to a dot-file in the same
// directory (readers skip dot-files), fsynced (unless FileSync::kPageCache), then renamed over
// the old file. Readers see the old content or the new, never a part. The file gets `mode`
// whatever the process's umask. On error (disk full, read-only) nothing is left behind and the
// message names the file and the reason.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode = 0644,
                                 FileSync sync = FileSync::kDurable);
// The same, and calls `before_rename` with the new file's stat(2) once its content is on disk,
// just before the rename: its st_dev and st_ino are what `directory`/`name` has from the rename
// on, so a reader of the file can tell the new file from the old the moment it lands.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content, mode_t mode,
                                 const std::function<void(const struct stat&)>& before_rename);

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_ATOMIC_FILE_H_
