// ScanInputs: what a scan read, read again by the probe; and HostDirectory, which the probe reads
// through, answering as Host does.
#include "edgeaccel/discovery/scan_inputs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>
#include <functional>
#include <optional>
#include <vector>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// A threshold only root writes is compared once per setting interval; the probes between take
// it as the scan read it, and the value beside it is still compared on every call.
TEST(ScanInputsTest, ASettingIsComparedOncePerIntervalAndNotBetween) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "99800\n");
  Host host(fixture.root());
  {
    ScanInputs inputs(&host, absl::Hours(1));
    inputs.Clear();
    EXPECT_EQ(*inputs.ReadInteger("/sys/class/thing/thing0/temp"), 45050);
    EXPECT_EQ(*inputs.ReadInteger("/sys/class/thing/thing0/hw_temp_warn2", Reread::kSetting),
              99800);
    EXPECT_TRUE(inputs.Unchanged());
    fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "89800\n");
    EXPECT_TRUE(inputs.Unchanged());  // not due for an hour
    fixture.Remove("/sys/class/thing/thing0/hw_temp_warn2");
    EXPECT_TRUE(inputs.Unchanged());
    fixture.WriteFile("/sys/class/thing/thing0/temp", "46050\n");
    EXPECT_FALSE(inputs.Unchanged());  // the reading beside it still is
  }
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "99800\n");
  // Settings are read again every 2 s: long enough that the looks meant to fall before that
  // do, however slow this thread.
  ScanInputs inputs(&host, absl::Seconds(2));
  inputs.Clear();
  (void)inputs.ReadInteger("/sys/class/thing/thing0/temp");
  (void)inputs.ReadInteger("/sys/class/thing/thing0/hw_temp_warn2", Reread::kSetting);
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "89800\n");
  EXPECT_TRUE(inputs.Unchanged());
  absl::SleepFor(absl::Milliseconds(2100));
  EXPECT_FALSE(inputs.Unchanged());  // due: read, and seen
  EXPECT_FALSE(inputs.Unchanged());  // until a scan reads it anew
  fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "99800\n");
  EXPECT_TRUE(inputs.Unchanged());  // as the scan read it: it counts from now on
  fixture.WriteFile("/sys/class/thing/thing0/hw_temp_warn2", "94800\n");
  EXPECT_TRUE(inputs.Unchanged());
  absl::SleepFor(absl::Milliseconds(2100));
  EXPECT_FALSE(inputs.Unchanged());
}

TEST(ScanInputsTest, AValueFixedAtBootIsNotReadAgainThereOrNot) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/devices/soc0/family", "Tegra\n");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  EXPECT_TRUE(inputs.ReadAttribute("/sys/devices/soc0/family", Reread::kFixedAtBoot).ok());
  EXPECT_FALSE(inputs.ReadFile("/proc/device-tree/compatible", 4096, Reread::kFixedAtBoot).ok());
  EXPECT_EQ(inputs.size(), 2u);
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/sys/devices/soc0/family", "Other\n");
  fixture.WriteFile("/proc/device-tree/compatible", std::string("nvidia,tegra234\0", 16));
  EXPECT_TRUE(inputs.Unchanged());
  // The same reads through kUntilRead: the missing one is looked at again.
  inputs.Clear();
  fixture.Remove("/proc/device-tree/compatible");
  EXPECT_FALSE(inputs.ReadFile("/proc/device-tree/compatible", 4096, Reread::kUntilRead).ok());
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/proc/device-tree/compatible", std::string("nvidia,tegra234\0", 16));
  EXPECT_FALSE(inputs.Unchanged());
}

