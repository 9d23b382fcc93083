#include "edgeaccel/host/host.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::FixtureHost;

TEST(HostTest, ResolvesUnderRootAndNeverEscapesIt) {
  Host host("/tmp/fixture/");
  EXPECT_EQ(host.Resolve("/dev/apex_0"), "/tmp/fixture/dev/apex_0");
  EXPECT_EQ(host.Resolve("/../../etc/shadow"), "/tmp/fixture/etc/shadow");
  EXPECT_EQ(host.Resolve("/sys/class/../../../etc"), "/tmp/fixture/sys/class/etc");
  EXPECT_EQ(Host("/").Resolve("/dev/apex_0"), "/dev/apex_0");
  EXPECT_EQ(Host("/").Resolve("/"), "/");
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

}  // namespace
}  // namespace edgeaccel
