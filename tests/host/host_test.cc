#include "edgeaccel/host/host.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;

TEST(HostTest, ResolvesUnderRootAndNeverEscapesIt) {
  Host host("/tmp/fixture/");
  EXPECT_EQ(host.Resolve("/dev/apex_0"), "/tmp/fixture/dev/apex_0");
  EXPECT_EQ(host.Resolve("/../../etc/shadow"), "/tmp/fixture/etc/shadow");
  // ".." climbs as it would on the host, and stops at the root.
  EXPECT_EQ(host.Resolve("/sys/class/../../../etc"), "/tmp/fixture/etc");
  EXPECT_EQ(Host("/").Resolve("/dev/apex_0"), "/dev/apex_0");
  EXPECT_EQ(Host("/").Resolve("/"), "/");
}

// What a runtime on the host opens for a path: symlinks followed inside the root, the root left
// out (driver libraries and L4T's listed files are mounted from these).
TEST(HostTest, ResolvesAHostPathToTheHostPathItNames) {
  FixtureHost fixture;
  fixture.WriteFile("/usr/lib/libcuda.so.515.76", "ELF");
  fixture.Symlink("libcuda.so.515.76", "/usr/lib/libcuda.so.1");
  fixture.Symlink("/usr/lib", "/lib");
  Host host(fixture.root());
  EXPECT_EQ(host.ResolveHostPath("/lib/libcuda.so.1"), "/usr/lib/libcuda.so.515.76");
  EXPECT_EQ(host.ResolveHostPath("/usr/lib/missing.so"), "/usr/lib/missing.so");
  EXPECT_EQ(host.ResolveHostPath("/"), "/");
  EXPECT_EQ(Host("/").ResolveHostPath("/dev/null"), "/dev/null");
}

TEST(HostTest, ReadsAttributesTrimmed) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/a", "ALIVE\n");
  fixture.WriteFile("/proc/device-tree/model", std::string("NVIDIA Jetson Nano Developer Kit\0", 33));
  fixture.WriteFile("/sys/n", " 45050\n");
  Host host(fixture.root());
  EXPECT_EQ(*host.ReadAttribute("/sys/a"), "ALIVE");
  EXPECT_EQ(*host.ReadAttribute("/proc/device-tree/model"), "NVIDIA Jetson Nano Developer Kit");
  EXPECT_EQ(*host.ReadInteger("/sys/n"), 45050);
}