// Missing paths are asked about with one open that makes no answer; whatever appears at one,
// a link that goes nowhere included, is seen.
TEST(ScanInputsTest, AMissingPathIsSeenToAppearWhateverItIs) {
  FixtureHost fixture;
  fixture.MakeDirectory("/sys/class");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  EXPECT_FALSE(inputs.ReadFile("/etc/nv_tegra_release").ok());
  EXPECT_FALSE(inputs.ListDirectory("/sys/class/apex").ok());
  EXPECT_FALSE(inputs.Lstat("/sys/class/thing").ok());
  EXPECT_FALSE(inputs.Exists("/proc/driver/nvidia"));
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_TRUE(inputs.Unchanged());
  fixture.Symlink("../nowhere", "/sys/class/thing");  // Lstat finds the link itself
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/sys/class/thing");
  EXPECT_TRUE(inputs.Unchanged());
  fixture.MakeDirectory("/sys/class/apex");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/sys/class/apex");
  fixture.WriteFile("/proc/driver/nvidia/version", "NVRM\n");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/proc/driver/nvidia");
  fixture.WriteFile("/etc/nv_tegra_release", "# R36 (release), REVISION: 4.3\n");
  EXPECT_FALSE(inputs.Unchanged());
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

// A directory whose entries fill several getdents64 buffers is listed whole, again and again:
// on tmpfs (/dev/shm), where a buffer left with room for any entry ends the listing without the
// call that would answer 0, and on the fixture's filesystem, where that call is made.
TEST(HostDirectoryTest, ADirectoryOfManyBuffersIsListedWhole) {
  std::vector<std::string> roots = {::testing::TempDir()};
  if (struct stat st; stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) roots.push_back("/dev/shm");
  for (const std::string& root : roots) {
    std::string made = root + "/edgeaccel-list-XXXXXX";
    ASSERT_NE(mkdtemp(made.data()), nullptr) << root;
    Host host("/");
    std::vector<std::string> expected;
    // 224-byte records: 36 fill a buffer but for 128 bytes, too few for the largest entry.
    for (int i = 0; i < 100; ++i) {
      expected.push_back(absl::StrCat(absl::Dec(i, absl::kZeroPad3), std::string(197, 'n')));
      std::ofstream(made + "/" + expected.back()) << "";
    }
    HostDirectory directory(&host, made, /*listable=*/true);
    for (int pass = 0; pass < 2; ++pass) {
      absl::StatusOr<std::vector<std::string>> names = directory.ListDirectory();
      ASSERT_TRUE(names.ok()) << names.status();
      EXPECT_EQ(*names, expected) << made;
    }
    for (const std::string& name : expected) unlink((made + "/" + name).c_str());
    // Emptied: one entry of "." and ".." alone.
    EXPECT_THAT(*directory.ListDirectory(), ::testing::IsEmpty());
    rmdir(made.c_str());
  }
}

// A file kept open answers as Host does for its path at every read: a value written in place (the
// same inode) and one written by replacing the file are both read; a file removed, moved away,
// made unreadable, swapped for a link or a device node, or a directory that now resolves
// elsewhere give Host's answer, not the kept file's.
// ListedAs answers from the last listing through the directory: an entry under the inode number
// and type an lstat gave, and nothing for a name not listed, another inode or another type.
TEST(HostDirectoryTest, ListedAsAnswersFromTheLastListing) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/file", "1\n");
  fixture.MakeDirectory("/sys/class/thing/dir");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/link");
  Host host(fixture.root());
  HostDirectory directory(&host, "/sys/class/thing", /*listable=*/true);
  const FileInfo file = *host.Lstat("/sys/class/thing/file");
  const FileInfo dir = *host.Lstat("/sys/class/thing/dir");
  const FileInfo link = *host.Lstat("/sys/class/thing/link");
  EXPECT_FALSE(directory.ListedAs("link", link));  // not listed yet
  ASSERT_EQ(*directory.ListDirectory(), (std::vector<std::string>{"dir", "file", "link"}));
  EXPECT_TRUE(directory.ListedAs("file", file));
  EXPECT_TRUE(directory.ListedAs("dir", dir));
  EXPECT_TRUE(directory.ListedAs("link", link));
  EXPECT_FALSE(directory.ListedAs("file", link));  // another inode
  FileInfo retyped = link;
  retyped.type = FileInfo::Type::kRegular;
  EXPECT_FALSE(directory.ListedAs("link", retyped));
  EXPECT_FALSE(directory.ListedAs("other", link));
  // A directory in the link's place: the next listing answers for it.
  fixture.Remove("/sys/class/thing/link");
  fixture.MakeDirectory("/sys/class/thing/link");
  ASSERT_TRUE(directory.ListDirectory().ok());
  EXPECT_FALSE(directory.ListedAs("link", link));
  EXPECT_TRUE(directory.ListedAs("link", *host.Lstat("/sys/class/thing/link")));
  EXPECT_FALSE(directory.OnSysfs());
}

