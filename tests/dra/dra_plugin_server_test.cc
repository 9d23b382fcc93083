#include "edgeaccel/dra/dra_plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

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

// A NodePrepareResources request for one claim in namespace default.
template <typename Request>
Request OneClaim(const std::string& name, const std::string& uid) {
  Request request;
  auto* claim = request.add_claims();
  claim->set_namespace_("default");
  claim->set_name(name);
  claim->set_uid(uid);
  return request;
}

class DraPluginServerTest : public ::testing::Test {
 protected:
  DraPluginServerTest() {
    preparer_ = std::make_unique<ClaimPreparer>(
        PreparerOptions([](const ClaimRef&) -> absl::StatusOr<std::string> {
          return absl::UnavailableError("no API server here");
        }),
        &set_);
    service_ = std::make_unique<DraPluginService>(preparer_.get(), &set_, "node-1", &counters_);
  }

  ClaimPreparer::Options PreparerOptions(ClaimFetcher fetch) {
    ClaimPreparer::Options options;
    options.driver = kDriver;
    options.pool = "node-1";
    options.cdi_dir = dir_.path() + "/cdi";
    options.state_dir = dir_.path() + "/state";
    options.fetch_claim = std::move(fetch);
    return options;
  }

  // A read that says it began (`reading`), waits for `release` (at most 30 s), then answers
  // `answer`: an API server that answers late.
  static ClaimFetcher HeldRead(absl::Notification* reading, absl::Notification* release, absl::Status answer) {
    return [=](const ClaimRef&) -> absl::StatusOr<std::string> {
      reading->Notify();
      release->WaitForNotificationWithTimeout(absl::Seconds(30));
      return answer;
    };
  }

  // The kubelet's NodePrepareResources of claim `name` on another thread, with its 45 s deadline.
  static std::thread PrepareMeanwhile(drav1::DRAPlugin::Stub* stub, const std::string& name,
                                      const std::string& uid, grpc::Status* status,
                                      drav1::NodePrepareResourcesResponse* response) {
    return std::thread([=] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(45));
      *status = stub->NodePrepareResources(
          &context, OneClaim<drav1::NodePrepareResourcesRequest>(name, uid), response);
    });
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

