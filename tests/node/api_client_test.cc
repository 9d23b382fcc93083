// ApiClient against real TLS servers on loopback (cpp-httplib's, and bare sockets that misbehave),
// and its answer parser on what servers send.
#include "edgeaccel/node/api_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "edgeaccel/host/poll_loop.h"
#include "eventually.h"
#include "fixture_host.h"
#include "https_server_test.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::ApiServerConfigFor;
using ::edgeaccel::testing::HttpsServerTest;
using ::edgeaccel::testing::ListenInBackground;
using ::edgeaccel::testing::MakeSelfSignedCertificate;
using ::edgeaccel::testing::ReadWatch;
using ::edgeaccel::testing::SilentTcpServer;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestApiServer;
using ::testing::HasSubstr;

constexpr size_t kManyChunksBytes = 4 << 20;

class ApiClientTest : public HttpsServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(HttpsServerTest::SetUp());
    server_->set_tcp_nodelay(true);  // as Go's server: every answer goes out at once
    // Each connection by its client port: how many the client opened.
    server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response&) {
      absl::MutexLock lock(&ports_mu_);
      ports_.insert(req.remote_port);
      return httplib::Server::HandlerResponse::Unhandled;
    });
    server_->Get("/plain", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("{\"auth\":\"" + req.get_header_value("Authorization") + "\"}",
                      "application/json");
    });
    server_->Get("/chunked", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
        if (offset < 3000) {
          const std::string part(1000, 'x');
          sink.write(part.data(), part.size());
        } else {
          sink.done();
        }
        return true;
      });
    });
    // 4 MiB in 256-byte chunks: one TLS record, one read, each.
    server_->Get("/many-chunks", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
        if (offset < kManyChunksBytes) {
          const std::string part(256, 'y');
          sink.write(part.data(), part.size());
        } else {
          sink.done();
        }
        return true;
      });
    });
    // A watch: three events, the second cut across two chunks, then the end of the stream.
    server_->Get("/watch", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
        static const std::vector<std::string> kParts = {
            "{\"type\":\"ADDED\"}\n{\"type\":", "\"MODIFIED\"}\n", "{\"type\":\"DELETED\"}\n"};
        size_t at = 0;
        for (const std::string& part : kParts) {
          if (offset == at) {
            sink.write(part.data(), part.size());
            return true;
          }
          at += part.size();
        }
        sink.done();
        return true;
      });
    });
    // A watch that sends one event and then nothing until the client goes.
    server_->Get("/watch-quiet", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
        if (offset == 0) {
          const std::string event = "{\"type\":\"ADDED\"}\n";
          sink.write(event.data(), event.size());
        } else {
          absl::SleepFor(absl::Milliseconds(20));
        }
        return sink.is_writable();
      });
    });
    server_->Get("/watch-forbidden", [](const httplib::Request&, httplib::Response& res) {
      res.status = 403;
      res.set_content("{\"kind\":\"Status\",\"code\":403}", "application/json");
    });
    server_->Patch("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.status = 201;
      res.set_content(req.get_header_value("Content-Type") + " " + req.body, "text/plain");
    });
    Listen();
  }

  int connections() {
    absl::MutexLock lock(&ports_mu_);
    return static_cast<int>(ports_.size());
  }

  absl::Mutex ports_mu_;
  std::set<int> ports_ ABSL_GUARDED_BY(ports_mu_);
};

// HTTP/1.1 keep-alive: answers that leave the connection open share it, whatever the method,
// until the server says Connection: close (cpp-httplib does after a connection's 5th request,
// as set here); an answer read to the connection's end is never followed by another request.
TEST_F(ApiClientTest, RequestsShareAConnectionUntilTheServerClosesIt) {
  server_->set_keep_alive_max_count(5);  // cpp-httplib 0.11's default; later ones allow 100
  PollLoop loop("ea-loop");
  ApiClient client(Config());
  client.WatchIdleConnections(&loop);
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<HttpResponse> response = client.Request("GET", i % 2 == 0 ? "/plain" : "/chunked");
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->status, 200);
  }
  EXPECT_EQ(connections(), 1) << "four answers, one connection (a chunked one too)";
  EXPECT_EQ(client.idle_connections(), 1);
  absl::StatusOr<HttpResponse> patched = client.Request("PATCH", "/echo", "text/plain", "x");
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(patched->body, "text/plain x");
  EXPECT_EQ(connections(), 1);
  EXPECT_EQ(client.idle_connections(), 0) << "the 5th answer said Connection: close";
  ASSERT_TRUE(client.Request("GET", "/plain").ok());
  EXPECT_EQ(connections(), 2);
  EXPECT_EQ(client.idle_connections(), 1);
  client.Cancel();
  EXPECT_EQ(client.idle_connections(), 0) << "a cancelled client keeps nothing";
}

// A client on no loop keeps nothing: each request has its own connection, closed after it.
TEST_F(ApiClientTest, WithoutALoopEachRequestHasItsOwnConnection) {
  ApiClient client(Config());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client.Request("GET", "/plain").ok());
  EXPECT_EQ(client.idle_connections(), 0);
  EXPECT_EQ(connections(), 3);
}

