// The DRA kubelet double (tests/support/dra_kubelet.h) is as strict as the kubelet it models:
// each test drives it with a tiny fake DRA plugin (sync gRPC servers on real Unix sockets) that
// gets one thing wrong, and shows the double refuses or fails it as the real kubelet would, next
// to the same plugin done right being accepted (so every test can fail both ways).
#include "dra_kubelet.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dra_health_v1alpha1.grpc.pb.h"
#include "dra_v1.grpc.pb.h"
#include "dra_v1beta1.grpc.pb.h"
#include "fixture_host.h"
#include "pluginregistration_v1.grpc.pb.h"

namespace edgeaccel::testing {
namespace {

namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;
namespace drav1beta1 = ::k8s::io::kubelet::pkg::apis::dra::v1beta1;

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::StartsWith;

using Claim = DraKubelet::Claim;
using Answer = std::map<std::string, DraKubelet::ClaimResult>;

constexpr char kDriver[] = "gpu.example.com";

// What a well-behaved plugin answers: one device per claim, its CDI id named after the claim.
Answer GoodAnswer(const std::vector<Claim>& claims) {
  Answer answer;
  for (const Claim& claim : claims) {
    DraKubelet::PreparedDevice device;
    device.request_names = {"gpu"};
    device.pool = "node-a";
    device.device = "gpu-0";
    device.cdi_device_ids = {absl::StrCat("k8s.gpu.example.com/claim=", claim.uid, "-gpu-0")};
    answer[claim.uid].devices.push_back(device);
  }
  return answer;
}

// A DRA driver's kubelet plugin reduced to what the kubelet sees: a registration socket in
// plugins_registry/ and a service socket (DRAPlugin v1 and v1beta1, optionally
// DRAResourceHealth), each served by a sync gRPC server.
class FakePlugin {
 public:
  struct Config {
    std::string type = "DRAPlugin";
    std::string name = kDriver;
    std::vector<std::string> versions = {"v1.DRAPlugin", "v1beta1.DRAPlugin"};
    absl::Duration get_info_delay = absl::ZeroDuration();
    std::string registration_name;   // default "<name>-reg.sock"
    std::string endpoint_override;   // what GetInfo says instead of the service socket
    bool one_socket = false;         // everything on the registration socket, endpoint ""
    bool serve_health = false;
  };

  FakePlugin(std::string registry_dir, std::string plugin_dir, Config config)
      : registry_dir_(std::move(registry_dir)),
        plugin_dir_(std::move(plugin_dir)),
        config_(std::move(config)),
        registration_(this),
        v1_(this),
        v1beta1_(this),
        health_(this) {
    mkdir(plugin_dir_.c_str(), 0755);
  }
  ~FakePlugin() { Stop(); }

  std::string registration_socket() const {
    return absl::StrCat(registry_dir_, "/",
                        config_.registration_name.empty() ? absl::StrCat(config_.name, "-reg.sock")
                                                          : config_.registration_name);
  }
  std::string service_socket() const {
    return config_.one_socket ? registration_socket() : plugin_dir_ + "/dra.sock";
  }
  std::string advertised_endpoint() const {
    if (config_.one_socket) return "";
    return config_.endpoint_override.empty() ? service_socket() : config_.endpoint_override;
  }

