// HttpsServerTest: a fixture for tests of clients of an HTTPS API server the test writes itself
// (cpp-httplib), where TestApiServer's Kubernetes behaviour is not what is tested.
#ifndef EDGEACCEL_TESTS_SUPPORT_HTTPS_SERVER_TEST_H_
#define EDGEACCEL_TESTS_SUPPORT_HTTPS_SERVER_TEST_H_

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>

#include "edgeaccel/node/api_server_config.h"
#include "fixture_host.h"

namespace edgeaccel::testing {

// A fixture for clients of an HTTPS API server written in the test: in a temporary directory a
// self-signed "server" certificate (the server's, and the CA a client trusts), an "other" one (a
// CA that does not match) and a token file ("secret-token"). SetUp makes them and the server; a
// test's SetUp then adds its handlers and calls Listen(). TearDown stops the server.
class HttpsServerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Binds any port of 127.0.0.1 and serves in the background.
  void Listen();
  // What reaches the server, trusting the CA `ca` (its .crt in the directory), with the token.
  ApiServerConfig Config(const std::string& ca = "server") const;

  TempDir dir_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_HTTPS_SERVER_TEST_H_
