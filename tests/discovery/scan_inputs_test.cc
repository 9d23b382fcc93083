// ScanInputs: what a scan read, read again by the probe; and HostDirectory, which the probe reads
// through, answering as Host does.
#include "edgeaccel/discovery/scan_inputs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;
using Reread = ScanInputs::Reread;

TEST(ScanInputsTest, NothingIsUnchangedBeforeAScan) {
  FixtureHost fixture;
  Host host(fixture.root());
  ScanInputs inputs(&host);
  EXPECT_FALSE(inputs.Unchanged());
  inputs.Clear();  // a scan that read nothing
  EXPECT_TRUE(inputs.Unchanged());
}

TEST(ScanInputsTest, EachKindOfReadIsSeenToChange) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/class/thing/thing0/status", "ALIVE\n");
  fixture.WriteFile("/sys/devices/thing0/uevent", "DEVNAME=thing0\n");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/link");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  EXPECT_EQ(*inputs.ReadInteger("/sys/class/thing/thing0/temp"), 45050);
  EXPECT_EQ(*inputs.ReadAttribute("/sys/class/thing/thing0/status"), "ALIVE");
  EXPECT_TRUE(inputs.Lstat("/sys/class/thing/link").ok());
  EXPECT_TRUE(inputs.Stat("/sys/class/thing/link").ok());
  EXPECT_TRUE(inputs.ListDirectory("/sys/class/thing").ok());
  EXPECT_FALSE(inputs.Exists("/sys/class/thing/thing1"));
  EXPECT_EQ(inputs.size(), 6u);
  EXPECT_TRUE(inputs.Unchanged());

  fixture.WriteFile("/sys/class/thing/thing0/temp", "46050\n");  // same size, new value
  EXPECT_FALSE(inputs.Unchanged());
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");  // the value read: as it was
  EXPECT_TRUE(inputs.Unchanged());
  fixture.Remove("/sys/class/thing/thing0/status");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.WriteFile("/sys/class/thing/thing0/status", "ALIVE\n");
  EXPECT_TRUE(inputs.Unchanged());
  // The link made again: another entry (a device removed and added again), same target.
  fixture.Remove("/sys/class/thing/link");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/link");
  EXPECT_FALSE(inputs.Unchanged());
  inputs.Clear();
  (void)inputs.ListDirectory("/sys/class/thing");
  (void)inputs.Exists("/sys/class/thing/thing1");
  EXPECT_TRUE(inputs.Unchanged());
  fixture.MakeDirectory("/sys/class/thing/thing1");
  EXPECT_FALSE(inputs.Unchanged());
}

TEST(ScanInputsTest, AFixedValueOnceReadIsNotReadAgainAndOneNotYetReadIs) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/pci_address", "0000:03:00.0\n");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  EXPECT_TRUE(inputs.ReadAttribute("/sys/class/thing/thing0/pci_address", Reread::kUntilRead).ok());
  EXPECT_FALSE(inputs.ReadAttribute("/sys/class/thing/thing0/dev", Reread::kUntilRead).ok());
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/sys/class/thing/thing0/pci_address", "0000:04:00.0\n");
  EXPECT_TRUE(inputs.Unchanged());  // fixed while the device is the same one
  fixture.WriteFile("/sys/class/thing/thing0/dev", "120:0\n");
  EXPECT_FALSE(inputs.Unchanged());  // there now: a scan would read it
}

TEST(ScanInputsTest, OnlyThePartThatMattersOfAFileIsCompared) {
  FixtureHost fixture;
  fixture.WriteFile("/proc/meminfo", "MemTotal: 100 kB\nMemFree: 50 kB\n");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  auto first_line = [](absl::string_view text) { return std::string(text.substr(0, text.find('\n'))); };
  EXPECT_EQ(*inputs.ReadPart("/proc/meminfo", first_line), "MemTotal: 100 kB");
  fixture.WriteFile("/proc/meminfo", "MemTotal: 100 kB\nMemFree: 40 kB\n");
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/proc/meminfo", "MemTotal: 200 kB\nMemFree: 40 kB\n");
  EXPECT_FALSE(inputs.Unchanged());
}

// Every answer of a HostDirectory is Host's for the same path: a file, a symlink to follow or
// not, a directory, something missing, a device node (never opened: that resets an Edge TPU).
TEST(HostDirectoryTest, AnswersAsHostDoes) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/devices/thing0/vendor", "0x1ac1\n");
  fixture.Symlink("../../../devices/thing0", "/sys/class/thing/thing0/device");
  fixture.Symlink("/sys/devices/thing0/vendor", "/sys/class/thing/thing0/vendor");
  fixture.MakeCharDevice("/sys/class/thing/thing0/node", 120, 0);
  fixture.WriteFile("/sys/class/thing/thing0/big", std::string(5000, 'x'));
  Host host(fixture.root());
  const std::string dir = "/sys/class/thing/thing0";
  HostDirectory directory(&host, dir);
  for (const char* name : {"temp", "vendor", "device", "node", "missing", "big", "..", "device/vendor"}) {
    SCOPED_TRACE(name);
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<std::string> read = directory.ReadFile(name, 64 * 1024);
    absl::StatusOr<std::string> want = host.ReadFile(path);
    EXPECT_EQ(read.status(), want.status());
    if (read.ok() && want.ok()) {
      EXPECT_EQ(*read, *want);
    }
    absl::StatusOr<std::string> small = directory.ReadFile(name, 4096);
    EXPECT_EQ(small.status(), host.ReadFile(path, 4096).status());
    for (bool lstat : {false, true}) {
      absl::StatusOr<FileInfo> info = lstat ? directory.Lstat(name) : directory.Stat(name);
      absl::StatusOr<FileInfo> want_info = lstat ? host.Lstat(path) : host.Stat(path);
      EXPECT_EQ(info.status(), want_info.status());
      if (info.ok() && want_info.ok()) {
        EXPECT_TRUE(*info == *want_info);
      }
    }
    EXPECT_EQ(directory.Exists(name), host.Exists(path));
  }
  // A directory that is not there: every answer is Host's.
  HostDirectory missing(&host, "/sys/class/none");
  EXPECT_EQ(missing.ReadFile("temp", 4096).status(), host.ReadFile("/sys/class/none/temp", 4096).status());
  EXPECT_FALSE(missing.Exists("temp"));
}

}  // namespace
}  // namespace edgeaccel
