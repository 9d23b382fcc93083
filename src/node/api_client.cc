#include "edgeaccel/node/api_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>
#if MBEDTLS_VERSION_MAJOR >= 3
#include <psa/crypto.h>
#endif
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "edgeaccel/host/poll_loop.h"

namespace edgeaccel {
namespace {

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

std::string MbedError(int code) {
  char buf[200];
  mbedtls_strerror(code, buf, sizeof(buf));
  return buf;
}

// Everything one TLS connection needs, freed together.
struct Tls {
  Tls() {
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    mbedtls_ssl_init(&ssl);
    mbedtls_ssl_config_init(&conf);
    mbedtls_x509_crt_init(&ca);
    mbedtls_x509_crt_init(&client_cert);
    mbedtls_pk_init(&client_key);
  }
  ~Tls() {
    mbedtls_pk_free(&client_key);
    mbedtls_x509_crt_free(&client_cert);
    mbedtls_x509_crt_free(&ca);
    mbedtls_ssl_config_free(&conf);
    mbedtls_ssl_free(&ssl);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
  }
  Tls(const Tls&) = delete;
  Tls& operator=(const Tls&) = delete;

  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
  mbedtls_ssl_context ssl;
  mbedtls_ssl_config conf;
  mbedtls_x509_crt ca;
  mbedtls_x509_crt client_cert;
  mbedtls_pk_context client_key;
};

// PEM text as mbedTLS parses it: with its terminating NUL counted.
const unsigned char* PemBytes(const std::string& pem) {
  return reinterpret_cast<const unsigned char*>(pem.c_str());
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

absl::Status Cancelled(absl::string_view what) {
  return absl::CancelledError(absl::StrCat(what, ": cancelled (stopping)"));
}

bool IsSignalled(int event_fd) {
  if (event_fd < 0) return false;
  pollfd p{event_fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Waits until `fd` is ready for `events`, the deadline passes, or `cancel_fd` (an eventfd; -1:
// none) is signalled.
absl::Status WaitFor(int fd, short events, absl::Time deadline, absl::string_view what,
                     int cancel_fd) {
  while (true) {
    pollfd p[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    const int n = poll(p, 2, RemainingMs(deadline));
    if (n > 0 && p[1].revents != 0) return Cancelled(what);
    if (n > 0) return absl::OkStatus();
    if (n == 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    if (errno != EINTR) return absl::InternalError(absl::StrCat(what, ": poll: ", strerror(errno)));
  }
}

// The TLS settings: TLS 1.2 or later, the server verified against the configured CA, our client
// certificate if there is one.
absl::Status Configure(const ApiServerConfig& config, Tls& tls) {
#if MBEDTLS_VERSION_MAJOR >= 3
  // mbedTLS 3 does its TLS 1.3 key exchange through PSA Crypto, which must be set up once per
  // process before any handshake (a TLS 1.3 server otherwise fails it).
  static const psa_status_t psa = psa_crypto_init();
  if (psa != PSA_SUCCESS) {
    return absl::InternalError(absl::StrCat("TLS: PSA crypto did not start (", psa, ")"));
  }
#endif
  static constexpr char kPersonalization[] = "edgeaccel-api-client";
  int rc = mbedtls_ctr_drbg_seed(&tls.drbg, mbedtls_entropy_func, &tls.entropy,
                                 reinterpret_cast<const unsigned char*>(kPersonalization),
                                 sizeof(kPersonalization) - 1);
  if (rc != 0) return absl::InternalError(absl::StrCat("no entropy for TLS: ", MbedError(rc)));
  if (!config.ca_pem.empty()) {
    rc = mbedtls_x509_crt_parse(&tls.ca, PemBytes(config.ca_pem), config.ca_pem.size() + 1);
    if (rc < 0 || tls.ca.version == 0) {
      return absl::InvalidArgumentError("the API server's CA data holds no PEM certificate");
    }
  } else {
    // In a pod the service account's CA; a kubeconfig names its own. With neither, the system's
    // bundle where there is one (the image has none).
    const std::string path =
        config.ca_file.empty() ? "/etc/ssl/certs/ca-certificates.crt" : config.ca_file;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot read the API server's CA file ", path, ": ", strerror(errno)));
    }
    rc = mbedtls_x509_crt_parse_file(&tls.ca, path.c_str());
    if (rc < 0 || tls.ca.version == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the API server's CA file ", path, " holds no usable PEM certificate",
                       rc < 0 ? absl::StrCat(": ", MbedError(rc)) : std::string()));
    }
  }
  if (!config.client_cert_pem.empty()) {
    rc = mbedtls_x509_crt_parse(&tls.client_cert, PemBytes(config.client_cert_pem),
                                config.client_cert_pem.size() + 1);
    if (rc == 0) {
#if MBEDTLS_VERSION_MAJOR >= 3
      // mbedTLS 3 wants a random generator for its blinding of the private-key operations.
      rc = mbedtls_pk_parse_key(&tls.client_key, PemBytes(config.client_key_pem),
                                config.client_key_pem.size() + 1, nullptr, 0,
                                mbedtls_ctr_drbg_random, &tls.drbg);
    }
    if (rc == 0) {
      rc = mbedtls_pk_check_pair(&tls.client_cert.pk, &tls.client_key, mbedtls_ctr_drbg_random,
                                 &tls.drbg);
    }
#else
      rc = mbedtls_pk_parse_key(&tls.client_key, PemBytes(config.client_key_pem),
                                config.client_key_pem.size() + 1, nullptr, 0);
    }
    if (rc == 0) rc = mbedtls_pk_check_pair(&tls.client_cert.pk, &tls.client_key);
#endif
    if (rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the client certificate or key is not PEM, or they do not match: ", MbedError(rc)));
    }
  }
  rc = mbedtls_ssl_config_defaults(&tls.conf, MBEDTLS_SSL_IS_CLIENT, MBEDTLS_SSL_TRANSPORT_STREAM,
                                   MBEDTLS_SSL_PRESET_DEFAULT);
  if (rc != 0) return absl::InternalError(absl::StrCat("TLS settings: ", MbedError(rc)));
#if MBEDTLS_VERSION_NUMBER >= 0x03020000
  mbedtls_ssl_conf_min_tls_version(&tls.conf, MBEDTLS_SSL_VERSION_TLS1_2);
#else
  mbedtls_ssl_conf_min_version(&tls.conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                               MBEDTLS_SSL_MINOR_VERSION_3);  // TLS 1.2
#endif
  // The key exchange's curves, fastest first. mbedTLS 2.28 offers its curves largest first
  // (secp521r1 leads), and an API server on TLS 1.2 that follows the client's order (the 1.36
  // lab's does: `openssl s_client -groups` shows it) then spends the handshake in P-521
  // arithmetic on both sides: 76% of a DRA prepare's CPU in a profile (docs/dra-reference.md).
  // X25519 and P-256 are what Go's crypto/tls prefers itself; the larger ones stay, last, for a
  // server that takes nothing else.
#if MBEDTLS_VERSION_NUMBER >= 0x03010000
  static const uint16_t kGroups[] = {
#if defined(MBEDTLS_ECP_DP_CURVE25519_ENABLED)
      MBEDTLS_SSL_IANA_TLS_GROUP_X25519,
#endif
#if defined(MBEDTLS_ECP_DP_SECP256R1_ENABLED)
      MBEDTLS_SSL_IANA_TLS_GROUP_SECP256R1,
#endif
#if defined(MBEDTLS_ECP_DP_SECP384R1_ENABLED)
      MBEDTLS_SSL_IANA_TLS_GROUP_SECP384R1,
#endif
#if defined(MBEDTLS_ECP_DP_SECP521R1_ENABLED)
      MBEDTLS_SSL_IANA_TLS_GROUP_SECP521R1,
#endif
      MBEDTLS_SSL_IANA_TLS_GROUP_NONE};
  mbedtls_ssl_conf_groups(&tls.conf, kGroups);
#else
  static const mbedtls_ecp_group_id kCurves[] = {
#if defined(MBEDTLS_ECP_DP_CURVE25519_ENABLED)
      MBEDTLS_ECP_DP_CURVE25519,
#endif
#if defined(MBEDTLS_ECP_DP_SECP256R1_ENABLED)
      MBEDTLS_ECP_DP_SECP256R1,
#endif
#if defined(MBEDTLS_ECP_DP_SECP384R1_ENABLED)
      MBEDTLS_ECP_DP_SECP384R1,
#endif
#if defined(MBEDTLS_ECP_DP_SECP521R1_ENABLED)
      MBEDTLS_ECP_DP_SECP521R1,
#endif
      MBEDTLS_ECP_DP_NONE};
  mbedtls_ssl_conf_curves(&tls.conf, kCurves);
#endif
  mbedtls_ssl_conf_authmode(&tls.conf, MBEDTLS_SSL_VERIFY_REQUIRED);
  mbedtls_ssl_conf_ca_chain(&tls.conf, &tls.ca, nullptr);
  mbedtls_ssl_conf_rng(&tls.conf, mbedtls_ctr_drbg_random, &tls.drbg);
  if (!config.client_cert_pem.empty()) {
    rc = mbedtls_ssl_conf_own_cert(&tls.conf, &tls.client_cert, &tls.client_key);
    if (rc != 0) return absl::InternalError(absl::StrCat("client certificate: ", MbedError(rc)));
  }
  return absl::OkStatus();
}

// The socket under the TLS session; non-blocking, so mbedTLS asks to be called again.
int SendOnSocket(void* context, const unsigned char* data, size_t size) {
  const ssize_t n = send(*static_cast<int*>(context), data, size, MSG_NOSIGNAL);
  if (n >= 0) return static_cast<int>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return MBEDTLS_ERR_SSL_WANT_WRITE;
  return errno == EPIPE || errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET
                                               : MBEDTLS_ERR_NET_SEND_FAILED;
}

int ReceiveFromSocket(void* context, unsigned char* data, size_t size) {
  const ssize_t n = recv(*static_cast<int*>(context), data, size, 0);
  if (n >= 0) return static_cast<int>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return MBEDTLS_ERR_SSL_WANT_READ;
  return errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET : MBEDTLS_ERR_NET_RECV_FAILED;
}

// Whether the certificate names `host`, an IP address, in its subjectAltName (mbedTLS 2.28
// checks DNS names only).
bool CertificateNamesAddress(const mbedtls_x509_crt& cert, const std::string& host) {
  unsigned char address[sizeof(in6_addr)];
  size_t length = 0;
  if (inet_pton(AF_INET, host.c_str(), address) == 1) {
    length = 4;
  } else if (inet_pton(AF_INET6, host.c_str(), address) == 1) {
    length = 16;
  } else {
    return false;
  }
  for (const mbedtls_x509_sequence* san = &cert.subject_alt_names; san != nullptr;
       san = san->next) {
    if (san->buf.tag == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_X509_SAN_IP_ADDRESS) &&
        san->buf.len == length && memcmp(san->buf.p, address, length) == 0) {
      return true;
    }
  }
  return false;
}

// One address to connect to, as the resolver gives it.
struct SocketAddress {
  sockaddr_storage address{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

std::string AddressText(const SocketAddress& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  const void* ip;
  if (a.family == AF_INET6) {
    ip = &reinterpret_cast<const sockaddr_in6*>(&a.address)->sin6_addr;
  } else {
    ip = &reinterpret_cast<const sockaddr_in*>(&a.address)->sin_addr;
  }
  inet_ntop(a.family, ip, text, sizeof(text));
  return text;
}

// How long the next of `left` addresses may take to connect: an equal share of the time left,
// but at least 2 s where that much is left, as Go's net.Dialer (client-go's, kubectl's) divides
// a dial's deadline over a name's addresses (net/dial.go: partialDeadline).
absl::Time PartialDeadline(absl::Time deadline, size_t left) {
  const absl::Time now = absl::Now();
  const absl::Duration remaining = deadline - now;
  constexpr absl::Duration kSaneMinimum = absl::Seconds(2);
  absl::Duration share = remaining / static_cast<int64_t>(left);
  if (share < kSaneMinimum) share = std::min(remaining, kSaneMinimum);
  return now + share;
}

// A TCP connection to the first of `addresses` that answers, each tried in turn with its share
// of the time to `deadline`: an address that never answers (a dead route, a full accept queue)
// costs its share, not the whole request. `endpoint` names the server in errors.
absl::Status ConnectToFirstAnswering(const std::vector<SocketAddress>& addresses,
                                     absl::Time deadline, const std::string& endpoint,
                                     int cancel_fd, Fd& out) {
  std::vector<std::string> failures;
  bool timed_out = false;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const SocketAddress& a = addresses[i];
    if (i > 0 && absl::Now() >= deadline) break;  // no time left to try the rest
    auto failed = [&](const std::string& why) {
      failures.push_back(addresses.size() == 1 ? why : absl::StrCat(AddressText(a), ": ", why));
    };
    Fd fd(socket(a.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP));
    if (fd.get() < 0) {
      failed(strerror(errno));
      continue;
    }
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.address), a.length) != 0) {
      if (errno != EINPROGRESS) {
        failed(strerror(errno));
        continue;
      }
      absl::Status waited =
          WaitFor(fd.get(), POLLOUT, PartialDeadline(deadline, addresses.size() - i), "connect",
                  cancel_fd);
      if (absl::IsCancelled(waited)) return waited;
      timed_out = !waited.ok() && absl::IsDeadlineExceeded(waited);
      if (!waited.ok()) {
        failed(timed_out ? "timed out" : std::string(waited.message()));
        continue;
      }
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
      if (error != 0) {
        failed(strerror(error));
        continue;
      }
    }
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    out.Reset(fd.Release());
    return absl::OkStatus();
  }
  if (failures.empty()) failures.push_back("no address");
  return absl::Status(
      timed_out ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
      absl::StrCat("cannot connect to the API server at ", endpoint, ": ",
                   absl::StrJoin(failures, "; ")));
}

std::vector<SocketAddress> Addresses(const addrinfo* found) {
  std::vector<SocketAddress> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SocketAddress address;
    memcpy(&address.address, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
    address.family = a->ai_family;
    addresses.push_back(address);
  }
  return addresses;
}

// A TCP connection to the API server: its name resolved afresh, then its addresses in turn.
absl::Status Connect(const ApiServerConfig& config, absl::Time deadline, int cancel_fd, Fd& out) {
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
  return ConnectToFirstAnswering(Addresses(found), deadline, Endpoint(config), cancel_fd, out);
}

// What a non-blocking mbedTLS step (handshake, write, read) that returned `n` < 0 asks of whoever
// runs it. The one reading of those results, for a request's steps (Drive) and a watch's reads
// (WatchStream::ReadAvailable).
enum class TlsNext {
  kStepAgain,   // nothing to wait for: make the step again
  kReadable,    // wait until the socket is readable, then make it again
  kWritable,    // wait until the socket is writable, then make it again
  kPeerClosed,  // the server closed the connection (with or without close_notify)
  kFailed,      // TlsFailure says what
};

TlsNext TlsNextAfter(int n) {
#ifdef MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET
  // A TLS 1.3 server's session ticket, reported by mbedTLS 3.6 between records: we keep no
  // sessions, so the read just goes on.
  if (n == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET) return TlsNext::kStepAgain;
#endif
  if (n == MBEDTLS_ERR_SSL_WANT_READ) return TlsNext::kReadable;
  if (n == MBEDTLS_ERR_SSL_WANT_WRITE) return TlsNext::kWritable;
  if (n == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || n == MBEDTLS_ERR_SSL_CONN_EOF) {
    return TlsNext::kPeerClosed;
  }
  return TlsNext::kFailed;
}

// The error of a step whose result `n` is kFailed: a server certificate that does not verify
// is Unauthenticated, anything else Unavailable.
absl::Status TlsFailure(int n, absl::string_view what) {
  return absl::Status(n == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED ? absl::StatusCode::kUnauthenticated
                                                               : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, ": ", MbedError(n)));
}

