#include "edgeaccel/discovery/coral_pcie.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdio.h>

#include <atomic>
#include <set>
#include <thread>

#include "captured_log.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;
using ::testing::HasSubstr;

class CoralTest : public ::testing::Test {
 protected:
  std::vector<Device> Scan(CoralHealthPolicy policy = {}) {
    if (!discoverer_) discoverer_ = std::make_unique<CoralPcieDiscoverer>(&host_, policy);
    return discoverer_->Scan();
  }
  Device ScanSingle() {
    std::vector<Device> devices = Scan();
    EXPECT_EQ(devices.size(), 1u);
    return devices.empty() ? Device() : devices[0];
  }
  // A scan finds one device, Unhealthy for a reason that says `why`.
  void ExpectTheOneDeviceUnhealthy(const std::string& why) {
    Device d = ScanSingle();
    EXPECT_EQ(d.health, Health::kUnhealthy);
    EXPECT_THAT(d.unhealthy_reason, HasSubstr(why));
  }

  FixtureHost fixture_;
  Host host_{fixture_.root()};
  std::unique_ptr<CoralPcieDiscoverer> discoverer_;
};

TEST_F(CoralTest, FindsHealthyM2WithItsFacts) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .numa_node = 0});
  Device d = ScanSingle();
  EXPECT_EQ(d.id, "0000:03:00.0");
  EXPECT_EQ(d.health, Health::kHealthy) << d.unhealthy_reason;
  EXPECT_EQ(d.numa_node, 0);
  ASSERT_EQ(d.nodes.size(), 1u);
  // Host paths, never under the fixture root.
  EXPECT_EQ(d.nodes[0].host_path, "/dev/apex_0");
  EXPECT_EQ(d.nodes[0].container_path, "/dev/apex_0");
  EXPECT_EQ(d.nodes[0].permissions, "rw");
  EXPECT_EQ(d.facts["pci_address"], "0000:03:00.0");
  EXPECT_EQ(d.facts["driver_version"], "1.2");
  EXPECT_EQ(d.facts["framework_version"], "1.1.4");
  EXPECT_EQ(d.facts["vendor_id"], "1ac1");
  EXPECT_EQ(d.facts["product_id"], "089a");
  EXPECT_EQ(d.facts["interface"], "pcie");
  EXPECT_DOUBLE_EQ(d.telemetry["temperature_celsius"], 45.05);
  EXPECT_DOUBLE_EQ(d.telemetry["temperature_threshold_celsius"], 99.8);
  EXPECT_DOUBLE_EQ(d.telemetry["trip_point0_temp_celsius"], 84.8);
}

TEST_F(CoralTest, DualEdgeTpuIsTwoDevices) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].nodes[0].host_path, "/dev/apex_0");
  EXPECT_EQ(devices[1].nodes[0].host_path, "/dev/apex_1");
  EXPECT_FALSE(devices[0].numa_node.has_value());  // numa_node -1: no NUMA information
}

TEST_F(CoralTest, NoDriverMeansNoDevices) {
  EXPECT_TRUE(Scan().empty());
  fixture_.MakeDirectory("/sys/class/apex");
  EXPECT_TRUE(Scan().empty());
}

TEST_F(CoralTest, IgnoresEntriesThatAreNotApexDevices) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.MakeDirectory("/sys/class/apex/apex_x");
  fixture_.MakeDirectory("/sys/class/apex/apex_0..");
  fixture_.MakeDirectory("/sys/class/apex/apex_1234");
  fixture_.MakeDirectory("/sys/class/apex/something");
  EXPECT_EQ(Scan().size(), 1u);
}

TEST_F(CoralTest, MissingNodeIsUnhealthy) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.Remove("/dev/apex_0");
  ExpectTheOneDeviceUnhealthy("device node /dev/apex_0 is missing");
}

TEST_F(CoralTest, NodeThatIsNotACharDeviceIsUnhealthy) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.Remove("/dev/apex_0");
  fixture_.WriteFile("/dev/apex_0", "");
  ExpectTheOneDeviceUnhealthy("/dev/apex_0 is a regular file, not a character device");
}

TEST_F(CoralTest, StaleNodeWithOtherNumbersIsUnhealthy) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.MakeCharDevice("/dev/apex_0", 120, 5);
  ExpectTheOneDeviceUnhealthy("is 120:5 but the driver registered 120:0");
}

TEST_F(CoralTest, DriverStatusOtherThanAliveIsUnhealthy) {
  for (const char* status : {"DEAD", "LAMED", "DRIVER_EXITING"}) {
    FixtureHost fixture;
    fixture.AddCoralPcie({.index = 0, .status = status});
    Host host(fixture.root());
    CoralPcieDiscoverer discoverer(&host, {});
    std::vector<Device> devices = discoverer.Scan();
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0].health, Health::kUnhealthy) << status;
    EXPECT_THAT(devices[0].unhealthy_reason, HasSubstr(std::string("driver reports status ") + status));
  }
}

