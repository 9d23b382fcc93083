#include "edgeaccel/host/json_fields.h"

namespace edgeaccel {

const nlohmann::json* JsonMember(const nlohmann::json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

std::optional<std::string> JsonString(const nlohmann::json& object, absl::string_view key) {
  const nlohmann::json* member = JsonMember(object, key);
  if (member == nullptr || !member->is_string()) return std::nullopt;
  return member->get<std::string>();
}

std::optional<int64_t> JsonInt(const nlohmann::json& object, absl::string_view key) {
  const nlohmann::json* member = JsonMember(object, key);
  // is_number_integer includes unsigned values; one above INT64_MAX is not an int64.
  if (member == nullptr || !member->is_number_integer()) return std::nullopt;
  if (member->is_number_unsigned() && member->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return std::nullopt;
  }
  return member->get<int64_t>();
}

std::optional<bool> JsonBool(const nlohmann::json& object, absl::string_view key) {
  const nlohmann::json* member = JsonMember(object, key);
  if (member == nullptr || !member->is_boolean()) return std::nullopt;
  return member->get<bool>();
}

std::optional<std::vector<std::string>> JsonStringList(const nlohmann::json& object,
                                                       absl::string_view key) {
  const nlohmann::json* member = JsonMember(object, key);
  if (member == nullptr || !member->is_array()) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(member->size());
  for (const nlohmann::json& item : *member) {
    if (!item.is_string()) return std::nullopt;
    out.push_back(item.get<std::string>());
  }
  return out;
}

}  // namespace edgeaccel