// Runs one non-blocking TLS step until it completes or the deadline passes. Returns the
// step's result (> 0 done, 0 end of stream) or an error.
template <typename Step>
absl::StatusOr<int> Drive(int fd, absl::Time deadline, absl::string_view what, int cancel_fd,
                          Step step) {
  while (true) {
    if (IsSignalled(cancel_fd)) return Cancelled(what);
    // Checked here too, not only while waiting: a server that keeps sending never makes us wait.
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    const int n = step();
    if (n >= 0) return n;
    const TlsNext next = TlsNextAfter(n);
    switch (next) {
      case TlsNext::kStepAgain:
        continue;
      case TlsNext::kReadable:
      case TlsNext::kWritable: {
        absl::Status waited =
            WaitFor(fd, next == TlsNext::kReadable ? POLLIN : POLLOUT, deadline, what, cancel_fd);
        if (!waited.ok()) return waited;
        continue;
      }
      case TlsNext::kPeerClosed:
        return 0;  // ends an answer read to the end
      case TlsNext::kFailed:
        return TlsFailure(n, what);
    }
  }
}

}  // namespace

// The status line and the headers; chooses how the body is read.
absl::Status HttpResponseReader::ParseHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  // "HTTP/1.1 200 OK"
  absl::string_view status_line = lines[0];
  if (!absl::ConsumePrefix(&status_line, "HTTP/1.") || status_line.size() < 5 ||
      status_line[1] != ' ' || !absl::SimpleAtoi(status_line.substr(2, 3), &response_.status) ||
      response_.status < 100 || response_.status > 599) {
    return absl::DataLossError(absl::StrCat("not an HTTP answer: \"",
                                            absl::CEscape(lines[0].substr(0, 64)), "\""));
  }
  // HTTP/1.1 keeps the connection unless told otherwise; 1.0 closes it (we ask in 1.1).
  keep_alive_ = status_line[0] == '1';
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
      response_.content_type = std::string(value);
    } else if (name == "connection") {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(option), "close")) keep_alive_ = false;
      }
    }
  }
  if (chunked) {
    phase_ = Phase::kChunkSize;
  } else if (has_length) {
    if (length > kMaxApiResponseBytes) {
      return absl::ResourceExhaustedError("the answer is larger than 8 MiB");
    }
    left_ = length;
    phase_ = length == 0 ? Phase::kDone : Phase::kLength;
  } else if (response_.status == 204 || response_.status == 304) {
    phase_ = Phase::kDone;  // never a body (RFC 9112, section 6.3)
  } else {
    phase_ = Phase::kToEnd;
    read_to_end_ = true;
  }
  return absl::OkStatus();
}

