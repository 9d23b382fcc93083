// End to end: how the real daemon ends. A SIGTERM or SIGINT at any moment (the first
// milliseconds, during registration, twice during the stop) is a clean stop: exit 0 and no socket
// of ours left. The stop is bounded whatever the API server does (one that takes connections and
// never answers, one that answers slowly): the kubelet's sockets go first, then every request in
// flight is cancelled.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "daemon_test.h"
#include "edgeaccel/discovery/resource_names.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_api_server.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::DaemonProcess;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::MakeSelfSignedCertificate;
using ::edgeaccel::testing::SilentTcpServer;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestApiServer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::string kTpu(kResourceEdgeTpu);

// The files in `dir` (and its subdirectories) whose names say they are ours: edgeaccel's plugin
// sockets and the DRA drivers' (edgetpu.edgeaccel.io, gpu.edgeaccel.io).
std::vector<std::string> OurFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    if (entry->d_type == DT_DIR) {
      for (const std::string& inner : OurFiles(path)) out.push_back(inner);
    } else if (entry->d_type == DT_SOCK &&
               (absl::StrContains(name, "edgeaccel") || absl::StrContains(path, "edgeaccel.io"))) {
      out.push_back(path);
    }
  }
  closedir(d);
  return out;
}

class StopTest : public ::edgeaccel::testing::DaemonTest {
 protected:
  void SetUp() override {
    host_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .numa_node = 0});
    host_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0", .numa_node = 0});
  }

  // Every socket of ours under the kubelet's root (device-plugins/, plugins_registry/, plugins/).
  std::vector<std::string> SocketsLeft() { return OurFiles(kubelet_.root()); }

  // Waits for the daemon to end; true when it ended within `timeout` with exit 0 and said it
  // stopped cleanly.
  void ExpectCleanStop(DaemonProcess& daemon, absl::Duration timeout = absl::Seconds(10)) {
    std::optional<int> code = daemon.Wait(timeout);
    ASSERT_TRUE(code.has_value()) << "still running after " << timeout << "\n" << daemon.Log();
    EXPECT_EQ(*code, 0) << daemon.Log();
    EXPECT_THAT(daemon.Log(), HasSubstr("stopped cleanly")) << daemon.Log();
    EXPECT_THAT(SocketsLeft(), IsEmpty()) << daemon.Log();
  }

  // Flags that point the daemon at an API server at `port` whose certificate is `ca_file`.
  static std::vector<std::string> ApiFlags(int port, const std::string& ca_file,
                                           const std::string& token_file) {
    return {"--node-name=node-1", absl::StrCat("--api-server=https://127.0.0.1:", port),
            "--api-ca-file=" + ca_file, "--api-token-file=" + token_file};
  }

  // The flags for `silent`, with a CA and a token of their own (the daemon gets as far as its
  // TLS handshake, where the server says nothing).
  std::vector<std::string> SilentApiFlags(const SilentTcpServer& silent) {
    EXPECT_TRUE(MakeSelfSignedCertificate(api_files_.path(), "ca"));
    const std::string token = api_files_.path() + "/token";
    std::ofstream(token) << "token\n";
    return ApiFlags(silent.port(), api_files_.path() + "/ca.crt", token);
  }

  TempDir api_files_;
};

// The signal lands while the daemon is still starting: before its first scan, while it starts
// gRPC, while it registers. Each round waits for the first log line, then a few milliseconds more
// (0 to 9), alternating the registration modes.
TEST_F(StopTest, ASigtermAtAnyMomentOfTheStartIsACleanStop) {
  kubelet_.Start();
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto daemon = StartDaemon({round % 2 == 0 ? "--registration=kubelet" : "--registration=plugin-watcher"});
    ASSERT_TRUE(daemon->WaitForLog("starting")) << daemon->Log();
    if (round % 10 != 0) std::this_thread::sleep_for(std::chrono::milliseconds(round % 10));
    daemon->Signal(SIGTERM);
    ExpectCleanStop(*daemon);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

// Why a signal at any moment is safe: every thread the daemon has (gRPC's, made before main()
// blocks anything, included) blocks SIGTERM and SIGINT, so only main's sigwait takes them; and
// SIGHUP is ignored. Read from /proc/<pid>/task/*/status, as an operator would check it.
TEST_F(StopTest, EveryThreadBlocksTheStopSignalsAndSighupIsIgnored) {
  kubelet_.Start();
  auto daemon = StartDaemon({"--registration=kubelet"});
  ASSERT_TRUE(Advertised(kTpu, 2, 2)) << daemon->Log();
  const std::string tasks = absl::StrCat("/proc/", daemon->pid(), "/task");
  DIR* dir = opendir(tasks.c_str());
  ASSERT_NE(dir, nullptr);
  int threads = 0;
  const uint64_t stop_signals = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream status(tasks + "/" + entry->d_name + "/status");
    std::string line, name;
    uint64_t blocked = 0, ignored = 0;
    while (std::getline(status, line)) {
      if (absl::StartsWith(line, "Name:\t")) name = line.substr(6);
      if (absl::StartsWith(line, "SigBlk:\t")) blocked = std::stoull(line.substr(8), nullptr, 16);
      if (absl::StartsWith(line, "SigIgn:\t")) ignored = std::stoull(line.substr(8), nullptr, 16);
    }
    // A thread that ended between readdir() and the read (a short-lived one: a DRA call, a
    // handover probe) has no status left to check.
    if (name.empty()) continue;
    ++threads;
    // Main waits in sigwait(), which unblocks what it waits for while it waits (the kernel shows
    // that): it is the one thread meant to take them.
    if (std::string(entry->d_name) == std::to_string(daemon->pid())) continue;
    EXPECT_EQ(blocked & stop_signals, stop_signals) << "thread " << name << " takes a stop signal";
    EXPECT_NE(ignored & (1ull << (SIGHUP - 1)), 0u) << "SIGHUP is not ignored";
  }
  closedir(dir);
  EXPECT_GE(threads, 4);
  daemon->Signal(SIGHUP);
  daemon->Signal(SIGTERM);
  ExpectCleanStop(*daemon);
}