// Requests at once each get a connection; what they leave open is kept up to the limit.
TEST_F(ApiClientTest, ConcurrentRequestsKeepAtMostTheLimit) {
  PollLoop loop("ea-loop");
  ApiClient client(Config());
  client.WatchIdleConnections(&loop);
  std::vector<std::thread> requests;
  std::atomic<int> good{0};
  for (int i = 0; i < 6; ++i) {
    requests.emplace_back([&] {
      absl::StatusOr<HttpResponse> response = client.Request("GET", "/many-chunks");
      if (response.ok() && response->status == 200) good.fetch_add(1);
    });
  }
  for (std::thread& request : requests) request.join();
  EXPECT_EQ(good.load(), 6);
  EXPECT_LE(client.idle_connections(), kMaxIdleConnections);
  EXPECT_GE(client.idle_connections(), 1);
}

// On a loop, a kept connection the server closes (its idle timeout; cpp-httplib's is set to 1 s
// here) is closed at once; the next request opens a new one.
TEST_F(ApiClientTest, TheLoopClosesAConnectionTheServerClosed) {
  server_->set_keep_alive_timeout(1);
  PollLoop loop("ea-loop");
  ApiClient client(Config());
  client.WatchIdleConnections(&loop);
  ASSERT_TRUE(client.Request("GET", "/plain").ok());
  EXPECT_EQ(client.idle_connections(), 1);
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return client.idle_connections() == 0; },
                                               absl::Seconds(10)))
      << "the server's close was seen";
  absl::StatusOr<HttpResponse> response = client.Request("GET", "/plain");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(connections(), 2);
}

TEST_F(ApiClientTest, GetSendsTheTokenAndReadsTheAnswer) {
  absl::StatusOr<HttpResponse> response = ApiClient(Config()).Request("GET", "/plain");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->content_type, "application/json");
  EXPECT_EQ(response->body, "{\"auth\":\"Bearer secret-token\"}");
}

TEST_F(ApiClientTest, ChunkedAnswersAreDecoded) {
  absl::StatusOr<HttpResponse> response = ApiClient(Config()).Request("GET", "/chunked");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, std::string(3000, 'x'));
}

TEST_F(ApiClientTest, PatchSendsItsBodyAndAnyStatusIsAnAnswer) {
  absl::StatusOr<HttpResponse> response =
      ApiClient(Config()).Request("PATCH", "/echo", "application/merge-patch+json", "{\"a\":1}");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, "application/merge-patch+json {\"a\":1}");
  response = ApiClient(Config()).Request("GET", "/nowhere");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 404);
}

TEST_F(ApiClientTest, InlineCaDataAndClientCertificate) {
  ApiServerConfig config = Config();
  std::ifstream ca(dir_.path() + "/server.crt");
  config.ca_pem.assign(std::istreambuf_iterator<char>(ca), {});
  config.ca_file = "/nonexistent";
  EXPECT_TRUE(ApiClient(config).Request("GET", "/plain").ok());
  config.ca_pem = "not a certificate";
  EXPECT_THAT(std::string(ApiClient(config).Request("GET", "/plain").status().message()),
              HasSubstr("holds no PEM certificate"));
  config = Config();
  config.client_cert_pem = "garbage";
  config.client_key_pem = "garbage";
  EXPECT_THAT(std::string(ApiClient(config).Request("GET", "/plain").status().message()),
              HasSubstr("client certificate or key"));
}

TEST_F(ApiClientTest, AnUnknownCaIsRefusedBeforeAnythingIsSent) {
  absl::Status status = ApiClient(Config("other")).Request("GET", "/plain").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("failed verification"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("not correctly signed by the trusted CA"));
}

TEST_F(ApiClientTest, ANameTheCertificateDoesNotCarryIsRefused) {
  ApiServerConfig config = Config();
  config.host = "localhost";  // resolves to the server, but its certificate names 127.0.0.1 only
  absl::Status status = ApiClient(config).Request("GET", "/plain").status();
  EXPECT_THAT(std::string(status.message()), HasSubstr("failed verification"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("does not match"));
}

// Reached by IP address (as in a pod: KUBERNETES_SERVICE_HOST), the certificate must carry that
// address as an IP subjectAltName; a CN or a DNS name that reads like it does not count.
TEST(ApiClientAddressTest, AnAddressMustBeAnIpSubjectAltName) {
  TempDir dir;
  ASSERT_TRUE(MakeSelfSignedCertificate(dir.path(), "s", "DNS:127.0.0.1,DNS:localhost"));
  httplib::SSLServer server((dir.path() + "/s.crt").c_str(), (dir.path() + "/s.key").c_str());
  server.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "a/b"); });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread = ListenInBackground(server);
  ApiServerConfig config;
  config.host = "127.0.0.1";
  config.port = port;
  config.ca_file = dir.path() + "/s.crt";
  config.timeout = absl::Seconds(5);
  absl::Status status = ApiClient(config).Request("GET", "/").status();
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("its certificate does not name the address 127.0.0.1"));
  config.host = "localhost";  // the DNS name it does carry: accepted
  absl::StatusOr<HttpResponse> by_name = ApiClient(config).Request("GET", "/");
  EXPECT_TRUE(by_name.ok()) << by_name.status();
  server.stop();
  thread.join();
}

