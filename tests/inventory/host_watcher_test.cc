// HostWatcher against real inotify on a real fixture tree.
#include "edgeaccel/inventory/host_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "edgeaccel/discovery/coral_pcie.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;

constexpr absl::Duration kPatience = absl::Seconds(5);  // generous for loaded CI machines

class HealthTest : public ::testing::Test {
 protected:
  void StartWatcher(absl::Duration probe = absl::ZeroDuration()) {
    watcher_ = std::make_unique<HostWatcher>(&host_, HostWatcher::Options{probe});
    watcher_->Add(&coral_, &set_);
    ASSERT_TRUE(watcher_->Start().ok());
  }
  // Waits for the next version and returns it.
  std::shared_ptr<const Snapshot> NextSnapshot() {
    uint64_t version = set_.Current()->version;
    return set_.WaitNewerThan(version, kPatience);
  }
  std::shared_ptr<const Snapshot> WaitUntil(const std::function<bool(const Snapshot&)>& done) {
    const absl::Time deadline = absl::Now() + kPatience;
    std::shared_ptr<const Snapshot> s = set_.Current();
    while (!done(*s) && absl::Now() < deadline) {
      s = set_.WaitNewerThan(s->version, deadline - absl::Now());
    }
    return s;
  }

  FixtureHost fixture_;
  Host host_{fixture_.root()};
  CoralPcieDiscoverer coral_{&host_, {}};
  DeviceSet set_{"coral.ai/edgetpu"};
  std::unique_ptr<HostWatcher> watcher_;
};

TEST_F(HealthTest, RemovedNodeTurnsUnhealthyAndComesBack) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher();
  ASSERT_EQ(set_.Current()->HealthyCount(), 1);

  fixture_.Remove("/dev/apex_0");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  ASSERT_EQ(s->devices.size(), 1u);
  EXPECT_EQ(s->devices[0].health, Health::kUnhealthy);

  fixture_.MakeCharDevice("/dev/apex_0", 120, 0);
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, HotPluggedDeviceAppearsAndUnpluggedOneGoes) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  StartWatcher();
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 2; });
  EXPECT_EQ(s->devices.size(), 2u);

  fixture_.UnplugCoralPcie(1, "0000:04:00.0");
  s = WaitUntil([](const Snapshot& s) { return s.devices.size() == 1; });
  EXPECT_EQ(s->devices.size(), 1u);
  EXPECT_EQ(s->devices[0].id, "0000:03:00.0");
}

TEST_F(HealthTest, DriverLoadedAfterStartIsNoticed) {
  // Neither /dev nor /sys/class/apex exists yet: their ancestors are watched.
  StartWatcher();
  EXPECT_TRUE(set_.Current()->devices.empty());
  fixture_.AddCoralPcie({.index = 0});
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, TemperatureIsReadOnTheProbeInterval) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher(absl::Milliseconds(100));
  fixture_.SetApexAttribute(0, "temp", "100050\n");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  EXPECT_THAT(s->devices[0].unhealthy_reason, ::testing::HasSubstr("100.05 °C"));
  fixture_.SetApexAttribute(0, "temp", "50050\n");
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, IdleWithoutProbeMeansNoRescans) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher();
  const uint64_t scans = watcher_->scans();
  // Unrelated activity in /dev does not rescan either.
  fixture_.WriteFile("/dev/ttyS0", "");
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(watcher_->scans(), scans);
}

}  // namespace
}  // namespace edgeaccel
