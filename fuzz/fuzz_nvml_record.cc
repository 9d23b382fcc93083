// The records the NVML helper writes (DecodeNvmlRecord): the daemon reads them from another
// process, which may be killed mid-line or be something else entirely. Decoding never fails
// badly, and what decodes encodes back to a line that decodes to the same record.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/nvml/nvml_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  std::optional<edgeaccel::NvmlRecord> record = edgeaccel::DecodeNvmlRecord(line);
  if (!record.has_value()) return 0;
  if (record->kind.empty()) __builtin_trap();
  const std::string encoded = edgeaccel::EncodeNvmlRecord(*record);
  if (encoded.empty() || encoded.back() != '\n' || encoded.find('\n') != encoded.size() - 1) {
    __builtin_trap();  // one line, whatever the values hold
  }
  std::optional<edgeaccel::NvmlRecord> again =
      edgeaccel::DecodeNvmlRecord(encoded.substr(0, encoded.size() - 1));
  if (!again.has_value() || again->kind != record->kind || again->fields != record->fields) {
    __builtin_trap();
  }
  return 0;
}