  // The service socket first, then the registration socket (the helper's order).
  void Start() {
    if (!config_.one_socket) StartService();
    StartRegistration();
  }
  void StartService() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + service_socket(), grpc::InsecureServerCredentials());
    RegisterServices(&builder);
    service_server_ = builder.BuildAndStart();
    ASSERT_NE(service_server_, nullptr);
  }
  void StartRegistration() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + registration_socket(), grpc::InsecureServerCredentials());
    builder.RegisterService(&registration_);
    if (config_.one_socket) RegisterServices(&builder);
    registration_server_ = builder.BuildAndStart();
    ASSERT_NE(registration_server_, nullptr);
  }
  // The plugin going away: its registration socket removed, then the server stopped.
  void StopRegistration() {
    if (registration_server_ == nullptr) return;
    unlink(registration_socket().c_str());
    Shutdown(&registration_server_);
  }
  void Stop() {
    StopRegistration();
    if (service_server_ != nullptr) {
      unlink(service_socket().c_str());
      Shutdown(&service_server_);
    }
  }

  void SetAnswer(std::function<Answer(const std::vector<Claim>&)> answer) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(answer);
  }
  void FailCallsWith(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    fail_with_ = std::move(status);
  }
  void SetHealth(std::vector<std::pair<std::string, v1alpha1::HealthStatus>> devices) {
    absl::MutexLock lock(&mu_);
    health_devices_ = std::move(devices);
    ++health_version_;
  }
  // Every open NodeWatchResources stream returns OK (the plugin closes them).
  void EndHealthStreams() {
    absl::MutexLock lock(&mu_);
    ++end_streams_;
  }

  std::vector<std::pair<bool, std::string>> notifications() {
    absl::MutexLock lock(&mu_);
    return notifications_;
  }
  // "v1 NodePrepareResources uid-a,uid-b", "v1beta1 NodeUnprepareResources uid-a", ...
  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int health_streams() {
    absl::MutexLock lock(&mu_);
    return health_streams_;
  }

 private:
  class Registration final : public pluginregistration::Registration::Service {
   public:
    explicit Registration(FakePlugin* plugin) : plugin_(plugin) {}
    grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                         pluginregistration::PluginInfo* info) override {
      absl::SleepFor(plugin_->config_.get_info_delay);
      info->set_type(plugin_->config_.type);
      info->set_name(plugin_->config_.name);
      info->set_endpoint(plugin_->advertised_endpoint());
      for (const std::string& v : plugin_->config_.versions) info->add_supported_versions(v);
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(
        grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
        pluginregistration::RegistrationStatusResponse*) override {
      absl::MutexLock lock(&plugin_->mu_);
      plugin_->notifications_.emplace_back(status->plugin_registered(), status->error());
      return grpc::Status::OK;
    }

   private:
    FakePlugin* plugin_;
  };

  template <typename Base, typename Api>
  class DraService final : public Base {
   public:
    explicit DraService(FakePlugin* plugin) : plugin_(plugin) {}
    grpc::Status NodePrepareResources(grpc::ServerContext*,
                                      const typename Api::PrepareRequest* request,
                                      typename Api::PrepareResponse* response) override {
      std::vector<Claim> claims = Claims(*request);
      auto [answer, fail] = plugin_->Called(Api::kName, "NodePrepareResources", claims);
      if (!fail.ok()) return fail;
      for (const auto& [uid, result] : answer) {
        auto& out = (*response->mutable_claims())[uid];
        out.set_error(result.error);
        for (const DraKubelet::PreparedDevice& device : result.devices) {
          auto* d = out.add_devices();
          for (const std::string& r : device.request_names) d->add_request_names(r);
          d->set_pool_name(device.pool);
          d->set_device_name(device.device);
          for (const std::string& id : device.cdi_device_ids) d->add_cdi_device_ids(id);
        }
      }
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*,
                                        const typename Api::UnprepareRequest* request,
                                        typename Api::UnprepareResponse* response) override {
      std::vector<Claim> claims = Claims(*request);
      auto [answer, fail] = plugin_->Called(Api::kName, "NodeUnprepareResources", claims);
      if (!fail.ok()) return fail;
      for (const auto& [uid, result] : answer) {
        (*response->mutable_claims())[uid].set_error(result.error);
      }
      return grpc::Status::OK;
    }

   private:
    template <typename Request>
    static std::vector<Claim> Claims(const Request& request) {
      std::vector<Claim> claims;
      for (const auto& c : request.claims()) claims.push_back({c.namespace_(), c.name(), c.uid()});
      return claims;
    }
    FakePlugin* plugin_;
  };
  struct V1Api {
    static constexpr const char* kName = "v1";
    using PrepareRequest = drav1::NodePrepareResourcesRequest;
    using PrepareResponse = drav1::NodePrepareResourcesResponse;
    using UnprepareRequest = drav1::NodeUnprepareResourcesRequest;
    using UnprepareResponse = drav1::NodeUnprepareResourcesResponse;
  };
  struct V1beta1Api {
    static constexpr const char* kName = "v1beta1";
    using PrepareRequest = drav1beta1::NodePrepareResourcesRequest;
    using PrepareResponse = drav1beta1::NodePrepareResourcesResponse;
    using UnprepareRequest = drav1beta1::NodeUnprepareResourcesRequest;
    using UnprepareResponse = drav1beta1::NodeUnprepareResourcesResponse;
  };

  class Health final : public v1alpha1::DRAResourceHealth::Service {
   public:
    explicit Health(FakePlugin* plugin) : plugin_(plugin) {}
    grpc::Status NodeWatchResources(
        grpc::ServerContext* context, const v1alpha1::NodeWatchResourcesRequest*,
        grpc::ServerWriter<v1alpha1::NodeWatchResourcesResponse>* writer) override {
      FakePlugin* p = plugin_;
      uint64_t sent = 0;
      int end_streams;
      {
        absl::MutexLock lock(&p->mu_);
        ++p->health_streams_;
        end_streams = p->end_streams_;
      }
      while (!context->IsCancelled()) {
        v1alpha1::NodeWatchResourcesResponse response;
        {
          absl::MutexLock lock(&p->mu_);
          auto news = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->health_version_ != sent || p->end_streams_ != end_streams;
          };
          p->mu_.AwaitWithTimeout(absl::Condition(&news), absl::Milliseconds(50));
          if (p->end_streams_ != end_streams) return grpc::Status::OK;
          if (p->health_version_ == sent) continue;
          sent = p->health_version_;
          for (const auto& [device, health] : p->health_devices_) {
            v1alpha1::DeviceHealth* d = response.add_devices();
            d->mutable_device()->set_pool_name("node-a");
            d->mutable_device()->set_device_name(device);
            d->set_health(health);
            d->set_last_updated_time(absl::ToUnixSeconds(absl::Now()));
          }
        }
        if (!writer->Write(response)) break;
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled");
    }

   private:
    FakePlugin* plugin_;
  };

  void RegisterServices(grpc::ServerBuilder* builder) {
    builder->RegisterService(&v1_);
    builder->RegisterService(&v1beta1_);
    if (config_.serve_health) builder->RegisterService(&health_);
  }
  static void Shutdown(std::unique_ptr<grpc::Server>* server) {
    (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    (*server)->Wait();
    server->reset();
  }
  std::pair<Answer, grpc::Status> Called(const char* api, const char* method,
                                         const std::vector<Claim>& claims) {
    std::vector<std::string> uids;
    for (const Claim& claim : claims) uids.push_back(claim.uid);
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat(api, " ", method, " ", absl::StrJoin(uids, ",")));
    return {answer_(claims), fail_with_};
  }

  const std::string registry_dir_;
  const std::string plugin_dir_;
  const Config config_;
  Registration registration_;
  DraService<drav1::DRAPlugin::Service, V1Api> v1_;
  DraService<drav1beta1::DRAPlugin::Service, V1beta1Api> v1beta1_;
  Health health_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> service_server_;

  absl::Mutex mu_;
  std::function<Answer(const std::vector<Claim>&)> answer_ ABSL_GUARDED_BY(mu_) = GoodAnswer;
  grpc::Status fail_with_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  std::vector<std::pair<bool, std::string>> notifications_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, v1alpha1::HealthStatus>> health_devices_ ABSL_GUARDED_BY(mu_);
  uint64_t health_version_ ABSL_GUARDED_BY(mu_) = 0;
  int end_streams_ ABSL_GUARDED_BY(mu_) = 0;
  int health_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

