#ifndef EDGEACCEL_NODE_JSON_FIELDS_H_
#define EDGEACCEL_NODE_JSON_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"

namespace edgeaccel {

// Reading JSON another program wrote (the API server's answers, a checkpoint on disk) without
// ever throwing: nlohmann's value() and get<>() throw type_error on a field of another type, and
// a const operator[] on a missing key is undefined behaviour. Out of the publisher's thread or the
// daemon's start, either would abort the daemon. These answer "absent" instead.

// The member `key` of `object`; null when `object` is not an object or has no such member.
const nlohmann::json* JsonMember(const nlohmann::json& object, absl::string_view key);

// The string at `key`; nullopt when it is missing or not a string.
std::optional<std::string> JsonString(const nlohmann::json& object, absl::string_view key);

// The integer at `key`; nullopt when it is missing or not an integer.
std::optional<int64_t> JsonInt(const nlohmann::json& object, absl::string_view key);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_JSON_FIELDS_H_
