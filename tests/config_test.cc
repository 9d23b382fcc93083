#include "edgeaccel/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DefaultsAreValid) { EXPECT_TRUE(ValidateConfig(DaemonConfig()).ok()); }

TEST(ConfigTest, RegistrationModesParse) {
  RegistrationMode mode;
  EXPECT_TRUE(ParseRegistrationMode("auto", &mode));
  EXPECT_EQ(mode, RegistrationMode::kAuto);
  EXPECT_TRUE(ParseRegistrationMode("plugin-watcher", &mode));
  EXPECT_EQ(mode, RegistrationMode::kPluginWatcher);
  EXPECT_TRUE(ParseRegistrationMode("kubelet", &mode));
  EXPECT_EQ(mode, RegistrationMode::kKubelet);
  EXPECT_FALSE(ParseRegistrationMode("Kubelet", &mode));
  EXPECT_FALSE(ParseRegistrationMode("", &mode));
}

TEST(ConfigTest, RejectsBadValuesNamingTheFlag) {
  struct Case {
    std::function<void(DaemonConfig&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {[](DaemonConfig& c) { c.host_root = "relative"; }, "--host-root must be an absolute path"},
      {[](DaemonConfig& c) { c.host_root = "/no/such/dir"; }, "--host-root /no/such/dir is not a directory"},
      {[](DaemonConfig& c) { c.kubelet_root = ""; }, "--kubelet-root must be an absolute path"},
      {[](DaemonConfig& c) { c.kubelet_root = "/" + std::string(100, 'k'); }, "Unix socket limit"},
      {[](DaemonConfig& c) { c.probe_interval = absl::Milliseconds(5); }, "--probe-interval"},
      {[](DaemonConfig& c) { c.probe_interval = -absl::Seconds(1); }, "--probe-interval"},
      {[](DaemonConfig& c) { c.temperature_threshold_celsius = 500; }, "--temperature-threshold"},
      {[](DaemonConfig& c) { c.temperature_threshold_celsius = -3; }, "--temperature-threshold"},
      {[](DaemonConfig& c) { c.temperature_hysteresis_celsius = -1; }, "--temperature-hysteresis"},
      {[](DaemonConfig& c) { c.register_timeout = absl::ZeroDuration(); }, "--register-timeout"},
  };
  for (const Case& test : cases) {
    DaemonConfig config;
    test.change(config);
    absl::Status status = ValidateConfig(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << test.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(test.message));
  }
  DaemonConfig off;
  off.probe_interval = absl::ZeroDuration();
  EXPECT_TRUE(ValidateConfig(off).ok());
}

}  // namespace
}  // namespace edgeaccel
