// edgeaccel-soak: the real daemon under churn, for a bounded time.
//
// 16 client threads call Allocate through the test kubelet while another thread removes and
// restores device nodes, unplugs and replugs TPUs, flips temperatures across the threshold, and
// restarts the kubelet. Passes when: the daemon never dies; every error is one a removed,
// unhealthy or momentarily unregistered device explains; every successful answer names exactly
// the requested device's node; every kubelet restart is followed by a registration; at the end
// all devices are back, and the daemon's open fds and RSS are where they were.
//
// Usage: edgeaccel-soak [--seconds=60] [--max-rss-growth-mib=1]
//        (root: fixture device nodes are made with mknod)
// scripts/tsan.sh runs it against the TSan-built daemon with a larger RSS allowance: TSan's own
// shadow memory and per-thread history grow with every access, which is not the daemon's.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "daemon_process.h"
#include "edgeaccel/discovery/resource_names.h"
#include "fixture_host.h"
#include "glog/logging.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using testing::DaemonProcess;
using testing::FixtureHost;
using testing::TempDir;
using testing::TestKubelet;

constexpr int kDevices = 8;
constexpr int kClients = 16;
const std::string kTpu(kResourceEdgeTpu);

std::string PciAddress(int i) { return absl::StrFormat("0000:%02x:00.0", i + 3); }

int OpenFds(pid_t pid) {
  int count = 0;
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (struct dirent* e = readdir(dir)) count += e->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

double RssMiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      double kib = 0;
      if (parts.size() >= 2) absl::SimpleAtod(parts[1], &kib);
      return kib / 1024;
    }
  }
  return 0;
}