TEST(HostDirectoryTest, AKeptFileAnswersAsHostDoesForItsPath) {
  FixtureHost fixture;
  const std::string dir = "/sys/class/thing/thing0";
  fixture.WriteFile("/sys/devices/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/devices/thing1/temp", "51050\n");
  fixture.Symlink("../../devices/thing0", dir);
  Host host(fixture.root());
  KeptFile kept;
  auto read_and_compare = [&](const char* step) {
    SCOPED_TRACE(step);
    HostDirectory directory(&host, dir);  // resolved again, as each probe does
    absl::StatusOr<std::string> read = directory.ReadFile("temp", 64 * 1024, &kept);
    absl::StatusOr<std::string> want = host.ReadFile(dir + "/temp");
    EXPECT_EQ(read.status(), want.status());
    if (read.ok() && want.ok()) {
      EXPECT_EQ(*read, *want);
    }
    return read;
  };
  EXPECT_EQ(*read_and_compare("first read"), "45050\n");
  EXPECT_FALSE(kept.empty());
  EXPECT_EQ(*read_and_compare("through the kept file"), "45050\n");
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "46050\n", {1, 0});
  EXPECT_EQ(*read_and_compare("written in place"), "46050\n");
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "7\n", {2, 0});  // shorter
  EXPECT_EQ(*read_and_compare("shorter, in place"), "7\n");
  fixture.WriteFile("/sys/devices/thing0/temp", "47050\n");
  EXPECT_EQ(*read_and_compare("replaced"), "47050\n");
  // Moved away: the kept file still holds its value, the path has none.
  ASSERT_EQ(rename(fixture.Path("/sys/devices/thing0/temp").c_str(),
                   fixture.Path("/sys/devices/thing0/temp.old").c_str()),
            0);
  EXPECT_EQ(read_and_compare("moved away").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(rename(fixture.Path("/sys/devices/thing0/temp.old").c_str(),
                   fixture.Path("/sys/devices/thing0/temp").c_str()),
            0);
  EXPECT_EQ(*read_and_compare("moved back"), "47050\n");
  EXPECT_EQ(*read_and_compare("moved back, kept again"), "47050\n");
  // Its permissions changed: opened again, as Host opens it (root reads it all the same).
  ASSERT_EQ(chmod(fixture.Path("/sys/devices/thing0/temp").c_str(), 0), 0);
  (void)read_and_compare("made unreadable");
  ASSERT_EQ(chmod(fixture.Path("/sys/devices/thing0/temp").c_str(), 0644), 0);
  EXPECT_EQ(*read_and_compare("readable again"), "47050\n");
  // The directory's link now names another device.
  fixture.Symlink("../../devices/thing1", dir);
  EXPECT_EQ(*read_and_compare("another directory"), "51050\n");
  // A link in the file's place is followed by Host, and nothing is kept for it.
  fixture.Symlink("/sys/devices/thing0/temp", "/sys/devices/thing1/temp.link");
  ASSERT_EQ(rename(fixture.Path("/sys/devices/thing1/temp.link").c_str(),
                   fixture.Path("/sys/devices/thing1/temp").c_str()),
            0);
  EXPECT_EQ(*read_and_compare("a link in its place"), "47050\n");
  EXPECT_TRUE(kept.empty());
  // A device node in its place is never opened (that resets an Edge TPU).
  fixture.Remove("/sys/devices/thing1/temp");
  fixture.MakeCharDevice("/sys/devices/thing1/temp", 120, 0);
  EXPECT_EQ(read_and_compare("a device node").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(kept.empty());
  // Removed with its device.
  fixture.Remove("/sys/devices/thing1");
  EXPECT_EQ(read_and_compare("device removed").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(kept.empty());
}

// An empty file is read through a new descriptor each time (a seq_file that gave nothing may
// give nothing again at offset 0 on older kernels), and still answers as Host does.
// A kernel attribute (procfs here, sysfs alike) is read again through its descriptor alone: the
// kernel fails the read of one that was removed. A file elsewhere is looked at by name first.
TEST(HostDirectoryTest, OnlyAKernelFileIsReadAgainWithoutLookingAtItsName) {
  Host node("/");
  KeptFile kernel;
  HostDirectory sysctl(&node, "/proc/sys/kernel");
  absl::StatusOr<std::string> ostype = sysctl.ReadFile("ostype", 4096, &kernel);
  ASSERT_TRUE(ostype.ok()) << ostype.status();
  EXPECT_EQ(kernel.ReadIfKernelFile(4096), std::optional<std::string>(*ostype));

  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  Host host(fixture.root());
  KeptFile kept;
  HostDirectory directory(&host, "/sys/class/thing/thing0");
  EXPECT_EQ(*directory.ReadFile("temp", 4096, &kept), "45050\n");
  EXPECT_FALSE(kept.empty());
  EXPECT_EQ(kept.ReadIfKernelFile(4096), std::nullopt);
  EXPECT_EQ(KeptFile().ReadIfKernelFile(4096), std::nullopt);
}

TEST(HostDirectoryTest, AnEmptyFileIsOpenedAgain) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/class/thing/thing0/label", "");
  Host host(fixture.root());
  KeptFile kept;
  HostDirectory directory(&host, "/sys/class/thing/thing0");
  EXPECT_EQ(*directory.ReadFile("label", 4096, &kept), "");
  fixture.OverwriteInPlace("/sys/class/thing/thing0/label", "gpu\n", {1, 0});
  EXPECT_EQ(*directory.ReadFile("label", 4096, &kept), "gpu\n");
  fixture.OverwriteInPlace("/sys/class/thing/thing0/label", std::string(5000, 'x'), {2, 0});
  EXPECT_EQ(directory.ReadFile("label", 4096, &kept).status(),
            host.ReadFile("/sys/class/thing/thing0/label", 4096).status());
}

// The probe reads through kept files from its second look on: a value written in place, a device
// whose attributes are gone, and one back with the same values, are each seen.
TEST(ScanInputsTest, KeptFilesSeeEveryChange) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/devices/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/devices/thing0/status", "ALIVE\n");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/thing0");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  (void)inputs.ReadAttribute("/sys/class/thing/thing0/temp");
  (void)inputs.ReadAttribute("/sys/class/thing/thing0/status");
  EXPECT_TRUE(inputs.Unchanged());  // opens and keeps them
  EXPECT_TRUE(inputs.Unchanged());  // reads through them
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "46050\n", {1, 0});
  EXPECT_FALSE(inputs.Unchanged());
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "45050\n", {2, 0});
  EXPECT_TRUE(inputs.Unchanged());
  ASSERT_EQ(rename(fixture.Path("/sys/devices/thing0").c_str(),
                   fixture.Path("/sys/devices/thing0.gone").c_str()),
            0);
  EXPECT_FALSE(inputs.Unchanged());
  EXPECT_FALSE(inputs.Unchanged());
  // Added again: new files with the same values read the same (the entry that names a device is
  // what tells one device from another; the discoverer reads it too).
  fixture.WriteFile("/sys/devices/thing0/temp", "45050\n");
  fixture.WriteFile("/sys/devices/thing0/status", "ALIVE\n");
  EXPECT_TRUE(inputs.Unchanged());
  fixture.WriteFile("/sys/devices/thing0/status", "DEAD\n");
  EXPECT_FALSE(inputs.Unchanged());
  inputs.Clear();
  EXPECT_TRUE(inputs.Unchanged());
}

