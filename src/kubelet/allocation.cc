#include "edgeaccel/kubelet/allocation.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace edgeaccel {
namespace {

// An id as it may appear in an error message: escaped and bounded, since it came from outside.
std::string Quoted(absl::string_view id) {
  constexpr size_t kMax = 64;
  std::string out = absl::StrCat("\"", absl::CHexEscape(id.substr(0, kMax)), "\"");
  if (id.size() > kMax) absl::StrAppend(&out, "... (", id.size(), " bytes)");
  return out;
}

}  // namespace

absl::Status BuildContainerAllocation(const Snapshot& snapshot, const std::string& resource,
                                      const v1beta1::ContainerAllocateRequest& request,
                                      const CdiNamer& cdi_device_name,
                                      v1beta1::ContainerAllocateResponse* response,
                                      std::string* cdi_fallback) {
  if (request.devices_ids_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Allocate request for ", resource, " names no device"));
  }
  absl::flat_hash_set<absl::string_view> seen_ids;
  absl::flat_hash_set<absl::string_view> seen_paths;
  absl::flat_hash_set<absl::string_view> seen_mounts;  // by container path
  absl::flat_hash_set<std::string> seen_cdi;
  std::vector<std::string> cdi_names;
  absl::Status cdi_status;  // the first reason a device could not be named
  std::map<std::string, std::vector<std::string>> env_values;
  for (const std::string& id : request.devices_ids()) {
    if (!seen_ids.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("device id ", Quoted(id),
                                                     " is named twice in one request"));
    }
    const Device* device = snapshot.Find(id);
    if (device == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown device id ", Quoted(id), " for ", resource, " (",
                       snapshot.devices.size(), " devices known)"));
    }
    if (device->health != Health::kHealthy) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", Quoted(id), " of ", resource, " is Unhealthy: ", device->unhealthy_reason));
    }
    // Paths come only from what discovery found on the host.
    for (const DeviceNode& node : device->nodes) {
      if (!seen_paths.insert(node.host_path).second) continue;
      v1beta1::DeviceSpec* spec = response->add_devices();
      spec->set_host_path(node.host_path);
      spec->set_container_path(node.container_path);
      spec->set_permissions(node.permissions);
    }
    // The driver's libraries: the kubelet hands them to any runtime, CDI or not.
    for (const Mount& mount : device->mounts) {
      if (!seen_mounts.insert(mount.container_path).second) continue;
      v1beta1::Mount* out = response->add_mounts();
      out->set_container_path(mount.container_path);
      out->set_host_path(mount.host_path);
      out->set_read_only(true);
    }
    for (const auto& [key, value] : device->envs) {
      std::vector<std::string>& values = env_values[key];
      if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
    }
    if (cdi_device_name && cdi_status.ok()) {
      absl::StatusOr<std::string> name = cdi_device_name(PhysicalId(*device));
      if (!name.ok()) {
        cdi_status = name.status();
      } else if (seen_cdi.insert(*name).second) {
        cdi_names.push_back(*std::move(name));
      }
    }
  }
  for (const auto& [key, values] : env_values) {
    // A device list (NVIDIA_VISIBLE_DEVICES) joins with ",".
    (*response->mutable_envs())[key] = absl::StrJoin(values, ",");
  }
  if (cdi_status.ok()) {
    for (std::string& name : cdi_names) response->add_cdi_devices()->set_name(std::move(name));
  } else if (cdi_fallback != nullptr) {
    *cdi_fallback = std::string(cdi_status.message());
  }
  return absl::OkStatus();
}

std::vector<std::string> PreferredDevices(
    const Snapshot& snapshot, const v1beta1::ContainerPreferredAllocationRequest& request) {
  std::vector<std::string> chosen;
  absl::flat_hash_set<std::string> taken;
  std::vector<int> must_numa;
  for (const std::string& id : request.must_include_deviceids()) {
    if (!taken.insert(id).second) continue;
    chosen.push_back(id);
    const Device* device = snapshot.Find(id);
    if (device != nullptr && device->numa_node.has_value()) must_numa.push_back(*device->numa_node);
  }
  const int size = request.allocation_size();
  if (size <= static_cast<int>(chosen.size())) {
    std::sort(chosen.begin(), chosen.end());
    return chosen;
  }
  size_t need = static_cast<size_t>(size) - chosen.size();

  // Healthy candidates grouped by NUMA node (-1: unknown), sorted by id within a group, each with
  // its physical device (itself, or what it is a replica of).
  struct Candidate {
    std::string id;
    std::string physical;
  };
  std::map<int, std::vector<Candidate>> by_numa;
  absl::flat_hash_map<std::string, int> free_replicas;  // per physical device
  for (const std::string& id : request.available_deviceids()) {
    if (taken.contains(id)) continue;
    const Device* device = snapshot.Find(id);
    if (device == nullptr || device->health != Health::kHealthy) continue;
    by_numa[device->numa_node.value_or(-1)].push_back({id, PhysicalId(*device)});
    free_replicas[PhysicalId(*device)]++;
    taken.insert(id);
  }
  for (auto& [numa, candidates] : by_numa) {
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  }

  // Order NUMA nodes: those of the must-include devices first; then nodes that can satisfy the
  // rest alone, smallest first (best fit leaves big groups for big requests); then the others,
  // biggest first. Ties by node number: deterministic.
  std::vector<int> order;
  for (const auto& [numa, candidates] : by_numa) order.push_back(numa);
  auto rank = [&](int numa) {
    const bool is_must = std::find(must_numa.begin(), must_numa.end(), numa) != must_numa.end();
    const size_t count = by_numa[numa].size();
    if (is_must) return std::make_tuple(0, 0L, numa);
    if (count >= need) return std::make_tuple(1, static_cast<long>(count), numa);
    return std::make_tuple(2, -static_cast<long>(count), numa);
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return rank(a) < rank(b); });

  // Within a node, spread over physical devices: least used in this answer first, then the one
  // with most replicas free (least loaded by other pods), then by id.
  absl::flat_hash_map<std::string, int> used;
  for (const std::string& id : chosen) {
    const Device* device = snapshot.Find(id);
    used[device == nullptr ? id : PhysicalId(*device)]++;
  }
  for (int numa : order) {
    std::vector<Candidate>& candidates = by_numa[numa];
    while (need > 0 && !candidates.empty()) {
      auto key = [&](const Candidate& c) {
        return std::make_tuple(used[c.physical], -free_replicas[c.physical],
                               std::cref(c.physical), std::cref(c.id));
      };
      auto best = candidates.begin();
      for (auto it = candidates.begin() + 1; it != candidates.end(); ++it) {
        if (key(*it) < key(*best)) best = it;
      }
      used[best->physical]++;
      chosen.push_back(std::move(best->id));
      candidates.erase(best);
      --need;
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace edgeaccel
