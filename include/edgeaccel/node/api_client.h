// ApiClient: one HTTPS request to the Kubernetes API server, over mbedTLS.
//
// Why our own and not an HTTP library: the daemon ships as one static binary, and Debian has no
// static archive of cpp-httplib (only its shared library). Why mbedTLS and not OpenSSL: linked
// statically, OpenSSL 3's libcrypto alone adds 3.3 MB to the binary (its providers reference
// every algorithm) and about 2 MB to the idle RSS; mbedTLS adds about 0.4 MB (docs/footprint.md).
// It speaks TLS 1.2, which every API server accepts unless told --tls-min-version=VersionTLS13.
// What the API server needs is small:
// HTTP/1.1 requests, a bearer token or a client certificate, the answer's status and body
// (Content-Length, chunked, or read to the end, parsed as it arrives).
//
// A connection whose answer left it open (HTTP/1.1 keep-alive: framed, no `Connection: close`) is
// kept for the next request, at most kMaxIdleConnections of them, each for at most
// kIdleConnectionTimeout, as Go's transport keeps them (client-go's, the reference DRA driver's):
// a burst of requests (a pod's claims read one after another) shakes hands once, not once each.
// A kept connection the server closed (its idle timeout, a proxy) is passed over; where one is
// found closed only once the request went out on it and nothing came back, a GET is asked again on
// a new connection (as net/http repeats only what is replayable) and anything else is an error
// its caller retries. Connections are kept only by a client on a PollLoop (WatchIdleConnections),
// whose loop closes a kept one the moment the server closes it and once its idle time is up: a
// client without one (the node labeler's, asking every few hours) opens a connection per request
// and never holds one the server has given up. Watches get a connection of their own, never kept.
// Each request resolves the name afresh, connects to its addresses in turn (each with its share
// of the deadline: one that never answers does not cost the others their turn), verifies the
// server's chain against the configured CA and its name (DNS name or IP address) against the
// certificate, and is bounded in time (`ApiServerConfig::timeout` covers connect, handshake and
// the whole exchange) and size.
// Every failure is an error that says which step failed and why (the name that did not resolve,
// the CA file that cannot be read, mbedTLS's verification reasons); nothing is thrown.
#ifndef EDGEACCEL_NODE_API_CLIENT_H_
#define EDGEACCEL_NODE_API_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/node/api_server_config.h"

namespace edgeaccel {

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

// The largest answer read; a Node object is a few KiB.
inline constexpr size_t kMaxApiResponseBytes = 8 << 20;

struct ApiConnection;
class PollLoop;
class WatchStream;

// Kept connections (see above): kube-apiserver closes an idle one after 90 s
// (k8s.io/apiserver/pkg/server/secure_serving.go: IdleTimeout), so ours are closed first. A DRA
// prepare reads its claims at once, each on its own connection (HTTP/1.1 has one request at a
// time): eight kept cover a pod's claims without a handshake (client-go keeps 25:
// k8s.io/client-go/transport/cache.go idleConnsPerHost), about 100 KiB of heap each (mbedTLS
// 2.28: its record buffers and contexts) while kept, freed within 60 s of the last request.
inline constexpr int kMaxIdleConnections = 8;
inline constexpr absl::Duration kIdleConnectionTimeout = absl::Seconds(60);

class ApiClient {
 public:
  explicit ApiClient(ApiServerConfig config);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // Ends every request in flight at once and fails every later one, with CANCELLED: whoever stops
  // a thread that talks to the API server calls this first, so the stop never waits for a server
  // that does not answer. (Only resolving a DNS name cannot be cut short; in a pod the server is
  // an address.) Safe from any thread; there is no way back.
  void Cancel() const;
  bool cancelled() const;

  // From now on connections are kept for the next request, and `loop` (which outlives this
  // client) closes each kept one the moment the server closes it, or once it has been idle
  // kIdleConnectionTimeout. Call once, before requests from other threads.
  void WatchIdleConnections(PollLoop* loop);
  // Connections kept for the next request now.
  int idle_connections() const;

  // METHOD path (e.g. "/api/v1/nodes/n") with an optional body of `content_type`. An answer
  // with any HTTP status is a response; an error is a failure to get one (unresolvable name,
  // refused connection, TLS verification, timeout, malformed or oversized answer).
  absl::StatusOr<HttpResponse> Request(absl::string_view method, absl::string_view path,
                                       absl::string_view content_type = "",
                                       absl::string_view body = "") const;

  // A watch (GET `path`, which asks for one with watch=true) opened for a thread that waits on
  // other things too: connects, shakes hands and sends the request, all within the configured
  // timeout, as a Request() does, then returns the open stream, whose answer is read with
  // WatchStream::ReadAvailable whenever its descriptor is readable, never waiting.
  absl::StatusOr<std::unique_ptr<WatchStream>> OpenWatch(absl::string_view path) const;

  const ApiServerConfig& config() const { return config_; }

 private:
  class IdleWatch;

  // A new TLS connection to the API server, handshake done, within `deadline`.
  absl::StatusOr<std::unique_ptr<ApiConnection>> Open(absl::Time deadline) const;
  // The request's text; `keep_alive` false asks the server to close after its answer.
  std::string RequestText(absl::string_view method, absl::string_view path,
                          absl::string_view content_type, absl::string_view body,
                          bool keep_alive) const;
  // Sends `request` on `connection` and reads its answer, within `deadline`. `received`: some of
  // an answer came; `reusable`: the answer left the connection open and nothing else on it.
  absl::StatusOr<HttpResponse> Exchange(ApiConnection& connection, const std::string& request,
                                        absl::Time deadline, absl::string_view what,
                                        bool* received, bool* reusable) const;
  // The newest kept connection that is still open and not past its idle time; nullptr if none.
  std::unique_ptr<ApiConnection> TakeIdle() const;
  void KeepIdle(std::unique_ptr<ApiConnection> connection) const;

