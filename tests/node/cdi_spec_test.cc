#include "edgeaccel/node/cdi_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "captured_log.h"
#include "daemon_process.h"
#include "eventually.h"
#include "fixture_host.h"
#include "nlohmann/json.hpp"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::TempDir;
using ::testing::HasSubstr;

Snapshot TwoReplicasOfOneGpu() {
  Snapshot s;
  s.version = 1;
  for (int k = 0; k < 2; ++k) {
    Device d;
    d.id = "GPU-1::" + std::to_string(k);
    d.replica_of = "GPU-1";
    d.nodes = {{"/dev/nvidia0", "/dev/nvidia0", "rw"}, {"/dev/nvidiactl", "/dev/nvidiactl", "rw"}};
    d.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-1";
    s.devices.push_back(d);
  }
  return s;
}

TEST(CdiTest, NamesUseOurOwnVendor) {
  EXPECT_EQ(CdiKind("coral.ai/edgetpu"), "edgeaccel.io/edgetpu");
  EXPECT_EQ(CdiDeviceName("nvidia.com/gpu", "GPU-1"), "edgeaccel.io/gpu=GPU-1");
}

TEST(CdiTest, SpecListsEachPhysicalDeviceOnce) {
  const std::string json = CdiSpecJson("nvidia.com/gpu", TwoReplicasOfOneGpu());
  EXPECT_THAT(json, HasSubstr("\"kind\": \"edgeaccel.io/gpu\""));
  EXPECT_THAT(json, HasSubstr("\"name\": \"GPU-1\""));
  EXPECT_EQ(json.find("\"name\": \"GPU-1\""), json.rfind("\"name\": \"GPU-1\""));
  EXPECT_THAT(json, HasSubstr("{\"path\": \"/dev/nvidia0\", \"hostPath\": \"/dev/nvidia0\", "
                              "\"permissions\": \"rw\"}"));
  EXPECT_THAT(json, HasSubstr("\"NVIDIA_VISIBLE_DEVICES=GPU-1\""));
}

TEST(CdiTest, DeviceNodesCarryTheHostNodesModeAndOwner) {
  Snapshot s = TwoReplicasOfOneGpu();
  for (Device& d : s.devices) d.nodes[0].host_mode = HostNodeMode{0660, 0, 44};
  const nlohmann::json spec = nlohmann::json::parse(CdiSpecJson("nvidia.com/gpu", s));
  // fileMode, uid and gid are in every CDI spec version since 0.3.0.
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  ASSERT_EQ(spec["devices"].size(), 1u);
  const nlohmann::json& nodes = spec["devices"][0]["containerEdits"]["deviceNodes"];
  ASSERT_EQ(nodes.size(), 2u);
  // As Go's os.FileMode reads it: the permission bits as a JSON number.
  EXPECT_EQ(nodes[0]["fileMode"], 0660);
  EXPECT_EQ(nodes[0]["uid"], 0);
  EXPECT_EQ(nodes[0]["gid"], 44);
  EXPECT_EQ(nodes[0]["permissions"], "rw");
  // A node that could not be stat'ed: no fields rather than made-up ones.
  EXPECT_FALSE(nodes[1].contains("fileMode"));
  EXPECT_FALSE(nodes[1].contains("uid"));
  EXPECT_FALSE(nodes[1].contains("gid"));
}

// The driver's libraries as a CDI-only runtime applies them: read-only bind mounts from the
// host's files where the container's loader looks by default; no env edit that would replace
// the image's LD_LIBRARY_PATH, no hook anywhere in the spec.
TEST(CdiTest, MountsAreReadOnlyBindMountsAndTheSpecHasNoHook) {
  Snapshot s = TwoReplicasOfOneGpu();
  for (Device& d : s.devices) {
    d.mounts = {{"/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04", "/usr/lib64/libcuda.so.1"}};
  }
  const nlohmann::json spec = nlohmann::json::parse(CdiSpecJson("nvidia.com/gpu", s));
  const nlohmann::json& edits = spec["devices"][0]["containerEdits"];
  ASSERT_EQ(edits["mounts"].size(), 1u);
  EXPECT_EQ(edits["mounts"][0]["hostPath"], "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04");
  EXPECT_EQ(edits["mounts"][0]["containerPath"], "/usr/lib64/libcuda.so.1");
  EXPECT_EQ(edits["mounts"][0]["options"],
            nlohmann::json::array({"ro", "nosuid", "nodev", "bind"}));
  for (const auto& env : edits.value("env", nlohmann::json::array())) {
    EXPECT_FALSE(absl::StartsWith(env.get<std::string>(), "LD_LIBRARY_PATH=")) << env;
  }
  EXPECT_FALSE(edits.contains("hooks"));
  // A device without mounts has no "mounts" key (older specs read the same).
  EXPECT_FALSE(nlohmann::json::parse(CdiSpecJson("nvidia.com/gpu", TwoReplicasOfOneGpu()))["devices"][0]
                   ["containerEdits"]
                       .contains("mounts"));
}

