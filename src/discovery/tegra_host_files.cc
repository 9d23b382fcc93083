#include "edgeaccel/discovery/tegra_host_files.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/discovery/driver_libraries.h"

namespace edgeaccel {
namespace {

// Where a Jetson container's loader looks by default (L4T's images are Ubuntu's): glibc's system
// search path there is /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib, the triplet the
// node's (aarch64-linux-gnu on every Jetson; this build's, NativeMultiarchTriplet).
bool IsLoaderDir(absl::string_view dir) {
  return dir == MultiarchLibraryDir() || dir == absl::StrCat("/lib/", NativeMultiarchTriplet()) ||
         dir == "/lib" || dir == "/usr/lib";
}

// Lists are a few dozen lines; anything much bigger is not one.
constexpr size_t kMaxListBytes = 1 << 20;
// How many missing entries one log line names.
constexpr size_t kMissingNamed = 8;

std::string Shown(absl::string_view text) {
  constexpr size_t kMax = 120;
  std::string out = absl::CHexEscape(text.substr(0, kMax));
  if (text.size() > kMax) absl::StrAppend(&out, "...");
  return out;
}

bool HasWildcard(absl::string_view step) {
  return step.find_first_of("*?[") != absl::string_view::npos;
}

absl::string_view KindName(HostFileEntry::Kind kind) {
  switch (kind) {
    case HostFileEntry::Kind::kDev:
      return "dev";
    case HostFileEntry::Kind::kLib:
      return "lib";
    case HostFileEntry::Kind::kSym:
      return "sym";
    case HostFileEntry::Kind::kDir:
      return "dir";
  }
  return "?";
}

}  // namespace

std::vector<HostFileEntry> ParseTegraHostFiles(absl::string_view name, absl::string_view text,
                                               std::vector<std::string>* problems) {
  std::vector<HostFileEntry> entries;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    auto problem = [&](absl::string_view why) {
      problems->push_back(absl::StrCat(name, ":", number, ": ", why, " (\"", Shown(line), "\")"));
    };
    const size_t comma = line.find(',');
    if (comma == absl::string_view::npos) {
      problem("not <kind>, <path>");
      continue;
    }
    const std::string kind = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, comma)));
    absl::string_view path = absl::StripAsciiWhitespace(line.substr(comma + 1));
    HostFileEntry entry;
    if (kind == "dev") {
      entry.kind = HostFileEntry::Kind::kDev;
    } else if (kind == "lib") {
      entry.kind = HostFileEntry::Kind::kLib;
    } else if (kind == "sym") {
      entry.kind = HostFileEntry::Kind::kSym;
    } else if (kind == "dir") {
      entry.kind = HostFileEntry::Kind::kDir;
    } else {
      problem("the kind is none of dev, lib, sym, dir");
      continue;
    }
    if (path.empty()) {
      problem("no path");
      continue;
    }
    std::string absolute(path);
    if (!absl::StartsWith(path, "/")) {
      if (entry.kind != HostFileEntry::Kind::kDev) {
        problem("not an absolute path");
        continue;
      }
      absolute = absl::StrCat("/dev/", path);
    }
    std::vector<absl::string_view> steps;
    bool refused = false;
    for (absl::string_view step : absl::StrSplit(absolute, '/', absl::SkipEmpty())) {
      if (step == ".") continue;
      if (step == "..") {
        problem("a path with \"..\" in it");
        refused = true;
        break;
      }
      steps.push_back(step);
    }
    if (refused) continue;
    if (steps.empty()) {
      problem("the root directory");
      continue;
    }
    for (size_t i = 0; i + 1 < steps.size(); ++i) {
      if (HasWildcard(steps[i])) {
        problem("a wildcard before the last step of the path");
        refused = true;
        break;
      }
    }
    if (refused) continue;
    entry.path = absl::StrCat("/", absl::StrJoin(steps, "/"));
    entries.push_back(std::move(entry));
  }
  return entries;
}

TegraHostFiles TegraHostFilesReader::Read() {
  ScanInputs inputs(host_);
  return Read(&inputs);
}