TEST(HostTest, ReportsBadFilesClearly) {
  FixtureHost fixture;
  fixture.WriteFile("/sys/garbage", "hot\x01\n");
  fixture.MakeDirectory("/sys/dir");
  fixture.MakeCharDevice("/dev/apex_0", 120, 0);
  fixture.WriteFile("/sys/huge", std::string(100000, 'x'));
  Host host(fixture.root());

  absl::StatusOr<int64_t> garbage = host.ReadInteger("/sys/garbage");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(garbage.status().message().find("/sys/garbage does not hold an integer"),
            std::string::npos);
  EXPECT_EQ(host.ReadFile("/sys/missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(host.ReadFile("/sys/dir").ok());
  // A device node is never read (it could block or have side effects).
  EXPECT_EQ(host.ReadFile("/dev/apex_0").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.ReadFile("/sys/huge").status().code(), absl::StatusCode::kOutOfRange);
}

TEST(HostTest, ListsAndStats) {
  FixtureHost fixture;
  fixture.MakeCharDevice("/dev/apex_1", 120, 1);
  fixture.MakeCharDevice("/dev/apex_0", 120, 0);
  fixture.WriteFile("/dev/not_a_node", "");
  Host host(fixture.root());
  EXPECT_EQ(*host.ListDirectory("/dev"),
            (std::vector<std::string>{"apex_0", "apex_1", "not_a_node"}));
  EXPECT_EQ(host.ListDirectory("/nope").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<FileInfo> node = host.Stat("/dev/apex_1");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->type, FileInfo::Type::kCharDevice);
  EXPECT_EQ(node->major, 120u);
  EXPECT_EQ(node->minor, 1u);
  EXPECT_EQ(host.Stat("/dev/not_a_node")->type, FileInfo::Type::kRegular);
  EXPECT_TRUE(host.Exists("/dev/apex_0"));
  EXPECT_FALSE(host.Exists("/dev/apex_9"));
}

// Every resolution test runs with the kernel's openat2 RESOLVE_IN_ROOT and with the walk used on
// kernels before 5.6 (Jetson Nano's 4.9): both must give the same answers.
class ResolutionTest : public ::testing::TestWithParam<Host::Resolution> {
 protected:
  Host MakeHost() const { return Host(fixture_.root(), GetParam()); }
  FixtureHost fixture_;
};

TEST_P(ResolutionTest, AbsoluteSymlinksResolveInsideTheRoot) {
  // As on a node: /proc/device-tree is an absolute link into /sys.
  fixture_.WriteFile("/sys/firmware/devicetree/base/model", std::string("Jetson\0", 7));
  fixture_.Symlink("/sys/firmware/devicetree/base", "/proc/device-tree");
  Host host = MakeHost();
  EXPECT_EQ(*host.ReadAttribute("/proc/device-tree/model"), "Jetson");
  EXPECT_EQ(*host.ListDirectory("/proc/device-tree"), std::vector<std::string>{"model"});
  EXPECT_EQ(host.Resolve("/proc/device-tree/model"),
            fixture_.root() + "/sys/firmware/devicetree/base/model");
}

TEST_P(ResolutionTest, LinksCannotLeaveTheRoot) {
  // This process's own /etc/passwd exists; the fixture's does not. Every way out lands inside.
  fixture_.MakeDirectory("/etc");
  fixture_.Symlink("/etc/passwd", "/sys/absolute");
  fixture_.Symlink("../../../../../../../../../../etc/passwd", "/sys/relative");
  fixture_.Symlink("/..", "/sys/up");
  fixture_.Symlink("/proc/self/root/etc/passwd", "/sys/magic");
  Host host = MakeHost();
  for (const char* path : {"/sys/absolute", "/sys/relative", "/sys/up/etc/passwd",
                           "/sys/up/../../etc/passwd", "/sys/magic"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(host.ReadFile(path).status().code(), absl::StatusCode::kNotFound);
    EXPECT_FALSE(host.Exists(path));
  }
  EXPECT_EQ(host.Resolve("/sys/relative"), fixture_.root() + "/etc/passwd");
  EXPECT_EQ(host.Resolve("/sys/up/etc"), fixture_.root() + "/etc");
  // Once the fixture has the file, the same links find it, and only it.
  fixture_.WriteFile("/etc/passwd", "fixture\n");
  EXPECT_EQ(*host.ReadAttribute("/sys/absolute"), "fixture");
  EXPECT_EQ(*host.ReadAttribute("/sys/relative"), "fixture");
  EXPECT_EQ(*host.ReadAttribute("/sys/up/etc/passwd"), "fixture");
}

TEST_P(ResolutionTest, LstatSeesTheLinkAndStatItsTarget) {
  fixture_.MakeCharDevice("/dev/sda", 8, 0);
  fixture_.Symlink("/dev/sda", "/dev/nvhost-gpu");
  Host host = MakeHost();
  absl::StatusOr<FileInfo> link = host.Lstat("/dev/nvhost-gpu");
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->type, FileInfo::Type::kSymlink);
  absl::StatusOr<FileInfo> target = host.Stat("/dev/nvhost-gpu");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->type, FileInfo::Type::kCharDevice);  // the fixture makes char devices only
  EXPECT_EQ(target->major, 8u);
  EXPECT_EQ(host.Lstat("/dev/missing").status().code(), absl::StatusCode::kNotFound);
}

// Absent() says a path is missing only where every look at it would find nothing: with the
// kernel's resolution; the walk leaves each call to answer for itself.
TEST_P(ResolutionTest, AbsentOnlyWhereEveryLookFindsNothing) {
  fixture_.WriteFile("/etc/os-release", "ID=debian\n");
  fixture_.Symlink("../nowhere", "/sys/class/dangling");
  Host host = MakeHost();
  const bool kernel = GetParam() == Host::Resolution::kKernel;
  EXPECT_EQ(host.Absent("/etc/nv_tegra_release"), kernel);
  EXPECT_EQ(host.Absent("/proc/driver/nvidia/gpus"), kernel);
  EXPECT_FALSE(host.Absent("/etc/os-release"));
  EXPECT_EQ(host.Absent("/sys/class/dangling"), kernel);  // followed: nothing there
  EXPECT_FALSE(host.Absent("/sys/class/dangling", /*follow_last=*/false));  // the link is there
  EXPECT_FALSE(host.Absent("/etc/os-release/x"));  // ENOTDIR: another answer
  EXPECT_TRUE(Host::IsAbsence(host.ReadFile("/etc/nv_tegra_release").status()));
  EXPECT_TRUE(Host::IsAbsence(host.ListDirectory("/proc/driver/nvidia/gpus").status()));
  EXPECT_TRUE(Host::IsAbsence(host.Lstat("/sys/class/missing").status()));
  EXPECT_FALSE(Host::IsAbsence(host.ReadFile("/etc/os-release/x").status()));
  EXPECT_FALSE(Host::IsAbsence(host.ReadFile("/etc/os-release").status()));
}

TEST_P(ResolutionTest, SymlinkLoopsAreAnErrorNotAHang) {
  fixture_.Symlink("/sys/b", "/sys/a");
  fixture_.Symlink("/sys/a", "/sys/b");
  Host host = MakeHost();
  absl::StatusOr<std::string> read = host.ReadFile("/sys/a");
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), ::testing::HasSubstr("/sys/a"));
  EXPECT_FALSE(host.Stat("/sys/a").ok());
  EXPECT_TRUE(host.Lstat("/sys/a").ok());
  EXPECT_EQ(host.Resolve("/sys/a"), fixture_.root() + "/sys/a");  // lexical: nothing to follow
}