// One counter of /proc/thread-self/io for this thread so far ("rchar": bytes read through
// read(2) and pread(2); "syscr": those calls, failed ones too). The read of that file counts too,
// the same every time.
uint64_t ThisThreadsIo(absl::string_view counter) {
  std::ifstream io("/proc/thread-self/io");
  std::string line;
  while (std::getline(io, line)) {
    uint64_t value = 0;
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, counter) && absl::ConsumePrefix(&rest, ": ") &&
        absl::SimpleAtoi(rest, &value)) {
      return value;
    }
  }
  ADD_FAILURE() << "no " << counter << " in /proc/thread-self/io";
  return 0;
}

// How much of `counter` one Unchanged() call adds, less what reading the counter costs.
uint64_t IoOf(const ScanInputs& inputs, absl::string_view counter, bool* unchanged) {
  const uint64_t a = ThisThreadsIo(counter);
  const uint64_t b = ThisThreadsIo(counter);
  *unchanged = inputs.Unchanged();
  const uint64_t c = ThisThreadsIo(counter);
  return (c - b) - (b - a);
}

// What one Unchanged() call reads, in bytes.
uint64_t BytesReadBy(const ScanInputs& inputs, bool* unchanged) {
  return IoOf(inputs, "rchar", unchanged);
}

