#include "edgeaccel/node/api_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace edgeaccel {
namespace {

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;
using SslPtr = std::unique_ptr<SSL, SslFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void Reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// OpenSSL's queued errors as one line (and the queue emptied), or `fallback`.
std::string OpenSslErrors(absl::string_view fallback) {
  std::string out;
  while (unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string(fallback) : out;
}

std::string Endpoint(const ApiServerConfig& config) {
  return absl::StrContains(config.host, ':') ? absl::StrCat("[", config.host, "]:", config.port)
                                             : absl::StrCat(config.host, ":", config.port);
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

int RemainingMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return absl::OkStatus();
    if (n == 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    if (errno != EINTR) return absl::InternalError(absl::StrCat(what, ": poll: ", strerror(errno)));
  }
}

absl::StatusOr<SslCtxPtr> MakeContext(const ApiServerConfig& config) {
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError(OpenSslErrors("SSL_CTX_new failed"));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!config.ca_pem.empty()) {
    BioPtr bio(BIO_new_mem_buf(config.ca_pem.data(), static_cast<int>(config.ca_pem.size())));
    X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
    int added = 0;
    while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      if (X509_STORE_add_cert(store, ca) == 1) added++;
      X509_free(ca);
    }
    ERR_clear_error();  // the end of the data reads as an error
    if (added == 0) {
      return absl::InvalidArgumentError("the API server's CA data holds no PEM certificate");
    }
  } else if (!config.ca_file.empty()) {
    struct stat st;
    if (stat(config.ca_file.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read the API server's CA file ", config.ca_file, ": ",
                       strerror(errno)));
    }
    if (SSL_CTX_load_verify_locations(ctx.get(), config.ca_file.c_str(), nullptr) != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("the API server's CA file ", config.ca_file, " holds no usable PEM "
                       "certificate: ", OpenSslErrors("unreadable")));
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
    return absl::FailedPreconditionError(OpenSslErrors("no CA to verify the API server with"));
  }
  if (!config.client_cert_pem.empty()) {
    BioPtr cert_bio(BIO_new_mem_buf(config.client_cert_pem.data(),
                                    static_cast<int>(config.client_cert_pem.size())));
    BioPtr key_bio(BIO_new_mem_buf(config.client_key_pem.data(),
                                   static_cast<int>(config.client_key_pem.size())));
    X509* cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    const bool ok = cert != nullptr && key != nullptr &&
                    SSL_CTX_use_certificate(ctx.get(), cert) == 1 &&
                    SSL_CTX_use_PrivateKey(ctx.get(), key) == 1 &&
                    SSL_CTX_check_private_key(ctx.get()) == 1;
    X509_free(cert);  // the context holds its own references
    EVP_PKEY_free(key);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the client certificate or key is not PEM, or they do not match: ",
          OpenSslErrors("unreadable")));
    }
  }
  return ctx;
}

// A TCP connection to the first address of `config.host` that answers before the deadline.
absl::Status Connect(const ApiServerConfig& config, absl::Time deadline, Fd& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG | (IsIpAddress(config.host) ? AI_NUMERICHOST : 0);
  addrinfo* found = nullptr;
  const std::string port = std::to_string(config.port);
  const int rc = getaddrinfo(config.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve the API server's name ", config.host, ": ",
        rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc),
        " (is /etc/resolv.conf there, and the name right?)"));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last_error = strerror(errno);
      continue;
    }
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = strerror(errno);
        continue;
      }
      absl::Status waited = WaitFor(fd.get(), POLLOUT, deadline, "connect");
      if (!waited.ok()) return absl::DeadlineExceededError(
          absl::StrCat("cannot connect to the API server at ", Endpoint(config), ": timed out"));
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) {
        last_error = strerror(error);
        continue;
      }
    }
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    out.Reset(fd.Release());
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("cannot connect to the API server at ", Endpoint(config), ": ", last_error));
}