class DraKubeletDoubleTest : public ::testing::Test {
 protected:
  DraKubelet& StartKubelet(DraKubeletOptions options = {}) {
    kubelet_ = std::make_unique<DraKubelet>(dir_.path() + "/kubelet", std::move(options));
    kubelet_->Start();
    return *kubelet_;
  }
  std::unique_ptr<FakePlugin> StartPlugin(FakePlugin::Config config = {}) {
    mkdir((kubelet_->root() + "/plugins").c_str(), 0755);
    std::string dir_name = config.name;
    std::replace(dir_name.begin(), dir_name.end(), '/', '_');
    auto plugin = std::make_unique<FakePlugin>(
        kubelet_->PluginsRegistryDir(), absl::StrCat(kubelet_->root(), "/plugins/", dir_name),
        config);
    plugin->Start();
    return plugin;
  }
  // Waits `d`: for tests of something that must NOT happen within the time the real kubelet
  // would have taken to do it.
  static void Within(absl::Duration d) { absl::SleepFor(d); }

  const std::vector<Claim> claims_ = {{"default", "claim-a", "uid-a"},
                                      {"default", "claim-b", "uid-b"}};
  TempDir dir_{"dra-kubelet"};
  std::unique_ptr<DraKubelet> kubelet_;
};

// --- registration ---

TEST_F(DraKubeletDoubleTest, GetInfoAnsweredAfterOneSecondIsNeverRegistered) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config late;
  late.get_info_delay = absl::Milliseconds(1500);
  auto plugin = StartPlugin(late);

  absl::StatusOr<DraKubelet::Registration> registration =
      kubelet.WaitForRegistration(kDriver, absl::Milliseconds(4500));
  EXPECT_TRUE(absl::IsDeadlineExceeded(registration.status())) << registration.status();
  const std::string socket = plugin->registration_socket();
  EXPECT_THAT(kubelet.registration_errors(),
              Contains(absl::StrCat("RegisterPlugin error -- failed to get plugin info using RPC "
                                    "GetInfo at socket ", socket,
                                    ", err: rpc error: code = DeadlineExceeded desc = context "
                                    "deadline exceeded")));
  // Never told anything (operation_generator returns before notifying), retried with backoff,
  // not in a loop: attempts at 0 s, 1.5 s (0.5 s of backoff after the 1 s timeout) and 3.5 s;
  // the next would be at 6.5 s.
  EXPECT_THAT(plugin->notifications(), IsEmpty());
  EXPECT_GE(kubelet.get_info_calls(socket), 2);
  EXPECT_LE(kubelet.get_info_calls(socket), 3);
}

