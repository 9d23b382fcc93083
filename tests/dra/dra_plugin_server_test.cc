#include "edgeaccel/dra/dra_plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using testing::MakeStaleSocket;
using testing::TempDir;

constexpr char kDriver[] = "edgetpu.edgeaccel.io";

bool IsSocket(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

class DraPluginServerTest : public ::testing::Test {
 protected:
  DraPluginServerTest() {
    ClaimPreparer::Options options;
    options.driver = kDriver;
    options.pool = "node-1";
    options.cdi_dir = dir_.path() + "/cdi";
    options.state_dir = dir_.path() + "/state";
    options.fetch_claim = [](const ClaimRef&) -> absl::StatusOr<std::string> {
      return absl::UnavailableError("no API server here");
    };
    preparer_ = std::make_unique<ClaimPreparer>(options, &set_);
    service_ = std::make_unique<DraPluginService>(preparer_.get(), &set_, "node-1", &counters_);
  }

  DraPluginServer::Options Options() {
    DraPluginServer::Options options;
    options.driver = kDriver;
    options.kubelet_root = dir_.path();
    return options;
  }

  TempDir dir_;
  DeviceSet set_{kDriver};
  DraCounters counters_;
  std::unique_ptr<ClaimPreparer> preparer_;
  std::unique_ptr<DraPluginService> service_;
};

TEST_F(DraPluginServerTest, GetInfoNamesTheDriverItsEndpointAndBothVersionsV1First) {
  DraPluginServer server(Options(), service_.get());
  ASSERT_TRUE(server.Start().ok());
  auto stub = pluginregistration::Registration::NewStub(grpc::CreateChannel(
      "unix:" + server.registration_socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));  // the kubelet's
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(stub->GetInfo(&context, pluginregistration::InfoRequest(), &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), kDriver);
  EXPECT_EQ(info.endpoint(), dir_.path() + "/plugins/edgetpu.edgeaccel.io/dra.sock");
  ASSERT_GE(info.supported_versions_size(), 2);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(info.supported_versions(1), "v1beta1.DRAPlugin");
  EXPECT_EQ(server.registration_socket(), dir_.path() + "/plugins_registry/edgetpu.edgeaccel.io-reg.sock");
}

TEST_F(DraPluginServerTest, AStaleSocketIsReplacedALiveOneIsNotAndStopRemovesOnlyOurs) {
  DraPluginServer first(Options(), service_.get());
  mkdir((dir_.path() + "/plugins_registry").c_str(), 0755);
  mkdir((dir_.path() + "/plugins").c_str(), 0755);
  mkdir((dir_.path() + "/plugins/edgetpu.edgeaccel.io").c_str(), 0755);
  MakeStaleSocket(first.registration_socket());
  MakeStaleSocket(first.service_socket());
  ASSERT_TRUE(first.Start().ok()) << "a dead daemon's sockets are replaced";
  // A second daemon on the same node must not take the sockets of the one serving.
  DraPluginServer second(Options(), service_.get());
  absl::Status status = second.Start();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("another process is serving on it"), std::string::npos) << status;
  second.Stop();
  EXPECT_TRUE(IsSocket(first.registration_socket())) << "the refused one removed nothing";
  first.Stop();
  EXPECT_FALSE(IsSocket(first.registration_socket()));
  EXPECT_FALSE(IsSocket(first.service_socket()));
}

TEST_F(DraPluginServerTest, AFileThatIsNotASocketIsNotReplaced) {
  DraPluginServer server(Options(), service_.get());
  mkdir((dir_.path() + "/plugins_registry").c_str(), 0755);
  std::ofstream(server.registration_socket()) << "someone's file";
  absl::Status status = server.Start();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("the path is taken by a regular file"), std::string::npos) << status;
  std::ifstream kept(server.registration_socket());
  std::string content;
  std::getline(kept, content);
  EXPECT_EQ(content, "someone's file");
}

TEST_F(DraPluginServerTest, PrepareAnswersEveryClaimEvenWhenTheApiServerIsAway) {
  DraPluginServer server(Options(), service_.get());
  ASSERT_TRUE(server.Start().ok());
  auto stub = drav1::DRAPlugin::NewStub(
      grpc::CreateChannel("unix:" + server.service_socket(), grpc::InsecureChannelCredentials()));
  drav1::NodePrepareResourcesRequest request;
  auto* claim = request.add_claims();
  claim->set_namespace_("default");
  claim->set_name("c");
  claim->set_uid("11111111-1111-1111-1111-111111111111");
  grpc::ClientContext context;
  drav1::NodePrepareResourcesResponse response;
  ASSERT_TRUE(stub->NodePrepareResources(&context, request, &response).ok());
  ASSERT_EQ(response.claims().count("11111111-1111-1111-1111-111111111111"), 1u);
  EXPECT_NE(response.claims().at("11111111-1111-1111-1111-111111111111").error().find("no API server here"),
            std::string::npos);
  EXPECT_EQ(counters_.prepare_errors.load(), 1u);
}

}  // namespace
}  // namespace edgeaccel