// Two drivers on one DraGrpcServer (the daemon's: one gRPC server, one loop): gRPC hands a call
// to the call object waiting longest, whichever driver's it is, and each call is still answered
// by the driver whose socket its connection came in on. Each driver is called twice in a row, so
// that the second call lands on the other driver's call object.
TEST_F(DraPluginServerTest, TwoDriversSharingOneServerEachAnswerAsThemselvesOnTheirOwnSockets) {
  constexpr char kGpuDriver[] = "gpu.edgeaccel.io";
  DeviceSet gpus(kGpuDriver);
  Device tpu;
  tpu.id = "0000:03:00.0";
  tpu.facts["interface"] = "pcie";
  set_.Update({tpu});
  Device gpu;
  gpu.id = "GPU-12345678-1234-1234-1234-123456789abc";
  gpus.Update({gpu});
  DraCounters gpu_counters;
  ClaimPreparer::Options gpu_options = PreparerOptions([](const ClaimRef&) -> absl::StatusOr<std::string> {
    return absl::UnavailableError("the GPU driver's API server is away");
  });
  gpu_options.driver = kGpuDriver;
  ClaimPreparer gpu_preparer(gpu_options, &gpus);
  DraPluginService gpu_service(&gpu_preparer, &gpus, "node-1", &gpu_counters);

  DraGrpcServer shared;
  DraPluginServer::Options tpu_options = Options();
  tpu_options.grpc = &shared;
  DraPluginServer::Options gpu_server_options = Options();
  gpu_server_options.driver = kGpuDriver;
  gpu_server_options.grpc = &shared;
  DraPluginServer tpu_server(tpu_options, service_.get());
  DraPluginServer gpu_server(gpu_server_options, &gpu_service);
  ASSERT_TRUE(tpu_server.Start().ok());
  ASSERT_TRUE(gpu_server.Start().ok());

  struct Expected {
    DraPluginServer* server;
    std::string driver;
    std::string device;
    std::string error;
  };
  const std::vector<Expected> drivers = {
      {&tpu_server, kDriver, "tpu-0000-03-00-0", "no API server here"},
      {&gpu_server, kGpuDriver, "gpu-12345678-1234-1234-1234-123456789abc",
       "the GPU driver's API server is away"}};
  int round = 0;
  for (int which : {0, 0, 1, 1, 0, 1, 1, 0}) {
    const Expected& expected = drivers[which];
    ++round;
    {
      SCOPED_TRACE(absl::StrCat(expected.driver, ", call ", round));
      auto registration = pluginregistration::Registration::NewStub(grpc::CreateChannel(
          "unix:" + expected.server->registration_socket(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext info_context;
      info_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      pluginregistration::PluginInfo info;
      ASSERT_TRUE(registration->GetInfo(&info_context, pluginregistration::InfoRequest(), &info).ok());
      EXPECT_EQ(info.name(), expected.driver);
      EXPECT_EQ(info.endpoint(), expected.server->service_socket());

      auto channel = grpc::CreateChannel("unix:" + expected.server->service_socket(),
                                         grpc::InsecureChannelCredentials());
      auto health = drahealth::DRAResourceHealth::NewStub(channel);
      grpc::ClientContext health_context;
      health_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      auto reader = health->NodeWatchResources(&health_context, drahealth::NodeWatchResourcesRequest());
      drahealth::NodeWatchResourcesResponse first;
      ASSERT_TRUE(reader->Read(&first));
      ASSERT_EQ(first.devices_size(), 1);
      EXPECT_EQ(first.devices(0).device().device_name(), expected.device);
      health_context.TryCancel();
      (void)reader->Finish();

      auto plugin = drav1::DRAPlugin::NewStub(channel);
      grpc::ClientContext prepare_context;
      prepare_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      drav1::NodePrepareResourcesResponse prepared;
      const std::string uid = "11111111-1111-1111-1111-111111111111";
      ASSERT_TRUE(plugin->NodePrepareResources(
                            &prepare_context, OneClaim<drav1::NodePrepareResourcesRequest>("c", uid), &prepared)
                      .ok());
      EXPECT_NE(prepared.claims().at(uid).error().find(expected.error), std::string::npos)
          << prepared.claims().at(uid).error();
    }
  }
  EXPECT_EQ(counters_.prepare.calls.load(), 4u);
  EXPECT_EQ(gpu_counters.prepare.calls.load(), 4u);
  tpu_server.Stop();
  gpu_server.Stop();
  shared.Stop(absl::Milliseconds(500), [&] {
    tpu_server.JoinCalls();
    gpu_server.JoinCalls();
  });
  EXPECT_FALSE(IsSocket(tpu_server.service_socket()));
  EXPECT_FALSE(IsSocket(gpu_server.registration_socket()));
}

// A connection that comes while this process is at its descriptor limit waits in the socket's
// backlog: accept() fails (EMFILE), is said, and is tried again a second later rather than at
// once (which would spin while the limit holds); once a descriptor is free, the connection is
// accepted and the server speaks first (HTTP/2's server preface: a SETTINGS frame).
TEST_F(DraPluginServerTest, AConnectionThatComesAtTheDescriptorLimitIsAcceptedOnceOneIsFree) {
  DraPluginServer server(Options(), service_.get());
  ASSERT_TRUE(server.Start().ok());
  const int client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  struct rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  // Every descriptor below the limit taken, then the connection made (it needs none of ours).
  std::vector<int> taken;
  const struct rlimit lowered = {512, limit.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  while (true) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    taken.push_back(fd);
  }
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  const std::string path = server.service_socket();
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const bool connected =
      connect(client, reinterpret_cast<const struct sockaddr*>(&address), sizeof(address)) == 0;
  struct pollfd answer = {client, POLLIN, 0};
  struct rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  const int answered_at_limit = poll(&answer, 1, 1500);
  getrusage(RUSAGE_SELF, &after);
  for (int fd : taken) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_TRUE(connected) << strerror(errno);
  EXPECT_EQ(answered_at_limit, 0) << "accepted while no descriptor was free";
  // A loop that tried accept() again at once would have used most of those 1.5 s.
  const double cpu_seconds =
      (after.ru_utime.tv_sec - before.ru_utime.tv_sec + after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
      (after.ru_utime.tv_usec - before.ru_utime.tv_usec + after.ru_stime.tv_usec - before.ru_stime.tv_usec) / 1e6;
  EXPECT_LT(cpu_seconds, 0.3) << "the accept loop spun at the limit";
  answer.revents = 0;
  EXPECT_EQ(poll(&answer, 1, 5000), 1) << "not accepted once descriptors were free";
  char frame[9];
  ASSERT_EQ(read(client, frame, sizeof(frame)), 9);
  EXPECT_EQ(frame[3], 0x4) << "the server's first frame is SETTINGS";
  close(client);
  server.Stop();
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
  grpc::ClientContext context;
  drav1::NodePrepareResourcesResponse response;
  ASSERT_TRUE(stub->NodePrepareResources(
                      &context, OneClaim<drav1::NodePrepareResourcesRequest>("c", "11111111-1111-1111-1111-111111111111"),
                      &response)
                  .ok());
  ASSERT_EQ(response.claims().count("11111111-1111-1111-1111-111111111111"), 1u);
  EXPECT_NE(response.claims().at("11111111-1111-1111-1111-111111111111").error().find("no API server here"),
            std::string::npos);
  EXPECT_EQ(counters_.prepare.claim_errors.load(), 1u);
  EXPECT_EQ(counters_.prepare.calls.load(), 1u);
  EXPECT_EQ(counters_.prepare.in_flight.load(), 0);
}

// The kubelet gives a DRA call 45 s and the registration's GetInfo 1 s; a prepare that waits for
// a slow API server must hold up none of the driver's other answers.
TEST_F(DraPluginServerTest, UnprepareGetInfoAndHealthAnswerWhileAPrepareWaitsForTheApiServer) {
  absl::Notification reading, release;
  ClaimPreparer preparer(
      PreparerOptions(HeldRead(&reading, &release, absl::UnavailableError("the API server answered late"))), &set_);
  DraPluginService service(&preparer, &set_, "node-1", &counters_);
  DraPluginServer server(Options(), &service);
  ASSERT_TRUE(server.Start().ok());
  auto channel = grpc::CreateChannel("unix:" + server.service_socket(), grpc::InsecureChannelCredentials());
  auto stub = drav1::DRAPlugin::NewStub(channel);
  const std::string uid = "11111111-1111-1111-1111-111111111111";
  grpc::Status prepared;
  drav1::NodePrepareResourcesResponse prepare_response;
  std::thread kubelet = PrepareMeanwhile(stub.get(), "slow", uid, &prepared, &prepare_response);
  ASSERT_TRUE(reading.WaitForNotificationWithTimeout(absl::Seconds(10)));

  grpc::ClientContext unprepare_context;
  unprepare_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  drav1::NodeUnprepareResourcesResponse unprepared;
  grpc::Status status = stub->NodeUnprepareResources(
      &unprepare_context,
      OneClaim<drav1::NodeUnprepareResourcesRequest>("done", "22222222-2222-2222-2222-222222222222"), &unprepared);
  EXPECT_TRUE(status.ok()) << status.error_message();

  auto registration = pluginregistration::Registration::NewStub(grpc::CreateChannel(
      "unix:" + server.registration_socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext info_context;
  info_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  pluginregistration::PluginInfo info;
  EXPECT_TRUE(registration->GetInfo(&info_context, pluginregistration::InfoRequest(), &info).ok());

  auto health = drahealth::DRAResourceHealth::NewStub(channel);
  grpc::ClientContext health_context;
  health_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  auto reader = health->NodeWatchResources(&health_context, drahealth::NodeWatchResourcesRequest());
  drahealth::NodeWatchResourcesResponse first;
  EXPECT_TRUE(reader->Read(&first)) << "the health stream's first list waited for the prepare";
  health_context.TryCancel();
  (void)reader->Finish();

  release.Notify();
  kubelet.join();
  ASSERT_TRUE(prepared.ok()) << prepared.error_message();
  EXPECT_NE(prepare_response.claims().at(uid).error().find("answered late"), std::string::npos);
  server.Stop();
}

// The daemon's stop cancels the API client first, then stops the server: a prepare reading a
// claim then ends at once, and Stop waits for it; one whose read ends only after the server has
// shut down (a fetcher that ignores the cancel) is waited for too, its answer going nowhere.
TEST_F(DraPluginServerTest, StopWaitsForThePrepareBeingAnswered) {
  for (absl::Duration read_ends_after : {absl::ZeroDuration(), absl::Milliseconds(1500)}) {
    SCOPED_TRACE(absl::FormatDuration(read_ends_after));
    absl::Notification reading, cancel;
    ClaimPreparer preparer(PreparerOptions(HeldRead(&reading, &cancel, absl::CancelledError("cancelled"))), &set_);
    DraPluginService service(&preparer, &set_, "node-1", &counters_);
    DraPluginServer server(Options(), &service);
    ASSERT_TRUE(server.Start().ok());
    auto stub = drav1::DRAPlugin::NewStub(
        grpc::CreateChannel("unix:" + server.service_socket(), grpc::InsecureChannelCredentials()));
    grpc::Status prepared;
    drav1::NodePrepareResourcesResponse response;
    std::thread kubelet =
        PrepareMeanwhile(stub.get(), "c", "11111111-1111-1111-1111-111111111111", &prepared, &response);
    ASSERT_TRUE(reading.WaitForNotificationWithTimeout(absl::Seconds(10)));
    std::thread late;
    if (read_ends_after == absl::ZeroDuration()) {
      cancel.Notify();
    } else {
      late = std::thread([&] {
        absl::SleepFor(read_ends_after);  // a read that ignores the cancel, past the 500 ms grace
        cancel.Notify();
      });
    }
    const absl::Time start = absl::Now();
    server.Stop();
    EXPECT_LT(absl::Now() - start, read_ends_after + absl::Seconds(1));
    EXPECT_EQ(service.OpenHealthStreams(), 0);
    kubelet.join();
    if (late.joinable()) late.join();
    EXPECT_EQ(counters_.prepare.in_flight.load(), 0);
  }
}

}  // namespace
}  // namespace edgeaccel