  const ApiServerConfig config_;
  const int cancel_fd_;  // an eventfd, signalled by Cancel()
  mutable absl::Mutex idle_mu_;
  // Oldest first. Only ever touched under idle_mu_: one taken out is its request's alone.
  mutable std::vector<std::unique_ptr<ApiConnection>> idle_ ABSL_GUARDED_BY(idle_mu_);
  std::unique_ptr<IdleWatch> idle_watch_;  // on the loop of WatchIdleConnections
};

// An HTTP/1.1 answer read as it arrives, each byte looked at once: the head (at most 64 KiB),
// then the body by Content-Length, by chunks, or to the end of the connection (at most
// kMaxApiResponseBytes). Request() feeds it every read; exposed for the tests and the fuzzer.
class HttpResponseReader {
 public:
  HttpResponseReader() = default;
  // A reader that hands a 200 answer's body to `body_sink` as it is decoded, in pieces, instead
  // of keeping it (no size limit then: the sink keeps what it needs); an error from the sink ends
  // the answer with that error. Other answers are kept whole, as without a sink.
  explicit HttpResponseReader(std::function<absl::Status(absl::string_view)> body_sink)
      : body_sink_(std::move(body_sink)) {}

  // The next bytes the server sent: true once the answer is complete (anything after it is
  // ignored), false while more is needed, an error once it cannot be an answer (then always).
  absl::StatusOr<bool> Feed(absl::string_view data);
  // The server closed the connection: OK when what came before is a whole answer.
  absl::Status Finish();
  // The answer, once Feed() said true or Finish() OK.
  HttpResponse& response() { return response_; }
  // The answer is complete, framed (by Content-Length, chunks, or a status that has no body),
  // nothing came after it, and the server keeps the connection open for another request
  // (HTTP/1.1 without `Connection: close`; RFC 9112 section 9.3).
  bool ConnectionReusable() const;

 private:
  enum class Phase { kHead, kLength, kChunkSize, kChunkData, kChunkEnd, kTrailers, kToEnd, kDone };
  absl::Status ParseHead(absl::string_view head);
  absl::StatusOr<bool> Step();

  Phase phase_ = Phase::kHead;
  std::string pending_;  // bytes received and not yet consumed: the head, or a chunk's size line
  size_t scanned_ = 0;   // how much of pending_ is known to hold no line end (no rescans)
  uint64_t left_ = 0;    // of the Content-Length body, or of the current chunk
  bool received_ = false;
  bool keep_alive_ = false;   // HTTP/1.1 without Connection: close
  bool read_to_end_ = false;  // no framing: the connection's end ends the answer
  bool trailing_ = false;     // bytes came after the answer
  bool streaming_ = false;  // the body goes to body_sink_
  absl::Status error_;
  HttpResponse response_;
  std::function<absl::Status(absl::string_view)> body_sink_;
};

// Splits a stream into lines ("\n"-ended; a "\r" before it is dropped) and hands each complete
// line to `on_line`; a line over `max_line` bytes is an error. For watch streams.
class LineSplitter {
 public:
  LineSplitter(size_t max_line, std::function<absl::Status(absl::string_view)> on_line)
      : max_line_(max_line), on_line_(std::move(on_line)) {}
  absl::Status Feed(absl::string_view data);

 private:
  const size_t max_line_;
  std::function<absl::Status(absl::string_view)> on_line_;
  std::string partial_;
};

// An open watch (ApiClient::OpenWatch): its answer read as it arrives, by whoever polls fd().
class WatchStream {
 public:
  ~WatchStream();
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // Readable (POLLIN) when more of the answer has come.
  int fd() const;
  // Reads all that has come, never waiting, and hands each whole event line of a 200 answer to
  // `on_event` (without its newline; at most 8 MiB). nullopt: the answer goes on. Once it has
  // ended: the answer (200 with no body when the server ended the stream; any other status
  // whole, as Request() returns it), or an error: `on_event`'s own, as it is, or the
  // connection's. After an answer or an error the stream is done; a later call returns the same.
  absl::StatusOr<std::optional<HttpResponse>> ReadAvailable(
      const std::function<absl::Status(absl::string_view event)>& on_event);

 private:
  friend class ApiClient;
  WatchStream(std::unique_ptr<ApiConnection> connection, std::string what, absl::Duration timeout);

  const std::unique_ptr<ApiConnection> connection_;
  const std::string what_;        // "GET <path>", for errors
  const absl::Duration timeout_;  // for a write the TLS session needs in the middle of a read
  const std::function<absl::Status(absl::string_view)>* on_event_ = nullptr;  // during a read
  absl::Status event_error_;
  LineSplitter lines_;
  HttpResponseReader reader_;
  std::optional<absl::StatusOr<HttpResponse>> end_;
};

// The parsed head and body of an HTTP/1.1 answer read to the end of the connection; exposed for
// the tests and the fuzzer. `raw` is everything the server sent.
absl::StatusOr<HttpResponse> ParseHttpResponse(absl::string_view raw);

// A TCP connection (non-blocking, TCP_NODELAY) to the first of `addresses` (numeric IPv4 or IPv6
// addresses, tried in the order given, as the resolver orders a name's) that accepts one before
// `deadline`; each gets its share of the time left. The caller owns the descriptor. Request()
// connects this way to what the API server's name resolves to; exposed for the tests, which
// cannot arrange what a name resolves to.
absl::StatusOr<int> ConnectToAny(const std::vector<std::string>& addresses, int port,
                                 absl::Time deadline);

}  // namespace edgeaccel

#endif  // EDGEACCEL_NODE_API_CLIENT_H_