// Runs one non-blocking OpenSSL step until it completes or the deadline passes. Returns the
// step's result (> 0 done, 0 clean close) or an error.
template <typename Step>
absl::StatusOr<int> Drive(SSL* ssl, int fd, absl::Time deadline, absl::string_view what,
                          Step step) {
  while (true) {
    ERR_clear_error();
    const int n = step();
    if (n > 0) return n;
    const int error = SSL_get_error(ssl, n);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      absl::Status waited =
          WaitFor(fd, error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, what);
      if (!waited.ok()) return waited;
      continue;
    }
    if (error == SSL_ERROR_ZERO_RETURN) return 0;
    if (error == SSL_ERROR_SYSCALL) {
      // EOF without close_notify: many servers just close after `Connection: close`.
      if (ERR_peek_error() == 0) return 0;
    }
    return absl::UnavailableError(absl::StrCat(what, ": ", OpenSslErrors("connection failed")));
  }
}

struct Parsed {
  bool complete = false;
  HttpResponse response;
};

// Decodes a chunked body; complete once the last chunk (size 0) and the trailers have been read.
absl::StatusOr<bool> Dechunk(absl::string_view in, std::string& out) {
  out.clear();
  while (true) {
    const size_t eol = in.find("\r\n");
    if (eol == absl::string_view::npos) return false;
    absl::string_view size_field = in.substr(0, eol);
    size_field = size_field.substr(0, size_field.find(';'));  // chunk extensions
    size_field = absl::StripAsciiWhitespace(size_field);
    uint64_t size = 0;
    if (size_field.empty() || size_field.size() > 15 ||
        !absl::SimpleHexAtoi(size_field, &size)) {
      return absl::DataLossError("bad chunk size in the answer");
    }
    in.remove_prefix(eol + 2);
    if (size == 0) return in.find("\r\n") != absl::string_view::npos;  // trailers end with CRLF
    if (out.size() + size > kMaxApiResponseBytes) {
      return absl::ResourceExhaustedError("the answer is larger than 8 MiB");
    }
    if (in.size() < size + 2) return false;
    if (in.substr(size, 2) != "\r\n") return absl::DataLossError("a chunk does not end in CRLF");
    out.append(in.data(), size);
    in.remove_prefix(size + 2);
  }
}

absl::StatusOr<Parsed> Parse(absl::string_view raw, bool at_eof) {
  Parsed parsed;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == absl::string_view::npos) {
    if (at_eof) {
      return absl::DataLossError(raw.empty() ? "the server closed the connection without an answer"
                                             : "the answer ends inside its header");
    }
    if (raw.size() > 64 * 1024) return absl::DataLossError("the answer's header exceeds 64 KiB");
    return parsed;
  }
  std::vector<absl::string_view> lines = absl::StrSplit(raw.substr(0, head_end), "\r\n");
  // "HTTP/1.1 200 OK"
  absl::string_view status_line = lines[0];
  if (!absl::ConsumePrefix(&status_line, "HTTP/1.") || status_line.size() < 5 ||
      status_line[1] != ' ' || !absl::SimpleAtoi(status_line.substr(2, 3), &parsed.response.status) ||
      parsed.response.status < 100 || parsed.response.status > 599) {
    return absl::DataLossError(absl::StrCat("not an HTTP answer: \"",
                                            absl::CEscape(lines[0].substr(0, 64)), "\""));
  }
  bool chunked = false;
  bool has_length = false;
  uint64_t length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (name == "content-length") {
      if (!absl::SimpleAtoi(value, &length)) return absl::DataLossError("bad Content-Length");
      has_length = true;
    } else if (name == "transfer-encoding") {
      chunked = absl::StrContains(absl::AsciiStrToLower(value), "chunked");
    } else if (name == "content-type") {
      parsed.response.content_type = std::string(value);
    }
  }
  absl::string_view body = raw.substr(head_end + 4);
  if (chunked) {
    absl::StatusOr<bool> done = Dechunk(body, parsed.response.body);
    if (!done.ok()) return done.status();
    if (!*done && at_eof) return absl::DataLossError("the answer ends inside a chunk");
    parsed.complete = *done;
  } else if (has_length) {
    if (length > kMaxApiResponseBytes) {
      return absl::ResourceExhaustedError("the answer is larger than 8 MiB");
    }
    if (body.size() < length) {
      if (at_eof) return absl::DataLossError("the answer is shorter than its Content-Length");
      return parsed;
    }
    parsed.response.body = std::string(body.substr(0, length));
    parsed.complete = true;
  } else {
    parsed.response.body = std::string(body);
    parsed.complete = at_eof || parsed.response.status == 204 || parsed.response.status == 304;
  }
  return parsed;
}

}  // namespace

