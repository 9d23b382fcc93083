// The CDI spec writer: whatever ids, paths and envs discovery hands it, the output is valid JSON
// that says the same thing (checked with nlohmann::json, used only here).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "edgeaccel/node/cdi_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  edgeaccel::Snapshot snapshot;
  const int count = input.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < count; ++i) {
    edgeaccel::Device device;
    device.id = input.ConsumeRandomLengthString(64);
    if (input.ConsumeBool()) device.replica_of = input.ConsumeRandomLengthString(64);
    const std::string path = input.ConsumeRandomLengthString(64);
    device.nodes.push_back({path, path, "rw"});
    if (input.ConsumeBool()) {
      device.nodes.back().host_mode = edgeaccel::HostNodeMode{
          input.ConsumeIntegral<mode_t>(), input.ConsumeIntegral<uid_t>(), input.ConsumeIntegral<gid_t>()};
    }
    device.envs[input.ConsumeRandomLengthString(16)] = input.ConsumeRandomLengthString(32);
    snapshot.devices.push_back(device);
  }
  const std::string resource = input.ConsumeRandomLengthString(32);
  const std::string json = edgeaccel::CdiSpecJson(resource, snapshot);
  // Invalid UTF-8 in the inputs passes through as bytes; strict JSON parsers reject that, so
  // only check inputs that are valid UTF-8 as a whole.
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    bool ascii = true;
    for (size_t i = 0; i < size; ++i) ascii &= data[i] < 0x80;
    if (ascii) __builtin_trap();  // our escaping is wrong
    return 0;
  }
  if (parsed["kind"] != edgeaccel::CdiKind(resource)) __builtin_trap();
  // Each node's fileMode is its permission bits alone (what Go's os.FileMode reads), with its
  // owner; none where the mode is unknown.
  if (parsed["devices"].size() == snapshot.devices.size()) {
    for (size_t i = 0; i < snapshot.devices.size(); ++i) {
      const edgeaccel::DeviceNode& node = snapshot.devices[i].nodes[0];
      const nlohmann::json& out = parsed["devices"][i]["containerEdits"]["deviceNodes"][0];
      if (!node.host_mode.has_value()) {
        if (out.contains("fileMode") || out.contains("uid") || out.contains("gid")) __builtin_trap();
        continue;
      }
      if (out["fileMode"] != (node.host_mode->permissions & 0777) ||
          out["uid"] != node.host_mode->uid || out["gid"] != node.host_mode->gid) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