int Run(absl::Duration duration, double max_rss_growth_mib) {
  FixtureHost host;
  for (int i = 0; i < kDevices; ++i) {
    host.AddCoralPcie({.index = static_cast<unsigned>(i), .pci_address = PciAddress(i)});
  }
  TempDir dir("edgeaccel-soak");
  TestKubelet kubelet(dir.path() + "/kubelet");
  kubelet.Start();
  DaemonProcess daemon(EDGEACCEL_DAEMON_PATH,
                       {"--host-root=" + host.root(), "--kubelet-root=" + kubelet.root(),
                        "--device-plugin-dir=" + kubelet.DevicePluginsDir(),
                        "--probe-interval=100ms", "--temperature-threshold=85",
                        "--metrics-address=127.0.0.1:0"});
  auto all_back = [&] {
    return kubelet.StreamOpen(kTpu) && kubelet.Allocatable(kTpu) == kDevices;
  };
  if (!kubelet.WaitFor(all_back)) {
    fprintf(stderr, "daemon did not register:\n%s\n", daemon.Log().c_str());
    return 1;
  }
  absl::SleepFor(absl::Milliseconds(500));
  const int fds_before = OpenFds(daemon.pid());
  // RSS is compared from the end of a warm-up (a third of the run, at most 20 s): malloc
  // arenas of gRPC's threads grow while the load ramps up, then stay.
  double rss_before = -1;
  const absl::Time warm = absl::Now() + std::min(duration / 3, absl::Seconds(20));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, expected_errors{0}, unexpected{0}, restarting_waits{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(c);
      while (!stop.load()) {
        const int i = static_cast<int>(rng() % kDevices);
        absl::StatusOr<v1beta1::AllocateResponse> r = kubelet.Allocate(kTpu, {PciAddress(i)});
        if (r.ok()) {
          const auto& container = r->container_responses(0);
          if (container.devices_size() != 1 ||
              container.devices(0).host_path() != absl::StrCat("/dev/apex_", i)) {
            fprintf(stderr, "WRONG ANSWER for %s: %d container answers, first node %s\n",
                    PciAddress(i).c_str(), r->container_responses_size(),
                    container.devices_size() > 0 ? container.devices(0).host_path().c_str() : "none");
            unexpected++;
          } else {
            ok++;
          }
          continue;
        }
        if (absl::StrContains(r.status().message(), "resource not registered")) {
          // The kubelet is restarting and has no endpoint yet: wait for it, as it would.
          kubelet.WaitFor([&] { return kubelet.HasEndpoint(kTpu) || stop.load(); },
                          absl::Milliseconds(100));
          restarting_waits++;
          continue;
        }
        switch (r.status().code()) {
          case absl::StatusCode::kFailedPrecondition:  // unhealthy
          case absl::StatusCode::kInvalidArgument:     // unplugged: unknown id
          case absl::StatusCode::kUnavailable:         // our socket being re-created
          case absl::StatusCode::kCancelled:
            expected_errors++;
            break;
          default:
            fprintf(stderr, "UNEXPECTED error: %s\n", r.status().ToString().c_str());
            unexpected++;
        }
      }
    });
  }

  // Churn.
  std::mt19937 rng(42);
  int restarts = 0, actions = 0;
  std::vector<bool> plugged(kDevices, true);
  const absl::Time end = absl::Now() + duration;
  absl::Time next_restart = absl::Now() + absl::Seconds(2);
  while (absl::Now() < end && daemon.Running()) {
    if (rss_before < 0 && absl::Now() >= warm) rss_before = RssMiB(daemon.pid());
    const unsigned i = rng() % kDevices;
    const std::string node = absl::StrCat("/dev/apex_", i);
    switch (rng() % 5) {
      case 0:
        if (plugged[i]) host.Remove(node);
        break;
      case 1:
        if (plugged[i]) host.MakeCharDevice(node, 120, i);
        break;
      case 2:
        if (plugged[i]) {
          host.UnplugCoralPcie(i, PciAddress(i));
        } else {
          host.AddCoralPcie({.index = i, .pci_address = PciAddress(i)});
        }
        plugged[i] = !plugged[i];
        break;
      default:
        if (plugged[i]) host.SetApexAttribute(i, "temp", rng() % 2 ? "90050\n" : "45050\n");
    }
    ++actions;
    if (absl::Now() >= next_restart) {
      const int before = kubelet.Registrations(kTpu);
      kubelet.Restart();
      ++restarts;
      if (!kubelet.WaitFor([&] { return kubelet.Registrations(kTpu) > before; }, absl::Seconds(5))) {
        fprintf(stderr, "NOT RE-REGISTERED after restart %d\n", restarts);
        unexpected++;
      }
      next_restart = absl::Now() + absl::Seconds(2);
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  stop = true;
  for (auto& t : clients) t.join();

  // Everything back to normal: all devices present, cool, healthy, advertised.
  for (int i = 0; i < kDevices; ++i) {
    if (!plugged[i]) host.AddCoralPcie({.index = static_cast<unsigned>(i), .pci_address = PciAddress(i)});
    host.MakeCharDevice(absl::StrCat("/dev/apex_", i), 120, i);
    host.SetApexAttribute(i, "temp", "45050\n");
  }
  const bool recovered = kubelet.WaitFor(all_back, absl::Seconds(10));
  absl::SleepFor(absl::Seconds(1));
  const bool alive = daemon.Running();
  const int fds_after = alive ? OpenFds(daemon.pid()) : -1;
  const double rss_after = alive ? RssMiB(daemon.pid()) : -1;
  printf("soak %s: %llu allocations ok, %llu refused as expected (removed/unhealthy device), "
         "%llu waits for a restarting kubelet, %llu unexpected; %d churn actions, "
         "%d kubelet restarts (registrations %d); fds %d -> %d; rss after warm-up %.1f -> %.1f MiB\n",
         absl::FormatDuration(duration).c_str(), static_cast<unsigned long long>(ok.load()),
         static_cast<unsigned long long>(expected_errors.load()),
         static_cast<unsigned long long>(restarting_waits.load()),
         static_cast<unsigned long long>(unexpected.load()), actions, restarts,
         kubelet.Registrations(kTpu), fds_before, fds_after, rss_before, rss_after);
  bool pass = true;
  auto check = [&](bool condition, const char* what) {
    if (!condition) {
      printf("FAIL: %s\n", what);
      pass = false;
    }
  };
  check(alive, "the daemon died");
  check(unexpected.load() == 0, "unexpected errors or wrong answers");
  check(ok.load() > 0, "no allocation succeeded");
  check(recovered, "devices not all back and advertised at the end");
  check(kubelet.Registrations(kTpu) == restarts + 1, "a kubelet restart was not followed by exactly one registration");
  check(fds_after == fds_before, "open fds changed");
  check(rss_after < rss_before + max_rss_growth_mib, "RSS grew by --max-rss-growth-mib or more after warm-up");
  if (!pass) {
    // The churn's own echo (tens of thousands of expected refusals, device and label changes)
    // would bury what went wrong: leave it out.
    std::string log;
    for (absl::string_view line : absl::StrSplit(daemon.Log(), '\n')) {
      if (absl::StrContains(line, "Allocate refused") || absl::StrContains(line, "device_set.cc") ||
          absl::StrContains(line, "node labels:")) {
        continue;
      }
      absl::StrAppend(&log, line, "\n");
    }
    fprintf(stderr, "%s\n", log.substr(log.size() > 60000 ? log.size() - 60000 : 0).c_str());
  }
  printf("%d passed, %d failed\n", pass ? 1 : 0, pass ? 0 : 1);
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace edgeaccel

int main(int argc, char** argv) {
  int seconds = 60;
  double max_rss_growth_mib = 1.0;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--seconds=") && absl::SimpleAtoi(arg, &seconds) && seconds > 0) continue;
    if (absl::ConsumePrefix(&arg, "--max-rss-growth-mib=") &&
        absl::SimpleAtod(arg, &max_rss_growth_mib) && max_rss_growth_mib > 0) {
      continue;
    }
    fprintf(stderr, "usage: edgeaccel-soak [--seconds=N] [--max-rss-growth-mib=M]\n");
    return 2;
  }
  if (geteuid() != 0) {
    fprintf(stderr, "edgeaccel-soak needs root (fixture device nodes are made with mknod)\n");
    return 1;
  }
  FLAGS_minloglevel = 2;
  return edgeaccel::Run(absl::Seconds(seconds), max_rss_growth_mib);
}
