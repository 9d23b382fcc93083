// The lists of host files a Jetson container needs, as L4T ships them for NVIDIA's container
// runtime ("CSV mode"): /etc/nvidia-container-runtime/host-files-for-container.d/*.csv
// (l4t.csv on JetPack 4; devices.csv and drivers.csv later). Each line is `<kind>, <path>`:
//   dev  a device node            -> handed out as a device node, when the host has it
//   lib  a library                -> bind-mounted read-only at the same path
//   sym  a symlink (libcuda.so.1) -> what it resolves to, bind-mounted at the link's own path
//   dir  a directory              -> bind-mounted read-only at the same path
// Only what exists on the host is handed out, and nothing the lists do not name. A library in a
// directory the container's loader does not search by default (L4T's tegra/) is also mounted
// under its name in /usr/lib/aarch64-linux-gnu (the node's triplet), which it does, so libcuda.so.1 is found without
// the ldconfig hook NVIDIA's runtime runs and without an LD_LIBRARY_PATH edit that would replace
// the image's own.
#ifndef EDGEACCEL_DISCOVERY_TEGRA_HOST_FILES_H_
#define EDGEACCEL_DISCOVERY_TEGRA_HOST_FILES_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "edgeaccel/discovery/device.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

inline constexpr absl::string_view kTegraHostFilesDir =
    "/etc/nvidia-container-runtime/host-files-for-container.d";

struct HostFileEntry {
  enum class Kind { kDev, kLib, kSym, kDir };
  Kind kind = Kind::kDev;
  // Absolute, without "." or ".." steps; may hold "*" and "?" in its last step (devices.csv
  // names /dev/dri/renderD*).
  std::string path;

  bool operator==(const HostFileEntry& other) const {
    return kind == other.kind && path == other.path;
  }
};

// The entries of one list, `name` its file name for messages. Spaces around the comma are
// allowed, the path may hold commas, empty lines and "#" comments are skipped; a `dev` path
// without a leading "/" is under /dev (L4T R32's lists write "dev, nvhost-gpu"). Each line that
// is none of that adds "<name>:<line>: <why>" to `problems` and is skipped.
std::vector<HostFileEntry> ParseTegraHostFiles(absl::string_view name, absl::string_view text,
                                               std::vector<std::string>* problems);

// What the lists give a container, of what is on the host.
struct TegraHostFiles {
  bool listed = false;  // a list was found: the device nodes come from the lists
  // `dev` entries that are character devices on the host, globs expanded: host paths under
  // /dev/, in list order, each once. The discoverer still judges each (display nodes, nodes of
  // a discrete GPU).
  std::vector<std::string> device_paths;
  std::vector<Mount> mounts;
};

class TegraHostFilesReader {
 public:
  explicit TegraHostFilesReader(const Host* host) : host_(host) {}

  // Reads the lists now. Never fails: an unreadable list or a bad line is one log line, and the
  // rest is used; without any list, `listed` is false (said once). A list is parsed again only
  // when its file is not the one parsed last (by stat(2): filesystem, inode, size, modification
  // time).
  TegraHostFiles Read();
  // The same, with every read of the host recorded in `inputs` (the discoverer's scan's).
  TegraHostFiles Read(ScanInputs* inputs);

 private:
  struct ParsedList {
    FileInfo file;  // what it was parsed from
    std::vector<HostFileEntry> entries;
  };

  const Host* host_;
  OnceLogger log_;
  std::map<std::string, ParsedList> parsed_;  // by host path
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_TEGRA_HOST_FILES_H_
