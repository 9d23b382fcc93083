#include "edgeaccel/kubelet/kubelet_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/host/json_fields.h"

namespace edgeaccel {
namespace {

constexpr size_t kMaxCheckpointBytes = 16 << 20;

std::vector<std::string> Strings(const nlohmann::json& list) {
  std::vector<std::string> out;
  if (!list.is_array()) return out;
  for (const nlohmann::json& item : list) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

// The field's string ("" when it is missing), or nullopt when it is of another type.
std::optional<std::string> StringField(const nlohmann::json& object, const char* key) {
  if (JsonMember(object, key) == nullptr) return std::string();
  return JsonString(object, key);
}

std::vector<std::string> Sorted(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

const KubeletCheckpoint::Entry* KubeletCheckpoint::FindEntry(
    absl::string_view resource, const std::vector<std::string>& ids) const {
  const std::vector<std::string> wanted = Sorted(ids);
  for (const Entry& entry : entries) {
    if (entry.resource_name == resource && Sorted(entry.device_ids) == wanted) return &entry;
  }
  return nullptr;
}

absl::StatusOr<KubeletCheckpoint> ParseKubeletCheckpoint(absl::string_view json) {
  nlohmann::json root = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                              /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError("the kubelet checkpoint is not a JSON object");
  }
  const nlohmann::json* data = JsonMember(root, "Data");
  if (data == nullptr || !data->is_object()) {
    return absl::InvalidArgumentError("the kubelet checkpoint has no \"Data\" object");
  }
  KubeletCheckpoint checkpoint;
  if (const nlohmann::json* registered = JsonMember(*data, "RegisteredDevices");
      registered != nullptr && registered->is_object()) {
    for (const auto& [resource, ids] : registered->items()) {
      checkpoint.registered_devices[resource] = Strings(ids);
    }
  }
  if (const nlohmann::json* entries = JsonMember(*data, "PodDeviceEntries");
      entries != nullptr && entries->is_array()) {
    for (const nlohmann::json& item : *entries) {
      if (!item.is_object()) {
        ++checkpoint.unreadable_entries;
        continue;
      }
      KubeletCheckpoint::Entry entry;
      const std::optional<std::string> pod_uid = StringField(item, "PodUID");
      const std::optional<std::string> container = StringField(item, "ContainerName");
      const std::optional<std::string> resource = StringField(item, "ResourceName");
      const std::optional<std::string> response = StringField(item, "AllocResp");
      if (!pod_uid || !container || !resource || !response) {
        ++checkpoint.unreadable_entries;  // a shape we do not know: say nothing from it
        continue;
      }
      entry.pod_uid = *pod_uid;
      entry.container_name = *container;
      entry.resource_name = *resource;
      if (const nlohmann::json* ids = JsonMember(item, "DeviceIDs"); ids != nullptr) {
        if (ids->is_array()) {
          entry.device_ids = Strings(*ids);
        } else if (ids->is_object()) {
          for (const auto& [numa, per_node] : ids->items()) {
            for (std::string& id : Strings(per_node)) entry.device_ids.push_back(std::move(id));
          }
        }
      }
      // Go writes []byte as base64: the marshalled ContainerAllocateResponse.
      std::string bytes;
      if (!absl::Base64Unescape(*response, &bytes) ||
          !entry.allocate_response.ParseFromString(bytes)) {
        ++checkpoint.unreadable_entries;  // an entry we cannot read says nothing we can check
        continue;
      }
      checkpoint.entries.push_back(std::move(entry));
    }
  }
  return checkpoint;
}

absl::StatusOr<KubeletCheckpoint> ReadKubeletCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<size_t>(size) > kMaxCheckpointBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a file of at most 16 MiB"));
  }
  std::string content(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(content.data(), size);
  content.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<KubeletCheckpoint> checkpoint = ParseKubeletCheckpoint(content);
  if (!checkpoint.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", checkpoint.status().message()));
  }
  return checkpoint;
}

}  // namespace edgeaccel
