// NodeLabeler against a local HTTPS server standing in for the API server.
#include "edgeaccel/node/node_labeler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdlib>
#include <sstream>

#include "absl/strings/escaping.h"
#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon_process.h"
#include "eventually.h"
#include "fixture_host.h"
#include "https_server_test.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::ApiServerConfigFor;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::HttpsServerTest;
using ::edgeaccel::testing::ListenInBackground;
using ::edgeaccel::testing::MakeSelfSignedCertificate;
using ::edgeaccel::testing::SilentTcpServer;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

class NodeLabelerTest : public HttpsServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(HttpsServerTest::SetUp());
    server_->Get("/api/v1/nodes/node-1", [this](const httplib::Request& req, httplib::Response& res) {
      absl::MutexLock lock(&mu_);
      gets_++;
      auth_ = req.get_header_value("Authorization");
      res.set_content(node_.dump(), "application/json");
    });
    server_->Patch("/api/v1/nodes/node-1", [this](const httplib::Request& req, httplib::Response& res) {
      absl::Duration delay;
      {
        absl::MutexLock lock(&mu_);
        delay = delay_;
      }
      absl::SleepFor(delay);
      absl::MutexLock lock(&mu_);
      content_type_ = req.get_header_value("Content-Type");
      auth_ = req.get_header_value("Authorization");
      bodies_.push_back(req.body);
      res.status = statuses_.empty() ? 200 : statuses_.front();
      if (!statuses_.empty()) statuses_.erase(statuses_.begin());
      // The API server applies a merge patch (RFC 7386) to the stored object.
      if (res.status == 200) node_.merge_patch(nlohmann::json::parse(req.body));
      res.set_content("{}", "application/json");
    });
    Listen();
  }
  ApiServerConfig Config(const std::string& ca = "server") const {
    // Its timeout: a request that times out is one more request, and the counts the tests expect
    // hold only if none does on a loaded machine (TimeoutsAreRetried sets its own).
    ApiServerConfig config = HttpsServerTest::Config(ca);
    config.node_name = "node-1";
    config.initial_backoff = absl::Milliseconds(20);
    config.max_backoff = absl::Milliseconds(100);
    return config;
  }
  size_t Patches() {
    absl::MutexLock lock(&mu_);
    return bodies_.size();
  }

  absl::Mutex mu_;
  int gets_ = 0;
  std::string auth_, content_type_;
  std::vector<std::string> bodies_;
  std::vector<int> statuses_;
  absl::Duration delay_;
  // The Node as the API server stores it.
  nlohmann::json node_ = nlohmann::json::parse(
      R"({"metadata":{"name":"node-1","labels":{"kubernetes.io/os":"linux"},)"
      R"("annotations":{"edgeaccel.io/managed-labels":"coral.ai/edgetpu.count,old.example/gone"}}})");
};

TEST(NodeLabelPatchTest, SetsOursRemovesOurOldOnesOnly) {
  nlohmann::json patch = nlohmann::json::parse(
      NodeLabelPatch({{"coral.ai/edgetpu.count", "2"}}, {"coral.ai/edgetpu.count", "old.example/gone"}));
  EXPECT_EQ(patch["metadata"]["labels"]["coral.ai/edgetpu.count"], "2");
  EXPECT_TRUE(patch["metadata"]["labels"]["old.example/gone"].is_null());
  EXPECT_EQ(patch["metadata"]["labels"].size(), 2u);
  EXPECT_EQ(patch["metadata"]["annotations"]["edgeaccel.io/managed-labels"], "coral.ai/edgetpu.count");
}