TEST_F(CoralTest, MissingOrUnreadableStatusIsUnhealthy) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.Remove("/sys/class/apex/apex_0/status");
  ExpectTheOneDeviceUnhealthy("cannot read driver status");
  // Unreadable (as root, a directory in its place is the reliable way to fail a read).
  fixture_.MakeDirectory("/sys/class/apex/apex_0/status");
  ExpectTheOneDeviceUnhealthy("cannot read driver status");
}

TEST_F(CoralTest, OverheatUsesTheDevicesOwnShutdownLineWithHysteresis) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.SetApexAttribute(0, "temp", "99800\n");
  ExpectTheOneDeviceUnhealthy("temperature 99.80 °C is at or above 99.80 °C");
  // Just under the line: still too hot (2 °C hysteresis).
  fixture_.SetApexAttribute(0, "temp", "98550\n");
  EXPECT_EQ(ScanSingle().health, Health::kUnhealthy);
  fixture_.SetApexAttribute(0, "temp", "97550\n");
  EXPECT_EQ(ScanSingle().health, Health::kHealthy);
  // A device with a lower shutdown line of its own.
  fixture_.SetApexAttribute(0, "hw_temp_warn2", "89800\n");
  fixture_.SetApexAttribute(0, "temp", "90050\n");
  EXPECT_EQ(ScanSingle().health, Health::kUnhealthy);
}

TEST_F(CoralTest, ThresholdFlagOverridesTheDevice) {
  fixture_.AddCoralPcie({.index = 0, .temp_mc = 85050});
  std::vector<Device> devices = Scan({.temperature_threshold_mc = 85000});
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].health, Health::kUnhealthy);
  EXPECT_DOUBLE_EQ(devices[0].telemetry["temperature_threshold_celsius"], 85.0);
}

// A shutdown line nobody would choose is not trusted: 0 would mark every TPU Unhealthy.
TEST_F(CoralTest, AnImplausibleShutdownLineIsIgnoredWithAWarning) {
  struct Case {
    const char* warn2;
    double threshold_celsius;
  };
  for (const Case& c : {Case{"0\n", 99.8}, Case{"-89700\n", 99.8}, Case{"166050\n", 99.8},
                        Case{"59800\n", 99.8}, Case{"70050\n", 70.05}}) {
    FixtureHost fixture;
    fixture.AddCoralPcie({.index = 0});
    fixture.SetApexAttribute(0, "hw_temp_warn2", c.warn2);
    Host host(fixture.root());
    CoralPcieDiscoverer discoverer(&host, {});
    ::edgeaccel::testing::CapturedLog log;
    std::vector<Device> devices = discoverer.Scan();
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0].health, Health::kHealthy) << c.warn2 << devices[0].unhealthy_reason;
    EXPECT_DOUBLE_EQ(devices[0].telemetry["temperature_threshold_celsius"], c.threshold_celsius)
        << c.warn2;
    discoverer.Scan();
    // Said once, not on every scan; and never about a plausible line.
    EXPECT_EQ(log.Count("hw_temp_warn2 is"), c.threshold_celsius == 99.8 ? 1 : 0) << c.warn2;
  }
}

TEST_F(CoralTest, GarbageTemperatureKeepsDeviceButSaysSo) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.SetApexAttribute(0, "temp", "not a number\n");
  Device d = ScanSingle();
  EXPECT_EQ(d.health, Health::kHealthy);
  EXPECT_THAT(d.facts["temperature"], HasSubstr("unknown"));
  EXPECT_EQ(d.telemetry.count("temperature_celsius"), 0u);
}

TEST_F(CoralTest, UnreadableTemperatureAfterOverheatStaysUnhealthy) {
  fixture_.AddCoralPcie({.index = 0, .temp_mc = 100050});
  EXPECT_EQ(ScanSingle().health, Health::kUnhealthy);
  fixture_.Remove("/sys/class/apex/apex_0/temp");
  ExpectTheOneDeviceUnhealthy("cannot be read now");
}

// The kernel removes a TPU's sysfs tree while /sys/class/apex still lists it (or the other way
// round): the entry that points nowhere is skipped, the other TPU is unaffected.
TEST_F(CoralTest, EntryWhoseSysfsTreeVanishedAfterListingIsSkipped) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  fixture_.Remove("/sys/devices/pci0000:00/0000:04:00.0");  // class symlink left dangling
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, "0000:03:00.0");
  EXPECT_EQ(devices[0].health, Health::kHealthy) << devices[0].unhealthy_reason;
}

