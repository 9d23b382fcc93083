// L4T's container file lists (host-files-for-container.d/*.csv), as ParseTegraHostFiles reads
// them: whatever a list holds, each accepted entry is a clean absolute path (no "." or ".."
// step, nothing empty), with wildcards only in its last step, and every line is either an entry,
// a skipped blank or comment line, or one problem.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "edgeaccel/discovery/tegra_host_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> problems;
  const std::vector<edgeaccel::HostFileEntry> entries =
      edgeaccel::ParseTegraHostFiles("fuzz.csv", text, &problems);
  const size_t lines = std::vector<absl::string_view>(absl::StrSplit(text, '\n')).size();
  if (entries.size() + problems.size() > lines) __builtin_trap();
  for (const edgeaccel::HostFileEntry& entry : entries) {
    const std::string& path = entry.path;
    if (path.size() < 2 || path[0] != '/') __builtin_trap();
    const std::string relative = path.substr(1);  // the steps below view into it
    const std::vector<absl::string_view> steps = absl::StrSplit(relative, '/');
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].empty() || steps[i] == "." || steps[i] == "..") __builtin_trap();
      if (i + 1 < steps.size() && steps[i].find_first_of("*?") != absl::string_view::npos) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