// Two SIGTERMs back to back, as `timeout`, some runtimes and impatient operators send them: one
// clean stop.
TEST_F(StopTest, TwoSigtermsDuringTheStopAreOneCleanStop) {
  kubelet_.Start();
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto daemon = StartDaemon({round % 2 == 0 ? "--registration=kubelet" : "--registration=plugin-watcher"});
    ASSERT_TRUE(Advertised(kTpu, 2, 2)) << daemon->Log();
    daemon->Signal(SIGTERM);
    daemon->Signal(SIGTERM);
    ASSERT_TRUE(daemon->WaitForLog("stopping")) << daemon->Log();
    daemon->Signal(SIGTERM);  // and one more while it stops
    ExpectCleanStop(*daemon);
    if (HasFailure()) return;
  }
}

// An API server that takes the connection and never answers holds the node labeller and the
// Event recorder in a request (their timeout is 10 s): the stop does not wait for them.
TEST_F(StopTest, TheStopTakesUnderASecondWhenTheApiServerNeverAnswers) {
  SilentTcpServer silent;
  std::vector<std::string> flags = SilentApiFlags(silent);
  kubelet_.Start();
  flags.push_back("--label-node");
  auto daemon = StartDaemon(flags);
  ASSERT_TRUE(Advertised(kTpu, 2, 2)) << daemon->Log();
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10))) << daemon->Log();
  host_.Remove("/dev/apex_1");  // an Event to record, queued behind the silent server
  ASSERT_TRUE(Advertised(kTpu, 2, 1)) << daemon->Log();
  const absl::Time start = absl::Now();
  daemon->Signal(SIGTERM);
  ExpectCleanStop(*daemon);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << daemon->Log();
}

// The same with the DRA driver: its slice publisher is in a request to the silent server.
TEST_F(StopTest, TheDraDriverStopsUnderASecondWhenTheApiServerNeverAnswers) {
  SilentTcpServer silent;
  std::vector<std::string> flags = SilentApiFlags(silent);
  kubelet_.Start();
  flags.push_back("--dra=coral-pcie");
  flags.push_back("--families=coral-pcie");
  flags.push_back("--cdi-dir=" + dir_.path() + "/cdi");
  auto daemon = StartDaemon(flags);
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10))) << daemon->Log();
  ASSERT_FALSE(SocketsLeft().empty()) << "the DRA driver serves\n" << daemon->Log();
  const absl::Time start = absl::Now();
  daemon->Signal(SIGTERM);
  ExpectCleanStop(*daemon);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << daemon->Log();
}

// An API server that answers, but each request only after 3 s: the stop still takes under a
// second, and the kubelet's sockets are gone before the daemon ends.
TEST_F(StopTest, TheStopTakesUnderASecondWhenTheApiServerIsSlow) {
  TestApiServer api;
  kubelet_.Start();
  std::vector<std::string> flags = ApiFlags(api.port(), api.ca_file(), api.token_file());
  flags.push_back("--label-node");
  auto daemon = StartDaemon(flags);
  ASSERT_TRUE(Advertised(kTpu, 2, 2)) << daemon->Log();
  api.AnswerSlowly(absl::Seconds(3));
  const int before = api.requests_received();
  host_.Remove("/dev/apex_1");  // an Event, in a slow request
  ASSERT_TRUE(Advertised(kTpu, 2, 1)) << daemon->Log();
  ASSERT_TRUE(Eventually([&] { return api.requests_received() > before; })) << daemon->Log();
  const absl::Time start = absl::Now();
  daemon->Signal(SIGTERM);
  ExpectCleanStop(*daemon);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << daemon->Log();
}

}  // namespace
}  // namespace edgeaccel