// Files vanishing mid-scan, for real: one thread unplugs and replugs a TPU as fast as it can
// while scans run. Every scan sees the steady TPU healthy, and the churning one either not at
// all or as itself; nothing else is ever made up, and nothing crashes.
TEST_F(CoralTest, ScansWhileATpuIsUnpluggedAndReplugged) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  std::atomic<bool> stop{false};
  std::atomic<int> churns{0};
  std::thread churn([&] {
    while (!stop.load()) {
      fixture_.UnplugCoralPcie(1, "0000:04:00.0");
      fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
      churns.fetch_add(1);
    }
  });
  std::set<size_t> sizes_seen;
  for (int i = 0; i < 2000; ++i) {
    std::vector<Device> devices = Scan();
    sizes_seen.insert(devices.size());
    ASSERT_GE(devices.size(), 1u);
    ASSERT_LE(devices.size(), 2u);
    EXPECT_EQ(devices[0].id, "0000:03:00.0");
    EXPECT_EQ(devices[0].health, Health::kHealthy) << devices[0].unhealthy_reason;
    if (devices.size() == 2) {
      EXPECT_EQ(devices[1].id, "0000:04:00.0");
      EXPECT_EQ(devices[1].nodes[0].host_path, "/dev/apex_1");
    }
  }
  stop.store(true);
  churn.join();
  EXPECT_GT(churns.load(), 0);
}

// The temperature lines change only when root writes them, so the probe's look compares them
// once a minute (ScanInputs::kSetting), and the reading and the driver status on every look.
TEST_F(CoralTest, TheProbeLeavesTheTemperatureLinesForAMinuteAndComparesTheReading) {
  fixture_.AddCoralPcie({.index = 0});
  ASSERT_EQ(Scan().size(), 1u);
  EXPECT_TRUE(discoverer_->InputsUnchanged());
  for (const char* line : {"trip_point0_temp", "trip_point1_temp", "trip_point2_temp",
                           "hw_temp_warn1", "hw_temp_warn2"}) {
    fixture_.SetApexAttribute(0, line, "59800\n");
    EXPECT_TRUE(discoverer_->InputsUnchanged()) << line;
  }
  fixture_.SetApexAttribute(0, "temp", "46050\n");
  EXPECT_FALSE(discoverer_->InputsUnchanged());
  ASSERT_EQ(Scan().size(), 1u);
  fixture_.SetApexAttribute(0, "status", "DEAD\n");
  EXPECT_FALSE(discoverer_->InputsUnchanged());
}

// The probe's look (InputsUnchanged) reads the attributes through descriptors it keeps from its
// first look on. Between two looks a TPU is removed, or removed and added again with the same
// values under the same name, with nothing in /dev to announce it: the next look sees it.
TEST_F(CoralTest, ARemovedOrReAddedTpuIsSeenByTheNextLookThroughKeptFiles) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  ASSERT_EQ(Scan().size(), 2u);
  EXPECT_TRUE(discoverer_->InputsUnchanged());  // opens and keeps the attributes
  EXPECT_TRUE(discoverer_->InputsUnchanged());  // reads through them

  // Its sysfs tree moved away whole: the kept files still hold their values, the paths do not.
  const std::string tree = fixture_.Path("/sys/devices/pci0000:00/0000:04:00.0");
  ASSERT_EQ(rename(tree.c_str(), (tree + ".gone").c_str()), 0);
  EXPECT_FALSE(discoverer_->InputsUnchanged());
  ASSERT_EQ(Scan().size(), 1u);
  EXPECT_TRUE(discoverer_->InputsUnchanged());
  EXPECT_TRUE(discoverer_->InputsUnchanged());

  // Back: what the last scan could not read (its PCI address) is there again.
  ASSERT_EQ(rename((tree + ".gone").c_str(), tree.c_str()), 0);
  EXPECT_FALSE(discoverer_->InputsUnchanged());
  ASSERT_EQ(Scan().size(), 2u);
  EXPECT_TRUE(discoverer_->InputsUnchanged());
  EXPECT_TRUE(discoverer_->InputsUnchanged());

  // Removed and added again under the same name with the same values, /dev left as it was.
  fixture_.Remove("/sys/class/apex/apex_1");
  fixture_.Remove("/sys/devices/pci0000:00/0000:04:00.0");
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  EXPECT_FALSE(discoverer_->InputsUnchanged());
  ASSERT_EQ(Scan().size(), 2u);
  EXPECT_TRUE(discoverer_->InputsUnchanged());
  EXPECT_TRUE(discoverer_->InputsUnchanged());

  // A reading written in place (the same file) is seen through the kept descriptor.
  fixture_.OverwriteInPlace("/sys/devices/pci0000:00/0000:03:00.0/apex/apex_0/status", "DEAD\n",
                            {1, 0});
  EXPECT_FALSE(discoverer_->InputsUnchanged());
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].health, Health::kUnhealthy);
  EXPECT_TRUE(discoverer_->InputsUnchanged());
}

TEST_F(CoralTest, IdFallsBackToDriverNameWithoutAValidPciAddress) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.SetApexAttribute(0, "pci_address", "../../etc/shadow\n");
  Device d = ScanSingle();
  EXPECT_EQ(d.id, "apex_0");
  EXPECT_EQ(d.facts.count("pci_address"), 0u);
}

}  // namespace
}  // namespace edgeaccel
