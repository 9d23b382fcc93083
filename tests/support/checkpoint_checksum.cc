#include "checkpoint_checksum.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace edgeaccel::testing {
namespace {

// A []string element or value: "[a b]", "[]" for an empty slice, "<nil>" for a nil one (JSON
// null). Elements carry no type.
std::string StringSlice(const nlohmann::json& list) {
  if (list.is_null()) return "<nil>";
  std::vector<std::string> items;
  for (const auto& item : list) items.push_back(item.get<std::string>());
  return absl::StrCat("[", absl::StrJoin(items, " "), "]");
}

// map[string][]string with its keys sorted bytewise.
std::string StringSliceMap(const nlohmann::json& map) {
  if (map.is_null()) return "<nil>";
  std::vector<std::string> keys;
  for (const auto& [key, value] : map.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> pairs;
  for (const std::string& key : keys) pairs.push_back(absl::StrCat(key, ":", StringSlice(map[key])));
  return absl::StrCat("map[", absl::StrJoin(pairs, " "), "]");
}

// DevicesPerNUMA, map[int64][]string: JSON's decimal-string keys sorted numerically.
std::string DevicesPerNuma(const nlohmann::json& map) {
  if (map.is_null()) return "<nil>";
  std::vector<std::pair<long long, std::string>> keys;
  for (const auto& [key, value] : map.items()) keys.emplace_back(std::atoll(key.c_str()), key);
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> pairs;
  for (const auto& [number, key] : keys) {
    pairs.push_back(absl::StrCat(number, ":", StringSlice(map[key])));
  }
  return absl::StrCat("map[", absl::StrJoin(pairs, " "), "]");
}

// AllocResp, []byte: JSON carries base64; spew prints the decimal bytes.
std::string Bytes(const nlohmann::json& encoded) {
  if (encoded.is_null()) return "<nil>";
  std::string raw;
  absl::Base64Unescape(encoded.get<std::string>(), &raw);
  std::vector<std::string> bytes;
  for (unsigned char c : raw) bytes.push_back(std::to_string(c));
  return absl::StrCat("[", absl::StrJoin(bytes, " "), "]");
}

std::string Entry(const nlohmann::json& entry) {
  return absl::StrCat(
      "{PodUID:(string)", entry.value("PodUID", ""),
      " ContainerName:(string)", entry.value("ContainerName", ""),
      " ResourceName:(string)", entry.value("ResourceName", ""),
      " DeviceIDs:(checkpoint.DevicesPerNUMA)", DevicesPerNuma(entry["DeviceIDs"]),
      " AllocResp:([]uint8)", Bytes(entry["AllocResp"]), "}");
}

}  // namespace

std::string SpewCheckpointData(const nlohmann::json& data) {
  std::string entries = "<nil>";
  const nlohmann::json& list = data["PodDeviceEntries"];
  if (!list.is_null()) {
    std::vector<std::string> items;
    for (const auto& entry : list) items.push_back(Entry(entry));
    entries = absl::StrCat("[", absl::StrJoin(items, " "), "]");
  }
  return absl::StrCat("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)",
                      entries, " RegisteredDevices:(map[string][]string)",
                      StringSliceMap(data["RegisteredDevices"]), "}");
}

uint32_t CheckpointChecksum(const nlohmann::json& data) {
  uint32_t hash = 2166136261u;  // FNV-1a 32, as hash/fnv.New32a
  for (unsigned char c : SpewCheckpointData(data)) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

}  // namespace edgeaccel::testing
