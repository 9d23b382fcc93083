// L4T's container file lists: what they name and the host has goes to the container, nothing
// else; bad lines and unreadable lists are log lines, never the end of the rest.
#include "edgeaccel/discovery/tegra_host_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "edgeaccel/discovery/driver_libraries.h"

#include "absl/strings/str_cat.h"
#include "captured_log.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::FixtureHost;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

using Kind = HostFileEntry::Kind;
constexpr char kLists[] = "/etc/nvidia-container-runtime/host-files-for-container.d";
constexpr char kTegra[] = "/usr/lib/aarch64-linux-gnu/tegra";

Mount M(const std::string& host, const std::string& container) { return {host, container}; }

TEST(TegraHostFilesParseTest, TheFormatsL4tWrites) {
  std::vector<std::string> problems;
  std::vector<HostFileEntry> entries = ParseTegraHostFiles(
      "l4t.csv",
      "# a comment\n"
      "dev, /dev/nvhost-ctrl\n"
      "dev, nvmap\n"                          // R32's lists leave out /dev/
      "lib,/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1\r\n"
      "  sym ,  /usr/lib/aarch64-linux-gnu/libcuda.so  \n"
      "dir, /usr/share/a, path, with commas\n"
      "DEV, /dev/dri/renderD*\n"
      "\n",
      &problems);
  EXPECT_THAT(problems, IsEmpty());
  EXPECT_THAT(entries, ElementsAre(HostFileEntry{Kind::kDev, "/dev/nvhost-ctrl"},
                                   HostFileEntry{Kind::kDev, "/dev/nvmap"},
                                   HostFileEntry{Kind::kLib, "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1"},
                                   HostFileEntry{Kind::kSym, "/usr/lib/aarch64-linux-gnu/libcuda.so"},
                                   HostFileEntry{Kind::kDir, "/usr/share/a, path, with commas"},
                                   HostFileEntry{Kind::kDev, "/dev/dri/renderD*"}));
}

TEST(TegraHostFilesParseTest, BadLinesAreProblemsNamingFileAndLineAndTheRestIsKept) {
  std::vector<std::string> problems;
  std::vector<HostFileEntry> entries = ParseTegraHostFiles(
      "drivers.csv",
      "lib /usr/lib/no-comma.so\n"
      "exe, /usr/bin/tegrastats\n"
      "lib, relative/libx.so\n"
      "lib, /usr/lib/../../etc/shadow\n"
      "dir, /usr/*/lib\n"
      "lib,\n"
      "lib, /usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so\n",
      &problems);
  EXPECT_THAT(entries, ElementsAre(HostFileEntry{Kind::kLib,
                                                 "/usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so"}));
  ASSERT_EQ(problems.size(), 6u);
  EXPECT_THAT(problems[0], ::testing::StartsWith("drivers.csv:1: not <kind>, <path>"));
  EXPECT_THAT(problems[1], ::testing::StartsWith("drivers.csv:2: the kind is none of dev, lib, sym, dir"));
  EXPECT_THAT(problems[2], ::testing::StartsWith("drivers.csv:3: not an absolute path"));
  EXPECT_THAT(problems[3], ::testing::StartsWith("drivers.csv:4: a path with \"..\" in it"));
  EXPECT_THAT(problems[4], ::testing::StartsWith("drivers.csv:5: a wildcard before the last step"));
  EXPECT_THAT(problems[5], ::testing::StartsWith("drivers.csv:6: no path"));
}

class TegraHostFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
    // The driver as L4T installs it: the library in tegra/, its soname a link to it.
    fixture_.WriteFile(absl::StrCat(kTegra, "/libcuda.so.1.1"), "cuda");
    fixture_.Symlink("libcuda.so.1.1", absl::StrCat(kTegra, "/libcuda.so.1"));
    fixture_.WriteFile(absl::StrCat(kTegra, "/libnvrm_gpu.so"), "nvrm");
    fixture_.MakeDirectory("/usr/share/nvidia/tegra");
  }
  TegraHostFiles Read() { return reader_.Read(); }

  FixtureHost fixture_;
  Host host_{fixture_.root()};
  TegraHostFilesReader reader_{&host_};
};

TEST_F(TegraHostFilesTest, WhatTheListsNameAndTheHostHasNothingElse) {
  fixture_.WriteFile(absl::StrCat(kLists, "/devices.csv"),
                     "dev, /dev/nvmap\n"
                     "dev, /dev/nvgpu/igpu0/ctrl\n"
                     "dev, /dev/dri/renderD*\n"
                     "dev, /dev/nvhost-vic\n");  // not on R36: left out
  fixture_.WriteFile(absl::StrCat(kLists, "/drivers.csv"),
                     absl::StrCat("lib, ", kTegra, "/libnvrm_gpu.so\n",
                                  "sym, ", kTegra, "/libcuda.so.1\n",
                                  "lib, ", kTegra, "/libnvos.so\n",  // not on this host
                                  "dir, /usr/share/nvidia/tegra\n"));
  CapturedLog log;
  TegraHostFiles files = Read();
  EXPECT_TRUE(files.listed);
  EXPECT_THAT(files.device_paths,
              ElementsAre("/dev/nvmap", "/dev/nvgpu/igpu0/ctrl", "/dev/dri/renderD128"));
  // A sym mounts the file it resolves to, at its own path; each from its host path. A library
  // outside the loader's own directories is also where the loader looks by default
  // (/usr/lib/aarch64-linux-gnu), under its name: no LD_LIBRARY_PATH to replace the image's.
  EXPECT_THAT(files.mounts,
              ElementsAre(M(absl::StrCat(kTegra, "/libnvrm_gpu.so"), absl::StrCat(kTegra, "/libnvrm_gpu.so")),
                          M(absl::StrCat(kTegra, "/libcuda.so.1.1"), absl::StrCat(kTegra, "/libcuda.so.1")),
                          M("/usr/share/nvidia/tegra", "/usr/share/nvidia/tegra"),
                          M(absl::StrCat(kTegra, "/libnvrm_gpu.so"), MultiarchLibraryDir() + "/libnvrm_gpu.so"),
                          M(absl::StrCat(kTegra, "/libcuda.so.1.1"), MultiarchLibraryDir() + "/libcuda.so.1")));
  EXPECT_TRUE(log.Contains(absl::StrCat("2 entries of the container file lists are not on this host "
                                        "and are left out (lists name more than one board has): "
                                        "/dev/nvhost-vic, ", kTegra, "/libnvos.so")))
      << log.Text();
}

