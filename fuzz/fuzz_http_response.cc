// The API client's HTTP answer parser against fuzzed server bytes: never crashes, never reads
// past its input, and what it accepts is a real answer: a status in 100..599 and a body no
// larger than what was sent or the client's limit.
#include <cstddef>
#include <cstdint>
#include <string>

#include "edgeaccel/node/api_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<edgeaccel::HttpResponse> response = edgeaccel::ParseHttpResponse(raw);
  if (response.ok()) {
    if (response->status < 100 || response->status > 599) __builtin_trap();
    if (response->body.size() > raw.size()) __builtin_trap();
    if (response->body.size() > edgeaccel::kMaxApiResponseBytes) __builtin_trap();
    if (raw.compare(0, 7, "HTTP/1.") != 0) __builtin_trap();
  }
  return 0;
}
