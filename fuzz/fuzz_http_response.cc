// The API client's HTTP answer parser against fuzzed server bytes: never crashes, never reads
// past its input, and what it accepts is a real answer: a status in 100..599 and a body no
// larger than what was sent or the client's limit. The reader that the client feeds read by read
// gives, for the same bytes cut into two reads anywhere, what the whole gives.
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
  // A cut chosen by the input itself, so the fuzzer explores cuts too.
  const size_t cut = size == 0 ? 0 : (data[0] * 257u + data[size - 1]) % (size + 1);
  edgeaccel::HttpResponseReader reader;
  absl::StatusOr<bool> done = reader.Feed(absl::string_view(raw).substr(0, cut));
  if (done.ok() && !*done) done = reader.Feed(absl::string_view(raw).substr(cut));
  absl::Status pieces = done.status();
  if (done.ok() && !*done) pieces = reader.Finish();
  if (pieces.ok() != response.ok()) __builtin_trap();
  if (!pieces.ok() && pieces != response.status()) __builtin_trap();
  if (pieces.ok() && (reader.response().status != response->status ||
                      reader.response().content_type != response->content_type ||
                      reader.response().body != response->body)) {
    __builtin_trap();
  }
  return 0;
}