TEST_F(DraKubeletDoubleTest, GetInfoAnsweredWithinOneSecondIsRegistered) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config prompt;
  prompt.get_info_delay = absl::Milliseconds(400);
  auto plugin = StartPlugin(prompt);

  absl::StatusOr<DraKubelet::Registration> registration = kubelet.WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->endpoint, plugin->service_socket());
  EXPECT_EQ(registration->socket, plugin->registration_socket());
  EXPECT_TRUE(kubelet.WaitFor([&] { return !plugin->notifications().empty(); }));
  EXPECT_THAT(plugin->notifications(), ElementsAre(Pair(true, "")));
}

TEST_F(DraKubeletDoubleTest, WrongTypeIsRefusedWithNotifyRegistrationStatusFalse) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config wrong;
  wrong.type = "DraPlugin";  // the constant is "DRAPlugin"
  auto plugin = StartPlugin(wrong);

  const std::string error =
      absl::StrCat("RegisterPlugin error -- no handler registered for plugin type: DraPlugin at "
                   "socket ", plugin->registration_socket());
  ASSERT_TRUE(kubelet.WaitFor([&] { return !plugin->notifications().empty(); }));
  EXPECT_EQ(plugin->notifications().front(), std::make_pair(false, error));
  EXPECT_EQ(kubelet.refusals().front(), error);
  // Retried (the socket stays in the desired state) with a backoff, never registered: within
  // 3 s at most the first attempt and those after 0.5 s and 1 s.
  Within(absl::Seconds(3));
  EXPECT_THAT(kubelet.Registered(kDriver), IsEmpty());
  EXPECT_GE(plugin->notifications().size(), 2u);
  EXPECT_LE(plugin->notifications().size(), 3u);
  for (const auto& [registered, said] : plugin->notifications()) {
    EXPECT_FALSE(registered);
    EXPECT_EQ(said, error);
  }
}

TEST_F(DraKubeletDoubleTest, OtherHandlersPluginTypesAreNeitherRegisteredNorRefused) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config device_plugin;
  device_plugin.type = "DevicePlugin";
  device_plugin.name = "example.com/gpu";
  device_plugin.registration_name = "example-gpu.sock";
  auto plugin = StartPlugin(device_plugin);

  ASSERT_TRUE(kubelet.WaitFor([&] {
    return kubelet.get_info_calls(plugin->registration_socket()) > 0;
  }));
  Within(absl::Seconds(1));
  EXPECT_THAT(plugin->notifications(), IsEmpty());
  EXPECT_THAT(kubelet.refusals(), IsEmpty());
  EXPECT_THAT(kubelet.Drivers(), IsEmpty());
}

TEST_F(DraKubeletDoubleTest, HiddenNamesAndNonSocketsAreNotDialled) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config hidden;
  hidden.registration_name = ".gpu.example.com-reg.sock";
  auto plugin = StartPlugin(hidden);
  const std::string file = kubelet.PluginsRegistryDir() + "/notes-reg.sock";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);

  Within(absl::Milliseconds(2500));
  EXPECT_EQ(kubelet.get_info_calls(plugin->registration_socket()), 0);
  EXPECT_EQ(kubelet.get_info_calls(file), 0);
  EXPECT_THAT(kubelet.events(),
              AllOf(Contains(HasSubstr("ignored " + plugin->registration_socket())),
                    Contains(absl::StrCat("ignored ", file, " (not a socket)"))));
  EXPECT_THAT(kubelet.Drivers(), IsEmpty());
}

TEST_F(DraKubeletDoubleTest, EmptyEndpointMeansTheRegistrationSocket) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config one;
  one.one_socket = true;
  auto plugin = StartPlugin(one);

  absl::StatusOr<DraKubelet::Registration> registration = kubelet.WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->endpoint, plugin->registration_socket());
  EXPECT_TRUE(kubelet.Prepare(kDriver, claims_).ok());
}