// A file outside /sys and /proc, on a filesystem that reports its changes (a fixture's, as a
// host's /etc and /usr): watched from the first look after the scan on, and read until one look
// found it as the scan did; then not read at all while no event came. Under /sys, read on every
// look (sysfs sends no events).
TEST(ScanInputsTest, AWatchedFileIsNotReadAgainUntilAnEventComes) {
  FixtureHost fixture;
  fixture.WriteFile("/etc/thing_release", "R36 (release), REVISION: 4.0\n");
  fixture.WriteFile("/sys/class/thing/thing0/temp", "45050\n");
  Host host(fixture.root());
  ScanInputs watched(&host);
  watched.Clear();
  EXPECT_TRUE(watched.ReadFile("/etc/thing_release").ok());
  ScanInputs polled(&host);
  polled.Clear();
  EXPECT_TRUE(polled.ReadFile("/sys/class/thing/thing0/temp").ok());

  bool unchanged = false;
  EXPECT_GT(BytesReadBy(watched, &unchanged), 0u);  // read once after the watches are in place
  EXPECT_TRUE(unchanged);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(BytesReadBy(watched, &unchanged), 0u);
    EXPECT_TRUE(unchanged);
    EXPECT_GT(BytesReadBy(polled, &unchanged), 0u);
    EXPECT_TRUE(unchanged);
  }
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.3\n", {1, 0});
  EXPECT_GT(BytesReadBy(watched, &unchanged), 0u);
  EXPECT_FALSE(unchanged);
  // Back as it was: the event made the look read it again, and it is as the scan found it.
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.0\n", {2, 0});
  EXPECT_TRUE(watched.Unchanged());
  EXPECT_EQ(BytesReadBy(watched, &unchanged), 0u);
  EXPECT_TRUE(unchanged);
}

// The read(2) and pread(2) calls one Unchanged() call makes.
uint64_t ReadCallsBy(const ScanInputs& inputs, bool* unchanged) {
  return IoOf(inputs, "syscr", unchanged);
}

// The tokens `epoll_fd` reports within `timeout_ms`.
std::vector<uint64_t> Reported(int epoll_fd, int timeout_ms) {
  struct epoll_event events[4];
  const int n = epoll_wait(epoll_fd, events, 4, timeout_ms);
  std::vector<uint64_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(events[i].data.u64);
  return tokens;
}

// Told through an epoll when an event waits (the HostWatcher's), a look reads the inotify queue
// only after the epoll reported one: a probe with no event makes no read at all. The epoll hears
// of each event once, until the look after it.
TEST(ScanInputsTest, WithAWakeALookReadsTheEventQueueOnlyAfterAnEventWasReported) {
  FixtureHost fixture;
  fixture.WriteFile("/etc/thing_release", "R36 (release), REVISION: 4.0\n");
  Host host(fixture.root());
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(epoll_fd, 0);
  ScanInputs woken(&host);
  woken.WakeThrough(epoll_fd, 7);
  ScanInputs unwoken(&host);
  for (ScanInputs* inputs : {&woken, &unwoken}) {
    inputs->Clear();
    EXPECT_TRUE(inputs->ReadFile("/etc/thing_release").ok());
    EXPECT_TRUE(inputs->Unchanged());  // the watches are added, and the file read once more
  }
  bool unchanged = false;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ReadCallsBy(unwoken, &unchanged), 1u);  // its queue, empty
    EXPECT_TRUE(unchanged);
    EXPECT_EQ(ReadCallsBy(woken, &unchanged), 0u);
    EXPECT_TRUE(unchanged);
  }
  EXPECT_THAT(Reported(epoll_fd, 0), ::testing::IsEmpty());

  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.3\n", {1, 0});
  EXPECT_THAT(Reported(epoll_fd, 2000), ::testing::ElementsAre(7u));
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.4\n", {2, 0});
  EXPECT_THAT(Reported(epoll_fd, 0), ::testing::IsEmpty());  // once, until read
  woken.EventsReady();
  EXPECT_FALSE(woken.Unchanged());
  EXPECT_FALSE(unwoken.Unchanged());

  // Watched anew after the event, by a new instance that the epoll reports in turn.
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.0\n", {3, 0});
  for (ScanInputs* inputs : {&woken, &unwoken}) EXPECT_TRUE(inputs->Unchanged());
  EXPECT_EQ(ReadCallsBy(woken, &unchanged), 0u);
  EXPECT_TRUE(unchanged);
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.5\n", {4, 0});
  EXPECT_THAT(Reported(epoll_fd, 2000), ::testing::ElementsAre(7u));
  woken.EventsReady();
  EXPECT_FALSE(woken.Unchanged());

  // Without the epoll, the queue is read on every look again.
  woken.WakeThrough(-1, 0);
  fixture.OverwriteInPlace("/etc/thing_release", "R36 (release), REVISION: 4.0\n", {5, 0});
  EXPECT_TRUE(woken.Unchanged());
  EXPECT_EQ(ReadCallsBy(woken, &unchanged), 1u);
  EXPECT_TRUE(unchanged);
  close(epoll_fd);
}

