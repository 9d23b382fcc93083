#include "https_server_test.h"

#include <fstream>

#include "test_api_server.h"

namespace edgeaccel::testing {

void HttpsServerTest::SetUp() {
  ASSERT_TRUE(MakeSelfSignedCertificate(dir_.path(), "server"));
  ASSERT_TRUE(MakeSelfSignedCertificate(dir_.path(), "other"));
  std::ofstream(dir_.path() + "/token") << "secret-token\n";
  server_ = std::make_unique<httplib::SSLServer>((dir_.path() + "/server.crt").c_str(),
                                                 (dir_.path() + "/server.key").c_str());
}

void HttpsServerTest::Listen() {
  port_ = server_->bind_to_any_port("127.0.0.1");
  thread_ = ListenInBackground(*server_);
}

void HttpsServerTest::TearDown() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

ApiServerConfig HttpsServerTest::Config(const std::string& ca) const {
  ApiServerConfig config;
  config.host = "127.0.0.1";
  config.port = port_;
  config.ca_file = dir_.path() + "/" + ca + ".crt";
  config.token_file = dir_.path() + "/token";
  config.timeout = absl::Seconds(5);
  return config;
}

}  // namespace edgeaccel::testing