// Consumes what it can of pending_. Only a head or a chunk's size line waits there for its end,
// and the search for that end resumes where the last one stopped: every byte is looked at once.
absl::StatusOr<bool> HttpResponseReader::Step() {
  size_t pos = 0;  // consumed from pending_
  auto wait = [&](size_t tail) {
    // Keeps the unconsumed rest; `tail` bytes at its end may begin the line end sought.
    pending_.erase(0, pos);
    scanned_ = pending_.size() > tail ? pending_.size() - tail : 0;
    return false;
  };
  auto more = [&] {  // for the rest of a body or a chunk: no line end is being sought
    pending_.erase(0, pos);
    scanned_ = 0;
    return false;
  };
  absl::Status sunk;  // the sink's error, which ends the answer
  auto take_body = [&](uint64_t most) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(most, pending_.size() - pos));
    if (streaming_) {
      if (n > 0 && sunk.ok()) sunk = body_sink_(absl::string_view(pending_).substr(pos, n));
    } else {
      response_.body.append(pending_, pos, n);
    }
    pos += n;
    return n;
  };
  while (true) {
    switch (phase_) {
      case Phase::kHead: {
        // The head ends within 64 KiB, however the reads cut it.
        constexpr size_t kMaxHead = 64 * 1024;
        const size_t end = pending_.find("\r\n\r\n", scanned_);
        if (end == std::string::npos ? pending_.size() > kMaxHead + 3 : end > kMaxHead) {
          return absl::DataLossError("the answer's header exceeds 64 KiB");
        }
        if (end == std::string::npos) return wait(3);
        if (absl::Status head = ParseHead(absl::string_view(pending_).substr(0, end));
            !head.ok()) {
          return head;
        }
        streaming_ = body_sink_ != nullptr && response_.status == 200;
        pos = end + 4;
        scanned_ = 0;
        break;
      }
      case Phase::kLength:
        left_ -= take_body(left_);
        if (!sunk.ok()) return sunk;
        if (left_ > 0) return more();
        phase_ = Phase::kDone;
        break;
      case Phase::kToEnd:
        take_body(pending_.size() - pos);
        if (!sunk.ok()) return sunk;
        if (response_.body.size() > kMaxApiResponseBytes) {
          return absl::ResourceExhaustedError("the answer is larger than 8 MiB");
        }
        return more();
      case Phase::kChunkSize: {
        // A size line is a few hex digits and, rarely, extensions: one over 4 KiB is garbage,
        // however the reads cut it.
        constexpr size_t kMaxSizeLine = 4096;
        const size_t eol = pending_.find("\r\n", pos + scanned_);
        if (eol == std::string::npos ? pending_.size() - pos > kMaxSizeLine + 1
                                     : eol - pos > kMaxSizeLine) {
          return absl::DataLossError("bad chunk size in the answer (a line over 4 KiB)");
        }
        if (eol == std::string::npos) return wait(1);
        absl::string_view size_field = absl::string_view(pending_).substr(pos, eol - pos);
        size_field = size_field.substr(0, size_field.find(';'));  // chunk extensions
        size_field = absl::StripAsciiWhitespace(size_field);
        uint64_t size = 0;
        if (size_field.empty() || size_field.size() > 15 ||
            !absl::SimpleHexAtoi(size_field, &size)) {
          return absl::DataLossError("bad chunk size in the answer");
        }
        pos = eol + 2;
        scanned_ = 0;
        if (size == 0) {
          phase_ = Phase::kTrailers;
          break;
        }
        if (response_.body.size() + size > kMaxApiResponseBytes) {
          return absl::ResourceExhaustedError("the answer is larger than 8 MiB");
        }
        left_ = size;
        phase_ = Phase::kChunkData;
        break;
      }
      case Phase::kChunkData:
        left_ -= take_body(left_);
        if (!sunk.ok()) return sunk;
        if (left_ > 0) return more();
        phase_ = Phase::kChunkEnd;
        break;
      case Phase::kChunkEnd:
        if (pending_.size() - pos < 2) return more();
        if (pending_.compare(pos, 2, "\r\n") != 0) {
          return absl::DataLossError("a chunk does not end in CRLF");
        }
        pos += 2;
        phase_ = Phase::kChunkSize;
        break;
      case Phase::kTrailers: {
        // After the last chunk: trailer lines (not used), if any, and the empty line that ends
        // the answer, all consumed, so that a kept connection's next answer starts clean.
        if (pending_.size() - pos >= 2 && pending_.compare(pos, 2, "\r\n") == 0) {
          pos += 2;
          phase_ = Phase::kDone;
          break;
        }
        constexpr size_t kMaxTrailers = 64 * 1024;
        const size_t end = pending_.find("\r\n\r\n", pos + scanned_);
        if (end == std::string::npos ? pending_.size() - pos > kMaxTrailers + 3
                                     : end - pos > kMaxTrailers) {
          return absl::DataLossError("the answer's trailers exceed 64 KiB");
        }
        if (end == std::string::npos) return wait(3);
        pos = end + 4;
        phase_ = Phase::kDone;
        break;
      }
      case Phase::kDone:
        trailing_ = trailing_ || pos < pending_.size();
        pending_.clear();
        scanned_ = 0;
        return true;
    }
  }
}