// Whether `look` answers true in a child process that may not look a path up (open, openat,
// openat2, stat, lstat, newfstatat, statx all fail with EPERM under a seccomp filter): the
// child's exit status. nullopt where seccomp cannot be used here.
std::optional<bool> TrueWithoutPathLookups(const std::function<bool()>& look) {
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
  constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#else
  constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#endif
  const pid_t child = fork();
  if (child < 0) return std::nullopt;
  if (child == 0) {
    std::vector<struct sock_filter> filter = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    };
    const std::vector<long> lookups = {
#if defined(__x86_64__)
        SYS_open, SYS_stat, SYS_lstat,
#endif
        SYS_openat, SYS_openat2, SYS_newfstatat, SYS_statx};
    for (size_t i = 0; i < lookups.size(); ++i) {
      const auto to_deny = static_cast<uint8_t>(lookups.size() - i);
      filter.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(lookups[i]), to_deny, 0));
    }
    filter.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    filter.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
    struct sock_fprog program = {static_cast<unsigned short>(filter.size()), filter.data()};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0) {
      _exit(2);
    }
    _exit(look() ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) == 2) {
    return std::nullopt;
  }
  return WEXITSTATUS(status) == 0;
#else
  (void)look;
  return std::nullopt;
#endif
}

// A fixture's copy of a sysfs attribute (ext4, tmpfs: a file that could be replaced under its
// name) is watched for what would put another file in its place, and from the look after that on,
// while no event came, read through the descriptor kept alone, with no path looked up: as a
// kernel attribute is, so the fixture's probe costs what a node's does. Its content still has no
// event (sysfs has none), so it is read on every look; a file put in its place is an event.
TEST(ScanInputsTest, AFixtureAttributeIsReadThroughItsKeptDescriptorWithNoPathLookup) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/devices/thing0/temp", "45050\n");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/thing0");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  ASSERT_TRUE(inputs.ReadAttribute("/sys/class/thing/thing0/temp").ok());
  EXPECT_TRUE(inputs.Unchanged());  // watches, then opens and keeps it
  // Not yet seen changed in place.
  std::optional<bool> unchanged = TrueWithoutPathLookups([&] { return inputs.Unchanged(); });
  if (!unchanged.has_value()) GTEST_SKIP() << "no seccomp here";
  EXPECT_TRUE(*unchanged);
  bool read_unchanged = false;
  EXPECT_GT(BytesReadBy(inputs, &read_unchanged), 0u);  // its content, read on every look
  EXPECT_TRUE(read_unchanged);
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "46050\n", {1, 0});
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), false);
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "45050\n", {2, 0});
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  // Another file with the same value in its place: an event, so the next look resolves the path
  // again and keeps the new file, whose changes it then sees. (Looked at here, not in a child: the
  // child's look would take the event from the queue the two share.)
  fixture.WriteFile("/sys/devices/thing0/temp", "45050\n");
  EXPECT_TRUE(inputs.Unchanged());
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "47050\n", {3, 0});
  EXPECT_FALSE(inputs.Unchanged());
  fixture.OverwriteInPlace("/sys/devices/thing0/temp", "45050\n", {4, 0});
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  // Its permissions changed: an event too, after which the look must resolve the path.
  ASSERT_EQ(chmod(fixture.Path("/sys/devices/thing0/temp").c_str(), 0600), 0);
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), false);
}