TEST_F(ApiClientTest, BadConfigurationIsAClearError) {
  ApiServerConfig config = Config();
  config.ca_file = dir_.path() + "/missing-ca.crt";
  EXPECT_THAT(std::string(ApiClient(config).Request("GET", "/plain").status().message()),
              HasSubstr("cannot read the API server's CA file " + config.ca_file +
                        ": No such file or directory"));
  config = Config();
  config.host = "api.invalid";  // RFC 6761: never resolves
  EXPECT_THAT(std::string(ApiClient(config).Request("GET", "/plain").status().message()),
              HasSubstr("cannot resolve the API server's name api.invalid"));
  config = Config();
  config.port = 1;  // nothing listens there
  EXPECT_THAT(std::string(ApiClient(config).Request("GET", "/plain").status().message()),
              HasSubstr("cannot connect to the API server at 127.0.0.1:1: Connection refused"));
}

// An answer arrives in as many reads as the server made TLS records. Each read used to parse the
// whole answer again (and decode every chunk so far): quadratic, minutes for 4 MiB in 256-byte
// chunks. Read once, it takes a fraction of a second.
TEST_F(ApiClientTest, ALargeAnswerInSmallPiecesIsReadWithinTheDeadline) {
  // A deadline far below the old reader's minutes and far above a sanitizer build's seconds
  // (both ends of the 16,384 TLS records are instrumented there).
  ApiServerConfig config = Config();
  config.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<HttpResponse> response = ApiClient(config).Request("GET", "/many-chunks");
  ASSERT_TRUE(response.ok()) << response.status() << " after " << absl::Now() - start;
  EXPECT_EQ(response->body.size(), kManyChunksBytes);
  EXPECT_EQ(response->body.find_first_not_of('y'), std::string::npos);
  // Within the request's own timeout (the old reader took a minute here: the deadline was
  // looked at only while waiting, and a server that keeps sending never makes us wait).
  EXPECT_LT(absl::Now() - start, config.timeout);
}

// A listening socket whose accept queue is full: a connect to it never completes (the kernel
// drops the SYN), as to an address behind a dead route. Needs no root, no route, no firewall.
class NeverAnswers {
 public:
  NeverAnswers(const std::string& address, int port) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
    bound_ = bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
             listen(listener_, 0) == 0;
    // Connect until one stays pending: the queue is full (Linux takes backlog + 1, gVisor 1).
    for (int i = 0; bound_ && i < 16 && !full_; ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      fillers_.push_back(fd);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) continue;
      pollfd p{fd, POLLOUT, 0};
      full_ = errno == EINPROGRESS && poll(&p, 1, 300) == 0;
    }
  }
  ~NeverAnswers() {
    for (int fd : fillers_) close(fd);
    close(listener_);
  }
  bool ready() const { return bound_ && full_; }

 private:
  int listener_ = -1;
  bool bound_ = false;
  bool full_ = false;
  std::vector<int> fillers_;
};

// A name with several addresses whose first never answers: the next is tried within the
// deadline (each gets its share, as Go's net.Dialer gives client-go's), not given up on.
TEST_F(ApiClientTest, AnAddressThatNeverAnswersIsPassedOver) {
  NeverAnswers dead("127.0.0.2", port_);
  ASSERT_TRUE(dead.ready());
  const absl::Time start = absl::Now();
  absl::StatusOr<int> fd =
      ConnectToAny({"127.0.0.2", "127.0.0.1"}, port_, start + absl::Seconds(4));
  ASSERT_TRUE(fd.ok()) << fd.status() << " after " << absl::Now() - start;
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  ASSERT_EQ(getpeername(*fd, reinterpret_cast<sockaddr*>(&peer), &len), 0);
  EXPECT_EQ(peer.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  close(*fd);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));

  // Every address silent: one error, at the deadline, not later.
  NeverAnswers dead_too("127.0.0.3", port_);
  ASSERT_TRUE(dead_too.ready());
  const absl::Time again = absl::Now();
  absl::StatusOr<int> none =
      ConnectToAny({"127.0.0.2", "127.0.0.3"}, port_, again + absl::Milliseconds(600));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("cannot connect to the API server at 127.0.0.2:" + std::to_string(port_)));
  EXPECT_LT(absl::Now() - again, absl::Seconds(2));

  // A refusal is passed over at once: it costs no share of the deadline (a minute: half of it for
  // each address), so both calls end far sooner than one share.
  const absl::Time refused = absl::Now();
  fd = ConnectToAny({"127.0.0.1", "127.0.0.1"}, 1, refused + absl::Minutes(1));
  EXPECT_THAT(std::string(fd.status().message()), HasSubstr("Connection refused"));
  fd = ConnectToAny({"127.0.0.4", "127.0.0.1"}, port_, refused + absl::Minutes(1));
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  EXPECT_LT(absl::Now() - refused, absl::Seconds(15));
}

