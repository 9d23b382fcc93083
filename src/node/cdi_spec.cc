#include "edgeaccel/node/cdi_spec.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "edgeaccel/host/atomic_file.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

// JSON string literal. Our strings are paths, ids and env values; escape what JSON requires.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buffer[8];
          snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

std::string CdiKind(absl::string_view resource_name) {
  size_t slash = resource_name.find('/');
  absl::string_view cls = slash == absl::string_view::npos ? resource_name : resource_name.substr(slash + 1);
  return absl::StrCat("edgeaccel.io/", cls);
}

std::string CdiDeviceName(absl::string_view resource_name, absl::string_view physical_id) {
  return absl::StrCat(CdiKind(resource_name), "=", physical_id);
}

std::string CdiContainerEditsJson(const Device& device) {
  std::vector<std::string> nodes, envs;
  for (const DeviceNode& node : device.nodes) {
    std::string entry = absl::StrCat("{\"path\": ", Quote(node.container_path),
                                     ", \"hostPath\": ", Quote(node.host_path),
                                     ", \"permissions\": ", Quote(node.permissions));
    // The mode and owner the runtime gives the node it makes in the container. CDI spec
    // (cncf-tags/container-device-interface SPEC.md, "deviceNodes"): "fileMode" (int64,
    // OPTIONAL) file mode for the device; "uid"/"gid" (uint32, OPTIONAL) id of device
    // owner/group in the container namespace. specs-go/config.go: DeviceNode.FileMode is a
    // *os.FileMode, `json:"fileMode,omitempty"`, so a JSON number holding the permission bits
    // (0660 is 432; JSON has no octal), UID/GID *uint32. All three are in the first tagged
    // spec, v0.3.0, so the 0.5.0 we declare (for hostPath) has them. Without them containerd
    // 2.1.9 makes the node crw-rw-rw- where the host's is crw-rw---- (only CDI libraries from
    // v1.1.0 take fileMode from the host themselves), owned by the container's user
    // (pkg/cdi/container-edits.go: an unset uid/gid becomes the process's, if not 0). With
    // them the node is what the DeviceSpec path gives: the host's mode and owner.
    if (node.host_mode.has_value()) {
      absl::StrAppend(&entry, ", \"fileMode\": ", node.host_mode->permissions & 0777,
                      ", \"uid\": ", node.host_mode->uid, ", \"gid\": ", node.host_mode->gid);
    }
    nodes.push_back(entry + "}");
  }
  for (const auto& [key, value] : device.envs) envs.push_back(Quote(absl::StrCat(key, "=", value)));
  std::string edits = absl::StrCat("{\"deviceNodes\": [", absl::StrJoin(nodes, ", "), "], \"env\": [",
                                   absl::StrJoin(envs, ", "), "]");
  if (!device.mounts.empty()) {
    // CDI SPEC.md, "mounts": hostPath, containerPath, options (mount(8) options; "bind" makes
    // it a bind mount, which runc and crun also infer from a file source). No hooks: the
    // runtime applies these edits by itself.
    std::vector<std::string> options, mounts;
    for (absl::string_view option : kMountOptions) options.push_back(Quote(option));
    for (const Mount& mount : device.mounts) {
      mounts.push_back(absl::StrCat("{\"hostPath\": ", Quote(mount.host_path),
                                    ", \"containerPath\": ", Quote(mount.container_path),
                                    ", \"options\": [", absl::StrJoin(options, ", "), "]}"));
    }
    absl::StrAppend(&edits, ", \"mounts\": [", absl::StrJoin(mounts, ", "), "]");
  }
  return edits + "}";
}

std::string CdiSpecJson(absl::string_view resource_name, const Snapshot& snapshot) {
  std::vector<std::string> devices;
  absl::flat_hash_set<std::string> seen;
  for (const Device& device : snapshot.devices) {
    const std::string& id = PhysicalId(device);
    if (!seen.insert(id).second) continue;
    devices.push_back(absl::StrCat("    {\"name\": ", Quote(id), ", \"containerEdits\": ",
                                   CdiContainerEditsJson(device), "}"));
  }
  return absl::StrCat("{\n  \"cdiVersion\": \"0.5.0\",\n  \"kind\": ", Quote(CdiKind(resource_name)),
                      ",\n  \"devices\": [\n", absl::StrJoin(devices, ",\n"), "\n  ]\n}\n");
}

