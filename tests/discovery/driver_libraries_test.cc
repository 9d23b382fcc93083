// The NVIDIA driver's libraries a container gets: found through the host's ld.so cache, of the
// running driver's version only, mounted from their host paths under their sonames.
#include "edgeaccel/discovery/driver_libraries.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

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
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr char kLib[] = "/usr/lib/x86_64-linux-gnu";

Mount M(const std::string& host, const std::string& container) { return {host, container}; }

// `host` mounted under `soname` in each directory the container's loader searches by default
// (and libcuda.so beside libcuda.so.1).
std::vector<Mount> InLoaderDirs(const std::string& host, const std::string& soname) {
  std::vector<Mount> mounts;
  for (const std::string& dir : DriverLibraryContainerDirs()) {
    mounts.push_back({host, absl::StrCat(dir, "/", soname)});
    if (soname == "libcuda.so.1") mounts.push_back({host, absl::StrCat(dir, "/libcuda.so")});
  }
  return mounts;
}

std::vector<Mount> Concat(std::vector<std::vector<Mount>> parts) {
  std::vector<Mount> all;
  for (std::vector<Mount>& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

// The host file the container path `container` is mounted from, or "none".
std::string HostPathOf(const DriverFiles& files, const std::string& container) {
  for (const Mount& mount : files.mounts) {
    if (mount.container_path == container) return mount.host_path;
  }
  return "none";
}

// Where a Debian-family loader looks (/usr/lib/<triplet>) and a RHEL-family one (/usr/lib64):
// glibc's system search path, after LD_LIBRARY_PATH and the ld.so cache, so nothing an image
// sets is replaced (`ld.so --help` on Debian 12: /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu,
// /lib, /usr/lib).
TEST(DriverLibrariesTest, TheLoadersOwnDirectoriesOfBothImageFamilies) {
#if defined(__aarch64__)
  EXPECT_THAT(DriverLibraryContainerDirs(), ElementsAre("/usr/lib/aarch64-linux-gnu", "/usr/lib64"));
#else
  EXPECT_THAT(DriverLibraryContainerDirs(), ElementsAre("/usr/lib/x86_64-linux-gnu", "/usr/lib64"));
#endif
}

TEST(DriverLibrariesTest, TheComputeLibrariesBySonameFromTheirHostFilesInTheLoadersDirectories) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  DriverFiles files = finder.Find("515.76");
  // The host's own paths (never under the fixture root), each symlink resolved to the
  // versioned file the runtime bind-mounts, under the soname the loader asks for.
  EXPECT_THAT(files.mounts,
              ElementsAreArray(Concat(
                  {InLoaderDirs(absl::StrCat(kLib, "/libcuda.so.515.76"), "libcuda.so.1"),
                   InLoaderDirs(absl::StrCat(kLib, "/libnvidia-ml.so.515.76"), "libnvidia-ml.so.1"),
                   InLoaderDirs(absl::StrCat(kLib, "/libnvidia-ptxjitcompiler.so.515.76"),
                                "libnvidia-ptxjitcompiler.so.1"),
                   InLoaderDirs(absl::StrCat(kLib, "/libnvidia-nvvm.so.515.76"), "libnvidia-nvvm.so.4"),
                   {M("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")}})));
}

TEST(DriverLibrariesTest, AnExtraDirectoryGetsThemTooAndTheSharedCompilerIsFoundByItsVersionedSoname) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.sonames = {"libcuda.so.1", "libnvidia-gpucomp.so.515.76"}});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host, {.extra_directory = "/usr/local/nvidia/lib64"});
  DriverFiles files = finder.Find("515.76");
  for (const std::string dir : {"/usr/lib64", "/usr/local/nvidia/lib64"}) {
    EXPECT_EQ(HostPathOf(files, absl::StrCat(dir, "/libnvidia-gpucomp.so.515.76")),
              absl::StrCat(kLib, "/libnvidia-gpucomp.so.515.76"));
    EXPECT_EQ(HostPathOf(files, absl::StrCat(dir, "/libcuda.so")),
              absl::StrCat(kLib, "/libcuda.so.515.76"));
  }
}