// A server that accepts and never answers: the client gives up at its deadline.
TEST(ApiClientSilentServerTest, ASilentServerTimesOut) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  ApiServerConfig config;
  config.host = "127.0.0.1";
  config.port = ntohs(addr.sin_port);
  config.timeout = absl::Milliseconds(300);
  TempDir dir;
  ASSERT_TRUE(MakeSelfSignedCertificate(dir.path(), "ca"));
  config.ca_file = dir.path() + "/ca.crt";
  const absl::Time start = absl::Now();
  absl::Status status = ApiClient(config).Request("GET", "/").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("TLS handshake: timed out"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Opening a watch, whose answer may last minutes, gets the configured timeout to connect and
  // shake hands as a request does: a server that never answers is an error soon.
  const absl::Time watched = absl::Now();
  status = ApiClient(config).OpenWatch("/?watch=true").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("TLS handshake: timed out"));
  EXPECT_LT(absl::Now() - watched, absl::Seconds(2));
  close(listener);
}

// Cancel ends a request in flight at once (here held in its TLS handshake by a server that never
// answers, with a minute left of its timeout), and every later request fails before it connects.
TEST(ApiClientSilentServerTest, CancelEndsARequestInFlightAndEveryLaterOne) {
  SilentTcpServer silent;
  TempDir dir;
  const ApiServerConfig config = ApiServerConfigFor(silent.port(), dir.path(), absl::Minutes(1));
  ASSERT_FALSE(config.host.empty());
  ApiClient client(config);
  absl::Status in_flight;
  absl::Time ended;
  std::thread request([&] {
    in_flight = client.Request("GET", "/api/v1/nodes/n").status();
    ended = absl::Now();
  });
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10)));
  EXPECT_FALSE(client.cancelled());
  const absl::Time cancelled = absl::Now();
  client.Cancel();
  request.join();
  EXPECT_EQ(in_flight.code(), absl::StatusCode::kCancelled) << in_flight;
  EXPECT_THAT(std::string(in_flight.message()), HasSubstr("cancelled (stopping)"));
  // Half the minute its timeout would have taken: the cancel ended it, whatever the machine's load.
  EXPECT_LT(ended - cancelled, absl::Seconds(30));
  EXPECT_TRUE(client.cancelled());
  absl::Status later = client.Request("GET", "/api/v1/nodes/n").status();
  EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
  EXPECT_FALSE(silent.WaitForConnections(2, absl::Milliseconds(200))) << "it connected again";
}

// A TLS server that answers every request with "{}" and keeps the connection, but reads the
// second request of each connection and closes the connection unanswered: a server whose idle
// timeout closes a kept connection just as the client's next request goes out on it. Connections
// are served one at a time, in the order they come.
class ClosingSecondRequestServer {
 public:
  explicit ClosingSecondRequestServer(const std::string& dir) : ctx_(SSL_CTX_new(TLS_server_method())) {
    if (SSL_CTX_use_certificate_chain_file(ctx_, (dir + "/server.crt").c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx_, (dir + "/server.key").c_str(), SSL_FILETYPE_PEM) != 1) {
      abort();
    }
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listener_, 8) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      abort();
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~ClosingSecondRequestServer() {
    shutdown(listener_, SHUT_RDWR);  // accept() returns
    thread_.join();
    close(listener_);
    SSL_CTX_free(ctx_);
  }
  int port() const { return port_; }
  // Each request's method, in the order read, and the connections accepted.
  std::vector<std::string> methods() {
    absl::MutexLock lock(&mu_);
    return methods_;
  }
  int connections() {
    absl::MutexLock lock(&mu_);
    return connections_;
  }

 private:
  void Run() {
    while (true) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      {
        absl::MutexLock lock(&mu_);
        ++connections_;
      }
      SSL* ssl = SSL_new(ctx_);
      SSL_set_fd(ssl, fd);
      if (SSL_accept(ssl) == 1) Serve(ssl);
      SSL_shutdown(ssl);  // close_notify, then FIN
      SSL_free(ssl);
      close(fd);
    }
  }
  void Serve(SSL* ssl) {
    std::string pending;
    for (int n = 1;; ++n) {
      size_t end;
      while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
        char buf[4096];
        const int got = SSL_read(ssl, buf, sizeof(buf));
        if (got <= 0) return;  // the client went
        pending.append(buf, got);
      }
      size_t length = 0;
      const size_t at = absl::AsciiStrToLower(pending.substr(0, end)).find("content-length:");
      if (at != std::string::npos) length = std::stoul(pending.substr(at + 15));
      while (pending.size() < end + 4 + length) {
        char buf[4096];
        const int got = SSL_read(ssl, buf, sizeof(buf));
        if (got <= 0) return;
        pending.append(buf, got);
      }
      {
        absl::MutexLock lock(&mu_);
        methods_.push_back(pending.substr(0, pending.find(' ')));
      }
      pending.erase(0, end + 4 + length);
      if (n == 2) return;  // read, and closed unanswered
      static constexpr char kAnswer[] =
          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
      if (SSL_write(ssl, kAnswer, sizeof(kAnswer) - 1) <= 0) return;
    }
  }

  SSL_CTX* const ctx_;
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> methods_ ABSL_GUARDED_BY(mu_);
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
};