// A device node looked at in /dev (devtmpfs, a tmpfs that reports its changes) is watched for
// what can change its answer (made, removed, renamed, its mode or owner changed), not for writes
// to the files beside it: /dev/null and the ttys are written all the time.
// A class directory as a discoverer looks at it: listed, then each entry looked at (lstat) and
// an attribute read through it. On a fixture's copy of sysfs, whose filesystem announces what
// would put another directory or entry under a name, the look lists the directory through the
// descriptor kept from the look before and looks at no entry or path while no event comes; a
// directory or entry put in place of the one kept is seen.
TEST(ScanInputsTest, AFixtureClassDirectoryIsListedThroughItsKeptDescriptorWithNoPathLookup) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/devices/thing0/status", "ALIVE\n");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/thing0");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  auto scan = [&] {
    inputs.Clear();
    ASSERT_TRUE(inputs.ListDirectory("/sys/class/thing").ok());
    ASSERT_TRUE(inputs.Lstat("/sys/class/thing/thing0").ok());
    ASSERT_TRUE(inputs.ReadAttribute("/sys/class/thing/thing0/status").ok());
  };
  scan();
  EXPECT_TRUE(inputs.Unchanged());  // watches, then opens and keeps
  std::optional<bool> unchanged = TrueWithoutPathLookups([&] { return inputs.Unchanged(); });
  if (!unchanged.has_value()) GTEST_SKIP() << "no seccomp here";
  EXPECT_TRUE(*unchanged);
  // The listing is still read: an entry added is seen, through the kept descriptor too.
  fixture.Symlink("../../devices/thing1", "/sys/class/thing/thing1");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/sys/class/thing/thing1");
  scan();
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  // The entry made again, the same link under the same name: another entry.
  fixture.Remove("/sys/class/thing/thing0");
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/thing0");
  EXPECT_FALSE(inputs.Unchanged());
  scan();
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  // The directory moved away and another with the same entry put in its place: the kept
  // descriptor would still list the old one.
  const std::string dir = fixture.Path("/sys/class/thing");
  ASSERT_EQ(rename(dir.c_str(), (dir + ".old").c_str()), 0);
  fixture.Symlink("../../devices/thing0", "/sys/class/thing/thing0");
  EXPECT_FALSE(inputs.Unchanged());
}

// A path missing from a fixture's copy of sysfs or procfs, watched up to where it stops, is not
// looked up while no event comes; whatever appears on the way is seen.
TEST(ScanInputsTest, AMissingFixturePathIsNotLookedUpUntilSomethingAppearsOnTheWay) {
  FixtureHost fixture;
  fixture.MakeDirectory("/sys/class");
  fixture.MakeDirectory("/proc");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  auto scan = [&] {
    inputs.Clear();
    EXPECT_FALSE(inputs.ListDirectory("/sys/bus/usb/devices").ok());
    EXPECT_FALSE(inputs.Stat("/proc/driver/nvidia").ok());
    EXPECT_FALSE(inputs.ReadAttribute("/sys/class/apex/apex_0/status").ok());
  };
  scan();
  EXPECT_TRUE(inputs.Unchanged());  // watches, then looks
  std::optional<bool> unchanged = TrueWithoutPathLookups([&] { return inputs.Unchanged(); });
  if (!unchanged.has_value()) GTEST_SKIP() << "no seccomp here";
  EXPECT_TRUE(*unchanged);
  // A step on the way: still missing, and watched from there on.
  fixture.MakeDirectory("/sys/bus/usb");
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  fixture.MakeDirectory("/sys/bus/usb/devices");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/sys/bus");
  scan();
  EXPECT_TRUE(inputs.Unchanged());
  fixture.MakeDirectory("/proc/driver/nvidia");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/proc/driver");
  scan();
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(TrueWithoutPathLookups([&] { return inputs.Unchanged(); }), true);
  fixture.WriteFile("/sys/class/apex/apex_0/status", "ALIVE\n");
  EXPECT_FALSE(inputs.Unchanged());
}

// On sysfs itself (this machine's /sys/class/net, where "lo" always is), which announces
// nothing: the directory is kept once it listed an entry, and an entry listed under the inode
// number it had is not looked at again.
TEST(ScanInputsTest, ASysfsClassDirectoryIsListedThroughItsKeptDescriptorWithNoPathLookup) {
  Host host("/");
  if (!host.IsSilentToInotify("/sys/class/net") || !host.Exists("/sys/class/net/lo")) {
    GTEST_SKIP() << "no sysfs /sys/class/net/lo here";
  }
  ScanInputs inputs(&host);
  inputs.Clear();
  ASSERT_TRUE(inputs.ListDirectory("/sys/class/net").ok());
  ASSERT_TRUE(inputs.Lstat("/sys/class/net/lo").ok());
  ASSERT_TRUE(inputs.ReadAttribute("/sys/class/net/lo/type").ok());
  EXPECT_TRUE(inputs.Unchanged());  // opens and keeps
  std::optional<bool> unchanged = TrueWithoutPathLookups([&] { return inputs.Unchanged(); });
  if (!unchanged.has_value()) GTEST_SKIP() << "no seccomp here";
  EXPECT_TRUE(*unchanged);
}