absl::StatusOr<HttpResponse> ParseHttpResponse(absl::string_view raw) {
  absl::StatusOr<Parsed> parsed = Parse(raw, /*at_eof=*/true);
  if (!parsed.ok()) return parsed.status();
  return std::move(parsed->response);
}

absl::StatusOr<HttpResponse> ApiClient::Request(absl::string_view method, absl::string_view path,
                                                absl::string_view content_type,
                                                absl::string_view body) const {
  const absl::Time deadline = absl::Now() + config_.timeout;
  const std::string what = absl::StrCat(method, " ", path);
  absl::StatusOr<SslCtxPtr> ctx = MakeContext(config_);
  if (!ctx.ok()) return ctx.status();
  Fd fd;
  if (absl::Status connected = Connect(config_, deadline, fd); !connected.ok()) return connected;

  SslPtr ssl(SSL_new(ctx->get()));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd.get()) != 1) {
    return absl::InternalError(OpenSslErrors("SSL_new failed"));
  }
  if (IsIpAddress(config_.host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), config_.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), config_.host.c_str());
    SSL_set1_host(ssl.get(), config_.host.c_str());
  }
  absl::StatusOr<int> handshake =
      Drive(ssl.get(), fd.get(), deadline, "TLS handshake", [&] { return SSL_connect(ssl.get()); });
  if (!handshake.ok() || *handshake == 0) {
    const long verify = SSL_get_verify_result(ssl.get());
    if (verify != X509_V_OK) {
      return absl::UnavailableError(absl::StrCat(
          "the API server at ", Endpoint(config_), " failed verification: ",
          X509_verify_cert_error_string(verify), " (check the CA, and that its certificate names ",
          config_.host, ")"));
    }
    return absl::Status(
        handshake.ok() ? absl::StatusCode::kUnavailable : handshake.status().code(),
        absl::StrCat("TLS with the API server at ", Endpoint(config_), " failed: ",
                     handshake.ok() ? "the connection was closed" : handshake.status().message()));
  }

  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", Endpoint(config_),
                                     "\r\nUser-Agent: edgeaccel-device-plugin\r\n"
                                     "Accept: application/json\r\nConnection: close\r\n");
  const std::string token = BearerToken(config_);
  if (!token.empty()) absl::StrAppend(&request, "Authorization: Bearer ", token, "\r\n");
  if (!content_type.empty()) absl::StrAppend(&request, "Content-Type: ", content_type, "\r\n");
  if (!body.empty() || method == "POST" || method == "PATCH" || method == "PUT") {
    absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  size_t sent = 0;
  while (sent < request.size()) {
    absl::StatusOr<int> n = Drive(ssl.get(), fd.get(), deadline, what, [&] {
      return SSL_write(ssl.get(), request.data() + sent, static_cast<int>(request.size() - sent));
    });
    if (!n.ok()) return n.status();
    if (*n == 0) return absl::UnavailableError(absl::StrCat(what, ": the server closed the connection"));
    sent += *n;
  }

  std::string raw;
  char buf[16 * 1024];
  while (true) {
    absl::StatusOr<int> n = Drive(ssl.get(), fd.get(), deadline, what,
                                  [&] { return SSL_read(ssl.get(), buf, sizeof(buf)); });
    if (!n.ok()) return n.status();
    const bool at_eof = *n == 0;
    raw.append(buf, at_eof ? 0 : *n);
    if (raw.size() > kMaxApiResponseBytes + 64 * 1024) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": the answer is larger than 8 MiB"));
    }
    absl::StatusOr<Parsed> parsed = Parse(raw, at_eof);
    if (!parsed.ok()) return absl::Status(parsed.status().code(),
                                          absl::StrCat(what, ": ", parsed.status().message()));
    if (parsed->complete) {
      SSL_shutdown(ssl.get());  // best effort: our close_notify
      return std::move(parsed->response);
    }
  }
}

}  // namespace edgeaccel