// NVIDIA's capability sets (libnvidia-container's nvc_info.c): compute and utility by default;
// video and graphics only when asked; utility alone gives no libcuda.
TEST(DriverLibrariesTest, EachCapabilityBringsItsOwnSet) {
  EXPECT_THAT(DriverLibrarySonames("580.1"),
              ElementsAre("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
                          "libnvidia-nvvm.so.4", "libnvidia-gpucomp.so.580.1", "libcudadebugger.so.1",
                          "libnvidia-opencl.so.1", "libnvidia-cfg.so.1"));
  EXPECT_THAT(DriverLibrarySonames("580.1", kDriverUtility),
              ElementsAre("libnvidia-ml.so.1", "libnvidia-cfg.so.1"));
  EXPECT_THAT(DriverLibrarySonames("580.1", kDriverVideo),
              ElementsAre("libnvcuvid.so.1", "libnvidia-encode.so.1", "libnvidia-opticalflow.so.1",
                          "libvdpau_nvidia.so.1"));
  EXPECT_THAT(DriverLibrarySonames("580.1", kDriverGraphics),
              ::testing::IsSupersetOf({"libGLX_nvidia.so.0", "libEGL_nvidia.so.0",
                                       "libnvidia-glcore.so.580.1", "libnvidia-eglcore.so.580.1",
                                       "libnvidia-glvkspirv.so.580.1", "libnvidia-gpucomp.so.580.1"}));
  EXPECT_THAT(*ParseDriverCapabilities("compute, utility"), kDriverCompute | kDriverUtility);
  EXPECT_EQ(DriverCapabilitiesText(*ParseDriverCapabilities("all")), "compute,utility,video,graphics");
  EXPECT_EQ(DriverCapabilitiesText(*ParseDriverCapabilities("video,compute")), "compute,video");
  EXPECT_THAT(ParseDriverCapabilities("compute,display").status().message(),
              HasSubstr("\"display\" is not a driver capability"));
  EXPECT_FALSE(ParseDriverCapabilities("").ok());

  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.sonames = {"libcuda.so.1", "libnvidia-ml.so.1", "libnvcuvid.so.1"}});
  Host host(fixture.root());
  DriverLibraryFinder video(&host, {.capabilities = kDriverCompute | kDriverVideo});
  DriverFiles files = video.Find("515.76");
  EXPECT_EQ(HostPathOf(files, "/usr/lib64/libnvcuvid.so.1"), absl::StrCat(kLib, "/libnvcuvid.so.515.76"));
  EXPECT_EQ(HostPathOf(files, "/usr/local/nvidia/bin/nvidia-smi"), "none");  // a utility
  DriverLibraryFinder utility(&host, {.capabilities = kDriverUtility});
  files = utility.Find("515.76");
  EXPECT_EQ(HostPathOf(files, "/usr/lib64/libcuda.so.1"), "none");
  EXPECT_EQ(HostPathOf(files, "/usr/lib64/libnvidia-ml.so.1"), absl::StrCat(kLib, "/libnvidia-ml.so.515.76"));
}

// The GPU Operator installs the driver in its container, whose root the host sees at
// /run/nvidia/driver: the host's own cache lists no libcuda, that root's does, with paths inside
// it.
TEST(DriverLibrariesTest, WithoutTheDriverOnTheHostTheGpuOperatorsRootIsRead) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.root = "/run/nvidia/driver"});
  fixture.AddNvidiaDriverFiles({.sonames = {}});  // the host's own cache, without the driver
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  DriverFiles files = finder.Find("515.76");
  EXPECT_EQ(HostPathOf(files, "/usr/lib64/libcuda.so.1"),
            absl::StrCat("/run/nvidia/driver", kLib, "/libcuda.so.515.76"));
  EXPECT_EQ(HostPathOf(files, "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
            absl::StrCat("/run/nvidia/driver", kLib, "/libnvidia-ml.so.515.76"));
}

// Debian's and Ubuntu's ldconfig name /lib/<triplet>/... (the first directory of ld.so.conf that
// holds the file; /lib is a link to usr/lib), and the DaemonSet mounts only the host's /usr
// directories: the file is found under /usr, as on the host.
TEST(DriverLibrariesTest, AMergedUsrHostsLibPathsAreFoundUnderUsr) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.directory = "/lib/x86_64-linux-gnu"});
  std::filesystem::create_directories(fixture.Path("/usr"));
  std::filesystem::rename(fixture.Path("/lib"), fixture.Path("/usr/lib"));  // no /lib in the pod
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  EXPECT_EQ(HostPathOf(finder.Find("515.76"), "/usr/lib64/libcuda.so.1"),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.515.76");
}

