// Where the API server is and how to authenticate: kubeconfig files as kubectl reads them, and
// the server's address. (The labeler's tests use these settings against live servers.)
#include "edgeaccel/node/api_server_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <sstream>

#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::MakeSelfSignedCertificate;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

// Runs in `dir` while it exists (the kubeconfig's own path is relative to the current directory).
class InDirectory {
 public:
  explicit InDirectory(const std::string& dir) {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) previous_ = cwd;
    EXPECT_EQ(chdir(dir.c_str()), 0) << dir;
  }
  ~InDirectory() { EXPECT_EQ(chdir(previous_.c_str()), 0) << previous_; }

 private:
  std::string previous_ = "/";
};

// A kubeconfig naming its CA, client certificate, key and token file by relative paths: kubectl
// (client-go's ResolveLocalPaths) reads them relative to the kubeconfig's own directory.
void WriteKubeconfig(const std::string& path) {
  std::ofstream(path) << "current-context: c\nclusters:\n- name: k\n  cluster:\n"
                      << "    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\n"
                      << "contexts:\n- name: c\n  context: {cluster: k, user: u}\n"
                      << "users:\n- name: u\n  user:\n    client-certificate: client.crt\n"
                      << "    client-key: client.key\n    tokenFile: token\n";
}

class RelativeKubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = root_.path() + "/kube";
    ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0);
    ASSERT_TRUE(MakeSelfSignedCertificate(dir_, "ca"));
    ASSERT_TRUE(MakeSelfSignedCertificate(dir_, "client"));
    std::ofstream(dir_ + "/token") << "kube-token\n";
    WriteKubeconfig(dir_ + "/kc");
  }
  void ExpectFilesBesideTheKubeconfig(const absl::StatusOr<ApiServerConfig>& config) {
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->ca_pem, Slurp(dir_ + "/ca.crt"));
    EXPECT_EQ(config->client_cert_pem, Slurp(dir_ + "/client.crt"));
    EXPECT_EQ(config->client_key_pem, Slurp(dir_ + "/client.key"));
  }

  TempDir root_;
  std::string dir_;
};

// --kubeconfig=kc: the directory part is empty; "ca.crt" inside it was read as "/ca.crt".
TEST_F(RelativeKubeconfigTest, ABareFileNameInTheCurrentDirectory) {
  absl::StatusOr<ApiServerConfig> config;
  {
    InDirectory in(dir_);
    config = KubeconfigConfig("node-1", "kc");
  }
  ExpectFilesBesideTheKubeconfig(config);
  // The token file is read again for every request, after the working directory may have
  // changed: it is kept as an absolute path.
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->token_file, dir_ + "/token");
  EXPECT_EQ(BearerToken(*config), "kube-token");
}

TEST_F(RelativeKubeconfigTest, ARelativePathWithDirectories) {
  for (const std::string& path : {std::string("kube/kc"), std::string("./kube/kc"),
                                  std::string("kube/../kube/kc")}) {
    absl::StatusOr<ApiServerConfig> config;
    {
      InDirectory in(root_.path());
      config = KubeconfigConfig("node-1", path);
    }
    ExpectFilesBesideTheKubeconfig(config);
    ASSERT_TRUE(config.ok()) << path;
    EXPECT_EQ(BearerToken(*config), "kube-token") << path;
  }
}

TEST_F(RelativeKubeconfigTest, AnAbsolutePath) {
  absl::StatusOr<ApiServerConfig> config = KubeconfigConfig("node-1", dir_ + "/kc");
  ExpectFilesBesideTheKubeconfig(config);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->token_file, dir_ + "/token");
}

TEST(ApiServerAddressTest, APortOutside1To65535IsRefused) {
  for (const char* port : {"0", "-1", "65536", "70000", "99999999999"}) {
    absl::StatusOr<ApiServerConfig> config =
        InClusterConfig("node-1", std::string("https://api.example:") + port, "/t", "/c");
    ASSERT_FALSE(config.ok()) << port;
    EXPECT_THAT(std::string(config.status().message()),
                HasSubstr(std::string("the API server's port must be 1 to 65535, got ") + port))
        << port;
  }
  for (const char* port : {"1", "6443", "65535"}) {
    absl::StatusOr<ApiServerConfig> config =
        InClusterConfig("node-1", std::string("https://api.example:") + port, "/t", "/c");
    ASSERT_TRUE(config.ok()) << port << ": " << config.status();
    EXPECT_EQ(config->port, std::stoi(port));
  }
  absl::StatusOr<ApiServerConfig> config =
      InClusterConfig("node-1", "https://[fd00::1]:6443", "/t", "/c");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->host, "fd00::1");
  EXPECT_EQ(config->port, 6443);
  config = InClusterConfig("node-1", "https://[fd00::1]", "/t", "/c");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->port, 443);
}

TEST(ApiServerAddressTest, AKubeconfigServerWithPortZeroIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/kubeconfig";
  std::ofstream(path) << "current-context: c\nclusters:\n- name: k\n"
                      << "  cluster: {server: 'https://a:0'}\n"
                      << "contexts:\n- name: c\n  context: {cluster: k}\n";
  EXPECT_THAT(std::string(KubeconfigConfig("n", path).status().message()),
              HasSubstr("the API server's port must be 1 to 65535, got 0"));
}

}  // namespace
}  // namespace edgeaccel
