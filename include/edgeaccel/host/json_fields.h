// Reading JSON another program wrote (the API server's answers, the kubelet's checkpoint, our own
// files on disk, which anyone may have edited) without ever throwing: nlohmann's value() and
// get<>() throw type_error on a field of another type, and a const operator[] on a missing key
// is undefined behaviour. Out of a worker thread or the daemon's start, either would abort the
// daemon. These answer "absent" instead; every read of such JSON goes through them.
//
// The one JSON module below kubelet/ and node/: both read JSON from other programs.
#ifndef EDGEACCEL_HOST_JSON_FIELDS_H_
#define EDGEACCEL_HOST_JSON_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/string_view.h"

namespace edgeaccel {

// The member `key` of `object`; null when `object` is not an object or has no such member.
const nlohmann::json* JsonMember(const nlohmann::json& object, absl::string_view key);

// The string at `key`; nullopt when it is missing or not a string.
std::optional<std::string> JsonString(const nlohmann::json& object, absl::string_view key);

// The integer at `key`; nullopt when it is missing or not an integer.
std::optional<int64_t> JsonInt(const nlohmann::json& object, absl::string_view key);

// The boolean at `key`; nullopt when it is missing or not a boolean.
std::optional<bool> JsonBool(const nlohmann::json& object, absl::string_view key);

// The list of strings at `key`; nullopt when it is missing, not a list, or has an item that is
// not a string.
std::optional<std::vector<std::string>> JsonStringList(const nlohmann::json& object,
                                                       absl::string_view key);

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_JSON_FIELDS_H_