// A kept connection that the server closes once the request went out on it, with nothing of an
// answer: a GET is asked again on a new connection and answered; a POST is not repeated (it may
// have been carried out) and is an error that says what happened, for its caller to retry.
TEST(ApiClientKeptConnectionTest, AGetIsAskedAgainOnANewConnectionAPostIsNot) {
  TempDir dir;
  ASSERT_TRUE(MakeSelfSignedCertificate(dir.path(), "server"));
  ClosingSecondRequestServer server(dir.path());
  ApiServerConfig config;
  config.host = "127.0.0.1";
  config.port = server.port();
  config.ca_file = dir.path() + "/server.crt";
  config.timeout = absl::Seconds(5);
  PollLoop loop("ea-loop");
  ApiClient client(config);
  client.WatchIdleConnections(&loop);
  ASSERT_TRUE(client.Request("GET", "/a").ok());
  EXPECT_EQ(client.idle_connections(), 1);
  absl::StatusOr<HttpResponse> again = client.Request("GET", "/b");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->body, "{}");
  EXPECT_EQ(server.connections(), 2);
  EXPECT_EQ(server.methods(), (std::vector<std::string>{"GET", "GET", "GET"}));

  absl::StatusOr<HttpResponse> posted = client.Request("POST", "/c", "application/json", "{}");
  ASSERT_FALSE(posted.ok()) << "a POST is not repeated";
  EXPECT_THAT(std::string(posted.status().message()), HasSubstr("POST /c"));
  EXPECT_THAT(std::string(posted.status().message()),
              HasSubstr("the server closed the connection without an answer"));
  EXPECT_EQ(server.methods(), (std::vector<std::string>{"GET", "GET", "GET", "POST"}));
  ASSERT_TRUE(client.Request("POST", "/c", "application/json", "{}").ok()) << "its retry, on a new connection";
  EXPECT_EQ(server.connections(), 3);
}

// The API server stand-in that the node and e2e tests point the daemon at answers as the real
// one does, so a request the real one refuses fails there too: checked with the client itself.
class TestApiServerTest : public ::testing::Test {
 protected:
  ApiServerConfig Config() {
    ApiServerConfig config;
    config.host = "127.0.0.1";
    config.port = api_.port();
    config.ca_file = api_.ca_file();
    config.token_file = api_.token_file();
    config.timeout = absl::Seconds(5);
    return config;
  }
  // The answer's status and, for an error, its Status reason.
  std::pair<int, std::string> Call(const std::string& method, const std::string& path,
                                   const std::string& type = "", const std::string& body = "",
                                   std::optional<ApiServerConfig> config = std::nullopt) {
    absl::StatusOr<HttpResponse> response =
        ApiClient(config.value_or(Config())).Request(method, path, type, body);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {0, ""};
    last_body_ = nlohmann::json::parse(response->body, nullptr, false);
    std::string reason;
    if (last_body_.is_object() && last_body_.value("kind", "") == "Status") {
      reason = last_body_.value("reason", "");
    }
    return {response->status, reason};
  }
  std::string NodeLabel(const std::string& key) {
    Call("GET", kNode);
    return last_body_["metadata"]["labels"].value(key, "");
  }
  std::string NodeVersion() {
    Call("GET", kNode);
    return last_body_["metadata"]["resourceVersion"];
  }

  static constexpr char kNode[] = "/api/v1/nodes/node-1";
  static constexpr char kMerge[] = "application/merge-patch+json";
  TestApiServer api_;
  nlohmann::json last_body_;
};

using Answer = std::pair<int, std::string>;

TEST_F(TestApiServerTest, ABadTokenIs401AndNoTokenIsAnonymous) {
  ApiServerConfig config = Config();
  config.token = "not-the-token";
  EXPECT_EQ(Call("GET", kNode, "", "", config), Answer(401, "Unauthorized"));
  EXPECT_EQ(Call("PATCH", kNode, kMerge, R"({"metadata":{"labels":{"a":"b"}}})", config),
            Answer(401, "Unauthorized"));
  config.token.clear();
  config.token_file.clear();
  EXPECT_EQ(Call("GET", kNode, "", "", config), Answer(403, "Forbidden"));
  EXPECT_THAT(last_body_.value("message", ""), HasSubstr("system:anonymous"));
  EXPECT_EQ(NodeLabel("a"), "");
  EXPECT_EQ(Call("GET", kNode), Answer(200, ""));
}