TEST_F(DraKubeletDoubleTest, AnotherInstanceCannotTakeARegisteredEndpoint) {
  DraKubelet& kubelet = StartKubelet();
  auto first = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  FakePlugin::Config second;
  second.registration_name = "gpu.example.com-pod2-reg.sock";
  second.endpoint_override = first->service_socket();
  mkdir((kubelet.root() + "/plugins/pod2").c_str(), 0755);
  auto other = std::make_unique<FakePlugin>(kubelet.PluginsRegistryDir(),
                                            kubelet.root() + "/plugins/pod2", second);
  other->StartRegistration();

  const std::string error = absl::StrCat(
      "RegisterPlugin error -- plugin registration failed with err: endpoint ",
      first->service_socket(), " already registered for DRA driver plugin ", kDriver);
  ASSERT_TRUE(kubelet.WaitFor([&] { return !other->notifications().empty(); }));
  EXPECT_EQ(other->notifications().front(), std::make_pair(false, error));
  // Refused after validation: it is in the actual state, so not retried.
  Within(absl::Seconds(2));
  EXPECT_THAT(other->notifications(), SizeIs(1));
  EXPECT_THAT(kubelet.Registered(kDriver), SizeIs(1));
}

// --- service choice ---

class ServiceChoiceTest : public DraKubeletDoubleTest,
                          public ::testing::WithParamInterface<DraKubeletGeneration> {};

TEST_P(ServiceChoiceTest, V1FirstListChoosesV1On136AndV1beta1On133AndCallsIt) {
  DraKubeletOptions options;
  options.generation = GetParam();
  DraKubelet& kubelet = StartKubelet(options);
  auto plugin = StartPlugin();  // ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

  absl::StatusOr<DraKubelet::Registration> registration = kubelet.WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status();
  const bool v1_36 = GetParam() == DraKubeletGeneration::kV1_36;
  EXPECT_EQ(registration->service, v1_36 ? "v1.DRAPlugin" : "v1beta1.DRAPlugin");
  absl::StatusOr<DraKubelet::PrepareAnswer> answer = kubelet.Prepare(kDriver, claims_);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->service, registration->service);
  ASSERT_TRUE(kubelet.Unprepare(kDriver, claims_).ok());
  const std::string api = v1_36 ? "v1" : "v1beta1";
  EXPECT_THAT(plugin->calls(), ElementsAre(api + " NodePrepareResources uid-a,uid-b",
                                           api + " NodeUnprepareResources uid-a,uid-b"));
}

TEST_P(ServiceChoiceTest, EmptyListIsRefused) {
  DraKubeletOptions options;
  options.generation = GetParam();
  DraKubelet& kubelet = StartKubelet(options);
  FakePlugin::Config none;
  none.versions = {};
  auto plugin = StartPlugin(none);

  ASSERT_TRUE(kubelet.WaitFor([&] { return !plugin->notifications().empty(); }));
  const std::string why = "empty list of supported gRPC services (aka supported versions)";
  EXPECT_EQ(plugin->notifications().front(),
            std::make_pair(false, absl::StrCat(
                                      "RegisterPlugin error -- plugin validation failed with err: ",
                                      GetParam() == DraKubeletGeneration::kV1_36
                                          ? absl::StrCat("invalid supported gRPC versions of DRA "
                                                         "driver plugin ", kDriver, " at endpoint ",
                                                         plugin->service_socket(), ": ", why)
                                          : absl::StrCat("invalid versions of plugin ", kDriver,
                                                         ": ", why))));
  EXPECT_THAT(kubelet.Drivers(), IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Generations, ServiceChoiceTest,
                         ::testing::Values(DraKubeletGeneration::kV1_36,
                                           DraKubeletGeneration::kV1_33),
                         [](const auto& info) {
                           return info.param == DraKubeletGeneration::kV1_36 ? "v1_36" : "v1_33";
                         });

TEST_F(DraKubeletDoubleTest, On136ThePluginsOrderDecides) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config beta_first;
  beta_first.versions = {"v1beta1.DRAPlugin", "v1.DRAPlugin"};
  auto plugin = StartPlugin(beta_first);

  absl::StatusOr<DraKubelet::Registration> registration = kubelet.WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->service, "v1beta1.DRAPlugin");
}

TEST_F(DraKubeletDoubleTest, On136AListWithoutAKnownServiceIsRefused) {
  DraKubelet& kubelet = StartKubelet();
  FakePlugin::Config future;
  future.versions = {"v2.DRAPlugin"};
  auto plugin = StartPlugin(future);

  ASSERT_TRUE(kubelet.WaitFor([&] { return !plugin->notifications().empty(); }));
  EXPECT_EQ(plugin->notifications().front().second,
            absl::StrCat("RegisterPlugin error -- plugin validation failed with err: invalid "
                         "supported gRPC versions of DRA driver plugin ", kDriver, " at endpoint ",
                         plugin->service_socket(),
                         ": none of services supported by the plugin ([\"v2.DRAPlugin\"]) are "
                         "supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"));
}

