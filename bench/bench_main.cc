// edgeaccel-bench: the daemon's speed and footprint, each figure a percentile or a ratio
// measured in one run on this machine (never compared across machines or runs).
//
//   1. Allocate on the real daemon vs. the floor: a bare sync gRPC echo server in its own
//      process (edgeaccel-echo-floor) on the same kind of Unix socket; and Allocate vs. an echo
//      method on the same server and socket (1 and 8 client threads each); and Allocate vs. the
//      floor on a busy node (one spinning process per CPU), p50, p99 and p99.9.
//   2. Health change: device node removed/restored -> ListAndWatch message (real daemon binary).
//   3. Re-registration: kubelet.sock re-created -> Register received (real daemon, test kubelet
//      restarted the way the real one restarts).
//   4. Idle: RSS and wake-ups (context switches of all threads) of the real daemon.
//   5. Cold start: exec -> registered with the kubelet.
//
// Needs root (device nodes are made with mknod). Usage: edgeaccel-bench [--quick]
//   [--idle-seconds=N] [--only=allocate-loaded|idle] [--host-root=PATH]
// --host-root (with --only=idle): the daemon serves the devices of that host (/ on a GPU node)
// instead of a fixture host with two Edge TPUs. A bench copied elsewhere runs the daemon and
// the floor server found beside it.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <functional>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "daemon_process.h"
#include "dra_kubelet.h"
#include "echo.grpc.pb.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/kubelet/plugin_server.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "fixture_host.h"
#include "glog/logging.h"
#include "test_api_server.h"
#include "test_kubelet.h"
#include "edgeaccel/inventory/replicas.h"

namespace edgeaccel {
namespace {

using testing::DaemonProcess;
using testing::FixtureHost;
using testing::TempDir;
using testing::TestKubelet;

const std::string kTpu(kResourceEdgeTpu);

struct Percentiles {
  double p50, p99, p999, max;
};

Percentiles Summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    size_t i = static_cast<size_t>(q * (samples.size() - 1) + 0.5);
    return samples[std::min(i, samples.size() - 1)];
  };
  return {at(0.50), at(0.99), at(0.999), samples.back()};
}

double Micros(absl::Duration d) { return absl::ToDoubleMicroseconds(d); }

// The same bare echo as edgeaccel-echo-floor, for the same-server comparison.
class EchoService final : public bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const bench::EchoMessage* request,
                    bench::EchoMessage* response) override {
    *response = *request;
    return grpc::Status::OK;
  }
};

