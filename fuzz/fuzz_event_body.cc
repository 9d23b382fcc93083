// The Event body builder (NodeEventObject): whatever bytes a reason, message, node name or event
// name holds (sysfs text, the environment), it never throws (an exception on the ea-events thread
// ends the process), its output is JSON that a strict parser takes (valid UTF-8 throughout), the
// message is at most 1024 bytes, and a message that was already valid and short is kept as it is.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/time/time.h"
#include "edgeaccel/node/node_events.h"

namespace {

// Whether `text` is valid UTF-8: nlohmann's strict dump() says so by not throwing.
bool ValidUtf8(const std::string& text) {
  try {
    nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  edgeaccel::NodeEvent event;
  event.warning = input.ConsumeBool();
  event.reason = input.ConsumeRandomLengthString(64);
  const std::string node = input.ConsumeRandomLengthString(64);
  const std::string name = input.ConsumeRandomLengthString(64);
  const int count = input.ConsumeIntegral<int>();
  // Mostly long messages: the cut at 1 KiB is where characters were split.
  const size_t pad = input.ConsumeIntegralInRange<size_t>(0, 1100);
  event.message = std::string(pad, 'x') + input.ConsumeRemainingBytesAsString();

  std::string object;
  try {
    object = edgeaccel::NodeEventObject(event, node, name, count, absl::FromUnixSeconds(0),
                                        absl::FromUnixSeconds(1));
  } catch (...) {
    __builtin_trap();  // would be std::terminate on the recorder's thread
  }
  const nlohmann::json parsed = nlohmann::json::parse(object, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) __builtin_trap();
  const auto message = parsed.find("message");
  if (message == parsed.end() || !message->is_string()) __builtin_trap();
  const std::string& kept = message->get_ref<const std::string&>();
  if (kept.size() > 1024) __builtin_trap();
  if (event.message.size() <= 1024 && ValidUtf8(event.message) && kept != event.message) {
    __builtin_trap();
  }
  const auto stored = parsed.find("count");
  if (stored == parsed.end() || *stored != count) __builtin_trap();
  return 0;
}
