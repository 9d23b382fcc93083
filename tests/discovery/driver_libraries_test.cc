// The NVIDIA driver's libraries a container gets: found through the host's ld.so cache, of the
// running driver's version only, mounted from their host paths under their sonames.
#include "edgeaccel/discovery/driver_libraries.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "captured_log.h"
#include "daemon_process.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::CommandResult;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::RunCommand;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr char kLib[] = "/usr/lib/x86_64-linux-gnu";

Mount M(const std::string& host, const std::string& container) { return {host, container}; }

TEST(DriverLibrariesTest, TheComputeLibrariesBySonameFromTheirHostFilesWithTheLoaderPath) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  DriverFiles files = finder.Find("515.76");
  // The host's own paths (never under the fixture root), each symlink resolved to the
  // versioned file the runtime bind-mounts, under the soname the loader asks for.
  EXPECT_THAT(files.mounts,
              ElementsAre(M(absl::StrCat(kLib, "/libcuda.so.515.76"), "/usr/local/nvidia/lib64/libcuda.so.1"),
                          M(absl::StrCat(kLib, "/libnvidia-ml.so.515.76"),
                            "/usr/local/nvidia/lib64/libnvidia-ml.so.1"),
                          M(absl::StrCat(kLib, "/libnvidia-ptxjitcompiler.so.515.76"),
                            "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1"),
                          M(absl::StrCat(kLib, "/libnvidia-nvvm.so.515.76"),
                            "/usr/local/nvidia/lib64/libnvidia-nvvm.so.4"),
                          M("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")));
  EXPECT_THAT(files.envs, ElementsAre(Pair("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")));
}

TEST(DriverLibrariesTest, TheSharedCompilerIsFoundByItsVersionedSoname) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.sonames = {"libcuda.so.1", "libnvidia-gpucomp.so.515.76"}});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/opt/driver");
  DriverFiles files = finder.Find("515.76");
  EXPECT_THAT(files.mounts,
              ::testing::Contains(M(absl::StrCat(kLib, "/libnvidia-gpucomp.so.515.76"),
                                    "/opt/driver/libnvidia-gpucomp.so.515.76")));
  EXPECT_THAT(files.envs, ElementsAre(Pair("LD_LIBRARY_PATH", "/opt/driver")));
}

TEST(DriverLibrariesTest, AMissingLibraryIsLeftOutWithOneLogLineNamingIt) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.sonames = {"libcuda.so.1", "libnvidia-ml.so.1",
                                            "libnvidia-ptxjitcompiler.so.1"},
                                .nvidia_smi = false});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  CapturedLog log;
  DriverFiles files = finder.Find("515.76");
  files = finder.Find("515.76");  // a rescan says nothing new
  EXPECT_EQ(files.mounts.size(), 3u);
  EXPECT_EQ(log.Count("WARNING: libnvidia-nvvm.so.4 is not in the host's /etc/ld.so.cache: left out"), 1)
      << log.Text();
  // What CUDA can run without (the debugger's library; the shared compiler older drivers lack)
  // is information, not a warning.
  EXPECT_EQ(log.Count("INFO: libcudadebugger.so.1 is not in the host's /etc/ld.so.cache"), 1)
      << log.Text();
  EXPECT_EQ(log.Count("INFO: libnvidia-gpucomp.so.515.76 is not in"), 1) << log.Text();
  EXPECT_EQ(log.Count("nvidia-smi is not visible to the daemon"), 1) << log.Text();
}

TEST(DriverLibrariesTest, ALibraryOfAnotherDriverVersionIsNeverMounted) {
  FixtureHost fixture;
  // A driver upgrade half done: the cache still names the old libcuda, the kernel module is new.
  fixture.AddNvidiaDriverFiles({.version = "510.47.03"});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  CapturedLog log;
  DriverFiles files = finder.Find("515.76");
  EXPECT_THAT(files.mounts, ElementsAre(M("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")));
  EXPECT_THAT(files.envs, IsEmpty());
  EXPECT_TRUE(log.Contains(absl::StrCat("libcuda.so.1 left out of what containers get of the NVIDIA "
                                        "driver 515.76: ", kLib, "/libcuda.so.1 (it is ", kLib,
                                        "/libcuda.so.510.47.03, not of the running driver 515.76)")))
      << log.Text();
  // Same for a file whose name carries no version at all: nothing proves it is this driver's.
  fixture.Remove(absl::StrCat(kLib, "/libcuda.so.1"));
  fixture.WriteFile(absl::StrCat(kLib, "/libcuda.so.1"), "a copy without its version");
  EXPECT_THAT(finder.Find("510.47.03").mounts,
              ::testing::Not(::testing::Contains(::testing::Field(&Mount::container_path,
                                                                  "/usr/local/nvidia/lib64/libcuda.so.1"))));
}

