// The DevicePlugin service over a real Unix socket, called the way the kubelet calls it.
#include "edgeaccel/kubelet/device_plugin_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "edgeaccel/kubelet/plugin_server.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Device Tpu(const std::string& id, int numa = -1, Health health = Health::kHealthy,
           const std::string& node = "") {
  Device d;
  d.id = id;
  d.health = health;
  if (health == Health::kUnhealthy) d.unhealthy_reason = "device node is missing";
  if (numa >= 0) d.numa_node = numa;
  const std::string path = node.empty() ? "/dev/" + id : node;
  d.nodes.push_back({path, path, "rw"});
  return d;
}

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_.Update({Tpu("apex_0", 0), Tpu("apex_1", 0), Tpu("apex_2", 1), Tpu("apex_3", 1),
                 Tpu("apex_4", 1)});
    server_ = std::make_unique<PluginServer>(socket_, &set_, &counters_, nullptr);
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  }
  void TearDown() override { server_->Stop(); }

  // Serves again, with other options.
  void Restart(PluginOptions options) {
    server_->Stop();
    server_ = std::make_unique<PluginServer>(socket_, &set_, &counters_, nullptr, options);
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    stub_ = v1beta1::DevicePlugin::NewStub(channel_);
  }

  grpc::Status Allocate(const std::vector<std::string>& ids, v1beta1::AllocateResponse* response) {
    v1beta1::AllocateRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : ids) container->add_devices_ids(id);
    grpc::ClientContext context;
    return stub_->Allocate(&context, request, response);
  }
  std::vector<std::string> Preferred(const std::vector<std::string>& available,
                                     const std::vector<std::string>& must, int size) {
    v1beta1::PreferredAllocationRequest request;
    auto* c = request.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    grpc::ClientContext context;
    v1beta1::PreferredAllocationResponse response;
    EXPECT_TRUE(stub_->GetPreferredAllocation(&context, request, &response).ok());
    const auto& ids = response.container_responses(0).deviceids();
    return {ids.begin(), ids.end()};
  }

  TempDir dir_;
  std::string socket_ = dir_.path() + "/plugin.sock";
  DeviceSet set_{"coral.ai/edgetpu"};
  PluginCounters counters_;
  std::unique_ptr<PluginServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST_F(PluginTest, OptionsOfferPreferredAllocationOnly) {
  grpc::ClientContext context;
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());
  EXPECT_FALSE(options.pre_start_required());
}

TEST_F(PluginTest, ListAndWatchSendsTheListAtOnceAndOnEveryChange) {
  grpc::ClientContext context;
  auto reader = stub_->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_EQ(response.devices_size(), 5);
  EXPECT_EQ(response.devices(0).id(), "apex_0");
  EXPECT_EQ(response.devices(0).health(), "Healthy");
  ASSERT_EQ(response.devices(0).topology().nodes_size(), 1);
  EXPECT_EQ(response.devices(2).topology().nodes(0).id(), 1);

  set_.Update({Tpu("apex_0", 0, Health::kUnhealthy), Tpu("apex_1", 0)});
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_EQ(response.devices_size(), 2);
  EXPECT_EQ(response.devices(0).health(), "Unhealthy");
  context.TryCancel();
}

TEST_F(PluginTest, EveryStreamSeesEveryChange) {
  // An abandoned stream must not swallow updates meant for a live one.
  grpc::ClientContext abandoned_context, live_context;
  auto abandoned = stub_->ListAndWatch(&abandoned_context, v1beta1::Empty());
  auto live = stub_->ListAndWatch(&live_context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  ASSERT_TRUE(abandoned->Read(&response));
  ASSERT_TRUE(live->Read(&response));
  abandoned_context.TryCancel();
  for (int i = 1; i <= 10; ++i) {
    std::vector<Device> devices;
    for (int k = 0; k < i; ++k) devices.push_back(Tpu("apex_" + std::to_string(k)));
    set_.Update(devices);
    ASSERT_TRUE(live->Read(&response));
    // Changes may coalesce, but the latest state always arrives.
    while (response.devices_size() != i) ASSERT_TRUE(live->Read(&response));
  }
  live_context.TryCancel();
}

TEST_F(PluginTest, StopEndsStreamsCleanly) {
  grpc::ClientContext context;
  auto reader = stub_->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse response;
  ASSERT_TRUE(reader->Read(&response));
  server_->Stop();
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_TRUE(reader->Finish().ok());
  struct stat st;
  EXPECT_NE(stat(socket_.c_str(), &st), 0) << "socket not removed";
}

TEST_F(PluginTest, AllocateAnswersTheDiscoveredNodesOnly) {
  v1beta1::AllocateResponse response;
  ASSERT_TRUE(Allocate({"apex_2"}, &response).ok());
  ASSERT_EQ(response.container_responses_size(), 1);
  const auto& c = response.container_responses(0);
  ASSERT_EQ(c.devices_size(), 1);
  EXPECT_EQ(c.devices(0).host_path(), "/dev/apex_2");
  EXPECT_EQ(c.devices(0).container_path(), "/dev/apex_2");
  EXPECT_EQ(c.devices(0).permissions(), "rw");
  EXPECT_EQ(c.mounts_size(), 0);
  EXPECT_EQ(counters_.allocations.load(), 1u);

  ASSERT_TRUE(Allocate({"apex_0", "apex_1"}, &response).ok());
  EXPECT_EQ(response.container_responses(0).devices_size(), 2);
}

TEST_F(PluginTest, AllocateRefusesHostileIdsNamingThem) {
  const std::string huge(10000, 'a');
  struct Case {
    std::vector<std::string> ids;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"../../etc/shadow"}, grpc::StatusCode::INVALID_ARGUMENT, "unknown device id \"../../etc/shadow\""},
      {{"/dev/sda"}, grpc::StatusCode::INVALID_ARGUMENT, "unknown device id \"/dev/sda\""},
      {{""}, grpc::StatusCode::INVALID_ARGUMENT, "unknown device id \"\""},
      {{huge}, grpc::StatusCode::INVALID_ARGUMENT, "(10000 bytes)"},
      {{"apex_0", "apex_9"}, grpc::StatusCode::INVALID_ARGUMENT, "unknown device id \"apex_9\""},
      {{"apex_0", "apex_0"}, grpc::StatusCode::INVALID_ARGUMENT, "named twice"},
      {{std::string("apex_0\n\x01", 8)}, grpc::StatusCode::INVALID_ARGUMENT, "\"apex_0\\n\\x01\""},
      {{}, grpc::StatusCode::INVALID_ARGUMENT, "names no device"},
  };
  for (const Case& test : cases) {
    v1beta1::AllocateResponse response;
    grpc::Status status = Allocate(test.ids, &response);
    EXPECT_EQ(status.error_code(), test.code) << test.message;
    EXPECT_THAT(status.error_message(), HasSubstr(test.message));
    EXPECT_LT(status.error_message().size(), 300u);
    EXPECT_EQ(response.container_responses_size(), 0) << "no paths on error";
  }
  EXPECT_EQ(counters_.allocate_errors.load(), cases.size());
}