TEST(CdiTest, ANodeWithoutAModeIsLoggedOnce) {
  CapturedLog log;
  TempDir dir;
  CdiSpecFile file(dir.path(), "nvidia.com/gpu");
  Snapshot s = TwoReplicasOfOneGpu();
  for (Device& d : s.devices) {
    d.nodes[0].host_mode = HostNodeMode{0660, 0, 44};
    d.nodes[1].host_stat_error = "cannot open /dev/nvidiactl: Permission denied";
  }
  ASSERT_TRUE(file.Write(s).ok());
  ASSERT_TRUE(file.Write(s).ok());
  EXPECT_EQ(log.Count("gives /dev/nvidiactl no fileMode, uid or gid"), 1) << log.Text();
  EXPECT_TRUE(log.Contains("Permission denied"));
  EXPECT_EQ(log.Count("/dev/nvidia0 no fileMode"), 0);
}

TEST(CdiTest, AResourceWithoutDevicesHasNoSpecFile) {
  TempDir dir;
  CdiSpecFile file(dir.path() + "/cdi", "coral.ai/edgetpu");
  // containerd refuses a spec with no devices ("invalid spec, no devices"): none is written.
  ASSERT_TRUE(file.Write(Snapshot{}).ok());
  EXPECT_NE(access(file.path().c_str(), F_OK), 0) << "a spec without devices was written";

  // The last device goes: our spec goes with it.
  CapturedLog log;
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  ASSERT_EQ(access(file.path().c_str(), F_OK), 0);
  ASSERT_TRUE(file.Write(Snapshot{}).ok());
  EXPECT_NE(access(file.path().c_str(), F_OK), 0) << "the spec outlived the resource's last device";
  EXPECT_TRUE(log.Contains("removed the CDI spec " + file.path() + ": coral.ai/edgetpu has no devices"))
      << log.Text();
  EXPECT_THAT(std::string(file.NameOnDisk("GPU-1").status().message()),
              HasSubstr("was removed: coral.ai/edgetpu had no devices"));

  // A device again: a spec again.
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  EXPECT_TRUE(file.NameOnDisk("GPU-1").ok());
}

TEST(CdiTest, RemovingASpecThatCannotBeRemovedIsAnError) {
  TempDir dir;
  CdiSpecFile file(dir.path(), "coral.ai/edgetpu");
  ASSERT_EQ(mkdir(file.path().c_str(), 0755), 0);  // a directory where the file is
  ASSERT_EQ(mkdir((file.path() + "/x").c_str(), 0755), 0);
  absl::Status status = file.Write(Snapshot{});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot remove " + file.path()));
}

// Allocate asks NameOnDisk while a spec is being written: a slow disk (an SD card's fsync) must
// not hold it up. The test runs itself again under strace, which holds every fsync for 1.5 s
// (docs/testing.md, "A slow disk").
constexpr char kSlowDiskChild[] = "EDGEACCEL_SLOW_DISK_CHILD";

