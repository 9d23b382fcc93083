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

std::string CdiSpecJson(absl::string_view resource_name, const Snapshot& snapshot) {
  std::vector<std::string> devices;
  absl::flat_hash_set<std::string> seen;
  for (const Device& device : snapshot.devices) {
    const std::string& id = PhysicalId(device);
    if (!seen.insert(id).second) continue;
    std::vector<std::string> nodes, envs;
    for (const DeviceNode& node : device.nodes) {
      nodes.push_back(absl::StrCat("{\"path\": ", Quote(node.container_path),
                                   ", \"hostPath\": ", Quote(node.host_path),
                                   ", \"permissions\": ", Quote(node.permissions), "}"));
    }
    for (const auto& [key, value] : device.envs) envs.push_back(Quote(absl::StrCat(key, "=", value)));
    devices.push_back(absl::StrCat("    {\"name\": ", Quote(id), ", \"containerEdits\": {\"deviceNodes\": [",
                                   absl::StrJoin(nodes, ", "), "], \"env\": [",
                                   absl::StrJoin(envs, ", "), "]}}"));
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
  mkdir(directory_.c_str(), 0755);
  absl::flat_hash_set<std::string> ids;
  for (const Device& device : snapshot.devices) ids.insert(PhysicalId(device));
  absl::MutexLock lock(&mu_);
  // Allocate must not name a device of the new spec before it lands, nor one the new spec drops
  // after it does: the old set stays until the rename has succeeded.
  absl::Status status = WriteFileAtomically(directory_, path_.substr(directory_.size() + 1),
                                            CdiSpecJson(resource_name_, snapshot));
  if (!status.ok()) return status;
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    written_ = false;
    return absl::InternalError(absl::StrCat("wrote ", path_, " but cannot stat it: ", strerror(errno)));
  }
  written_ = true;
  written_device_ = st.st_dev;
  written_inode_ = st.st_ino;
  written_ids_ = std::move(ids);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CdiSpecFile::NameOnDisk(absl::string_view physical_id) const {
  absl::MutexLock lock(&mu_);
  if (!written_) {
    return absl::UnavailableError(absl::StrCat("the CDI spec ", path_, " has not been written yet"));
  }
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("the CDI spec ", path_, " is gone (", strerror(errno),
                                               "); it is written again on the next retry or change"));
  }
  if (st.st_dev != written_device_ || st.st_ino != written_inode_) {
    return absl::UnavailableError(
        absl::StrCat("the CDI spec ", path_, " was replaced by another writer since we wrote it"));
  }
  if (!written_ids_.contains(physical_id)) {
    return absl::UnavailableError(
        absl::StrCat("the CDI spec ", path_, " does not hold ", physical_id, " yet"));
  }
  return CdiDeviceName(resource_name_, physical_id);
}

}  // namespace edgeaccel