TEST_F(PluginTest, AllocateRefusesUnhealthyAndRemovedDevices) {
  set_.Update({Tpu("apex_0", 0, Health::kUnhealthy), Tpu("apex_1", 0)});
  v1beta1::AllocateResponse response;
  grpc::Status status = Allocate({"apex_0"}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("\"apex_0\" of coral.ai/edgetpu is Unhealthy: device node is missing"));
  status = Allocate({"apex_4"}, &response);  // removed
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(PluginTest, PreferredAllocationKeepsToOneNumaNode) {
  const std::vector<std::string> all = {"apex_0", "apex_1", "apex_2", "apex_3", "apex_4"};
  // Two fit on node 0 exactly (best fit), three need node 1.
  EXPECT_THAT(Preferred(all, {}, 2), ElementsAre("apex_0", "apex_1"));
  EXPECT_THAT(Preferred(all, {}, 3), ElementsAre("apex_2", "apex_3", "apex_4"));
  // must_include pulls its own node first.
  EXPECT_THAT(Preferred(all, {"apex_3"}, 2), ElementsAre("apex_2", "apex_3"));
  EXPECT_THAT(Preferred(all, {"apex_0"}, 2), ElementsAre("apex_0", "apex_1"));
  // More than one node holds: spill over, biggest group next.
  EXPECT_THAT(Preferred(all, {"apex_0"}, 4), ElementsAre("apex_0", "apex_1", "apex_2", "apex_3"));
  // Only what is available, and never an unknown id.
  EXPECT_THAT(Preferred({"apex_1", "apex_4", "bogus"}, {}, 2), ElementsAre("apex_1", "apex_4"));
  // Deterministic.
  EXPECT_EQ(Preferred(all, {}, 1), Preferred(all, {}, 1));
}

TEST_F(PluginTest, PreStartContainerIsOk) {
  grpc::ClientContext context;
  v1beta1::PreStartContainerRequest request;
  request.add_devices_ids("apex_0");
  v1beta1::PreStartContainerResponse response;
  EXPECT_TRUE(stub_->PreStartContainer(&context, request, &response).ok());
}

TEST_F(PluginTest, OptionsFollowTheHooksAndPreStartRunsItsHook) {
  std::vector<std::string> seen;
  PluginOptions options;
  options.preferred_allocation = nullptr;
  options.pre_start = [&seen](const Snapshot& snapshot, const std::vector<std::string>& ids) {
    seen = ids;
    const Device* device = snapshot.Find(ids.front());
    return device != nullptr && device->health == Health::kHealthy
               ? absl::OkStatus()
               : absl::FailedPreconditionError("device " + ids.front() + " is gone");
  };
  Restart(options);

  grpc::ClientContext options_context;
  v1beta1::DevicePluginOptions advertised;
  ASSERT_TRUE(stub_->GetDevicePluginOptions(&options_context, v1beta1::Empty(), &advertised).ok());
  EXPECT_TRUE(advertised.pre_start_required());
  EXPECT_FALSE(advertised.get_preferred_allocation_available());

  v1beta1::PreferredAllocationRequest preferred_request;
  preferred_request.add_container_requests()->set_allocation_size(1);
  v1beta1::PreferredAllocationResponse preferred;
  grpc::ClientContext preferred_context;
  EXPECT_EQ(stub_->GetPreferredAllocation(&preferred_context, preferred_request, &preferred)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  for (const char* id : {"apex_1", "apex_9"}) {
    grpc::ClientContext context;
    v1beta1::PreStartContainerRequest request;
    request.add_devices_ids(id);
    v1beta1::PreStartContainerResponse response;
    grpc::Status status = stub_->PreStartContainer(&context, request, &response);
    EXPECT_THAT(seen, ElementsAre(id));
    if (std::string(id) == "apex_1") {
      EXPECT_TRUE(status.ok()) << status.error_message();
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_THAT(status.error_message(), HasSubstr("device apex_9 is gone"));
    }
  }
}

}  // namespace
}  // namespace edgeaccel