TEST_F(DraKubeletDoubleTest, On133AV1OnlyPluginRegistersAsAlphaAndItsCallsFail) {
  DraKubeletOptions options;
  options.generation = DraKubeletGeneration::kV1_33;
  DraKubelet& kubelet = StartKubelet(options);
  FakePlugin::Config v1_only;
  v1_only.versions = {"v1.DRAPlugin"};
  auto plugin = StartPlugin(v1_only);

  absl::StatusOr<DraKubelet::Registration> registration = kubelet.WaitForRegistration(kDriver);
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->service, "v1alpha3.NodeService");
  absl::StatusOr<DraKubelet::PrepareAnswer> answer = kubelet.Prepare(kDriver, claims_);
  EXPECT_TRUE(absl::IsUnimplemented(answer.status())) << answer.status();
  EXPECT_THAT(std::string(answer.status().message()),
              StartsWith("prepare dynamic resources: NodePrepareResources: rpc error: code = "
                         "Unimplemented desc = "));
  EXPECT_THAT(plugin->calls(), IsEmpty());
}

// --- the kubelet's checks of an answer ---

TEST_F(DraKubeletDoubleTest, ACompleteAnswerPrepares) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());

  absl::StatusOr<DraKubelet::PrepareAnswer> answer = kubelet.Prepare(kDriver, claims_);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_THAT(answer->claims, SizeIs(2));
  const DraKubelet::ClaimResult& a = answer->claims.at("uid-a");
  ASSERT_THAT(a.devices, SizeIs(1));
  EXPECT_EQ(a.devices[0].pool, "node-a");
  EXPECT_EQ(a.devices[0].device, "gpu-0");
  EXPECT_THAT(a.devices[0].request_names, ElementsAre("gpu"));
  EXPECT_THAT(a.devices[0].cdi_device_ids, ElementsAre("k8s.gpu.example.com/claim=uid-a-gpu-0"));
  EXPECT_FALSE(a.devices[0].share_id.has_value());
}

TEST_F(DraKubeletDoubleTest, AnAnswerMissingAClaimFailsThePrepare) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  plugin->SetAnswer([](const std::vector<Claim>& claims) {
    return GoodAnswer({claims.front()});
  });

  absl::StatusOr<DraKubelet::PrepareAnswer> answer = kubelet.Prepare(kDriver, claims_);
  EXPECT_EQ(answer.status().message(),
            "prepare dynamic resources: NodePrepareResources skipped 1 ResourceClaims");
  // What the plugin said, unchecked.
  absl::StatusOr<DraKubelet::PrepareAnswer> raw =
      kubelet.CallNodePrepareResources(kDriver, claims_);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_THAT(raw->claims, SizeIs(1));

  absl::StatusOr<DraKubelet::UnprepareAnswer> unprepared = kubelet.Unprepare(kDriver, claims_);
  EXPECT_EQ(unprepared.status().message(),
            "unprepare dynamic resources: NodeUnprepareResources skipped 1 ResourceClaims");
}

TEST_F(DraKubeletDoubleTest, AnAnswerForAClaimNotAskedForFailsThePrepare) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  plugin->SetAnswer([](const std::vector<Claim>& claims) {
    Answer answer = GoodAnswer(claims);
    answer["uid-z"];  // an empty entry for a claim never asked about
    return answer;
  });

  EXPECT_EQ(kubelet.Prepare(kDriver, claims_).status().message(),
            "prepare dynamic resources: NodePrepareResources returned result for unknown claim "
            "UID uid-z");
  EXPECT_EQ(kubelet.Unprepare(kDriver, claims_).status().message(),
            "unprepare dynamic resources: NodeUnprepareResources returned result for unknown "
            "claim UID uid-z");
}

TEST_F(DraKubeletDoubleTest, AClaimsErrorFailsThePrepare) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  plugin->SetAnswer([](const std::vector<Claim>& claims) {
    Answer answer = GoodAnswer(claims);
    answer["uid-b"].error = "claim not allocated";
    return answer;
  });

  EXPECT_EQ(kubelet.Prepare(kDriver, claims_).status().message(),
            "prepare dynamic resources: NodePrepareResources failed for ResourceClaim claim-b: "
            "claim not allocated");
}

