// Finding another plugin that serves a resource, from what the kubelet's directories show: real
// gRPC servers on real Unix sockets stand in for the other plugins.
#include "edgeaccel/kubelet/other_plugins.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>

#include "absl/time/clock.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "edgeaccel/kubelet/plugin_watcher_service.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::HungSocket;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

Device Gpu(const std::string& id) {
  Device d;
  d.id = id;
  d.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}};
  return d;
}

class OtherPluginsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mkdir(device_plugins_.c_str(), 0755);
    mkdir(registry_.c_str(), 0755);
  }
  // What the kubelet holds per resource (its checkpoint's RegisteredDevices).
  void KubeletHolds(std::map<std::string, std::vector<std::string>> held) {
    kubelet_holds_ = std::move(held);
  }
  // Another vendor's plugin for nvidia.com/gpu, as NVIDIA's names its socket.
  std::unique_ptr<PluginServer> Serve(const std::string& path, std::vector<Device> devices,
                                      PluginWatcherService* extra = nullptr) {
    sets_.push_back(std::make_unique<DeviceSet>("nvidia.com/gpu"));
    sets_.back()->Update(std::move(devices));
    auto server = std::make_unique<PluginServer>(path, sets_.back().get(), &counters_, extra);
    EXPECT_TRUE(server->Start().ok());
    return server;
  }
  OtherPluginQuery Query(std::vector<std::string> own_ids = {"tegra234-igpu0"}) {
    OtherPluginQuery query;
    query.resource = "nvidia.com/gpu";
    query.device_plugin_dir = device_plugins_;
    query.plugins_registry_dir = registry_;
    query.own_socket_name = "edgeaccel-nvidia.com-gpu.sock";
    query.own_ids = std::move(own_ids);
    query.kubelet_ids = kubelet_holds_[query.resource];
    return query;
  }

  TempDir dir_;
  const std::string device_plugins_ = dir_.path() + "/device-plugins";
  const std::string registry_ = dir_.path() + "/plugins_registry";
  std::vector<std::unique_ptr<DeviceSet>> sets_;
  std::map<std::string, std::vector<std::string>> kubelet_holds_;
  PluginCounters counters_;
};

TEST_F(OtherPluginsTest, NothingElseThereIsNobody) {
  auto ours = Serve(device_plugins_ + "/edgeaccel-nvidia.com-gpu.sock", {Gpu("tegra234-igpu0")});
  EXPECT_FALSE(FindOtherPlugin(Query()).has_value()) << "our own socket is not another plugin";
}

TEST_F(OtherPluginsTest, ASocketAdvertisingWhatTheKubeletHoldsForTheResourceServesIt) {
  // NVIDIA's plugin on a Jetson: one device "tegra", which the kubelet holds for nvidia.com/gpu.
  KubeletHolds({{"nvidia.com/gpu", {"tegra"}}, {"coral.ai/edgetpu", {"0000:03:00.0"}}});
  auto nvidia = Serve(device_plugins_ + "/nvidia-gpu.sock", {Gpu("tegra")});
  std::optional<OtherPlugin> other = FindOtherPlugin(Query());
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->socket, device_plugins_ + "/nvidia-gpu.sock");
  EXPECT_EQ(other->registration, "kubelet");
  EXPECT_THAT(other->evidence, HasSubstr("tegra, which the kubelet holds for nvidia.com/gpu"));

  // The same plugin, asked about another resource: not it.
  OtherPluginQuery tpu = Query({"0000:04:00.0"});
  tpu.resource = "coral.ai/edgetpu";
  tpu.kubelet_ids = kubelet_holds_["coral.ai/edgetpu"];
  tpu.own_socket_name = "edgeaccel-coral.ai-edgetpu.sock";
  EXPECT_FALSE(FindOtherPlugin(tpu).has_value());
}

TEST_F(OtherPluginsTest, ASocketAdvertisingOurOwnDevicesServesThemTwice) {
  // A discrete GPU: NVIDIA's plugin and we both call it by its UUID. The kubelet holds nothing
  // yet, but the same physical device must not be served twice.
  auto nvidia = Serve(device_plugins_ + "/nvidia-gpu.sock", {Gpu("GPU-a::0"), Gpu("GPU-a::1")});
  std::optional<OtherPlugin> other = FindOtherPlugin(Query({"GPU-a"}));
  ASSERT_TRUE(other.has_value());
  EXPECT_THAT(other->evidence, HasSubstr("GPU-a::0, a device we found too"));
}

TEST_F(OtherPluginsTest, APluginWatcherSocketSaysWhatItIs) {
  PluginWatcherService info("nvidia.com/gpu");
  auto watcher = Serve(registry_ + "/nvidia.com-gpu.sock", {Gpu("x")}, &info);
  std::optional<OtherPlugin> other = FindOtherPlugin(Query());
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->registration, "plugin-watcher");
  EXPECT_THAT(other->evidence, HasSubstr("its GetInfo names nvidia.com/gpu"));
}

TEST_F(OtherPluginsTest, HungDeadOrUnrelatedSocketsDoNotCountAndDoNotHoldUsUp) {
  KubeletHolds({{"nvidia.com/gpu", {"tegra"}}});
  HungSocket hung_device_plugin(device_plugins_ + "/hung.sock");
  HungSocket hung_registry(registry_ + "/hung.sock");
  ::edgeaccel::testing::MakeStaleSocket(device_plugins_ + "/crashed.sock");
  std::ofstream(device_plugins_ + "/DEPRECATION") << "not a socket";
  auto unrelated = Serve(device_plugins_ + "/vendor-fpga.sock", {Gpu("fpga-0")});
  const absl::Time start = absl::Now();
  EXPECT_FALSE(FindOtherPlugin(Query()).has_value());
  // Two hung sockets, half a second each at most.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
}

TEST_F(OtherPluginsTest, AWatchedPluginThatGoesAwayIsHeardOf) {
  auto nvidia = Serve(device_plugins_ + "/nvidia-gpu.sock", {Gpu("tegra")});
  const int fd = eventfd(0, EFD_CLOEXEC);
  {
    OtherPluginWatch watch(device_plugins_ + "/nvidia-gpu.sock", fd);
    struct pollfd p = {fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 200), 0) << "nothing to hear while it runs";
    nvidia->Stop();  // it exits
    EXPECT_EQ(poll(&p, 1, 5000), 1) << "its end was not heard of";
  }
  uint64_t count = 0;
  ASSERT_EQ(read(fd, &count, sizeof(count)), static_cast<ssize_t>(sizeof(count)));
  {
    // Ending the watch ourselves reports nothing.
    auto again = Serve(device_plugins_ + "/nvidia-gpu.sock", {Gpu("tegra")});
    OtherPluginWatch watch(device_plugins_ + "/nvidia-gpu.sock", fd);
  }
  struct pollfd p = {fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 200), 0);
  close(fd);
}

}  // namespace
}  // namespace edgeaccel