TEST_F(NodeLabelerTest, PatchesOnceWithTheRightRequest) {
  NodeLabeler labeler(Config());
  labeler.Start();
  labeler.Set({{"coral.ai/edgetpu.count", "2"}, {"coral.ai/edgetpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 1; }));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(gets_, 1);
    EXPECT_EQ(auth_, "Bearer secret-token");
    EXPECT_EQ(content_type_, "application/merge-patch+json");
    nlohmann::json body = nlohmann::json::parse(bodies_[0]);
    EXPECT_EQ(body["metadata"]["labels"]["coral.ai/edgetpu.present"], "true");
    EXPECT_TRUE(body["metadata"]["labels"]["old.example/gone"].is_null());
    EXPECT_FALSE(body["metadata"]["labels"].contains("kubernetes.io/os")) << "never touch others";
  }
  // The same labels again: no request. A change: one more.
  labeler.Set({{"coral.ai/edgetpu.count", "2"}, {"coral.ai/edgetpu.present", "true"}});
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Patches(), 1u);
  labeler.Set({{"coral.ai/edgetpu.count", "1"}, {"coral.ai/edgetpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 2; }));
  labeler.Stop();
}

// GPU feature discovery labels the same GPUs with the same keys. A key another writer holds on
// the Node is left to it: never overwritten, never removed.
TEST_F(NodeLabelerTest, KeysAnotherWriterHoldsAreLeftToIt) {
  {
    absl::MutexLock lock(&mu_);
    node_["metadata"]["labels"]["nvidia.com/gpu.product"] = "Orin";  // GFD's
  }
  NodeLabeler labeler(Config());
  labeler.Start();
  labeler.Set({{"nvidia.com/gpu.product", "NVIDIA-Jetson-AGX-Orin"}, {"nvidia.com/gpu.count", "1"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 1; }));
  {
    absl::MutexLock lock(&mu_);
    nlohmann::json body = nlohmann::json::parse(bodies_.back());
    EXPECT_FALSE(body["metadata"]["labels"].contains("nvidia.com/gpu.product"));
    EXPECT_EQ(body["metadata"]["labels"]["nvidia.com/gpu.count"], "1");
    EXPECT_EQ(node_["metadata"]["labels"]["nvidia.com/gpu.product"], "Orin");
    EXPECT_EQ(body["metadata"]["annotations"]["edgeaccel.io/managed-labels"], "nvidia.com/gpu.count");
    // GFD then takes a key we set: it changes its value.
    node_["metadata"]["labels"]["nvidia.com/gpu.count"] = "2";
  }
  // Our next change neither overwrites nor removes it.
  labeler.Set({{"nvidia.com/gpu.product", "NVIDIA-Jetson-AGX-Orin"}, {"nvidia.com/gpu.count", "1"},
               {"nvidia.com/jetson.soc", "tegra234"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 2; }));
  absl::MutexLock lock(&mu_);
  nlohmann::json body = nlohmann::json::parse(bodies_.back());
  EXPECT_FALSE(body["metadata"]["labels"].contains("nvidia.com/gpu.count"));
  EXPECT_EQ(node_["metadata"]["labels"]["nvidia.com/gpu.count"], "2");
  EXPECT_EQ(node_["metadata"]["labels"]["nvidia.com/gpu.product"], "Orin");
  EXPECT_EQ(node_["metadata"]["labels"]["nvidia.com/jetson.soc"], "tegra234");
  EXPECT_EQ(body["metadata"]["annotations"]["edgeaccel.io/managed-labels"], "nvidia.com/jetson.soc");
}

TEST_F(NodeLabelerTest, ForbiddenConflictAndServerErrorsAreRetriedWithBackoff) {
  {
    absl::MutexLock lock(&mu_);
    statuses_ = {403, 409, 500, 503};
  }
  NodeLabeler labeler(Config());
  labeler.Start();
  labeler.Set({{"nvidia.com/gpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 1; }));
  EXPECT_EQ(labeler.failures(), 4u);
  EXPECT_EQ(Patches(), 5u);
}

TEST_F(NodeLabelerTest, TimeoutsAreRetried) {
  {
    absl::MutexLock lock(&mu_);
    delay_ = absl::Milliseconds(500);  // longer than the client's 300 ms
  }
  ApiServerConfig config = Config();
  config.timeout = absl::Milliseconds(300);
  NodeLabeler labeler(config);
  labeler.Start();
  labeler.Set({{"nvidia.com/gpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.failures() >= 1; }));
  {
    absl::MutexLock lock(&mu_);
    delay_ = absl::ZeroDuration();
  }
  ASSERT_TRUE(Eventually([&] { return labeler.patches() >= 1; }));
}

// A request held by an API server that never answers (a minute of timeout left) does not hold
// up Stop: it is cancelled.
TEST(NodeLabelerStopTest, StopDoesNotWaitForAnApiServerThatNeverAnswers) {
  SilentTcpServer silent;
  TempDir dir;
  const ApiServerConfig config = ApiServerConfigFor(silent.port(), dir.path(), absl::Minutes(1));
  ASSERT_FALSE(config.host.empty());
  NodeLabeler labeler(config);
  labeler.Start();
  labeler.Set({{"nvidia.com/gpu.present", "true"}});
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  labeler.Stop();
  // Half the minute the request's timeout would take: the cancel ended it.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(labeler.patches(), 0u);
  EXPECT_EQ(labeler.failures(), 0u) << "a cancelled request is the stop, not a failure to retry";
}

TEST_F(NodeLabelerTest, UnknownCertificateAuthorityIsRefused) {
  NodeLabeler labeler(Config("other"));  // a CA that did not sign the server's certificate
  labeler.Start();
  labeler.Set({{"nvidia.com/gpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.failures() >= 2; }));
  EXPECT_EQ(labeler.patches(), 0u);
  EXPECT_EQ(Patches(), 0u) << "nothing may be sent to an unverified server";
}

TEST_F(NodeLabelerTest, TheDaemonLabelsItsNode) {
  edgeaccel::testing::FixtureHost host;
  host.AddCoralPcie({.index = 0});
  edgeaccel::testing::DaemonProcess daemon(
      EDGEACCEL_DAEMON_PATH,
      {"--host-root=" + host.root(), "--kubelet-root=" + dir_.path() + "/kubelet",
       "--device-plugin-dir=" + dir_.path() + "/kubelet/device-plugins",
       "--metrics-address=", "--label-node", "--node-name=node-1",
       "--api-server=https://127.0.0.1:" + std::to_string(port_),
       "--api-token-file=" + dir_.path() + "/token", "--api-ca-file=" + dir_.path() + "/server.crt"});
  ASSERT_TRUE(daemon.WaitForLog("node node-1 labelled")) << daemon.Log();
  absl::MutexLock lock(&mu_);
  ASSERT_FALSE(bodies_.empty());
  // The first PATCH already carries every family's labels: a half-scanned host must never reach
  // the node (it would drop the labels of the families not yet scanned).
  nlohmann::json body = nlohmann::json::parse(bodies_.front());
  EXPECT_EQ(body["metadata"]["labels"]["coral.ai/edgetpu.count"], "1");
  EXPECT_TRUE(body["metadata"]["labels"]["old.example/gone"].is_null());
}

TEST(NodeLabelerCliTest, LabelNodeWithoutANodeNameIsRefused) {
  unsetenv("NODE_NAME");
  edgeaccel::testing::FixtureHost host;
  edgeaccel::testing::CommandResult result = edgeaccel::testing::RunCommand(
      EDGEACCEL_DAEMON_PATH, {"--host-root=" + host.root(), "--label-node", "--metrics-address="});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("needs the node's name: set NODE_NAME"));
}

std::string Base64File(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return absl::Base64Escape(content.str());
}

TEST_F(NodeLabelerTest, KubeconfigWithInlineCaAndToken) {
  std::ofstream(dir_.path() + "/kubeconfig")
      << "apiVersion: v1\nkind: Config\ncurrent-context: edge\nclusters:\n- name: lab\n  cluster:\n"
      << "    server: https://127.0.0.1:" << port_ << "\n"
      << "    certificate-authority-data: " << Base64File(dir_.path() + "/server.crt") << "\n"
      << "contexts:\n- name: other\n  context: {cluster: nowhere, user: nobody}\n"
      << "- name: edge\n  context:\n    cluster: lab\n    user: robot\n"
      << "users:\n- name: robot\n  user:\n    token: kube-token\n";
  absl::StatusOr<ApiServerConfig> config = KubeconfigConfig("node-1", dir_.path() + "/kubeconfig");
  ASSERT_TRUE(config.ok()) << config.status();
  config->initial_backoff = absl::Milliseconds(20);
  NodeLabeler labeler(*config);
  labeler.Start();
  labeler.Set({{"coral.ai/edgetpu.present", "true"}});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 1; }));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(auth_, "Bearer kube-token");
}

TEST(KubeconfigTest, ClientCertificateAgainstAServerThatRequiresOne) {
  TempDir dir;
  ASSERT_TRUE(MakeSelfSignedCertificate(dir.path(), "server"));
  ASSERT_TRUE(MakeSelfSignedCertificate(dir.path(), "client"));
  httplib::SSLServer server((dir.path() + "/server.crt").c_str(), (dir.path() + "/server.key").c_str(),
                            (dir.path() + "/client.crt").c_str());  // verifies client certificates
  std::atomic<int> patches{0};
  server.Get("/api/v1/nodes/node-1", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"metadata\":{}}", "application/json");
  });
  server.Patch("/api/v1/nodes/node-1", [&](const httplib::Request&, httplib::Response& res) {
    patches++;
    res.set_content("{}", "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread = ListenInBackground(server);
  // Paths relative to the kubeconfig's directory, as kubectl reads them.
  std::ofstream(dir.path() + "/kubeconfig")
      << "current-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:" << port
      << "\n    certificate-authority: server.crt\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
      << "users:\n- name: u\n  user:\n    client-certificate-data: " << Base64File(dir.path() + "/client.crt")
      << "\n    client-key: client.key\n";
  absl::StatusOr<ApiServerConfig> config = KubeconfigConfig("node-1", dir.path() + "/kubeconfig");
  ASSERT_TRUE(config.ok()) << config.status();
  {
    NodeLabeler labeler(*config);
    labeler.Start();
    labeler.Set({{"coral.ai/edgetpu.present", "true"}});
    EXPECT_TRUE(Eventually([&] { return labeler.patches() == 1; }));
  }
  // Without the client certificate the server refuses the connection.
  config->client_cert_pem.clear();
  config->client_key_pem.clear();
  config->initial_backoff = absl::Milliseconds(20);
  {
    NodeLabeler labeler(*config);
    labeler.Start();
    labeler.Set({{"coral.ai/edgetpu.present", "true"}});
    EXPECT_TRUE(Eventually([&] { return labeler.failures() >= 1; }));
    EXPECT_EQ(labeler.patches(), 0u);
  }
  EXPECT_EQ(patches.load(), 1);
  server.stop();
  thread.join();
}

TEST(KubeconfigTest, BadFilesAreClearErrors) {
  TempDir dir;
  const std::string path = dir.path() + "/kubeconfig";
  std::ofstream(path) << "current-context: missing\ncontexts: []\n";
  EXPECT_THAT(std::string(KubeconfigConfig("n", path).status().message()), HasSubstr("no context named \"missing\""));
  std::ofstream(path) << "{ this is: [not yaml";
  EXPECT_THAT(std::string(KubeconfigConfig("n", path).status().message()), HasSubstr("kubeconfig"));
  std::ofstream(path) << "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'http://plain:80'}\n"
                      << "contexts:\n- name: c\n  context: {cluster: k, user: u}\n";
  EXPECT_THAT(std::string(KubeconfigConfig("n", path).status().message()), HasSubstr("https://"));
  std::ofstream(path) << "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://a:1', "
                      << "certificate-authority-data: '!!!'}\ncontexts:\n- name: c\n  context: {cluster: k}\n";
  EXPECT_THAT(std::string(KubeconfigConfig("n", path).status().message()), HasSubstr("not base64"));
  EXPECT_FALSE(KubeconfigConfig("n", dir.path() + "/absent").ok());
  EXPECT_THAT(std::string(KubeconfigConfig("", path).status().message()), HasSubstr("NODE_NAME"));
}

TEST(InClusterConfigTest, FromEnvironmentOrFlags) {
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  absl::StatusOr<ApiServerConfig> config = InClusterConfig("node-1", "", "/t", "/c");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->host, "10.96.0.1");
  EXPECT_EQ(config->port, 443);
  config = InClusterConfig("node-1", "https://api.example:6443", "/t", "/c");
  EXPECT_EQ(config->host, "api.example");
  EXPECT_EQ(config->port, 6443);
  EXPECT_THAT(std::string(InClusterConfig("", "", "/t", "/c").status().message()), HasSubstr("NODE_NAME"));
  EXPECT_FALSE(InClusterConfig("n", "http://plain:80", "/t", "/c").ok());
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_THAT(std::string(InClusterConfig("n", "", "/t", "/c").status().message()), HasSubstr("--api-server"));
}

}  // namespace
}  // namespace edgeaccel
