// Writing files other programs read while we write them (CDI specs, NFD feature files).
#ifndef EDGEACCEL_ATOMIC_FILE_H_
#define EDGEACCEL_ATOMIC_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace edgeaccel {

// Replaces `directory`/`name` with `content` atomically: written to a dot-file in the same
// directory (readers skip dot-files), fsynced, then renamed over the old file. Readers see the
// old content or the new, never a part. On error (disk full, read-only) nothing is left behind
// and the message names the file and the reason.
absl::Status WriteFileAtomically(const std::string& directory, const std::string& name,
                                 absl::string_view content);

}  // namespace edgeaccel

#endif  // EDGEACCEL_ATOMIC_FILE_H_
