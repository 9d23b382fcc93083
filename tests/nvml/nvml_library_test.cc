// Finding the host's libnvidia-ml.so.1: the ld.so cache that the real ldconfig writes, the
// driver directories (the GPU Operator's /run/nvidia/driver too), symlinks kept inside the root.
#include "edgeaccel/nvml/nvml_library.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>


#include "daemon_process.h"
#include "fixture_host.h"
#include "ld_so_cache_builder.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::LdSoCacheBuilder;
using ::edgeaccel::testing::RunCommand;
using ::testing::HasSubstr;

std::string FakeLibrary() { return FixtureHost::FakeNvmlLibrary(); }

// The layout of H100 node §5.6 of docs/host-facts.md: the driver's files in a read-only
// /usr/local/nvidia/lib64, the versioned file behind libnvidia-ml.so.1, and links from /lib.
void InstallLikeTheH100Node(const FixtureHost& host) {
  host.WriteFile("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", FakeLibrary());
  host.Symlink("libnvidia-ml.so.580.159.04", "/usr/local/nvidia/lib64/libnvidia-ml.so.1");
  host.Symlink("/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/lib/libnvidia-ml.so.1");
}

// The real ldconfig writes the fixture's /etc/ld.so.cache from its /etc/ld.so.conf.
void RunLdconfig(const FixtureHost& host, const std::string& directories) {
  host.WriteFile("/etc/ld.so.conf", directories);
  CommandResult result = RunCommand("/sbin/ldconfig", {"-r", host.root()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
}

TEST(NvmlLibraryTest, TheCacheTheRealLdconfigWroteNamesTheDriversDirectory) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  RunLdconfig(host, "/usr/local/nvidia/lib64\n");
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->found_by, "/etc/ld.so.cache");
  EXPECT_EQ(library->host_path, "/usr/local/nvidia/lib64/libnvidia-ml.so.1");
  EXPECT_EQ(library->open_path,
            host.root() + "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
}

TEST(NvmlLibraryTest, WithoutACacheTheDriverDirectoriesAreTriedAndAbsoluteLinksStayInTheRoot) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->found_by, "the driver directories");
  EXPECT_EQ(library->host_path, "/lib/libnvidia-ml.so.1");
  // /lib/libnvidia-ml.so.1 -> /usr/local/... is the host's path: resolved under the root.
  EXPECT_EQ(library->open_path,
            host.root() + "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04");
}

TEST(NvmlLibraryTest, TheGpuOperatorsDriverRootIsLookedIn) {
  FixtureHost host;
  host.WriteFile("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", FakeLibrary());
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
}

TEST(NvmlLibraryTest, ACacheNamingARemovedLibraryFallsBackAndNotFoundSaysWhereItLooked) {
  FixtureHost host;
  InstallLikeTheH100Node(host);
  RunLdconfig(host, "/usr/local/nvidia/lib64\n");
  host.Remove("/usr/local/nvidia/lib64");  // the driver uninstalled; the cache is stale
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(absl::IsNotFound(library.status())) << library.status();
  EXPECT_THAT(library.status().message(),
              HasSubstr("/usr/local/nvidia/lib64/libnvidia-ml.so.1 (listed in /etc/ld.so.cache, "
                        "not there)"));
  EXPECT_THAT(library.status().message(),
              HasSubstr("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"));
}

TEST(NvmlLibraryTest, AnUnreadableCacheIsSaidAndTheDirectoriesStillTried) {
  FixtureHost host;
  host.WriteFile("/etc/ld.so.cache", "this is no cache");
  host.WriteFile("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", FakeLibrary());
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  host.Remove("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
  library = FindNvmlLibrary(view);
  EXPECT_THAT(library.status().message(),
              HasSubstr("/etc/ld.so.cache (not an ld.so cache in the glibc-ld.so.cache1.1 format)"));
}

TEST(NvmlLibraryTest, OnlyThisMachinesEntryIsTaken) {
  LdSoCacheBuilder cache;
  cache.Add(0x0003, "libnvidia-ml.so.1", "/usr/lib/i386-linux-gnu/libnvidia-ml.so.1");  // 32-bit
  cache.Add(0x0003 | (NativeLdCacheFlags() == 0x0303 ? 0x0a00 : 0x0300), "libnvidia-ml.so.1",
            "/usr/lib/other-machine/libnvidia-ml.so.1");
  cache.Add(NativeLdCacheFlags(), "libnvidia-ml.so.1", "/opt/driver/lib/libnvidia-ml.so.1");
  FixtureHost host;
  host.WriteFile("/etc/ld.so.cache", cache.OldThenNew());
  for (const char* path : {"/usr/lib/i386-linux-gnu/libnvidia-ml.so.1",
                           "/usr/lib/other-machine/libnvidia-ml.so.1",
                           "/opt/driver/lib/libnvidia-ml.so.1"}) {
    host.WriteFile(path, FakeLibrary());
  }
  Host view(host.root());
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(view);
  ASSERT_TRUE(library.ok()) << library.status();
  EXPECT_EQ(library->host_path, "/opt/driver/lib/libnvidia-ml.so.1");
  EXPECT_EQ(library->found_by, "/etc/ld.so.cache");
}

}  // namespace
}  // namespace edgeaccel
