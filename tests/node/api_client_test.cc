// ApiClient against real TLS servers on loopback (cpp-httplib's, and bare sockets that misbehave),
// and its answer parser on what servers send.
#include "edgeaccel/node/api_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/time/clock.h"
#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::MakeSelfSignedCertificate;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

class ApiClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeSelfSignedCertificate(dir_.path(), "server"));
    ASSERT_TRUE(MakeSelfSignedCertificate(dir_.path(), "other"));
    std::ofstream(dir_.path() + "/token") << "secret-token\n";
    server_ = std::make_unique<httplib::SSLServer>((dir_.path() + "/server.crt").c_str(),
                                                   (dir_.path() + "/server.key").c_str());
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
    server_->Patch("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.status = 201;
      res.set_content(req.get_header_value("Content-Type") + " " + req.body, "text/plain");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  ApiServerConfig Config(const std::string& ca = "server") {
    ApiServerConfig config;
    config.host = "127.0.0.1";
    config.port = port_;
    config.ca_file = dir_.path() + "/" + ca + ".crt";
    config.token_file = dir_.path() + "/token";
    config.timeout = absl::Seconds(5);
    return config;
  }

  TempDir dir_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
};

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
  std::thread thread([&] { server.listen_after_bind(); });
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
  close(listener);
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