TegraHostFiles TegraHostFilesReader::Read(ScanInputs* inputs) {
  TegraHostFiles files;
  constexpr absl::string_view without_lists =
      "the integrated GPU is served with the device nodes this daemon knows and without the "
      "driver's libraries, so CUDA in a container needs NVIDIA's runtime";
  absl::StatusOr<std::vector<std::string>> names = inputs->ListDirectory(kTegraHostFilesDir);
  if (!names.ok()) {
    log_.Warn(absl::StrCat(
        absl::IsNotFound(names.status())
            ? absl::StrCat("no container file lists (", kTegraHostFilesDir,
                           "/*.csv: older L4T, or a trimmed image)")
            : absl::StrCat("cannot read the container file lists (", names.status().message(), ")"),
        ": ", without_lists));
    return files;
  }
  std::vector<HostFileEntry> entries;
  std::map<std::string, ParsedList> parsed;  // the lists there are now
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".csv")) continue;
    const std::string path = absl::StrCat(kTegraHostFilesDir, "/", name);
    // Looked at before it is read: a list replaced in between is parsed again at the next scan.
    absl::StatusOr<FileInfo> file = inputs->Stat(path);
    auto known = parsed_.find(path);
    if (file.ok() && known != parsed_.end() && known->second.file == *file) {
      files.listed = true;
      entries.insert(entries.end(), known->second.entries.begin(), known->second.entries.end());
      parsed.insert(parsed_.extract(known));
      continue;
    }
    absl::StatusOr<std::string> text =
        inputs->ReadFile(path, kMaxListBytes, ScanInputs::Reread::kUntilRead);
    if (!text.ok()) {
      // The message names the list ("cannot open <path>: ...").
      log_.Warn(absl::StrCat(text.status().message(), "; what it lists is not handed out"));
      continue;
    }
    files.listed = true;
    std::vector<std::string> problems;
    std::vector<HostFileEntry> listed = ParseTegraHostFiles(path, *text, &problems);
    for (const std::string& problem : problems) {
      log_.Warn(absl::StrCat(problem, ": line skipped, the rest of the list is used"));
    }
    entries.insert(entries.end(), listed.begin(), listed.end());
    if (file.ok()) parsed[path] = ParsedList{*file, std::move(listed)};
  }
  parsed_ = std::move(parsed);
  if (!files.listed) {
    log_.Warn(absl::StrCat("no container file lists in ", kTegraHostFilesDir, ": ", without_lists));
    return files;
  }

  std::vector<std::string> missing;
  absl::flat_hash_set<std::string> seen_nodes, seen_mounts, late_paths;
  std::vector<Mount> late_mounts;
  for (const HostFileEntry& entry : entries) {
    // A wildcard in the last step stands for every entry of the directory it matches.
    std::vector<std::string> paths;
    const size_t slash = entry.path.rfind('/');
    const std::string directory = slash == 0 ? "/" : entry.path.substr(0, slash);
    const std::string last = entry.path.substr(slash + 1);
    if (HasWildcard(last)) {
      absl::StatusOr<std::vector<std::string>> children = inputs->ListDirectory(directory);
      if (children.ok()) {
        for (const std::string& child : *children) {
          if (fnmatch(last.c_str(), child.c_str(), FNM_PERIOD) == 0) {
            paths.push_back(absl::StrCat(directory == "/" ? "" : directory, "/", child));
          }
        }
      }
      if (paths.empty()) missing.push_back(entry.path);
    } else {
      paths.push_back(entry.path);
    }
    for (const std::string& path : paths) {
      const std::string line = absl::StrCat(KindName(entry.kind), ", ", path);
      if (entry.kind == HostFileEntry::Kind::kDev) {
        if (!absl::StartsWith(path, "/dev/")) {
          log_.Warn(absl::StrCat("not handing out \"", Shown(line), "\" of the container file lists: "
                                 "a device node outside /dev"));
          continue;
        }
        absl::StatusOr<FileInfo> info = inputs->Lstat(path);  // a symlink is never a device node
        if (!info.ok()) {
          missing.push_back(path);
        } else if (info->type != FileInfo::Type::kCharDevice) {
          log_.Warn(absl::StrCat("not handing out \"", Shown(line), "\" of the container file lists: "
                                 "it is ", FileTypeName(info->type), ", not a character device"));
        } else if (seen_nodes.insert(path).second) {
          files.device_paths.push_back(path);
        }
        continue;
      }
      absl::StatusOr<FileInfo> info = inputs->Stat(path);  // lib and sym: what the path resolves to
      if (!info.ok()) {
        missing.push_back(path);
        continue;
      }
      const bool want_directory = entry.kind == HostFileEntry::Kind::kDir;
      const FileInfo::Type want = want_directory ? FileInfo::Type::kDirectory : FileInfo::Type::kRegular;
      if (info->type != want) {
        log_.Warn(absl::StrCat("not mounting \"", Shown(line), "\" of the container file lists: it is ",
                               FileTypeName(info->type), ", not ", FileTypeName(want)));
        continue;
      }
      if (!seen_mounts.insert(path).second) continue;
      const std::string host_path = inputs->ResolveHostPath(path);
      files.mounts.push_back({host_path, path});
      const std::string file = path.substr(path.rfind('/') + 1);
      const std::string library_dir = path.substr(0, std::max<size_t>(1, path.rfind('/')));
      // A library outside the loader's own directories (L4T's tegra/, tegra-egl/) is found by
      // its name in /usr/lib/<triplet> as well, where the container's loader looks by
      // default: NVIDIA's runtime runs ldconfig in the container instead, and an
      // LD_LIBRARY_PATH edit would replace the image's own.
      if (!want_directory && absl::StrContains(file, ".so") && !IsLoaderDir(library_dir)) {
        const std::string in_loader_dir = absl::StrCat(MultiarchLibraryDir(), "/", file);
        if (late_paths.insert(in_loader_dir).second) late_mounts.push_back({host_path, in_loader_dir});
      }
    }
  }
  // After every listed path: a file the lists name in the loader's directory itself wins.
  for (Mount& mount : late_mounts) {
    if (seen_mounts.contains(mount.container_path)) continue;
    files.mounts.push_back(std::move(mount));
  }
  if (!missing.empty()) {
    std::vector<std::string> named(missing.begin(),
                                   missing.begin() + std::min(missing.size(), kMissingNamed));
    log_.Warn(absl::StrCat(missing.size(), " entries of the container file lists are not on this "
                           "host and are left out (lists name more than one board has): ",
                           absl::StrJoin(named, ", "), missing.size() > kMissingNamed ? ", ..." : ""));
  }
  return files;
}

}  // namespace edgeaccel