TEST_P(ResolutionTest, MissingTailIsAppendedAsWritten) {
  fixture_.MakeDirectory("/sys/devices/real");
  fixture_.Symlink("../devices/real", "/sys/class/link");
  Host host = MakeHost();
  EXPECT_EQ(host.Resolve("/sys/class/link/not/yet/../there"),
            fixture_.root() + "/sys/devices/real/not/there");
  EXPECT_EQ(host.ListDirectory("/sys/class/link/not").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(host.Resolve("/"), fixture_.root());
}

// The root is opened once and every path resolved from that descriptor: links made after the
// Host was, and a Host copied from it, are still confined to the root.
TEST_P(ResolutionTest, TheRootOpenedOnceStillConfinesEveryPath) {
  fixture_.MakeDirectory("/sys");
  Host host = MakeHost();
  fixture_.Symlink("/etc/passwd", "/sys/absolute");
  fixture_.Symlink("../../../../../../../../../../etc/passwd", "/sys/relative");
  fixture_.Symlink("/..", "/sys/up");
  fixture_.Symlink("/proc/self/root/etc/passwd", "/sys/magic");
  std::optional<Host> copy(host);
  Host assigned("/");
  assigned = host;
  for (const Host* h : {&host, &*copy, &assigned}) {
    for (const char* path : {"/sys/absolute", "/sys/relative", "/sys/up/etc/passwd",
                             "/sys/up/../../etc/passwd", "/sys/magic", "/../etc/passwd"}) {
      SCOPED_TRACE(path);
      EXPECT_EQ(h->ReadFile(path).status().code(), absl::StatusCode::kNotFound);
      EXPECT_FALSE(h->Exists(path));
      EXPECT_EQ(h->Stat(path).status().code(), absl::StatusCode::kNotFound);
    }
    EXPECT_EQ(h->Resolve("/sys/up/etc"), fixture_.root() + "/etc");
  }
  fixture_.WriteFile("/etc/passwd", "fixture\n");
  copy.reset();  // the others hold their own descriptors
  EXPECT_EQ(*host.ReadAttribute("/sys/absolute"), "fixture");
  EXPECT_EQ(*assigned.ReadAttribute("/sys/relative"), "fixture");
}

// A root that is not there yet is opened by the first call that finds it, and kept from then.
TEST_P(ResolutionTest, ARootMadeAfterTheHostIsFoundThen) {
  const std::string root = fixture_.root() + "/later";
  Host host(root, GetParam());
  EXPECT_EQ(host.ReadFile("/etc/hostname").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(host.Exists("/"));
  fixture_.WriteFile("/later/etc/hostname", "node-1\n");
  fixture_.Symlink("/../../etc/hostname", "/later/sys/name");
  EXPECT_EQ(*host.ReadAttribute("/etc/hostname"), "node-1");
  EXPECT_EQ(*host.ReadAttribute("/sys/name"), "node-1");
  EXPECT_TRUE(host.Exists("/"));
}

INSTANTIATE_TEST_SUITE_P(KernelAndWalk, ResolutionTest,
                         ::testing::Values(Host::Resolution::kKernel, Host::Resolution::kWalk),
                         [](const ::testing::TestParamInfo<Host::Resolution>& info) {
                           return info.param == Host::Resolution::kKernel ? "Kernel" : "Walk";
                         });

// More entries than one getdents64 call returns: all of them, sorted, without "." and "..".
TEST(HostTest, ListsADirectoryLargerThanOneRead) {
  FixtureHost fixture;
  std::vector<std::string> want;
  for (int i = 0; i < 400; ++i) {
    want.push_back(absl::StrCat("entry_with_a_rather_long_name_", 1000 + i));
    fixture.WriteFile(absl::StrCat("/sys/many/", want.back()), "");
  }
  std::sort(want.begin(), want.end());
  Host host(fixture.root());
  EXPECT_EQ(*host.ListDirectory("/sys/many"), want);
  EXPECT_EQ(host.ListDirectory("/sys/many/entry_with_a_rather_long_name_1000").status().code(),
            absl::StatusCode::kNotFound);  // ENOTDIR, as before
  HostDirectory listable(&host, "/sys/many", /*listable=*/true);
  EXPECT_EQ(*listable.ListDirectory(), want);
  EXPECT_EQ(*listable.ListDirectory(), want);  // again, from the start
  HostDirectory not_listable(&host, "/sys/many");
  EXPECT_EQ(*not_listable.ListDirectory(), want);
  HostDirectory missing(&host, "/sys/none", /*listable=*/true);
  EXPECT_EQ(missing.ListDirectory().status(), host.ListDirectory("/sys/none").status());
}

TEST(HostTest, SysAndProcAreSilentToInotify) {
  FixtureHost fixture;
  fixture.MakeDirectory("/sys/class/apex");
  fixture.MakeDirectory("/dev");
  Host host(fixture.root());
  // By host path: a fixture's sys/ and proc/ behave as a node's do.
  EXPECT_TRUE(host.IsSilentToInotify("/sys/class/apex"));
  EXPECT_TRUE(host.IsSilentToInotify("/proc/driver/nvidia"));
  EXPECT_TRUE(host.IsSilentToInotify("/dev/../sys/bus"));
  EXPECT_FALSE(host.IsSilentToInotify("/dev"));
  EXPECT_FALSE(host.IsSilentToInotify("/dev/bus/usb"));
  EXPECT_FALSE(host.IsSilentToInotify("/system"));
  // By filesystem type: this machine's own procfs and sysfs, wherever they are mounted.
  EXPECT_TRUE(Host("/proc").IsSilentToInotify("/self"));
  EXPECT_TRUE(Host("/sys").IsSilentToInotify("/class"));
}

}  // namespace
}  // namespace edgeaccel