// Allocate on `allocate_socket` vs Echo on `echo_socket`, `threads` client threads with a
// connection of their own to each, calls interleaved (alternating which goes first) so drift
// hits both alike. Prints p50/p99 of each and their ratios.
void CompareAllocateWithEcho(const char* label, const std::string& allocate_socket,
                             const std::string& echo_socket, const std::string& device_id,
                             int threads, int calls_per_thread) {
  v1beta1::AllocateRequest allocate;
  allocate.add_container_requests()->add_devices_ids(device_id);
  bench::EchoMessage ping;
  ping.set_payload(allocate.SerializeAsString());  // the same bytes on the wire

  std::vector<std::vector<double>> alloc_samples(threads), echo_samples(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per thread
      auto plugin = v1beta1::DevicePlugin::NewStub(grpc::CreateCustomChannel(
          "unix:" + allocate_socket, grpc::InsecureChannelCredentials(), args));
      auto echo_stub = bench::Echo::NewStub(grpc::CreateCustomChannel(
          "unix:" + echo_socket, grpc::InsecureChannelCredentials(), args));
      const int warmup = 500;
      for (int i = 0; i < warmup + calls_per_thread; ++i) {
        v1beta1::AllocateResponse alloc_response;
        bench::EchoMessage pong;
        grpc::ClientContext c1, c2;
        grpc::Status s1, s2;
        absl::Duration alloc_time, echo_time;
        for (int k = 0; k < 2; ++k) {
          const absl::Time t0 = absl::Now();
          if ((i + k) % 2 == 0) {
            s1 = plugin->Allocate(&c1, allocate, &alloc_response);
            alloc_time = absl::Now() - t0;
          } else {
            s2 = echo_stub->Echo(&c2, ping, &pong);
            echo_time = absl::Now() - t0;
          }
        }
        if (!s1.ok() || !s2.ok()) {
          fprintf(stderr, "call failed: %s %s\n", s1.error_message().c_str(),
                  s2.error_message().c_str());
          exit(1);
        }
        if (i >= warmup) {
          alloc_samples[t].push_back(Micros(alloc_time));
          echo_samples[t].push_back(Micros(echo_time));
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  std::vector<double> all_alloc, all_echo;
  for (int t = 0; t < threads; ++t) {
    all_alloc.insert(all_alloc.end(), alloc_samples[t].begin(), alloc_samples[t].end());
    all_echo.insert(all_echo.end(), echo_samples[t].begin(), echo_samples[t].end());
  }
  Percentiles a = Summarize(all_alloc), e = Summarize(all_echo);
  printf("%s threads=%d calls=%zu: allocate p50 %.1f us p99 %.1f us p99.9 %.1f us | echo p50 "
         "%.1f us p99 %.1f us p99.9 %.1f us | ratio p50 %.2fx p99 %.2fx p99.9 %.2fx\n",
         label, threads, all_alloc.size(), a.p50, a.p99, a.p999, e.p50, e.p99, e.p999,
         a.p50 / e.p50, a.p99 / e.p99, a.p999 / e.p999);
}

// 1a. Allocate on our server vs an echo method on the same server and socket: what Allocate's
// own work costs.
void BenchAllocate(int threads, int calls_per_thread) {
  TempDir dir("edgeaccel-bench");
  DeviceSet set(kTpu);
  std::vector<Device> devices;
  for (int i = 0; i < 8; ++i) {
    Device d;
    d.id = absl::StrFormat("0000:%02x:00.0", i + 3);
    d.numa_node = i / 4;
    d.nodes.push_back({absl::StrCat("/dev/apex_", i), absl::StrCat("/dev/apex_", i), "rw"});
    devices.push_back(d);
  }
  set.Update(devices);
  PluginCounters counters;
  EchoService echo;
  PluginServer server(dir.path() + "/bench.sock", &set, &counters, nullptr);
  server.AlsoServe(&echo);
  if (!server.Start().ok()) {
    fprintf(stderr, "cannot start server\n");
    exit(1);
  }
  CompareAllocateWithEcho("allocate_vs_same_server_echo", server.socket_path(),
                          server.socket_path(), "0000:03:00.0", threads, calls_per_thread);
  server.Stop();
}

// 1024 advertised devices (8 GPUs x 128 replicas): what the kubelet sees per change, and what
// Allocate and GetPreferredAllocation cost with that many.
void BenchManyDevices(int samples) {
  TempDir dir("edgeaccel-bench");
  DeviceSet set{std::string(kResourceNvidiaGpu)};
  std::vector<Device> physical;
  for (int i = 0; i < 8; ++i) {
    Device d;
    d.id = absl::StrFormat("GPU-%08d-0000-0000-0000-000000000000", i);
    d.numa_node = i / 4;
    d.nodes = {{absl::StrCat("/dev/nvidia", i), absl::StrCat("/dev/nvidia", i), "rw"},
               {"/dev/nvidiactl", "/dev/nvidiactl", "rw"}};
    d.envs["NVIDIA_VISIBLE_DEVICES"] = d.id;
    physical.push_back(d);
  }
  set.Update(ExpandReplicas(physical, 128));
  PluginCounters counters;
  EchoService echo;
  PluginServer server(dir.path() + "/many.sock", &set, &counters, nullptr);
  server.AlsoServe(&echo);
  if (!server.Start().ok()) exit(1);
  auto channel = grpc::CreateChannel("unix:" + server.socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  auto echo_stub = bench::Echo::NewStub(channel);

  // ListAndWatch: flip one GPU's health, time until the full list arrives.
  grpc::ClientContext stream_context;
  auto reader = stub->ListAndWatch(&stream_context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse message;
  reader->Read(&message);
  std::vector<double> stream_ms;
  for (int i = 0; i < samples; ++i) {
    physical[0].health = i % 2 == 0 ? Health::kUnhealthy : Health::kHealthy;
    const absl::Time t0 = absl::Now();
    set.Update(ExpandReplicas(physical, 128));
    reader->Read(&message);
    stream_ms.push_back(Micros(absl::Now() - t0) / 1000);
  }
  Percentiles l = Summarize(stream_ms);
  printf("many_devices list_and_watch devices=%d bytes=%zu: change -> full list p50 %.2f ms p99 "
         "%.2f ms\n",
         message.devices_size(), message.ByteSizeLong(), l.p50, l.p99);

  // Allocate 1 and 64 replicas, and a preferred allocation of 8 out of 1024, vs echo.
  auto time_calls = [&](const std::function<void()>& call) {
    std::vector<double> us;
    for (int i = 0; i < samples * 5; ++i) {
      const absl::Time t0 = absl::Now();
      call();
      us.push_back(Micros(absl::Now() - t0));
    }
    return Summarize(us);
  };
  bench::EchoMessage ping, pong;
  ping.set_payload(std::string(64, 'x'));
  Percentiles e = time_calls([&] {
    grpc::ClientContext c;
    echo_stub->Echo(&c, ping, &pong);
  });
  for (int n : {1, 64}) {
    v1beta1::AllocateRequest request;
    auto* container = request.add_container_requests();
    for (int k = 0; k < n; ++k) container->add_devices_ids(set.Current()->devices[k * 16].id);
    Percentiles a = time_calls([&] {
      grpc::ClientContext c;
      v1beta1::AllocateResponse response;
      if (!stub->Allocate(&c, request, &response).ok()) exit(1);
    });
    printf("many_devices allocate ids=%d of 1024: p50 %.1f us p99 %.1f us (echo p50 %.1f us; "
           "ratio p50 %.2fx)\n",
           n, a.p50, a.p99, e.p50, a.p50 / e.p50);
  }
  v1beta1::PreferredAllocationRequest preferred;
  auto* want = preferred.add_container_requests();
  const std::shared_ptr<const Snapshot> snapshot = set.Current();
  for (const Device& d : snapshot->devices) want->add_available_deviceids(d.id);
  want->set_allocation_size(8);
  Percentiles p = time_calls([&] {
    grpc::ClientContext c;
    v1beta1::PreferredAllocationResponse response;
    if (!stub->GetPreferredAllocation(&c, preferred, &response).ok()) exit(1);
  });
  printf("many_devices preferred_allocation size=8 of 1024: p50 %.1f us p99 %.1f us\n", p.p50, p.p99);
  stream_context.TryCancel();
  server.Stop();
}

// A ListAndWatch reader of our own on the daemon's socket, beside the kubelet's stream.
class Watcher {
 public:
  explicit Watcher(const std::string& socket)
      : channel_(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials())),
        stub_(v1beta1::DevicePlugin::NewStub(channel_)),
        reader_(stub_->ListAndWatch(&context_, v1beta1::Empty())) {}
  ~Watcher() { context_.TryCancel(); }
  // Reads until `done` holds for a message's devices.
  bool WaitUntil(const std::function<bool(const v1beta1::ListAndWatchResponse&)>& done) {
    v1beta1::ListAndWatchResponse response;
    while (reader_->Read(&response)) {
      if (done(response)) return true;
    }
    return false;
  }
  // Reads until device `id` has `health`.
  bool WaitFor(const std::string& id, const std::string& health) {
    v1beta1::ListAndWatchResponse response;
    while (reader_->Read(&response)) {
      for (const auto& d : response.devices()) {
        if (d.id() == id && d.health() == health) return true;
      }
    }
    return false;
  }

 private:
  grpc::ClientContext context_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
  std::unique_ptr<grpc::ClientReader<v1beta1::ListAndWatchResponse>> reader_;
};

// Times `samples` round trips of one device: make_bad() until the stream says Unhealthy, then
// make_good() until Healthy, in milliseconds. With `max_offset`, each change starts at a random
// point within it (for changes seen on a timer, whose phase would otherwise lock to the stream).
std::vector<double> TimeHealthFlips(Watcher& watcher, const std::string& id,
                                    const std::function<void()>& make_bad,
                                    const std::function<void()>& make_good, int samples,
                                    absl::Duration max_offset = absl::ZeroDuration()) {
  std::vector<double> ms;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> offset_us(0, absl::ToInt64Microseconds(max_offset));
  for (int i = 0; i < samples; ++i) {
    for (const auto& [change, health] : {std::make_pair(&make_bad, "Unhealthy"),
                                         std::make_pair(&make_good, "Healthy")}) {
      absl::SleepFor(absl::Microseconds(offset_us(rng)));
      const absl::Time t0 = absl::Now();
      (*change)();
      if (!watcher.WaitFor(id, health)) exit(1);
      ms.push_back(Micros(absl::Now() - t0) / 1000);
    }
  }
  return ms;
}

struct ProcessSample {
  double rss_kib = 0;
  double pss_kib = 0;
  double private_kib = 0;  // anonymous memory: what this process alone costs
  uint64_t own_switches = 0;   // context switches (wake-ups) of the daemon's own threads
  uint64_t grpc_switches = 0;  // ... of gRPC's internal threads
  std::map<std::string, uint64_t> switches_by_thread;  // by thread name (comm)
  double anon_kib = 0;  // heap, stacks, written data: what no other process can share
  double cpu_seconds = 0;  // utime + stime, in clock ticks (10 ms steps)
  // Time on a CPU of the threads alive at the sample, in nanoseconds (the first field of each
  // /proc/<pid>/task/<tid>/schedstat): exact where cpu_seconds counts whole ticks.
  uint64_t cpu_ns = 0;
  std::map<std::string, uint64_t> cpu_ns_by_thread;  // by thread name (comm)
  int threads = 0;
  // The process's children (the NVML helper), on a CPU, and how many there are.
  uint64_t child_cpu_ns = 0;
  int children = 0;
};

// The daemon's own threads: main (named after the binary) and the ea-* workers.
bool IsOwnThread(const std::string& comm) {
  return absl::StartsWith(comm, "edgeaccel") || absl::StartsWith(comm, "ea-");
}

double KiB(const std::string& line) {
  std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
  double value = 0;
  if (parts.size() >= 2) absl::SimpleAtod(parts[1], &value);
  return value;
}

// The children of `pid`: what /proc/<pid>/task/<tid>/children lists for each of its threads.
std::vector<std::string> ChildrenOf(pid_t pid) {
  std::vector<std::string> children;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  for (const std::string& tid : Host("/").ListDirectory(tasks).value_or(std::vector<std::string>())) {
    std::ifstream file(absl::StrCat(tasks, "/", tid, "/children"));
    std::string child;
    while (file >> child) children.push_back(child);
  }
  return children;
}

ProcessSample SampleProcess(pid_t pid) {
  ProcessSample sample;
  for (const std::string& child : ChildrenOf(pid)) {
    pid_t child_pid = 0;
    if (!absl::SimpleAtoi(child, &child_pid)) continue;
    sample.child_cpu_ns += SampleProcess(child_pid).cpu_ns;
    ++sample.children;
  }
  std::ifstream rollup(absl::StrCat("/proc/", pid, "/smaps_rollup"));
  std::string line;
  while (std::getline(rollup, line)) {
    if (absl::StartsWith(line, "Rss:")) sample.rss_kib = KiB(line);
    if (absl::StartsWith(line, "Pss:")) sample.pss_kib = KiB(line);
    if (absl::StartsWith(line, "Pss_Anon:")) sample.private_kib = KiB(line);
    if (absl::StartsWith(line, "Anonymous:")) sample.anon_kib = KiB(line);
  }
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  absl::StatusOr<std::vector<std::string>> threads = Host("/").ListDirectory(tasks);
  sample.threads = static_cast<int>(threads.value_or(std::vector<std::string>()).size());
  for (const std::string& tid : threads.value_or(std::vector<std::string>())) {
    std::ifstream schedstat(absl::StrCat(tasks, "/", tid, "/schedstat"));
    uint64_t on_cpu_ns = 0;
    if (!(schedstat >> on_cpu_ns)) continue;
    sample.cpu_ns += on_cpu_ns;
    std::ifstream comm_file(absl::StrCat(tasks, "/", tid, "/comm"));
    std::string comm;
    std::getline(comm_file, comm);
    sample.cpu_ns_by_thread[comm] += on_cpu_ns;
  }
  for (const auto& [name, switches] : testing::WakeUpsByThread(pid)) {
    (IsOwnThread(name) ? sample.own_switches : sample.grpc_switches) += switches;
    sample.switches_by_thread[name] += switches;
  }
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::vector<std::string> fields = absl::StrSplit(content.substr(content.rfind(')') + 2), ' ');
  if (fields.size() > 13) {
    double utime = 0, stime = 0;
    absl::SimpleAtod(fields[11], &utime);
    absl::SimpleAtod(fields[12], &stime);
    sample.cpu_seconds = (utime + stime) / sysconf(_SC_CLK_TCK);
  }
  return sample;
}

void PrintIdle(const char* what, absl::Duration window, const ProcessSample& before,
               const ProcessSample& after) {
  const double seconds = absl::ToDoubleSeconds(window);
  const uint64_t own = after.own_switches - before.own_switches;
  const uint64_t grpc = after.grpc_switches - before.grpc_switches;
  std::string by_thread;
  for (const auto& [comm, n] : after.switches_by_thread) {
    auto it = before.switches_by_thread.find(comm);
    const uint64_t delta = n - (it == before.switches_by_thread.end() ? 0 : it->second);
    if (delta == 0) continue;
    absl::StrAppend(&by_thread, by_thread.empty() ? "" : ", ", comm, " ", delta);
    auto cpu_before = before.cpu_ns_by_thread.find(comm);
    auto cpu_after = after.cpu_ns_by_thread.find(comm);
    if (cpu_after != after.cpu_ns_by_thread.end()) {
      const uint64_t start =
          cpu_before == before.cpu_ns_by_thread.end() ? 0 : cpu_before->second;
      if (cpu_after->second >= start) {
        absl::StrAppend(&by_thread, absl::StrFormat(" (%.3f ms)", (cpu_after->second - start) / 1e6));
      }
    }
  }
  // Threads that ended within the window take their time with them: the figure is then low, and
  // the thread counts differ.
  const double cpu_ms = after.cpu_ns >= before.cpu_ns ? (after.cpu_ns - before.cpu_ns) / 1e6 : 0;
  std::string helpers;
  if (after.children > 0) {
    // A helper started again within the window takes its earlier time with it: then the
    // figure is low, and the counts differ.
    const double helper_ms =
        after.child_cpu_ns >= before.child_cpu_ns ? (after.child_cpu_ns - before.child_cpu_ns) / 1e6 : 0;
    helpers = absl::StrFormat("; helper processes %d (before: %d): %.3f ms on a CPU = %.3f ms per 30 s",
                              after.children, before.children, helper_ms, helper_ms * 30 / seconds);
  }
  printf("idle %s window=%s: rss %.1f MiB (anonymous %.1f MiB, file-backed %.1f MiB; pss %.1f "
         "MiB), threads %d, wake-ups %.2f/s whole process (own threads %llu, gRPC's %llu; by "
         "thread: %s); cpu %.1f ms (ticks), %.3f ms on a CPU (schedstat) = %.3f ms per 30 s%s\n",
         what, absl::FormatDuration(window).c_str(), after.rss_kib / 1024, after.anon_kib / 1024,
         (after.rss_kib - after.anon_kib) / 1024, after.pss_kib / 1024, after.threads,
         (own + grpc) / seconds, static_cast<unsigned long long>(own),
         static_cast<unsigned long long>(grpc), by_thread.empty() ? "none" : by_thread.c_str(),
         (after.cpu_seconds - before.cpu_seconds) * 1000, cpu_ms, cpu_ms * 30 / seconds,
         helpers.c_str());
}

// A program built beside this one (the daemon, the floor server): where the build put it, or,
// for a bench copied elsewhere (a GPU node), beside the bench itself.
std::string ProgramPath(const char* built) {
  if (access(built, X_OK) == 0) return built;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return built;
  const std::string dir(self, static_cast<size_t>(n));
  const absl::string_view name = absl::string_view(built).substr(std::string(built).rfind('/') + 1);
  return absl::StrCat(dir.substr(0, dir.rfind('/')), "/", name);
}

// The real daemon binary, registered with a test kubelet: on a fixture host with two Edge TPUs,
// or, given `host_root`, on that host with whatever devices it has (at least one registered).
struct RunningDaemon {
  // The fixture host's TPUs and the kubelet; the daemon starts with Start().
  struct NotStarted {};
  explicit RunningDaemon(NotStarted, const std::string& host_root = "")
      : host_root(host_root), kubelet(dir.path() + "/kubelet") {
    if (host_root.empty()) {
      host.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
      host.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
    }
    kubelet.Start();
  }
  // Started and registered, as Start(probe_interval, extra) leaves it.
  explicit RunningDaemon(const std::string& probe_interval, std::vector<std::string> extra = {},
                         const std::string& host_root = "")
      : RunningDaemon(NotStarted{}, host_root) {
    Start(probe_interval, std::move(extra));
  }

  // Starts the daemon with the host, the kubelet, the probe, /metrics and `extra`, and waits
  // until `serving` says it serves (by default: its device plugin resource is allocatable);
  // exits the bench with the daemon's log when it never does.
  void Start(const std::string& probe_interval, std::vector<std::string> extra,
             const std::function<bool()>& serving = nullptr) {
    std::vector<std::string> args = {"--host-root=" + (host_root.empty() ? host.root() : host_root),
                                     "--kubelet-root=" + kubelet.root(),
                                     "--device-plugin-dir=" + kubelet.DevicePluginsDir(),
                                     "--probe-interval=" + probe_interval,
                                     "--metrics-address=127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon = std::make_unique<DaemonProcess>(ProgramPath(EDGEACCEL_DAEMON_PATH), args);
    const bool ok = serving != nullptr ? serving() : kubelet.WaitFor([&] {
      if (host_root.empty()) return kubelet.Allocatable(kTpu) == 2;
      for (const std::string resource : {kTpu, std::string(kResourceNvidiaGpu)}) {
        if (kubelet.Allocatable(resource) > 0) {
          served = resource;
          return true;
        }
      }
      return false;
    });
    if (!ok) {
      fprintf(stderr, "the daemon did not start serving:\n%s\n", daemon->Log().c_str());
      daemon.reset();  // exit() runs no destructor of ours: the daemon would outlive the bench
      exit(1);
    }
  }
  const std::string host_root;
  FixtureHost host;
  TempDir dir{"edgeaccel-bench"};
  TestKubelet kubelet;
  std::unique_ptr<DaemonProcess> daemon;
  std::string served = kTpu;  // the resource waited for
};

// Samples processes across one idle window and prints memory and wake-ups of each.
void MeasureIdle(const std::vector<std::pair<std::string, pid_t>>& processes,
                 absl::Duration window, absl::Duration settle = absl::Milliseconds(500)) {
  absl::SleepFor(settle);  // let start-up settle
  std::vector<ProcessSample> before;
  for (const auto& [what, pid] : processes) before.push_back(SampleProcess(pid));
  absl::SleepFor(window);
  for (size_t i = 0; i < processes.size(); ++i) {
    PrintIdle(processes[i].first.c_str(), window, before[i], SampleProcess(processes[i].second));
  }
}

void BenchDaemon(int health_samples, int restarts, absl::Duration idle_window) {
  RunningDaemon running("0");
  FixtureHost& host = running.host;
  TestKubelet& kubelet = running.kubelet;
  DaemonProcess& daemon = *running.daemon;

  // 2. Health change.
  {
    Watcher watcher(kubelet.DevicePluginsDir() + "/" + SocketFileName(kTpu));
    watcher.WaitFor("0000:04:00.0", "Healthy");
    const std::string node = host.Path("/dev/apex_1");
    std::vector<double> samples = TimeHealthFlips(
        watcher, "0000:04:00.0", [&] { unlink(node.c_str()); },
        [&] { mknod(node.c_str(), S_IFCHR | 0660, makedev(120, 1)); }, health_samples);
    Percentiles p = Summarize(samples);
    printf("health_change samples=%zu (node removed/restored, devtmpfs: seen at once -> ListAndWatch message): p50 %.3f ms "
           "p99 %.3f ms max %.3f ms (target p99 <= 10 ms)\n",
           samples.size(), p.p50, p.p99, p.max);
  }

  // 3. Re-registration after kubelet restarts.
  {
    std::vector<double> samples;
    for (int i = 0; i < restarts; ++i) {
      const int before = kubelet.Registrations(kTpu);
      kubelet.Restart();
      if (!kubelet.WaitFor([&] {
            return kubelet.Registrations(kTpu) > before && kubelet.StreamOpen(kTpu) &&
                   kubelet.Allocatable(kTpu) == 2;
          })) {
        fprintf(stderr, "not re-registered after restart %d:\n%s\n", i, daemon.Log().c_str());
        exit(1);
      }
      samples.push_back(
          Micros(kubelet.LastRegisterReceived(kTpu) - kubelet.KubeletSocketCreated()) / 1000);
    }
    Percentiles p = Summarize(samples);
    printf("reregistration restarts=%zu (kubelet.sock created -> Register received): p50 %.2f ms "
           "p99 %.2f ms max %.2f ms (target <= 100 ms)\n",
           samples.size(), p.p50, p.p99, p.max);
  }

  // 4. Idle: registered, one ListAndWatch stream open, nothing happening.
  MeasureIdle({{"daemon probe=off (stream open)", daemon.pid()}}, idle_window);
}

// A whole Edge TPU plugged in and out, as the kernel does it: sysfs first and then the node on the
// way in, the node first and then sysfs on the way out. The node is what is seen at once
// (devtmpfs); the sysfs side of a removal only by the settle look that follows (100 ms).
void BenchHotplug(int samples) {
  RunningDaemon running("0");
  Watcher watcher(running.kubelet.DevicePluginsDir() + "/" + SocketFileName(kTpu));
  watcher.WaitFor("0000:04:00.0", "Healthy");
  const std::string id = "0000:05:00.0";
  auto has = [&](const v1beta1::ListAndWatchResponse& r, const char* health) {
    for (const auto& d : r.devices()) {
      if (d.id() == id) return health == nullptr || d.health() == health;
    }
    return false;
  };
  std::vector<double> appear, unhealthy, gone;
  for (int i = 0; i < samples; ++i) {
    absl::Time t0 = absl::Now();
    running.host.AddCoralPcie({.index = 2, .pci_address = id});
    if (!watcher.WaitUntil([&](const auto& r) { return has(r, "Healthy"); })) exit(1);
    appear.push_back(Micros(absl::Now() - t0) / 1000);
    t0 = absl::Now();
    running.host.UnplugCoralPcie(2, id);
    // One message may already say both (the rescan ran after the sysfs side was gone too).
    bool seen_unhealthy = false;
    if (!watcher.WaitUntil([&](const auto& r) {
          if (!seen_unhealthy && !has(r, "Healthy")) {
            seen_unhealthy = true;
            unhealthy.push_back(Micros(absl::Now() - t0) / 1000);
          }
          return !has(r, nullptr);
        })) {
      exit(1);
    }
    gone.push_back(Micros(absl::Now() - t0) / 1000);
  }
  Percentiles a = Summarize(appear), u = Summarize(unhealthy), g = Summarize(gone);
  printf("hotplug samples=%d (devtmpfs node, seen at once): plugged -> listed Healthy p50 %.3f ms "
         "p99 %.3f ms; unplugged -> Unhealthy p50 %.3f ms p99 %.3f ms; unplugged -> off the list "
         "(settle look) p50 %.1f ms p99 %.1f ms\n",
         samples, a.p50, a.p99, u.p50, u.p99, g.p50, g.p99);
}

// What only sysfs says (driver status, temperature) has no event of any kind: it is seen on the
// next probe, so its latency is bounded by --probe-interval (here 100 ms).
void BenchSysfsOnly(int samples) {
  RunningDaemon running("100ms");
  Watcher watcher(running.kubelet.DevicePluginsDir() + "/" + SocketFileName(kTpu));
  watcher.WaitFor("0000:03:00.0", "Healthy");
  std::vector<double> samples_ms = TimeHealthFlips(
      watcher, "0000:03:00.0", [&] { running.host.SetApexAttribute(0, "status", "DEAD\n"); },
      [&] { running.host.SetApexAttribute(0, "status", "ALIVE\n"); }, samples,
      absl::Milliseconds(100));
  Percentiles p = Summarize(samples_ms);
  printf("sysfs_only_change samples=%zu probe=100ms (driver status DEAD/ALIVE -> ListAndWatch "
         "message): p50 %.1f ms p99 %.1f ms max %.1f ms (bounded by the probe interval)\n",
         samples_ms.size(), p.p50, p.p99, p.max);
}

// Temperature has no inotify event: a crossing is seen on the next probe, so its latency is
// bounded by --probe-interval (here 100 ms) plus the node-removal path above.
void BenchTemperatureCrossing(int samples) {
  RunningDaemon running("100ms", {"--temperature-threshold=85"});
  Watcher watcher(running.kubelet.DevicePluginsDir() + "/" + SocketFileName(kTpu));
  watcher.WaitFor("0000:03:00.0", "Healthy");
  // Each change follows a message, which follows a probe tick: start at a random point of the
  // interval, or every sample would see the same phase.
  std::vector<double> samples_ms = TimeHealthFlips(
      watcher, "0000:03:00.0", [&] { running.host.SetApexAttribute(0, "temp", "90050\n"); },
      [&] { running.host.SetApexAttribute(0, "temp", "45050\n"); }, samples, absl::Milliseconds(100));
  Percentiles p = Summarize(samples_ms);
  printf("temperature_crossing samples=%zu probe=100ms (threshold crossed -> ListAndWatch message): "
         "p50 %.1f ms p99 %.1f ms max %.1f ms (bounded by the probe interval)\n",
         samples_ms.size(), p.p50, p.p99, p.max);
}

// A busy node: `per_cpu` spinning processes per online CPU (none for 0), for as long as this object lives. Bounded:
// each dies with the bench (PR_SET_PDEATHSIG) and after `limit` whatever happens (alarm).
class BusyLoad {
 public:
  BusyLoad(int per_cpu, absl::Duration limit) {
    const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (long i = 0; i < cpus * per_cpu; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(static_cast<unsigned>(absl::ToInt64Seconds(limit)) + 1);
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
      }
      if (pid > 0) children_.push_back(pid);
    }
  }
  ~BusyLoad() {
    for (pid_t pid : children_) kill(pid, SIGKILL);
    for (pid_t pid : children_) waitpid(pid, nullptr, 0);
  }
  size_t size() const { return children_.size(); }

 private:
  std::vector<pid_t> children_;
};

// 1b. Allocate on the real daemon (its own process, two fake Edge TPUs) vs the floor: a bare sync
// echo server in another process, on the same kind of socket, from the same archives.
// 1c. With `busy_per_cpu` > 0, the same comparison on a busy node (the kubelet calls Allocate
// while it admits a pod, and a node admitting pods is busy): the floor is measured under the same
// load, interleaved.
void BenchAllocateVsFloor(int threads, int calls_per_thread, int busy_per_cpu = 0) {
  RunningDaemon running("5s");
  TempDir dir("edgeaccel-floor");
  const std::string floor_socket = dir.path() + "/floor.sock";
  DaemonProcess floor(ProgramPath(EDGEACCEL_ECHO_FLOOR_PATH), {floor_socket});
  if (!floor.WaitForLog("ready")) {
    fprintf(stderr, "the echo floor server did not start:\n%s\n", floor.Log().c_str());
    exit(1);
  }
  BusyLoad load(busy_per_cpu, absl::Minutes(5));
  const std::string label =
      busy_per_cpu == 0 ? std::string("allocate_vs_floor")
                        : absl::StrCat("allocate_vs_floor_loaded(", load.size(), " busy)");
  CompareAllocateWithEcho(label.c_str(),
                          running.kubelet.DevicePluginsDir() + "/" + SocketFileName(kTpu),
                          floor_socket, "0000:03:00.0", threads, calls_per_thread);
}

// 5. Cold start: exec -> registered with the kubelet (its Register or plugin-watcher
// registration seen), and -> both devices advertised on an open ListAndWatch.
void BenchColdStart(int samples) {
  FixtureHost host;
  host.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  host.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  std::vector<double> registered_ms, advertised_ms;
  for (int i = 0; i < samples; ++i) {
    TempDir dir("edgeaccel-cold");
    TestKubelet kubelet(dir.path() + "/kubelet");
    kubelet.Start();
    const absl::Time t0 = absl::Now();
    DaemonProcess daemon(ProgramPath(EDGEACCEL_DAEMON_PATH),
                         {"--host-root=" + host.root(), "--kubelet-root=" + kubelet.root(),
                          "--device-plugin-dir=" + kubelet.DevicePluginsDir(),
                          "--metrics-address=127.0.0.1:0"});
    if (!kubelet.WaitFor([&] { return kubelet.Registrations(kTpu) > 0; })) {
      fprintf(stderr, "cold start: not registered:\n%s\n", daemon.Log().c_str());
      exit(1);
    }
    registered_ms.push_back(Micros(absl::Now() - t0) / 1000);
    if (!kubelet.WaitFor([&] { return kubelet.StreamOpen(kTpu) && kubelet.Allocatable(kTpu) == 2; })) {
      fprintf(stderr, "cold start: not advertised:\n%s\n", daemon.Log().c_str());
      exit(1);
    }
    advertised_ms.push_back(Micros(absl::Now() - t0) / 1000);
  }
  Percentiles r = Summarize(registered_ms), a = Summarize(advertised_ms);
  printf("cold_start samples=%d (exec -> registered with the kubelet): p50 %.1f ms p99 %.1f ms | "
         "(exec -> 2 devices advertised on ListAndWatch): p50 %.1f ms p99 %.1f ms\n",
         samples, r.p50, r.p99, a.p50, a.p99);
}

// The daemon with every sink on and the shipped DRA configuration (manifests/components/dra:
// --dra=coral-pcie,coral-usb,tegra) on the fixture host's two Edge TPUs: node labels and Events
// against the API server stand-in, which also takes the ResourceSlice and serves the slice
// watch; CDI, NFD and the seed labels; the DRA kubelet double registered the Edge TPU driver
// and holds its health stream open.
struct RunningDraDaemon {
  RunningDraDaemon() {
    dra = std::make_unique<testing::DraKubelet>(running.kubelet.root());
    dra->Start();
    mkdir((dir.path() + "/cdi").c_str(), 0755);
    mkdir((dir.path() + "/nfd").c_str(), 0755);
    running.Start("5s",
                  {"--node-name=node-1", "--api-server=" + api.url(),
                   "--api-token-file=" + api.token_file(), "--api-ca-file=" + api.ca_file(),
                   "--label-node", "--node-events", "--cdi", "--cdi-dir=" + dir.path() + "/cdi",
                   "--nfd-features-dir=" + dir.path() + "/nfd", "--seed-labels",
                   "--dra=coral-pcie,coral-usb,tegra"},
                  [this] {  // the Edge TPU driver registered and published both TPUs
                    return dra->WaitForRegistration(std::string(kDraDriver)).ok() &&
                           api.WaitForResourceSlices(
                               [](const std::vector<nlohmann::json>& slices) {
                                 return slices.size() == 1 &&
                                        slices[0]["spec"]["devices"].size() == 2;
                               },
                               absl::Seconds(10));
                  });
  }
  // The daemon goes first, as from a node: then its kubelets.
  ~RunningDraDaemon() { running.daemon.reset(); }
  static constexpr absl::string_view kDraDriver = "edgetpu.edgeaccel.io";
  TempDir dir{"edgeaccel-bench-dra"};
  testing::TestApiServer api{"node-1"};
  RunningDaemon running{RunningDaemon::NotStarted{}};
  std::unique_ptr<testing::DraKubelet> dra;
};

// The daemon as deployed (default 5 s probe, /metrics on, the kubelet's stream open), with every
// sink that needs no API server on, and (on the fixture host) with every sink and the shipped DRA
// configuration, beside the floor server idle over the same window: what gRPC itself costs an
// idle process. `host_root` empty: a fixture host with two Edge TPUs; else that host's own
// devices (NVML too, on a GPU node: its helper is counted apart).
void BenchIdleWithProbe(absl::Duration window, const std::string& host_root = "") {
  RunningDaemon running("5s", {}, host_root);
  TempDir dir("edgeaccel-floor");
  DaemonProcess floor(ProgramPath(EDGEACCEL_ECHO_FLOOR_PATH), {dir.path() + "/floor.sock"});
  if (!floor.WaitForLog("ready")) exit(1);
  // And with every file sink on (--label-node and --node-events need an API server: not here).
  mkdir((dir.path() + "/cdi").c_str(), 0755);
  mkdir((dir.path() + "/nfd").c_str(), 0755);
  RunningDaemon sinks("5s",
                      {"--cdi", "--cdi-dir=" + dir.path() + "/cdi",
                       "--nfd-features-dir=" + dir.path() + "/nfd", "--seed-labels"},
                      host_root);
  const std::string where =
      host_root.empty() ? std::string("fixture host, 2 Edge TPUs")
                        : absl::StrCat("host ", host_root, ", serving ", running.served, " x",
                                       running.kubelet.Allocatable(running.served));
  std::unique_ptr<RunningDraDaemon> dra;
  if (host_root.empty()) dra = std::make_unique<RunningDraDaemon>();
  printf("idle: %ld CPUs online; %s\n", sysconf(_SC_NPROCESSORS_ONLN), where.c_str());
  std::vector<std::pair<std::string, pid_t>> measured = {
      {"daemon probe=5s (default; stream open, metrics on)", running.daemon->pid()},
      {"daemon probe=5s --cdi --nfd-features-dir --seed-labels", sinks.daemon->pid()}};
  if (dra != nullptr) {
    measured.push_back({"daemon probe=5s, every sink (labels, Events too) and --dra=coral-pcie,coral-usb,tegra",
                        dra->running.daemon->pid()});
  }
  measured.push_back({"echo-floor (bare sync gRPC server, no calls)", floor.pid()});
  MeasureIdle(measured,
              // Past the first probe, which sets up what every later one reuses (the files kept
              // open, the inotify watches): once per scan, not an idle cost.
              window, absl::Milliseconds(5500));
  if (!host_root.empty()) printf("daemon log (default flags):\n%s\n", running.daemon->Log().c_str());
}

}  // namespace
}  // namespace edgeaccel

int main(int argc, char** argv) {
  bool quick = false;
  int idle_seconds = 10;
  std::string only;
  std::string host_root;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--quick") {
      quick = true;
      idle_seconds = 3;
    } else if (absl::ConsumePrefix(&arg, "--only=")) {
      only = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--host-root=") && !arg.empty()) {
      host_root = std::string(arg);
    } else if (!(absl::ConsumePrefix(&arg, "--idle-seconds=") && absl::SimpleAtoi(arg, &idle_seconds) &&
                 idle_seconds > 0)) {
      fprintf(stderr,
              "usage: edgeaccel-bench [--quick] [--idle-seconds=N] [--only=allocate-loaded|idle] "
              "[--host-root=PATH (with --only=idle)]\n");
      return 2;
    }
  }
  if (geteuid() != 0) {
    fprintf(stderr, "edgeaccel-bench needs root (fixture device nodes are made with mknod)\n");
    return 1;
  }
  FLAGS_minloglevel = 2;  // in-process servers' INFO/WARNING lines are noise here
  if (only == "allocate-loaded") {
    edgeaccel::BenchAllocateVsFloor(1, quick ? 2000 : 20000, 1);
    edgeaccel::BenchAllocateVsFloor(1, quick ? 2000 : 20000, 2);
    return 0;
  }
  if (!host_root.empty() && only != "idle") {
    fprintf(stderr, "edgeaccel-bench: --host-root goes with --only=idle\n");
    return 2;
  }
  if (only == "idle") {
    edgeaccel::BenchIdleWithProbe(absl::Seconds(idle_seconds), host_root);
    return 0;
  }
  if (!only.empty()) {
    fprintf(stderr, "edgeaccel-bench: --only takes allocate-loaded or idle\n");
    return 2;
  }
  edgeaccel::BenchAllocateVsFloor(1, quick ? 2000 : 20000);
  edgeaccel::BenchAllocateVsFloor(8, quick ? 500 : 5000);
  edgeaccel::BenchAllocateVsFloor(1, quick ? 2000 : 20000, 1);
  edgeaccel::BenchAllocateVsFloor(1, quick ? 2000 : 20000, 2);
  edgeaccel::BenchAllocate(1, quick ? 2000 : 20000);
  edgeaccel::BenchAllocate(8, quick ? 500 : 5000);
  edgeaccel::BenchColdStart(quick ? 5 : 30);
  edgeaccel::BenchManyDevices(quick ? 40 : 200);
  edgeaccel::BenchDaemon(quick ? 50 : 500, quick ? 20 : 100, absl::Seconds(idle_seconds));
  edgeaccel::BenchHotplug(quick ? 10 : 100);
  edgeaccel::BenchSysfsOnly(quick ? 10 : 50);
  edgeaccel::BenchTemperatureCrossing(quick ? 10 : 50);
  edgeaccel::BenchIdleWithProbe(absl::Seconds(idle_seconds));
  return 0;
}