TEST_F(TestApiServerTest, APatchOfAnotherContentTypeIs415) {
  for (const char* type : {"application/json", "text/plain", ""}) {
    EXPECT_EQ(Call("PATCH", kNode, type, R"({"metadata":{"labels":{"a":"b"}}})"),
              Answer(415, "UnsupportedMediaType")) << type;
    // Before the name is looked up: 415, not 404, for an Event that does not exist.
    EXPECT_EQ(Call("PATCH", "/api/v1/namespaces/default/events/gone", type, R"({"count":2})"),
              Answer(415, "UnsupportedMediaType")) << type;
  }
  EXPECT_EQ(NodeLabel("a"), "");
  EXPECT_EQ(Call("PATCH", kNode, "application/merge-patch+json; charset=utf-8",
                 R"({"metadata":{"labels":{"a":"b"}}})"), Answer(200, ""));
  EXPECT_EQ(Call("PATCH", kNode, "application/strategic-merge-patch+json",
                 R"({"metadata":{"labels":{"a":"c"}}})"), Answer(200, ""));
  EXPECT_EQ(Call("PATCH", kNode, "application/json-patch+json",
                 R"([{"op":"replace","path":"/metadata/labels/a","value":"d"}])"), Answer(200, ""));
  EXPECT_EQ(NodeLabel("a"), "d");
}

TEST_F(TestApiServerTest, AMalformedBodyIs400) {
  for (const char* body : {"{not json", "[1]", "\"a\"", ""}) {
    EXPECT_EQ(Call("PATCH", kNode, kMerge, body), Answer(400, "BadRequest")) << body;
    EXPECT_EQ(Call("POST", "/api/v1/namespaces/default/events", "application/json", body),
              Answer(400, "BadRequest")) << body;
    EXPECT_EQ(Call("PUT", kNode, "application/json", body), Answer(400, "BadRequest")) << body;
  }
  EXPECT_EQ(Call("PATCH", kNode, "application/json-patch+json", R"({"op":"add"})"),
            Answer(400, "BadRequest"));
  // A well-formed JSON patch that does not apply is 422.
  EXPECT_EQ(Call("PATCH", kNode, "application/json-patch+json",
                 R"([{"op":"test","path":"/metadata/name","value":"other"}])"),
            Answer(422, "Invalid"));
  Call("GET", kNode);
  EXPECT_EQ(last_body_["metadata"]["name"], "node-1");
  EXPECT_EQ(last_body_["metadata"]["labels"], nlohmann::json::object());
}

TEST_F(TestApiServerTest, AStaleResourceVersionIs409) {
  const std::string first = NodeVersion();
  EXPECT_EQ(Call("PATCH", kNode, kMerge,
                 R"({"metadata":{"resourceVersion":")" + first + R"(","labels":{"a":"1"}}})"),
            Answer(200, ""));
  const std::string second = NodeVersion();
  EXPECT_NE(second, first);
  // Written against the first version, which is gone.
  EXPECT_EQ(Call("PATCH", kNode, kMerge,
                 R"({"metadata":{"resourceVersion":")" + first + R"(","labels":{"a":"2"}}})"),
            Answer(409, "Conflict"));
  EXPECT_THAT(last_body_.value("message", ""), HasSubstr("the object has been modified"));
  EXPECT_EQ(Call("PUT", kNode, "application/json",
                 R"({"metadata":{"name":"node-1","resourceVersion":")" + first +
                     R"(","labels":{"a":"3"}}})"),
            Answer(409, "Conflict"));
  EXPECT_EQ(NodeLabel("a"), "1");
  // The current version, or none (unconditional, as nodes and events allow), is written.
  EXPECT_EQ(Call("PUT", kNode, "application/json",
                 R"({"metadata":{"name":"node-1","resourceVersion":")" + second +
                     R"(","labels":{"a":"4"}}})"),
            Answer(200, ""));
  EXPECT_EQ(Call("PATCH", kNode, kMerge, R"({"metadata":{"labels":{"a":"5"}}})"), Answer(200, ""));
  EXPECT_EQ(NodeLabel("a"), "5");
}

TEST_F(ApiClientTest, AWatchHandsOverEachEventAsItsLineArrives) {
  std::vector<std::string> events;
  absl::StatusOr<HttpResponse> response =
      ReadWatch(ApiClient(Config()), "/watch", absl::Now() + absl::Seconds(5), [&](absl::string_view event) {
        events.emplace_back(event);
        return absl::OkStatus();
      });
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_TRUE(response->body.empty()) << "the events went to the callback";
  EXPECT_THAT(events, ::testing::ElementsAre("{\"type\":\"ADDED\"}", "{\"type\":\"MODIFIED\"}",
                                             "{\"type\":\"DELETED\"}"));
}