TEST_F(DraKubeletDoubleTest, AGrpcErrorFailsTheWholeCall) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  plugin->FailCallsWith(grpc::Status(grpc::StatusCode::UNAVAILABLE, "API server unreachable"));

  absl::StatusOr<DraKubelet::PrepareAnswer> answer = kubelet.Prepare(kDriver, claims_);
  EXPECT_TRUE(absl::IsUnavailable(answer.status()));
  EXPECT_EQ(answer.status().message(),
            "prepare dynamic resources: NodePrepareResources: rpc error: code = Unavailable desc "
            "= API server unreachable");
}

// --- deregistration and restart ---

TEST_F(DraKubeletDoubleTest, RemovingTheRegistrationSocketDeregisters) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  ASSERT_FALSE(kubelet.Deregistered(kDriver));

  plugin->StopRegistration();  // the DRA service still answers
  ASSERT_TRUE(kubelet.WaitFor([&] { return kubelet.Deregistered(kDriver); }, absl::Seconds(10)));
  EXPECT_EQ(kubelet.deregistrations(kDriver), 1);
  EXPECT_EQ(kubelet.Prepare(kDriver, claims_).status().message(),
            "prepare dynamic resources: DRA driver gpu.example.com is not registered");
  EXPECT_THAT(plugin->calls(), IsEmpty());

  // Back: registered again (a new instance), and usable.
  plugin->StartRegistration();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  EXPECT_THAT(kubelet.registrations(kDriver), SizeIs(2));
  EXPECT_TRUE(kubelet.Prepare(kDriver, claims_).ok());
}

TEST_F(DraKubeletDoubleTest, ARestartRegistersTheSocketsStillThere) {
  DraKubelet& kubelet = StartKubelet();
  auto plugin = StartPlugin();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());

  kubelet.Stop();
  EXPECT_THAT(kubelet.Drivers(), IsEmpty());
  kubelet.Start();
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());
  EXPECT_THAT(kubelet.registrations(kDriver), SizeIs(2));
  // Told after it is in the store.
  ASSERT_TRUE(kubelet.WaitFor([&] { return plugin->notifications().size() == 2; }));
  EXPECT_THAT(plugin->notifications(), ElementsAre(Pair(true, ""), Pair(true, "")));
  EXPECT_TRUE(kubelet.Prepare(kDriver, claims_).ok());
}

// --- health ---

TEST_F(DraKubeletDoubleTest, HealthStreamIsRetriedOnUnimplemented) {
  DraKubeletOptions options;
  options.health_retry_interval = absl::Milliseconds(200);
  DraKubelet& kubelet = StartKubelet(options);
  auto plugin = StartPlugin();  // no health service, none advertised
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());

  ASSERT_TRUE(kubelet.WaitFor([&] { return kubelet.health_stream_errors(kDriver) >= 3; },
                              absl::Seconds(3)));
  EXPECT_THAT(kubelet.last_health_stream_error(kDriver), StartsWith("Unimplemented: "));
  EXPECT_THAT(kubelet.Health(kDriver), IsEmpty());
  // Every 200 ms, not in a loop: 10 in 2 s, fewer where each failed call takes a while.
  const int before = kubelet.health_streams_opened(kDriver);
  Within(absl::Seconds(2));
  const int opened = kubelet.health_streams_opened(kDriver) - before;
  EXPECT_GE(opened, 5);
  EXPECT_LE(opened, 11);
  EXPECT_TRUE(kubelet.Prepare(kDriver, claims_).ok());  // the driver stays usable
}

TEST_F(DraKubeletDoubleTest, On133NoHealthStreamIsOpened) {
  DraKubeletOptions options;
  options.generation = DraKubeletGeneration::kV1_33;
  options.health_retry_interval = absl::Milliseconds(100);
  DraKubelet& kubelet = StartKubelet(options);
  FakePlugin::Config healthy;
  healthy.serve_health = true;
  healthy.versions = {"v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"};
  auto plugin = StartPlugin(healthy);
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());

  Within(absl::Milliseconds(500));
  EXPECT_EQ(kubelet.health_streams_opened(kDriver), 0);
  EXPECT_EQ(plugin->health_streams(), 0);
}

