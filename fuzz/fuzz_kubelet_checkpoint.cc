// The kubelet checkpoint reader (ParseKubeletCheckpoint) against fuzzed files: the kubelet
// writes the file and our gRPC and registrar threads read it, so it must never throw (an
// exception there ends the process) and what it returns must be sane: every entry found again
// by FindEntry with its own resource and ids, nothing invented beyond what the input could hold.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/kubelet/kubelet_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<edgeaccel::KubeletCheckpoint> checkpoint;
  try {
    checkpoint = edgeaccel::ParseKubeletCheckpoint(json);
  } catch (...) {
    __builtin_trap();
  }
  if (!checkpoint.ok()) {
    if (checkpoint.status().message().empty()) __builtin_trap();  // an error says why
    return 0;
  }
  // Every entry and every registered resource takes some bytes of the input.
  if (checkpoint->unreadable_entries < 0) __builtin_trap();
  if (checkpoint->entries.size() + static_cast<size_t>(checkpoint->unreadable_entries) > size) {
    __builtin_trap();
  }
  if (checkpoint->registered_devices.size() > size) __builtin_trap();
  size_t ids = 0;
  for (const auto& [resource, devices] : checkpoint->registered_devices) ids += devices.size();
  for (const edgeaccel::KubeletCheckpoint::Entry& entry : checkpoint->entries) {
    ids += entry.device_ids.size();
    const edgeaccel::KubeletCheckpoint::Entry* found =
        checkpoint->FindEntry(entry.resource_name, entry.device_ids);
    if (found == nullptr || found->resource_name != entry.resource_name) __builtin_trap();
  }
  if (ids > size) __builtin_trap();
  return 0;
}