absl::StatusOr<bool> HttpResponseReader::Feed(absl::string_view data) {
  if (!error_.ok()) return error_;
  if (phase_ == Phase::kDone) {
    trailing_ = trailing_ || !data.empty();
    return true;
  }
  received_ = received_ || !data.empty();
  pending_.append(data.data(), data.size());
  absl::StatusOr<bool> done = Step();
  if (!done.ok()) error_ = done.status();
  return done;
}

bool HttpResponseReader::ConnectionReusable() const {
  return error_.ok() && phase_ == Phase::kDone && !read_to_end_ && !trailing_ && keep_alive_;
}

absl::Status HttpResponseReader::Finish() {
  if (!error_.ok()) return error_;
  switch (phase_) {
    case Phase::kDone:
      return absl::OkStatus();
    case Phase::kToEnd:
      phase_ = Phase::kDone;
      return absl::OkStatus();
    case Phase::kHead:
      error_ = absl::DataLossError(
          received_ ? "the answer ends inside its header"
                    : "the server closed the connection without an answer");
      break;
    case Phase::kLength:
      error_ = absl::DataLossError("the answer is shorter than its Content-Length");
      break;
    default:
      error_ = absl::DataLossError("the answer ends inside a chunk");
      break;
  }
  return error_;
}

absl::StatusOr<HttpResponse> ParseHttpResponse(absl::string_view raw) {
  HttpResponseReader reader;
  absl::StatusOr<bool> done = reader.Feed(raw);
  if (!done.ok()) return done.status();
  if (!*done) {
    if (absl::Status finished = reader.Finish(); !finished.ok()) return finished;
  }
  return std::move(reader.response());
}