TEST_F(DraKubeletDoubleTest, HealthIsStreamedEvenIfNotAdvertisedAndClearedWhenTheStreamEnds) {
  DraKubeletOptions options;
  options.health_retry_interval = absl::Milliseconds(300);
  DraKubelet& kubelet = StartKubelet(options);
  FakePlugin::Config healthy;
  healthy.serve_health = true;
  healthy.versions = {"v1.DRAPlugin"};  // the health service not advertised
  auto plugin = StartPlugin(healthy);
  plugin->SetHealth({{"gpu-0", v1alpha1::HEALTHY}, {"gpu-1", v1alpha1::HEALTHY}});
  ASSERT_TRUE(kubelet.WaitForRegistration(kDriver).ok());

  auto health_of = [](const std::vector<DraKubelet::HealthEntry>& devices) {
    std::vector<std::string> out;
    for (const auto& d : devices) out.push_back(absl::StrCat(d.pool, "/", d.device, "=", d.health));
    return out;
  };
  ASSERT_TRUE(kubelet.WaitForHealth(kDriver, [&](const auto& devices) {
    return health_of(devices) ==
           std::vector<std::string>{"node-a/gpu-0=Healthy", "node-a/gpu-1=Healthy"};
  })) << absl::StrJoin(health_of(kubelet.Health(kDriver)), " ");
  // Each message is the complete list: a device left out is gone from it.
  plugin->SetHealth({{"gpu-1", v1alpha1::UNHEALTHY}});
  ASSERT_TRUE(kubelet.WaitForHealth(kDriver, [&](const auto& devices) {
    return health_of(devices) == std::vector<std::string>{"node-a/gpu-1=Unhealthy"};
  })) << absl::StrJoin(health_of(kubelet.Health(kDriver)), " ");
  // The plugin ends the stream: the list is cleared, and the stream opened again.
  const int opened = kubelet.health_streams_opened(kDriver);
  plugin->EndHealthStreams();
  ASSERT_TRUE(kubelet.WaitForHealth(kDriver, [](const auto& devices) { return devices.empty(); }));
  ASSERT_TRUE(kubelet.WaitForHealth(kDriver, [](const auto& devices) { return !devices.empty(); }));
  EXPECT_EQ(kubelet.health_streams_opened(kDriver), opened + 1);
  EXPECT_EQ(kubelet.health_stream_errors(kDriver), 0);  // EOF is no error
}

// --- the program ---

// Runs edgeaccel-test-dra-kubelet (built beside this test) and returns its exit status, stdout
// and stderr.
struct ProgramRun {
  int status = -1;
  std::string out;
  std::string err;
};
ProgramRun RunProgram(const std::string& program, const std::string& args,
                      const std::string& scratch) {
  ProgramRun run;
  const std::string err_file = scratch + "/program.err";
  FILE* pipe = popen(absl::StrCat(program, " ", args, " 2>", err_file).c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int status = pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* f = fopen(err_file.c_str(), "r")) {
    while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) run.err.append(buffer, n);
    fclose(f);
  }
  return run;
}

TEST_F(DraKubeletDoubleTest, TheProgramPreparesAClaimAndSaysTheKubeletsError) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(len, 0);
  std::string program(self, len);
  program = program.substr(0, program.find_last_of('/')) + "/edgeaccel-test-dra-kubelet";
  if (access(program.c_str(), X_OK) != 0) {
    GTEST_SKIP() << program << " is not built (cmake --build build --target "
                 << "edgeaccel-test-dra-kubelet)";
  }
  const std::string root = dir_.path() + "/kubelet";
  mkdir(root.c_str(), 0755);
  mkdir((root + "/plugins_registry").c_str(), 0755);
  mkdir((root + "/plugins").c_str(), 0755);
  FakePlugin plugin(root + "/plugins_registry", root + "/plugins/gpu", FakePlugin::Config());
  plugin.Start();

  ProgramRun run = RunProgram(program,
                              absl::StrCat("--root ", root, " --timeout 10 prepare default "
                                           "claim-a uid-a"),
                              dir_.path());
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("\"service\": \"v1.DRAPlugin\""));
  EXPECT_THAT(run.out, HasSubstr("\"cdiDeviceIDs\": [\"k8s.gpu.example.com/claim=uid-a-gpu-0\"]"));
  EXPECT_THAT(run.err, HasSubstr("registered gpu.example.com v1.DRAPlugin"));

  run = RunProgram(program,
                   absl::StrCat("--root ", root, " --generation 1.33 --driver ", kDriver,
                                " prepare default claim-a uid-a default claim-b uid-b"),
                   dir_.path());
  EXPECT_EQ(run.status, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("\"service\": \"v1beta1.DRAPlugin\""));

  plugin.SetAnswer([](const std::vector<Claim>& claims) { return GoodAnswer({claims.front()}); });
  run = RunProgram(program,
                   absl::StrCat("--root ", root, " prepare default claim-a uid-a default claim-b "
                                "uid-b"),
                   dir_.path());
  EXPECT_EQ(run.status, 1);
  EXPECT_THAT(run.out, HasSubstr("\"uid-a\""));  // what the plugin said
  EXPECT_THAT(run.err, HasSubstr("edgeaccel-test-dra-kubelet: prepare dynamic resources: "
                                 "NodePrepareResources skipped 1 ResourceClaims"));
}

}  // namespace
}  // namespace edgeaccel::testing