TEST(DriverLibrariesTest, AnUnreadableCacheOrUnknownVersionGivesNoLibraryAndSaysWhy) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.nvidia_smi = false});
  fixture.WriteFile("/etc/ld.so.cache", "this is no cache");
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  CapturedLog log;
  EXPECT_THAT(finder.Find("515.76").mounts, IsEmpty());
  EXPECT_TRUE(log.Contains("cannot read the host's library cache (/etc/ld.so.cache: not an ld.so "
                           "cache in the glibc-ld.so.cache1.1 format)"))
      << log.Text();
  EXPECT_THAT(finder.Find("").mounts, IsEmpty());
  EXPECT_TRUE(log.Contains("the NVIDIA driver's version is unknown")) << log.Text();
}

// The layout of the H100 node (fixtures-facts §5.6): the driver in /usr/local/nvidia/lib64,
// linked from /lib with absolute links, the cache written by the real ldconfig.
TEST(DriverLibrariesTest, TheRealLdconfigsCacheAndAbsoluteLinksResolveInsideTheRoot) {
  FixtureHost fixture;
  fixture.WriteFile("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", FixtureHost::FakeNvmlLibrary());
  fixture.WriteFile("/etc/ld.so.conf", "/lib\n");
  fixture.Symlink("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", "/lib/libnvidia-ml.so.580.159.04");
  CommandResult result = RunCommand("/sbin/ldconfig", {"-r", fixture.root()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  EXPECT_THAT(finder.Find("580.159.04").mounts,
              ElementsAre(M("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04",
                            "/usr/local/nvidia/lib64/libnvidia-ml.so.1")));
}

// The ld.so cache is parsed again only when its file is another or changed as stat(2) tells
// (inode, size, modification time): rewritten in place with the same size and a new time, it is
// read again.
TEST(DriverLibrariesTest, TheLdCacheIsReadAgainWhenItsFileChangesEvenAtTheSameSize) {
  FixtureHost fixture;
  // Two installs in directories of the same length: caches of the same size.
  fixture.AddNvidiaDriverFiles({.directory = "/opt/driver-a"});
  const std::string cache_a = ::edgeaccel::testing::ReadFileText(fixture.Path("/etc/ld.so.cache"));
  fixture.AddNvidiaDriverFiles({.directory = "/opt/driver-b"});
  const std::string cache_b = ::edgeaccel::testing::ReadFileText(fixture.Path("/etc/ld.so.cache"));
  ASSERT_EQ(cache_a.size(), cache_b.size());
  ASSERT_NE(cache_a, cache_b);
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, "/usr/local/nvidia/lib64");
  auto cuda = [&] {
    for (const Mount& mount : finder.Find("515.76").mounts) {
      if (mount.container_path == "/usr/local/nvidia/lib64/libcuda.so.1") return mount.host_path;
    }
    return std::string("none");
  };
  const struct timespec modified = fixture.Modified("/etc/ld.so.cache");
  fixture.OverwriteInPlace("/etc/ld.so.cache", cache_a, modified);
  EXPECT_EQ(cuda(), "/opt/driver-a/libcuda.so.515.76");

  // The same file as stat(2) sees it (the content changed behind a restored time): not parsed
  // again.
  fixture.OverwriteInPlace("/etc/ld.so.cache", cache_b, modified);
  EXPECT_EQ(cuda(), "/opt/driver-a/libcuda.so.515.76");

  // A new modification time, the same size and inode: read again.
  fixture.OverwriteInPlace("/etc/ld.so.cache", cache_b, {modified.tv_sec + 1, modified.tv_nsec});
  EXPECT_EQ(cuda(), "/opt/driver-b/libcuda.so.515.76");
}

}  // namespace
}  // namespace edgeaccel