// The event callback's error ends the stream: it is returned as it is, then at every later read.
TEST_F(ApiClientTest, AnEventCallbacksErrorEndsTheWatchAsItIs) {
  ApiClient client(Config());
  const absl::Status enough = absl::AbortedError("enough");
  absl::StatusOr<HttpResponse> response = ReadWatch(client, "/watch-quiet", absl::Now() + absl::Seconds(5),
                                                    [&](absl::string_view) { return enough; });
  EXPECT_EQ(response.status(), enough);
  absl::StatusOr<std::unique_ptr<WatchStream>> stream = client.OpenWatch("/watch-quiet");
  ASSERT_TRUE(stream.ok()) << stream.status();
  int events = 0;
  absl::StatusOr<std::optional<HttpResponse>> read = std::optional<HttpResponse>();
  while (read.ok() && !read->has_value()) {
    pollfd readable{(*stream)->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&readable, 1, 5000), 1);
    read = (*stream)->ReadAvailable([&](absl::string_view) {
      ++events;
      return enough;
    });
  }
  EXPECT_EQ(read.status(), enough);
  EXPECT_EQ(events, 1);
  read = (*stream)->ReadAvailable([&](absl::string_view) {
    ++events;
    return absl::OkStatus();
  });
  EXPECT_EQ(read.status(), enough) << "done: the same error";
  EXPECT_EQ(events, 1);
}

// An opened watch is read by whoever polls its descriptor: each read takes what has come and
// returns at once, the event first, then nothing while the server is quiet; the answer once the
// server ends it; and the same answer again after that.
TEST_F(ApiClientTest, AnOpenWatchIsReadAsItArrivesWithoutWaiting) {
  ApiClient client(Config());
  absl::StatusOr<std::unique_ptr<WatchStream>> quiet = client.OpenWatch("/watch-quiet");
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  std::vector<std::string> events;
  auto keep = [&](absl::string_view event) {
    events.emplace_back(event);
    return absl::OkStatus();
  };
  pollfd readable{(*quiet)->fd(), POLLIN, 0};
  ASSERT_EQ(poll(&readable, 1, 5000), 1);
  while (events.empty()) {
    absl::StatusOr<std::optional<HttpResponse>> read = (*quiet)->ReadAvailable(keep);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_FALSE(read->has_value()) << "the quiet watch does not end";
    if (events.empty()) ASSERT_EQ(poll(&readable, 1, 5000), 1);
  }
  EXPECT_THAT(events, ::testing::ElementsAre("{\"type\":\"ADDED\"}"));
  const absl::Time before = absl::Now();
  absl::StatusOr<std::optional<HttpResponse>> read = (*quiet)->ReadAvailable(keep);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->has_value());
  // The watch stays quiet for the rest of the test: a read that waited would never return.
  EXPECT_LT(absl::Now() - before, absl::Seconds(30)) << "nothing came: it returned, not waited";
  EXPECT_EQ(events.size(), 1u);

  absl::StatusOr<std::unique_ptr<WatchStream>> ended = client.OpenWatch("/watch");
  ASSERT_TRUE(ended.ok()) << ended.status();
  events.clear();
  std::optional<HttpResponse> answer;
  while (!answer.has_value()) {
    pollfd more{(*ended)->fd(), POLLIN, 0};
    ASSERT_EQ(poll(&more, 1, 5000), 1);
    read = (*ended)->ReadAvailable(keep);
    ASSERT_TRUE(read.ok()) << read.status();
    answer = *read;
  }
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(events.size(), 3u);
  read = (*ended)->ReadAvailable(keep);
  ASSERT_TRUE(read.ok() && read->has_value()) << "done: the same answer";
  EXPECT_EQ((*read)->status, 200);
}

TEST_F(ApiClientTest, AWatchRefusedIsAnsweredWhole) {
  absl::StatusOr<HttpResponse> response =
      ReadWatch(ApiClient(Config()), "/watch-forbidden", absl::Now() + absl::Seconds(5),
                [](absl::string_view) { return absl::InternalError("no event expected"); });
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 403);
  EXPECT_THAT(response->body, HasSubstr("\"code\":403"));
}

TEST(LineSplitterTest, LinesAreWholeHoweverTheStreamIsCut) {
  const std::string stream = "{\"a\":1}\r\n\n{\"b\":2}\n{\"c\"";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    std::vector<std::string> lines;
    LineSplitter splitter(64, [&](absl::string_view line) {
      lines.emplace_back(line);
      return absl::OkStatus();
    });
    ASSERT_TRUE(splitter.Feed(absl::string_view(stream).substr(0, cut)).ok());
    ASSERT_TRUE(splitter.Feed(absl::string_view(stream).substr(cut)).ok());
    EXPECT_THAT(lines, ::testing::ElementsAre("{\"a\":1}", "{\"b\":2}")) << "cut at " << cut;
  }
  LineSplitter small(4, [](absl::string_view) { return absl::OkStatus(); });
  EXPECT_TRUE(small.Feed("abcd").ok());
  EXPECT_EQ(small.Feed("e").code(), absl::StatusCode::kResourceExhausted) << "a line over the bound";
}

TEST(ParseHttpResponseTest, WhatServersSend) {
  absl::StatusOr<HttpResponse> r =
      ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: a/b\r\n\r\n{}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{}");
  r = ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "abcde");
  r = ParseHttpResponse("HTTP/1.0 403 Forbidden\r\n\r\nno");  // read to the end
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(r->body, "no");
}