CdiSpecFile::CdiSpecFile(std::string directory, std::string resource_name)
    : directory_(std::move(directory)), resource_name_(std::move(resource_name)) {
  path_ = absl::StrCat(directory_, "/", absl::StrReplaceAll(CdiKind(resource_name_), {{"/", "-"}}),
                       ".json");
}

absl::Status CdiSpecFile::Write(const Snapshot& snapshot) {
  absl::MutexLock write_lock(&write_mu_);
  absl::flat_hash_set<std::string> ids;
  for (const Device& device : snapshot.devices) {
    if (!ids.insert(PhysicalId(device)).second) continue;
    for (const DeviceNode& node : device.nodes) {
      if (node.host_mode.has_value()) continue;
      unstatted_.Warn(absl::StrCat(
          "the CDI spec ", path_, " gives ", node.host_path, " no fileMode, uid or gid (",
          node.host_stat_error.empty() ? "not looked up" : node.host_stat_error,
          "): a runtime that makes the node from the spec gives it its own mode and owner"));
    }
  }
  if (ids.empty()) {
    // No spec at all rather than one with no devices, which containerd refuses.
    const bool removed = unlink(path_.c_str()) == 0;
    // Not there (nor its directory): nothing to remove.
    if (!removed && errno != ENOENT && errno != ENOTDIR) {
      return absl::InternalError(absl::StrCat("cannot remove ", path_, " (", resource_name_,
                                              " has no devices): ", strerror(errno)));
    }
    {
      absl::MutexLock lock(&mu_);
      written_.reset();
      incoming_.reset();
      removed_ = true;
    }
    LOG_IF(INFO, removed) << "removed the CDI spec " << path_ << ": " << resource_name_
                          << " has no devices";
    return absl::OkStatus();
  }
  mkdir(directory_.c_str(), 0755);
  // Allocate must not name a device of the new spec before it lands, nor one the new spec drops
  // after it does: NameOnDisk goes by which file is on disk, the one before or this one, and
  // knows this one's identity before the rename (the rename keeps the inode).
  absl::Status status = WriteFileAtomically(
      directory_, path_.substr(directory_.size() + 1), CdiSpecJson(resource_name_, snapshot), 0644,
      [&](const struct stat& st) {
        absl::MutexLock lock(&mu_);
        incoming_ = OnDisk{st.st_dev, st.st_ino, ids};
      });
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    incoming_.reset();
    return status;
  }
  written_ = std::move(incoming_);
  incoming_.reset();
  removed_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::string> CdiSpecFile::NameOnDisk(absl::string_view physical_id) const {
  absl::MutexLock lock(&mu_);
  if (!written_.has_value() && !incoming_.has_value()) {
    if (removed_) {
      return absl::UnavailableError(absl::StrCat("the CDI spec ", path_, " was removed: ",
                                                 resource_name_, " had no devices"));
    }
    return absl::UnavailableError(absl::StrCat("the CDI spec ", path_, " has not been written yet"));
  }
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("the CDI spec ", path_, " is gone (", strerror(errno),
                                               "); it is written again on the next retry or change"));
  }
  const OnDisk* on_disk = nullptr;
  for (const std::optional<OnDisk>* candidate : {&written_, &incoming_}) {
    if (candidate->has_value() && (*candidate)->device == st.st_dev &&
        (*candidate)->inode == st.st_ino) {
      on_disk = &**candidate;
    }
  }
  if (on_disk == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the CDI spec ", path_, " was replaced by another writer since we wrote it"));
  }
  if (!on_disk->ids.contains(physical_id)) {
    return absl::UnavailableError(
        absl::StrCat("the CDI spec ", path_, " does not hold ", physical_id, " yet"));
  }
  return CdiDeviceName(resource_name_, physical_id);
}

}  // namespace edgeaccel