// A RHEL-family host (Rocky, Amazon Linux): the driver's package installs into /usr/lib64, its
// cache names the files there; each of the four compute libraries is mounted from there.
TEST(DriverLibrariesTest, ARhelFamilyHostsLibrariesComeFromUsrLib64) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.directory = "/usr/lib64"});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  const DriverFiles files = finder.Find("515.76");
  for (const std::string soname : {"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1",
                                   "libnvidia-nvvm.so.4"}) {
    const std::string file = absl::StrCat("/usr/lib64/", soname.substr(0, soname.find(".so.")), ".so.515.76");
    for (const std::string& dir : DriverLibraryContainerDirs()) {
      EXPECT_EQ(HostPathOf(files, absl::StrCat(dir, "/", soname)), file) << dir << "/" << soname;
    }
  }
}

TEST(DriverLibrariesTest, AMissingLibraryIsLeftOutWithOneLogLineNamingIt) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.sonames = {"libcuda.so.1", "libnvidia-ml.so.1",
                                            "libnvidia-ptxjitcompiler.so.1"},
                                .nvidia_smi = false});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  CapturedLog log;
  DriverFiles files = finder.Find("515.76");
  files = finder.Find("515.76");  // a rescan says nothing new
  // Three libraries in the loader's two directories, and libcuda.so beside libcuda.so.1.
  EXPECT_EQ(files.mounts.size(), 3u * DriverLibraryContainerDirs().size() + DriverLibraryContainerDirs().size());
  EXPECT_EQ(log.Count("WARNING: libnvidia-nvvm.so.4 is not in /etc/ld.so.cache: left out"), 1)
      << log.Text();
  // What CUDA can run without (the debugger's library; the shared compiler older drivers lack)
  // is information, not a warning.
  EXPECT_EQ(log.Count("INFO: libcudadebugger.so.1 is not in /etc/ld.so.cache"), 1)
      << log.Text();
  EXPECT_EQ(log.Count("INFO: libnvidia-gpucomp.so.515.76 is not in"), 1) << log.Text();
  EXPECT_EQ(log.Count("nvidia-smi is not visible to the daemon"), 1) << log.Text();
}

TEST(DriverLibrariesTest, ALibraryOfAnotherDriverVersionIsNeverMounted) {
  FixtureHost fixture;
  // A driver upgrade half done: the cache still names the old libcuda, the kernel module is new.
  fixture.AddNvidiaDriverFiles({.version = "510.47.03"});
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
  CapturedLog log;
  DriverFiles files = finder.Find("515.76");
  EXPECT_THAT(files.mounts, ElementsAre(M("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")));
  EXPECT_TRUE(log.Contains(absl::StrCat("libcuda.so.1 left out of what containers get of the NVIDIA "
                                        "driver 515.76: ", kLib, "/libcuda.so.1 (it is ", kLib,
                                        "/libcuda.so.510.47.03, not of the running driver 515.76)")))
      << log.Text();
  // Same for a file whose name carries no version at all: nothing proves it is this driver's.
  fixture.Remove(absl::StrCat(kLib, "/libcuda.so.1"));
  fixture.WriteFile(absl::StrCat(kLib, "/libcuda.so.1"), "a copy without its version");
  EXPECT_THAT(finder.Find("510.47.03").mounts,
              ::testing::Not(::testing::Contains(::testing::Field(&Mount::container_path,
                                                                  "/usr/lib64/libcuda.so.1"))));
}

TEST(DriverLibrariesTest, AnUnreadableCacheOrUnknownVersionGivesNoLibraryAndSaysWhy) {
  FixtureHost fixture;
  fixture.AddNvidiaDriverFiles({.nvidia_smi = false});
  fixture.WriteFile("/etc/ld.so.cache", "this is no cache");
  Host host(fixture.root());
  DriverLibraryFinder finder(&host);
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
  DriverLibraryFinder finder(&host);
  EXPECT_THAT(finder.Find("580.159.04").mounts,
              ElementsAreArray(InLoaderDirs("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04",
                                            "libnvidia-ml.so.1")));
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
  DriverLibraryFinder finder(&host);
  auto cuda = [&] {
    for (const Mount& mount : finder.Find("515.76").mounts) {
      if (mount.container_path == "/usr/lib64/libcuda.so.1") return mount.host_path;
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
