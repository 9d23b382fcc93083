#include "edgeaccel/discovery/coral_usb.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;
using ::testing::HasSubstr;

class CoralUsbTest : public ::testing::Test {
 protected:
  std::vector<Device> Scan() { return discoverer_.Scan(); }
  FixtureHost fixture_;
  Host host_{fixture_.root()};
  CoralUsbDiscoverer discoverer_{&host_};
};

TEST_F(CoralUsbTest, ReadyAcceleratorIsHealthyOnItsPort) {
  fixture_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, "2-1");
  EXPECT_EQ(devices[0].health, Health::kHealthy) << devices[0].unhealthy_reason;
  ASSERT_EQ(devices[0].nodes.size(), 1u);
  EXPECT_EQ(devices[0].nodes[0].host_path, "/dev/bus/usb/002/003");
  EXPECT_EQ(devices[0].facts["vendor_id"], "18d1");
  EXPECT_EQ(devices[0].facts["product_id"], "9302");
  EXPECT_EQ(devices[0].facts["interface"], "usb");
}

TEST_F(CoralUsbTest, DfuModeIsListedButUnhealthyUntilTheFirmwareLoads) {
  FixtureHost::CoralUsb dfu{.port = "2-1", .bus = 2, .dev = 2, .firmware_loaded = false};
  fixture_.AddCoralUsb(dfu);
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].health, Health::kUnhealthy);
  EXPECT_THAT(devices[0].unhealthy_reason, HasSubstr("firmware not loaded (1a6e:089a)"));
  EXPECT_EQ(devices[0].nodes[0].host_path, "/dev/bus/usb/002/002");

  // Re-enumeration: new ids, new devnum, same port, same id.
  FixtureHost::CoralUsb ready{.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true};
  fixture_.ReenumerateCoralUsb(dfu, ready);
  devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, "2-1");
  EXPECT_EQ(devices[0].health, Health::kHealthy) << devices[0].unhealthy_reason;
  EXPECT_EQ(devices[0].nodes[0].host_path, "/dev/bus/usb/002/003");
}

TEST_F(CoralUsbTest, OtherUsbDevicesAndInterfacesAreIgnored) {
  fixture_.WriteFile("/sys/bus/usb/devices/1-1/idVendor", "046d\n");
  fixture_.WriteFile("/sys/bus/usb/devices/1-1/idProduct", "c52b\n");
  fixture_.WriteFile("/sys/bus/usb/devices/usb1/idVendor", "1d6b\n");
  fixture_.WriteFile("/sys/bus/usb/devices/usb1/idProduct", "0003\n");
  fixture_.WriteFile("/sys/bus/usb/devices/2-1:1.0/idVendor", "18d1\n");
  fixture_.WriteFile("/sys/bus/usb/devices/2-1:1.0/idProduct", "9302\n");
  EXPECT_TRUE(Scan().empty());
}

TEST_F(CoralUsbTest, UpperCaseIdsAreNotTheKernelsAndMakeNoDevice) {
  fixture_.AddCoralUsb({.port = "3-1", .bus = 3, .dev = 4, .firmware_loaded = true});
  fixture_.WriteFile("/sys/bus/usb/devices/3-1/idVendor", "18D1\n");
  EXPECT_TRUE(Scan().empty());
}

TEST_F(CoralUsbTest, BadBusOrDevnumIsUnhealthyWithoutAPath) {
  fixture_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  fixture_.WriteFile("/sys/bus/usb/devices/2-1/devnum", "../../x\n");
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].health, Health::kUnhealthy);
  EXPECT_TRUE(devices[0].nodes.empty());
}

TEST_F(CoralUsbTest, StaleNodeIsUnhealthy) {
  fixture_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  fixture_.MakeCharDevice("/dev/bus/usb/002/003", 189, 7);
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_THAT(devices[0].unhealthy_reason, HasSubstr("is not the character device 189:130"));
}

// Scans race a second accelerator being unplugged and replugged. A scan may catch its sysfs
// directory half gone or half made: then the device is skipped, or listed under its own port
// and Unhealthy until busnum/devnum and its node are there. It is never given another id or a
// node that is not its own, and the accelerator that stays plugged is never disturbed.
TEST_F(CoralUsbTest, ScansWhileAnAcceleratorIsUnpluggedAndReplugged) {
  const FixtureHost::CoralUsb stays{.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true};
  const FixtureHost::CoralUsb churns{.port = "2-2", .bus = 2, .dev = 5, .firmware_loaded = true};
  fixture_.AddCoralUsb(stays);
  fixture_.AddCoralUsb(churns);
  std::atomic<bool> stop{false};
  std::atomic<int> replugs{0};
  std::thread churn([&] {
    while (!stop.load()) {
      fixture_.UnplugCoralUsb(churns);
      fixture_.AddCoralUsb(churns);
      replugs.fetch_add(1);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    std::vector<Device> devices = Scan();
    ASSERT_GE(devices.size(), 1u);
    ASSERT_LE(devices.size(), 2u);
    EXPECT_EQ(devices[0].id, "2-1");
    EXPECT_EQ(devices[0].health, Health::kHealthy) << devices[0].unhealthy_reason;
    if (devices.size() == 2) {
      const Device& leaving = devices[1];
      EXPECT_EQ(leaving.id, "2-2");
      for (const DeviceNode& node : leaving.nodes) {
        EXPECT_EQ(node.host_path, "/dev/bus/usb/002/005");
      }
      if (leaving.health == Health::kHealthy) {
        ASSERT_EQ(leaving.nodes.size(), 1u);
      }
    }
  }
  stop.store(true);
  churn.join();
  EXPECT_GT(replugs.load(), 0);
}

}  // namespace
}  // namespace edgeaccel