absl::StatusOr<int> ConnectToAny(const std::vector<std::string>& addresses, int port,
                                 absl::Time deadline) {
  std::vector<SocketAddress> resolved;
  for (const std::string& address : addresses) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("not a numeric address: ", address));
    }
    for (const SocketAddress& a : Addresses(found)) resolved.push_back(a);
    freeaddrinfo(found);
  }
  ApiServerConfig config;
  config.host = addresses.empty() ? std::string() : addresses.front();
  config.port = port;
  Fd fd;
  if (absl::Status connected =
          ConnectToFirstAnswering(resolved, deadline, Endpoint(config), /*cancel_fd=*/-1, fd);
      !connected.ok()) {
    return connected;
  }
  return fd.Release();
}

absl::Status LineSplitter::Feed(absl::string_view data) {
  while (!data.empty()) {
    const size_t eol = data.find('\n');
    const absl::string_view piece = data.substr(0, eol);
    if (partial_.size() + piece.size() > max_line_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a line of the stream is longer than ", max_line_, " bytes"));
    }
    if (eol == absl::string_view::npos) {
      partial_.append(piece.data(), piece.size());
      return absl::OkStatus();
    }
    absl::string_view line = piece;
    if (!partial_.empty()) {
      partial_.append(piece.data(), piece.size());
      line = partial_;
    }
    absl::ConsumeSuffix(&line, "\r");
    absl::Status taken = line.empty() ? absl::OkStatus() : on_line_(line);
    partial_.clear();
    if (!taken.ok()) return taken;
    data.remove_prefix(eol + 1);
  }
  return absl::OkStatus();
}

// One TLS connection. The session's I/O context is `socket_fd`, so the connection stays where it
// was made (it is only ever held by pointer).
struct ApiConnection {
  Tls tls;
  Fd fd;
  int socket_fd = -1;
  absl::Time idle_since;  // while kept for the next request
};

namespace {

// Whether a kept connection can carry another request at `now`: kept for less than
// kIdleConnectionTimeout, and the server has neither closed it nor sent anything unasked on it
// (nothing is due on it). The one judgement of a kept connection, for a request that takes one
// and for the loop that closes the rest.
bool CanCarryAnother(const ApiConnection& connection, absl::Time now) {
  if (now - connection.idle_since >= kIdleConnectionTimeout) return false;
  if (mbedtls_ssl_get_bytes_avail(&connection.tls.ssl) > 0) return false;
  pollfd p{connection.socket_fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) == 0;
}

// What net/http asks again on a new connection when a kept one turned out closed: a request that
// cannot change anything (Request.isReplayable: GET, HEAD, OPTIONS, TRACE). A POST or a PATCH may
// have been carried out before the connection went; its caller decides.
bool Replayable(absl::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE";
}

}  // namespace