TEST(ScanInputsTest, WritesBesideAWatchedDeviceNodeAreNoEvent) {
  FixtureHost fixture;
  fixture.MakeCharDevice("/dev/nvhost-gpu", 486, 0);
  fixture.WriteFile("/dev/ttyS0", "");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  ASSERT_TRUE(inputs.Lstat("/dev/nvhost-gpu").ok());
  EXPECT_TRUE(inputs.Unchanged());
  bool unchanged = false;
  EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);
  for (int i = 0; i < 3; ++i) {
    fixture.OverwriteInPlace("/dev/ttyS0", absl::StrCat("line ", i, "\n"), {i + 1, 0});
    EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);  // not even an event to read
    EXPECT_TRUE(unchanged);
  }
  ASSERT_EQ(chmod(fixture.Path("/dev/nvhost-gpu").c_str(), 0600), 0);
  EXPECT_FALSE(inputs.Unchanged());
}

// Every change on the way to a watched file is an event: a directory on its path removed and made
// again (whose old watch ended with it), a symlink on its path pointed elsewhere, its target
// changed, and a file appearing where there was none.
TEST(ScanInputsTest, WatchedPathsSeeEveryChangeOnTheWay) {
  FixtureHost fixture;
  fixture.WriteFile("/usr/lib/driver-1/libthing.so.1", "one");
  fixture.WriteFile("/usr/lib/driver-2/libthing.so.1", "two");
  fixture.Symlink("driver-1", "/usr/lib/current");
  fixture.WriteFile("/etc/a/b/config", "x=1\n");
  Host host(fixture.root());
  ScanInputs inputs(&host);
  inputs.Clear();
  EXPECT_EQ(*inputs.ReadFile("/usr/lib/current/libthing.so.1"), "one");
  EXPECT_EQ(inputs.ResolveHostPath("/usr/lib/current/libthing.so.1"), "/usr/lib/driver-1/libthing.so.1");
  EXPECT_TRUE(inputs.Stat("/usr/lib/current/libthing.so.1").ok());
  EXPECT_EQ(*inputs.ReadFile("/etc/a/b/config"), "x=1\n");
  EXPECT_FALSE(inputs.Exists("/etc/a/b/c/missing"));
  EXPECT_TRUE(inputs.ListDirectory("/etc/a").ok());
  bool unchanged = false;
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);
  EXPECT_TRUE(unchanged);

  // A directory on the way removed and made again as it was: the same answers, and the new one
  // is watched in turn.
  fixture.Remove("/etc/a");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.WriteFile("/etc/a/b/config", "x=1\n");
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);
  EXPECT_TRUE(unchanged);
  fixture.OverwriteInPlace("/etc/a/b/config", "x=2\n", {3, 0});
  EXPECT_FALSE(inputs.Unchanged());
  fixture.OverwriteInPlace("/etc/a/b/config", "x=1\n", {4, 0});
  EXPECT_TRUE(inputs.Unchanged());

  // What the missing path's nearest directory gets.
  fixture.MakeDirectory("/etc/a/b/c");
  EXPECT_TRUE(inputs.Unchanged());  // an entry of a directory looked in, not listed: the same answers
  fixture.WriteFile("/etc/a/b/c/missing", "");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/etc/a/b/c");
  EXPECT_TRUE(inputs.Unchanged());
  EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);

  // The link pointed at the other driver.
  fixture.Remove("/usr/lib/current");
  fixture.Symlink("driver-2", "/usr/lib/current");
  EXPECT_FALSE(inputs.Unchanged());
  fixture.Remove("/usr/lib/current");
  fixture.Symlink("driver-1", "/usr/lib/current");
  EXPECT_TRUE(inputs.Unchanged());  // back: every answer as the scan's (Stat follows the link)
  EXPECT_EQ(BytesReadBy(inputs, &unchanged), 0u);
  // The target written through another name.
  fixture.OverwriteInPlace("/usr/lib/driver-1/libthing.so.1", "ONE", {5, 0});
  EXPECT_FALSE(inputs.Unchanged());
}

}  // namespace
}  // namespace edgeaccel