TEST_F(TegraHostFilesTest, NodesThatAreNotCharacterDevicesAreRefusedWithAReason) {
  fixture_.Symlink("/dev/nvmap", "/dev/nvmap-link");
  fixture_.WriteFile("/etc/passwd", "root:x:0:0\n");
  fixture_.WriteFile(absl::StrCat(kLists, "/devices.csv"),
                     "dev, /dev/nvmap-link\ndev, /etc/passwd\nlib, /dev/nvmap\n");
  CapturedLog log;
  TegraHostFiles files = Read();
  EXPECT_THAT(files.device_paths, IsEmpty());
  EXPECT_THAT(files.mounts, IsEmpty());
  EXPECT_TRUE(log.Contains("\"dev, /dev/nvmap-link\" of the container file lists: it is a symlink"))
      << log.Text();
  EXPECT_TRUE(log.Contains("\"dev, /etc/passwd\" of the container file lists: a device node outside /dev"))
      << log.Text();
  EXPECT_TRUE(log.Contains("\"lib, /dev/nvmap\" of the container file lists: it is a character device, "
                           "not a regular file"))
      << log.Text();
}

TEST_F(TegraHostFilesTest, WithoutListsTheReaderSaysSoOnce) {
  CapturedLog log;
  EXPECT_FALSE(Read().listed);
  EXPECT_FALSE(Read().listed);
  EXPECT_EQ(log.Count("no container file lists (/etc/nvidia-container-runtime/host-files-for-container.d/*.csv"),
            1)
      << log.Text();
  // A directory with no .csv in it is no list either.
  fixture_.WriteFile(absl::StrCat(kLists, "/README"), "not a list");
  EXPECT_FALSE(Read().listed);
}

TEST_F(TegraHostFilesTest, AnUnreadableListIsSaidAndTheOthersAreUsed) {
  fixture_.MakeDirectory(absl::StrCat(kLists, "/broken.csv"));  // a list that cannot be read
  fixture_.WriteFile(absl::StrCat(kLists, "/devices.csv"), "dev, /dev/nvmap\nbogus line\n");
  CapturedLog log;
  TegraHostFiles files = Read();
  EXPECT_TRUE(files.listed);
  EXPECT_THAT(files.device_paths, ElementsAre("/dev/nvmap"));
  EXPECT_TRUE(log.Contains(absl::StrCat("cannot read ", kLists, "/broken.csv"))) << log.Text();
  EXPECT_TRUE(log.Contains(absl::StrCat(kLists, "/devices.csv:2: not <kind>, <path>"))) << log.Text();
}

// A list is parsed again only when its file is another or changed as stat(2) tells (inode, size,
// modification time): rewritten in place with the same size and a new time, it is read again.
TEST_F(TegraHostFilesTest, AListIsReadAgainWhenItsFileChangesEvenAtTheSameSize) {
  const std::string list = absl::StrCat(kLists, "/drivers.csv");
  const std::string nvrm = absl::StrCat("lib, ", kTegra, "/libnvrm_gpu.so\n");
  const std::string cuda = absl::StrCat("lib, ", kTegra, "/libcuda.so.1.1\n");
  ASSERT_EQ(nvrm.size(), cuda.size());
  fixture_.WriteFile(list, nvrm);
  const Mount nvrm_mount = M(absl::StrCat(kTegra, "/libnvrm_gpu.so"), absl::StrCat(kTegra, "/libnvrm_gpu.so"));
  const Mount cuda_mount = M(absl::StrCat(kTegra, "/libcuda.so.1.1"), absl::StrCat(kTegra, "/libcuda.so.1.1"));
  // Each also where the container's loader looks by default.
  const Mount nvrm_loader = M(absl::StrCat(kTegra, "/libnvrm_gpu.so"), MultiarchLibraryDir() + "/libnvrm_gpu.so");
  const Mount cuda_loader = M(absl::StrCat(kTegra, "/libcuda.so.1.1"), MultiarchLibraryDir() + "/libcuda.so.1.1");
  EXPECT_THAT(Read().mounts, ElementsAre(nvrm_mount, nvrm_loader));

  // The same file as stat(2) sees it (the content changed behind a restored time): not parsed
  // again.
  const struct timespec modified = fixture_.Modified(list);
  fixture_.OverwriteInPlace(list, cuda, modified);
  EXPECT_THAT(Read().mounts, ElementsAre(nvrm_mount, nvrm_loader));

  // A new modification time, the same size and inode: read again.
  fixture_.OverwriteInPlace(list, cuda, {modified.tv_sec + 1, modified.tv_nsec});
  EXPECT_THAT(Read().mounts, ElementsAre(cuda_mount, cuda_loader));
  // Replaced (a new inode), and a list gone: each seen.
  fixture_.WriteFile(list, nvrm);
  EXPECT_THAT(Read().mounts, ElementsAre(nvrm_mount, nvrm_loader));
  fixture_.Remove(list);
  EXPECT_FALSE(Read().listed);
}

}  // namespace
}  // namespace edgeaccel