// On the loop of WatchIdleConnections: waits (one epoll set, however many are kept) on the kept
// connections' sockets, readable once the server closes one, and on their idle deadline, and
// closes what neither side will use again.
class ApiClient::IdleWatch : public PollLoop::Member {
 public:
  IdleWatch(const ApiClient* client, PollLoop* loop)
      : client_(client),
        loop_(loop),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {
    loop_->Add(this);
  }
  ~IdleWatch() override {
    loop_->Remove(this);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }
  IdleWatch(const IdleWatch&) = delete;
  IdleWatch& operator=(const IdleWatch&) = delete;

  // Whether it can watch connections (this process had the descriptors for it).
  bool usable() const { return wake_fd_ >= 0 && epoll_fd_ >= 0; }

  // A connection kept, or taken for a request (then it is not this watch's to look at).
  void Watch(const ApiConnection& connection) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.fd = connection.socket_fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, connection.socket_fd, &event);
    Wake();  // its idle deadline may be the next one
  }
  void Unwatch(const ApiConnection& connection) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, connection.socket_fd, nullptr);
  }

  PollLoop::Fds WaitFds() override { return {wake_fd_, epoll_fd_, -1, -1}; }

  absl::Time Step(const PollLoop::Events& ready) override {
    if (ready[0] != 0) {
      uint64_t count;
      if (read(wake_fd_, &count, sizeof(count)) < 0) {
        // EAGAIN: nothing to take; the kept connections below say what changed.
      }
    }
    // Each kept connection looked at afresh under the lock: one the loop saw ready may have been
    // taken since (a taken one is its request's alone). Those closed leave the epoll set, so it
    // is not ready again for them.
    std::vector<std::unique_ptr<ApiConnection>> closing;
    absl::Time next = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&client_->idle_mu_);
      const absl::Time now = absl::Now();
      auto& idle = client_->idle_;
      for (auto it = idle.begin(); it != idle.end();) {
        if (!CanCarryAnother(**it, now)) {
          Unwatch(**it);
          closing.push_back(std::move(*it));
          it = idle.erase(it);
        } else {
          next = std::min(next, (*it)->idle_since + kIdleConnectionTimeout);
          ++it;
        }
      }
    }
    return next;  // `closing` closes them, outside the lock
  }

 private:
  void Wake() {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) < 0) {
      // Only a counter at its maximum fails, and then the loop is woken already.
    }
  }

  const ApiClient* const client_;
  PollLoop* const loop_;
  const int wake_fd_;
  const int epoll_fd_;
};

ApiClient::ApiClient(ApiServerConfig config)
    : config_(std::move(config)), cancel_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ApiClient::~ApiClient() {
  idle_watch_.reset();  // off the loop before the connections it watches go
  {
    absl::MutexLock lock(&idle_mu_);
    idle_.clear();
  }
  if (cancel_fd_ >= 0) close(cancel_fd_);
}

void ApiClient::Cancel() const {
  const uint64_t one = 1;
  if (cancel_fd_ >= 0 && write(cancel_fd_, &one, sizeof(one)) < 0) {
    // Only a counter at its maximum fails, and then it is signalled already.
  }
  std::vector<std::unique_ptr<ApiConnection>> closing;  // closed outside the lock
  absl::MutexLock lock(&idle_mu_);
  for (const auto& connection : idle_) idle_watch_->Unwatch(*connection);
  closing.swap(idle_);
}

bool ApiClient::cancelled() const { return IsSignalled(cancel_fd_); }

absl::StatusOr<std::unique_ptr<ApiConnection>> ApiClient::Open(absl::Time deadline) const {
  auto connection = std::make_unique<ApiConnection>();
  Tls& tls = connection->tls;
  if (absl::Status configured = Configure(config_, tls); !configured.ok()) return configured;
  if (absl::Status connected = Connect(config_, deadline, cancel_fd_, connection->fd);
      !connected.ok()) {
    return connected;
  }

  int rc = mbedtls_ssl_setup(&tls.ssl, &tls.conf);
  const bool by_address = IsIpAddress(config_.host);
  // A DNS name goes in SNI and is checked against the certificate by mbedTLS; an address is
  // checked below, once the chain is verified. For an address the name is set to none on
  // purpose: mbedTLS >= 3.6.3 refuses to verify a server when no name was ever set.
  if (rc == 0) {
    rc = mbedtls_ssl_set_hostname(&tls.ssl, by_address ? nullptr : config_.host.c_str());
  }
  if (rc != 0) return absl::InternalError(absl::StrCat("TLS session: ", MbedError(rc)));
  connection->socket_fd = connection->fd.get();
  const int socket_fd = connection->socket_fd;
  mbedtls_ssl_set_bio(&tls.ssl, &connection->socket_fd, SendOnSocket, ReceiveFromSocket, nullptr);
  absl::StatusOr<int> handshake = Drive(socket_fd, deadline, "TLS handshake", cancel_fd_,
                                        [&] { return mbedtls_ssl_handshake(&tls.ssl); });
  if (!handshake.ok() || *handshake != 0) {
    const uint32_t flags = mbedtls_ssl_get_verify_result(&tls.ssl);
    if (flags != 0 && flags != static_cast<uint32_t>(-1)) {
      char info[512];
      mbedtls_x509_crt_verify_info(info, sizeof(info), "", flags);
      std::string reasons(info);
      while (!reasons.empty() && reasons.back() == '\n') reasons.pop_back();
      absl::StrReplaceAll({{"\n", "; "}}, &reasons);
      return absl::UnavailableError(absl::StrCat(
          "the API server at ", Endpoint(config_), " failed verification: ", reasons,
          " (check the CA, and that its certificate names ", config_.host, ")"));
    }
    return absl::Status(
        handshake.ok() ? absl::StatusCode::kUnavailable : handshake.status().code(),
        absl::StrCat("TLS with the API server at ", Endpoint(config_), " failed: ",
                     handshake.ok() ? "the connection was closed" : handshake.status().message()));
  }
  if (by_address) {
    const mbedtls_x509_crt* peer = mbedtls_ssl_get_peer_cert(&tls.ssl);
    if (peer == nullptr || !CertificateNamesAddress(*peer, config_.host)) {
      return absl::UnavailableError(absl::StrCat(
          "the API server at ", Endpoint(config_), " failed verification: its certificate does "
          "not name the address ", config_.host, " (hostname mismatch: no IP subjectAltName ",
          config_.host, ")"));
    }
  }
  return connection;
}