// The reader gets the answer in whatever pieces TLS records cut it into: every cut gives what
// the whole gives, answer or error.
TEST(HttpResponseReaderTest, AnyCutGivesWhatTheWholeGives) {
  const std::vector<std::string> answers = {
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: a/b\r\n\r\nhello",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n\r\n0\r\n\r\n",
      "HTTP/1.0 403 Forbidden\r\n\r\nno",
      "HTTP/1.1 204 No Content\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
      "SSH-2.0-OpenSSH\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Le",
  };
  for (const std::string& answer : answers) {
    const absl::StatusOr<HttpResponse> whole = ParseHttpResponse(answer);
    auto same = [&](absl::StatusOr<HttpResponse> pieces, const std::string& how) {
      ASSERT_EQ(pieces.ok(), whole.ok())
          << how << ": " << pieces.status() << " / " << whole.status();
      if (!whole.ok()) {
        EXPECT_EQ(pieces.status(), whole.status()) << how;
        return;
      }
      EXPECT_EQ(pieces->status, whole->status) << how;
      EXPECT_EQ(pieces->content_type, whole->content_type) << how;
      EXPECT_EQ(pieces->body, whole->body) << how;
    };
    auto read = [](const std::vector<absl::string_view>& pieces) -> absl::StatusOr<HttpResponse> {
      HttpResponseReader reader;
      for (absl::string_view piece : pieces) {
        absl::StatusOr<bool> done = reader.Feed(piece);
        if (!done.ok()) return done.status();
        if (*done) return reader.response();
      }
      if (absl::Status finished = reader.Finish(); !finished.ok()) return finished;
      return reader.response();
    };
    const absl::string_view all = answer;
    for (size_t cut = 0; cut <= all.size(); ++cut) {
      same(read({all.substr(0, cut), all.substr(cut)}), absl::StrCat(all, " cut at ", cut));
    }
    std::vector<absl::string_view> bytes;
    for (size_t i = 0; i < all.size(); ++i) bytes.push_back(all.substr(i, 1));
    same(read(bytes), absl::StrCat(all, " byte by byte"));
  }
}

// Whether a connection can carry the next request after an answer: only an HTTP/1.1 answer that
// is framed (so its end is known), complete, followed by nothing, and not `Connection: close`.
// Trailers after the last chunk are read to their end: the next answer starts clean.
TEST(HttpResponseReaderTest, AConnectionIsKeptOnlyAfterAFramedHttp11AnswerWithoutClose) {
  const std::vector<std::pair<std::string, bool>> answers = {
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", true},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", true},
      {"HTTP/1.1 204 No Content\r\n\r\n", true},
      {"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", true},
      {"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 2\r\n\r\n{}", false},
      {"HTTP/1.1 200 OK\r\nConnection: upgrade, close\r\nContent-Length: 2\r\n\r\n{}", false},
      {"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", false},
      {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra", false},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nHTTP/1.1", false},
  };
  for (const auto& [answer, kept] : answers) {
    for (size_t cut = 0; cut <= answer.size(); ++cut) {
      HttpResponseReader reader;
      absl::StatusOr<bool> done = reader.Feed(absl::string_view(answer).substr(0, cut));
      ASSERT_TRUE(done.ok()) << answer << " cut at " << cut << ": " << done.status();
      done = reader.Feed(absl::string_view(answer).substr(cut));
      ASSERT_TRUE(done.ok() && *done) << answer << " cut at " << cut;
      EXPECT_EQ(reader.ConnectionReusable(), kept) << absl::CEscape(answer) << " cut at " << cut;
    }
  }
  // Read to the connection's end: never kept.
  HttpResponseReader to_end;
  ASSERT_TRUE(to_end.Feed("HTTP/1.1 200 OK\r\n\r\n{}").ok());
  ASSERT_TRUE(to_end.Finish().ok());
  EXPECT_FALSE(to_end.ConnectionReusable());
  HttpResponseReader partial;
  ASSERT_TRUE(partial.Feed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}").ok());
  EXPECT_FALSE(partial.ConnectionReusable()) << "not complete";
}

TEST(ParseHttpResponseTest, MalformedAnswersAreErrors) {
  EXPECT_THAT(std::string(ParseHttpResponse("").status().message()), HasSubstr("without an answer"));
  EXPECT_THAT(std::string(ParseHttpResponse("SSH-2.0-OpenSSH\r\n\r\n").status().message()),
              HasSubstr("not an HTTP answer"));
  EXPECT_THAT(std::string(ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Le").status().message()),
              HasSubstr("inside its header"));
  EXPECT_THAT(std::string(ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}")
                              .status().message()),
              HasSubstr("shorter than its Content-Length"));
  EXPECT_THAT(std::string(ParseHttpResponse("HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n")
                              .status().message()),
              HasSubstr("larger than 8 MiB"));
  EXPECT_THAT(std::string(ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            "zz\r\n").status().message()),
              HasSubstr("bad chunk size"));
  EXPECT_THAT(std::string(ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            "5\r\nab").status().message()),
              HasSubstr("inside a chunk"));
}

}  // namespace
}  // namespace edgeaccel
