// The kernel uevent parser against fuzzed messages: never crashes, and whatever it accepts has
// an action and a subsystem and came with an "ACTION@DEVPATH" header.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/host/uevent_socket.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string message(reinterpret_cast<const char*>(data), size);
  std::optional<edgeaccel::Uevent> event = edgeaccel::ParseUevent(message);
  if (event.has_value()) {
    if (event->action.empty() || event->subsystem.empty() || event->devpath.empty()) __builtin_trap();
    if (message.find('@') == std::string::npos) __builtin_trap();
  }
  return 0;
}