std::string ApiClient::RequestText(absl::string_view method, absl::string_view path,
                                   absl::string_view content_type, absl::string_view body,
                                   bool keep_alive) const {
  std::string request = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", Endpoint(config_),
                                     "\r\nUser-Agent: edgeaccel-device-plugin\r\n"
                                     "Accept: application/json\r\n",
                                     keep_alive ? "" : "Connection: close\r\n");
  const std::string token = BearerToken(config_);  // read each time: a projected token rotates
  if (!token.empty()) absl::StrAppend(&request, "Authorization: Bearer ", token, "\r\n");
  if (!content_type.empty()) absl::StrAppend(&request, "Content-Type: ", content_type, "\r\n");
  if (!body.empty() || method == "POST" || method == "PATCH" || method == "PUT") {
    absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  return request;
}

namespace {

// Writes all of `data` on the connection's TLS session within `deadline`.
absl::Status WriteAll(ApiConnection& connection, absl::string_view data, absl::Time deadline,
                      absl::string_view what, int cancel_fd) {
  size_t sent = 0;
  while (sent < data.size()) {
    absl::StatusOr<int> n = Drive(connection.socket_fd, deadline, what, cancel_fd, [&] {
      return mbedtls_ssl_write(&connection.tls.ssl,
                               reinterpret_cast<const unsigned char*>(data.data()) + sent,
                               data.size() - sent);
    });
    if (!n.ok()) return n.status();
    if (*n == 0) return absl::UnavailableError(absl::StrCat(what, ": the server closed the connection"));
    sent += *n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HttpResponse> ApiClient::Exchange(ApiConnection& connection,
                                                 const std::string& request, absl::Time deadline,
                                                 absl::string_view what, bool* received,
                                                 bool* reusable) const {
  *received = false;
  *reusable = false;
  if (absl::Status written = WriteAll(connection, request, deadline, what, cancel_fd_);
      !written.ok()) {
    return written;
  }
  mbedtls_ssl_context* ssl = &connection.tls.ssl;
  // Each read is handed to the reader once: the answer is parsed as it arrives, never again
  // from its start (reparsing is quadratic for a big answer in small TLS records).
  HttpResponseReader reader;
  size_t bytes = 0;
  char buf[16 * 1024];
  while (true) {
    absl::StatusOr<int> n = Drive(connection.socket_fd, deadline, what, cancel_fd_, [&] {
      return mbedtls_ssl_read(ssl, reinterpret_cast<unsigned char*>(buf), sizeof(buf));
    });
    if (!n.ok()) return n.status();
    if (*n == 0) {
      if (absl::Status finished = reader.Finish(); !finished.ok()) {
        return absl::Status(finished.code(), absl::StrCat(what, ": ", finished.message()));
      }
      return std::move(reader.response());
    }
    *received = true;
    bytes += *n;
    if (bytes > kMaxApiResponseBytes + 64 * 1024) {
      return absl::ResourceExhaustedError(absl::StrCat(what, ": the answer is larger than 8 MiB"));
    }
    absl::StatusOr<bool> done = reader.Feed(absl::string_view(buf, *n));
    if (!done.ok()) {
      return absl::Status(done.status().code(), absl::StrCat(what, ": ", done.status().message()));
    }
    if (*done) {
      *reusable = reader.ConnectionReusable() && mbedtls_ssl_get_bytes_avail(ssl) == 0;
      if (!*reusable) mbedtls_ssl_close_notify(ssl);  // best effort
      return std::move(reader.response());
    }
  }
}

std::unique_ptr<ApiConnection> ApiClient::TakeIdle() const {
  std::vector<std::unique_ptr<ApiConnection>> closing;  // closed outside the lock
  absl::MutexLock lock(&idle_mu_);
  const absl::Time now = absl::Now();
  while (!idle_.empty()) {
    std::unique_ptr<ApiConnection> connection = std::move(idle_.back());
    idle_.pop_back();
    idle_watch_->Unwatch(*connection);
    if (CanCarryAnother(*connection, now)) return connection;
    closing.push_back(std::move(connection));
  }
  return nullptr;
}

void ApiClient::KeepIdle(std::unique_ptr<ApiConnection> connection) const {
  connection->idle_since = absl::Now();
  std::unique_ptr<ApiConnection> oldest;  // closed outside the lock
  {
    absl::MutexLock lock(&idle_mu_);
    // Kept only where a loop will close it once the server does or its time is up; and not
    // once stopping, when nothing more will be asked.
    if (idle_watch_ == nullptr || cancelled()) return;
    idle_watch_->Watch(*connection);
    idle_.push_back(std::move(connection));
    if (idle_.size() > static_cast<size_t>(kMaxIdleConnections)) {
      idle_watch_->Unwatch(*idle_.front());
      oldest = std::move(idle_.front());
      idle_.erase(idle_.begin());
    }
  }
}

void ApiClient::WatchIdleConnections(PollLoop* loop) {
  auto watch = std::make_unique<IdleWatch>(this, loop);
  // Without its descriptors (the process at its limit) nothing is kept: a connection per request.
  if (watch->usable()) idle_watch_ = std::move(watch);
}

int ApiClient::idle_connections() const {
  absl::MutexLock lock(&idle_mu_);
  return static_cast<int>(idle_.size());
}

absl::StatusOr<HttpResponse> ApiClient::Request(absl::string_view method, absl::string_view path,
                                                absl::string_view content_type,
                                                absl::string_view body) const {
  const std::string what = absl::StrCat(method, " ", path);
  const absl::Time deadline = absl::Now() + config_.timeout;
  if (cancelled()) return Cancelled(what);
  const std::string request = RequestText(method, path, content_type, body, /*keep_alive=*/true);
  while (true) {
    std::unique_ptr<ApiConnection> connection = TakeIdle();
    const bool kept = connection != nullptr;
    if (!kept) {
      absl::StatusOr<std::unique_ptr<ApiConnection>> opened = Open(deadline);
      if (!opened.ok()) return opened.status();
      connection = *std::move(opened);
    }
    bool received = false;
    bool reusable = false;
    absl::StatusOr<HttpResponse> answer =
        Exchange(*connection, request, deadline, what, &received, &reusable);
    if (answer.ok() && reusable) KeepIdle(std::move(connection));
    // A kept connection that the server closed as the request went out (its idle timeout, met
    // between our look and our write): a replayable request is asked again, on the next kept
    // connection or a new one. A new connection's failure is the answer.
    if (!answer.ok() && kept && !received && Replayable(method) && !absl::IsCancelled(answer.status()) &&
        !absl::IsDeadlineExceeded(answer.status())) {
      continue;
    }
    return answer;
  }
}

absl::StatusOr<std::unique_ptr<WatchStream>> ApiClient::OpenWatch(absl::string_view path) const {
  const std::string what = absl::StrCat("GET ", path);
  if (cancelled()) return Cancelled(what);
  const absl::Time deadline = absl::Now() + config_.timeout;
  absl::StatusOr<std::unique_ptr<ApiConnection>> connection = Open(deadline);
  if (!connection.ok()) return connection.status();
  // Its own connection, closed with the stream: a watch lasts minutes and is never kept.
  const std::string request = RequestText("GET", path, "", "", /*keep_alive=*/false);
  if (absl::Status written = WriteAll(**connection, request, deadline, what, cancel_fd_);
      !written.ok()) {
    return written;
  }
  return std::unique_ptr<WatchStream>(
      new WatchStream(*std::move(connection), what, config_.timeout));
}

WatchStream::WatchStream(std::unique_ptr<ApiConnection> connection, std::string what,
                         absl::Duration timeout)
    : connection_(std::move(connection)),
      what_(std::move(what)),
      timeout_(timeout),
      lines_(kMaxApiResponseBytes,
             [this](absl::string_view line) {
               event_error_ = (*on_event_)(line);
               return event_error_;
             }),
      reader_([this](absl::string_view data) { return lines_.Feed(data); }) {}

WatchStream::~WatchStream() = default;

int WatchStream::fd() const { return connection_->socket_fd; }

absl::StatusOr<std::optional<HttpResponse>> WatchStream::ReadAvailable(
    const std::function<absl::Status(absl::string_view event)>& on_event) {
  if (end_.has_value()) {
    if (!end_->ok()) return end_->status();
    return std::optional<HttpResponse>(**end_);
  }
  on_event_ = &on_event;
  mbedtls_ssl_context* ssl = &connection_->tls.ssl;
  char buf[16 * 1024];
  // Until the socket has nothing more: what mbedTLS has decrypted and kept is read too, so
  // nothing that came waits for the next poll.
  while (!end_.has_value()) {
    const int n = mbedtls_ssl_read(ssl, reinterpret_cast<unsigned char*>(buf), sizeof(buf));
    if (n > 0) {
      absl::StatusOr<bool> done = reader_.Feed(absl::string_view(buf, n));
      if (!done.ok()) {
        end_ = !event_error_.ok() ? event_error_
                                  : absl::Status(done.status().code(),
                                                 absl::StrCat(what_, ": ", done.status().message()));
      } else if (*done) {
        mbedtls_ssl_close_notify(ssl);  // best effort
        end_ = std::move(reader_.response());
      }
      continue;
    }
    const TlsNext next = n == 0 ? TlsNext::kPeerClosed : TlsNextAfter(n);
    if (next == TlsNext::kReadable) break;  // all read: the loop's poll says when more comes
    switch (next) {
      case TlsNext::kStepAgain:
      case TlsNext::kReadable:
        break;
      case TlsNext::kWritable:
        // The session has to send before it can read on: rare, and bounded as a request's write.
        if (absl::Status waited = WaitFor(fd(), POLLOUT, absl::Now() + timeout_, what_, -1);
            !waited.ok()) {
          end_ = waited;
        }
        break;
      case TlsNext::kPeerClosed: {
        absl::Status finished = reader_.Finish();
        end_ = finished.ok()
                   ? absl::StatusOr<HttpResponse>(std::move(reader_.response()))
                   : absl::Status(finished.code(), absl::StrCat(what_, ": ", finished.message()));
        break;
      }
      case TlsNext::kFailed:
        end_ = TlsFailure(n, what_);
        break;
    }
  }
  on_event_ = nullptr;
  if (!end_.has_value()) return std::optional<HttpResponse>();
  if (!end_->ok()) return end_->status();
  return std::optional<HttpResponse>(**end_);
}

}  // namespace edgeaccel