TEST(CdiSlowDiskTest, NameOnDiskNeverWaitsForAWriteInProgress) {
  if (getenv(kSlowDiskChild) != nullptr) {
    TempDir dir;
    CdiSpecFile file(dir.path(), "nvidia.com/gpu");
    Snapshot one = TwoReplicasOfOneGpu();
    ASSERT_TRUE(file.Write(one).ok());
    Snapshot two = one;
    Device gpu2 = one.devices[0];
    gpu2.id = gpu2.replica_of = "GPU-2";
    two.devices.push_back(gpu2);
    two.version = 2;
    std::atomic<bool> written{false};
    std::thread writer([&] {
      EXPECT_TRUE(file.Write(two).ok());
      written = true;
    });
    // The new spec's temporary file is there: its fsync follows and is held.
    const std::string temp = dir.path() + "/.edgeaccel.io-gpu.json.tmp";
    ASSERT_TRUE(testing::Eventually([&] { return access(temp.c_str(), F_OK) == 0; }));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> name = file.NameOnDisk("GPU-1");
    absl::StatusOr<std::string> name2 = file.NameOnDisk("GPU-2");
    const absl::Duration took = absl::Now() - start;
    std::printf("NameOnDisk took %s\n", absl::FormatDuration(took).c_str());
    // The write is still held in its fsync (1.5 s): NameOnDisk did not wait for it.
    EXPECT_FALSE(written.load()) << "NameOnDisk waited for the disk (" << took << ")";
    EXPECT_TRUE(name.ok()) << name.status();
    writer.join();
    // Once the new spec is in place it names the new device too.
    EXPECT_TRUE(file.NameOnDisk("GPU-2").ok());
    return;
  }
  if (access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "no strace here";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  testing::CommandResult child = testing::RunCommand(
      "/usr/bin/strace",
      {"-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync,fdatasync", "-e",
       "inject=fsync,fdatasync:delay_enter=1500000", "/usr/bin/env",
       absl::StrCat(kSlowDiskChild, "=1"),
       // LeakSanitizer cannot run under ptrace: an ASan build's child would fail at exit.
       absl::StrCat("ASAN_OPTIONS=", getenv("ASAN_OPTIONS") != nullptr ? getenv("ASAN_OPTIONS") : "",
                    ":detect_leaks=0"),
       self,
       absl::StrCat("--gtest_filter=", test->test_suite_name(), ".", test->name())},
      absl::Seconds(60));
  if (child.exit_code != 0 && child.err.find("ptrace") != std::string::npos) {
    GTEST_SKIP() << "strace cannot trace here: " << child.err;
  }
  EXPECT_EQ(child.exit_code, 0) << child.out << child.err;
  EXPECT_THAT(child.out, HasSubstr("[  PASSED  ] 1 test")) << child.out << child.err;
}

TEST(CdiTest, StringsAreEscaped) {
  Snapshot s;
  Device d;
  d.id = "a\"b\\c\n";
  s.devices.push_back(d);
  EXPECT_THAT(CdiSpecJson("x/y", s), HasSubstr("\"a\\\"b\\\\c\\n\""));
}

TEST(CdiTest, FileIsWrittenAtomically) {
  TempDir dir;
  CdiSpecFile file(dir.path() + "/cdi", "nvidia.com/gpu");
  EXPECT_EQ(file.path(), dir.path() + "/cdi/edgeaccel.io-gpu.json");
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  std::ifstream in(file.path());
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_THAT(content.str(), HasSubstr("\"cdiVersion\""));
  EXPECT_NE(access((dir.path() + "/cdi/.edgeaccel.io-gpu.json.tmp").c_str(), F_OK), 0);
  struct stat st;
  ASSERT_EQ(stat(file.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644);
}

TEST(CdiTest, NamesOnlyWhatTheSpecOnDiskHolds) {
  TempDir dir;
  CdiSpecFile file(dir.path(), "nvidia.com/gpu");
  auto reason = [&](absl::string_view id) {
    return std::string(file.NameOnDisk(id).status().message());
  };
  EXPECT_THAT(reason("GPU-1"), HasSubstr("has not been written yet"));

  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  ASSERT_TRUE(file.NameOnDisk("GPU-1").ok());
  EXPECT_EQ(*file.NameOnDisk("GPU-1"), "edgeaccel.io/gpu=GPU-1");
  EXPECT_THAT(reason("GPU-1::0"), HasSubstr("does not hold GPU-1::0")) << "physical ids only";
  EXPECT_THAT(reason("GPU-b"), HasSubstr("does not hold GPU-b yet"));

  // Replaced by another writer (same name, other content).
  const std::string other = dir.path() + "/other.json";
  std::ofstream(other) << "{}";
  ASSERT_EQ(rename(other.c_str(), file.path().c_str()), 0);
  EXPECT_THAT(reason("GPU-1"), HasSubstr("was replaced by another writer"));

  // Removed (a tmpfs /var/run/cdi cleared under us).
  unlink(file.path().c_str());
  EXPECT_THAT(reason("GPU-1"), HasSubstr(file.path() + " is gone"));

  // Written again: named again.
  ASSERT_TRUE(file.Write(TwoReplicasOfOneGpu()).ok());
  EXPECT_TRUE(file.NameOnDisk("GPU-1").ok());
}

TEST(CdiTest, UnwritableDirectoryIsAClearError) {
  TempDir dir;
  const std::string blocker = dir.path() + "/cdi";
  FILE* f = fopen(blocker.c_str(), "w");  // a file where the directory should be
  fclose(f);
  CdiSpecFile file(blocker, "coral.ai/edgetpu");
  absl::Status status = file.Write(TwoReplicasOfOneGpu());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot write"));
}

}  // namespace
}  // namespace edgeaccel
