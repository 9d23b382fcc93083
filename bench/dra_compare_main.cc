// edgeaccel-dra-compare: our DRA driver and Kubernetes' reference DRA driver (the e2e
// test-driver, built on k8s.io/dynamic-resource-allocation/kubeletplugin) side by side, in one
// run, called the way the kubelet calls them. bench/lab-dra-compare.sh starts both drivers on the
// lab cluster and runs this; docs/dra-reference.md has the figures.
//
// What it does:
//  1. Creates the ResourceClaims both drivers will be asked about, in --namespace, through the
//     API server (a POST of the claim, then a merge PATCH of its status subresource with
//     status.allocation.devices.results[{request, driver, pool, device}], as the scheduler
//     writes it): per driver and round, two claims of one device each (the single-claim calls)
//     and --batch claims of one device each (the batch call), each claim holding a device of
//     its own within a batch. Created before any call is timed.
//  2. Registers both drivers as the kubelet does (the DRA kubelet double, tests/support/
//     dra_kubelet.h, on each driver's own kubelet root: plugin watcher, GetInfo, the v1 DRAPlugin
//     service, the health stream) and calls NodePrepareResources / NodeUnprepareResources on
//     each dra.sock with the kubelet's Claim {namespace, uid, name} and the kubelet's checks of
//     the answer, plus a check that every claim got back exactly the device it was allocated.
//  3. Interleaves the two drivers call by call, the order alternating each round: prepare of
//     fresh claims ("cold": the driver reads them from the API server), the same prepare again
//     ("warm"), then the unprepare; once with one claim per call, once with --batch claims per
//     call, once more with one claim. A pause of --pause-ms before each call keeps the
//     reference's client under client-go's default rate limit (50 requests/s, burst 100) and
//     keeps the calls apart as a kubelet's are.
//     The disk's write+fsync+rename time is printed before and after the calls (ours' figures
//     move with it; see FsyncProbe).
//  4. Prints p50/p99 per kind for each driver and ours/reference, then each process's idle
//     figures over --idle-seconds with both still registered: CPU (utime+stime), context
//     switches (voluntary+nonvoluntary over every thread), threads and RSS.
//
// Usage (as root, since the kubelet double reads the drivers' sockets):
//   edgeaccel-dra-compare --kubeconfig=F --namespace=NS --node=NODE
//     --ours-root=DIR --ours-driver=NAME --ours-devices=a,b,... [--ours-pid=PID]
//     --ref-root=DIR --ref-driver=NAME --ref-devices=a,b,... [--ref-pid=PID]
//     [--rounds=100] [--warmup=5] [--batch=8] [--pause-ms=40] [--idle-seconds=30]
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
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
#include "dra_kubelet.h"
#include "lab_claims.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

using testing::DraKubelet;

struct Options {
  std::string kubeconfig;
  std::string namespace_name;
  std::string node;
  int rounds = 100;
  int warmup = 5;
  int batch = 8;
  int pause_ms = 40;
  int idle_seconds = 30;
};

// One driver under test: where its kubelet root is, its name, the devices of its slice.
struct Driver {
  std::string label;  // "ours" / "reference"
  std::string tag;    // claim name prefix: "ours" / "ref"
  std::string root;
  std::string name;
  std::vector<std::string> devices;
  int pid = 0;
  std::unique_ptr<DraKubelet> kubelet;
};

// A claim made for the run, and the device it was allocated.
struct MadeClaim {
  DraKubelet::Claim claim;
  std::string device;
};

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "edgeaccel-dra-compare: %s\n", message.c_str());
  fflush(stderr);
  _exit(1);
}

// The claim `name`, allocated `device` of `driver`: what the scheduler leaves for the kubelet.
DraKubelet::Claim MakeClaim(const ApiClient& api, const Options& options, const Driver& driver,
                            const std::string& name, const std::string& device) {
  absl::StatusOr<DraKubelet::Claim> made = bench::MakeAllocatedClaim(
      api, {options.namespace_name, name, options.node, driver.name, device, "edgeaccel-dra-compare"});
  if (!made.ok()) Fail(std::string(made.status().message()));
  return *made;
}

// The claims of one driver for every round: [round][0] and [round][1] single, [round][2..]
// the batch (claim j of a batch holds device j).
std::vector<std::vector<MadeClaim>> MakeClaims(const ApiClient& api, const Options& options,
                                               const Driver& driver, int total_rounds) {
  std::vector<std::vector<MadeClaim>> claims(total_rounds,
                                             std::vector<MadeClaim>(2 + options.batch));
  std::vector<std::pair<int, int>> work;
  for (int r = 0; r < total_rounds; ++r) {
    for (int k = 0; k < 2 + options.batch; ++k) work.push_back({r, k});
  }
  std::mutex mu;
  size_t next = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (;;) {
        std::pair<int, int> item;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (next == work.size()) return;
          item = work[next++];
        }
        const auto [r, k] = item;
        // Single claims take the devices in turn; batch claim j takes device j.
        const std::string device = k < 2 ? driver.devices[(2 * r + k) % driver.devices.size()]
                                         : driver.devices[k - 2];
        const std::string name =
            k < 2 ? absl::StrFormat("%s-s-%03d-%d", driver.tag, r, k) : absl::StrFormat("%s-b-%03d-%d", driver.tag, r, k - 2);
        claims[r][k] = {MakeClaim(api, options, driver, name, device), device};
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return claims;
}

std::vector<DraKubelet::Claim> Refs(const std::vector<MadeClaim>& claims) {
  std::vector<DraKubelet::Claim> out;
  for (const MadeClaim& claim : claims) out.push_back(claim.claim);
  return out;
}

// Every claim answered with exactly its allocated device, from this node's pool, with a CDI id.
void CheckDevices(const Driver& driver, const Options& options, const std::vector<MadeClaim>& claims,
                  const DraKubelet::PrepareAnswer& answer) {
  for (const MadeClaim& claim : claims) {
    auto it = answer.claims.find(claim.claim.uid);
    if (it == answer.claims.end()) Fail(absl::StrCat(driver.label, ": no answer for ", claim.claim.name));
    const std::vector<DraKubelet::PreparedDevice>& devices = it->second.devices;
    if (devices.size() != 1 || devices[0].device != claim.device || devices[0].pool != options.node ||
        devices[0].cdi_device_ids.empty()) {
      std::string got;
      for (const auto& device : devices) {
        absl::StrAppend(&got, " ", device.pool, "/", device.device, " (", device.cdi_device_ids.size(), " CDI ids)");
      }
      Fail(absl::StrCat(driver.label, ": ", claim.claim.name, " (", claim.device, ") got:", got));
    }
  }
}

struct Samples {
  std::map<std::string, std::vector<double>> ms;  // kind -> samples
};

double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t i = static_cast<size_t>(q * (samples.size() - 1) + 0.5);
  return samples[std::min(i, samples.size() - 1)];
}

// One sub-round: for each phase, each driver in `order` once.
void SubRound(const Options& options, std::vector<Driver*> order,
              const std::map<Driver*, std::vector<MadeClaim>>& claims, const std::string& size,
              bool record, std::map<Driver*, Samples>* samples) {
  for (const char* phase : {"prepare cold", "prepare warm", "unprepare"}) {
    for (Driver* driver : order) {
      const std::vector<MadeClaim>& made = claims.at(driver);
      const std::vector<DraKubelet::Claim> refs = Refs(made);
      absl::SleepFor(absl::Milliseconds(options.pause_ms));
      const bool prepare = absl::StartsWith(phase, "prepare");
      absl::Duration took;
      if (prepare) {
        const absl::Time t0 = absl::Now();
        absl::StatusOr<DraKubelet::PrepareAnswer> answer = driver->kubelet->Prepare(driver->name, refs);
        took = absl::Now() - t0;
        if (!answer.ok()) Fail(absl::StrCat(driver->label, " ", phase, " ", size, ": ", answer.status().ToString()));
        CheckDevices(*driver, options, made, *answer);
      } else {
        const absl::Time t0 = absl::Now();
        absl::StatusOr<DraKubelet::UnprepareAnswer> answer = driver->kubelet->Unprepare(driver->name, refs);
        took = absl::Now() - t0;
        if (!answer.ok()) Fail(absl::StrCat(driver->label, " ", phase, " ", size, ": ", answer.status().ToString()));
      }
      if (record) (*samples)[driver].ms[absl::StrCat(phase, ", ", size)].push_back(absl::ToDoubleMilliseconds(took));
    }
  }
}

// --- idle figures from /proc ---

struct ProcFigures {
  double cpu_ms = 0;
  long long switches = 0;
  int threads = 0;
  long long rss_kib = 0;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

long long StatusField(const std::string& status, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (absl::ConsumePrefix(&line, key) && absl::ConsumePrefix(&line, ":")) {
      line = absl::StripAsciiWhitespace(line);
      line = line.substr(0, line.find(' '));
      long long value = 0;
      if (absl::SimpleAtoi(line, &value)) return value;
    }
  }
  return 0;
}

ProcFigures ReadProc(int pid) {
  ProcFigures figures;
  const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) Fail(absl::StrCat("process ", pid, " is gone"));
  // Fields after "comm)": state is field 3; utime and stime are fields 14 and 15.
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  long long utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime)) {
    Fail(absl::StrCat("cannot read /proc/", pid, "/stat"));
  }
  figures.cpu_ms = (utime + stime) * 1000.0 / sysconf(_SC_CLK_TCK);
  const std::string status = ReadAll(absl::StrCat("/proc/", pid, "/status"));
  figures.threads = static_cast<int>(StatusField(status, "Threads"));
  figures.rss_kib = StatusField(status, "VmRSS");
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  if (DIR* dir = opendir(tasks.c_str()); dir != nullptr) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const std::string task = ReadAll(absl::StrCat(tasks, "/", entry->d_name, "/status"));
      figures.switches += StatusField(task, "voluntary_ctxt_switches") +
                          StatusField(task, "nonvoluntary_ctxt_switches");
    }
    closedir(dir);
  }
  return figures;
}

// What a small durable write costs on the disk under `dir` now (write, fsync, rename of a
// 1.5 KiB file, 50 times): ours makes such writes on prepare and unprepare, the reference does
// not, so its figures move with the disk's other traffic.
std::string FsyncProbe(const std::string& dir) {
  const std::string path = dir + "/.fsync-probe", temp = path + ".tmp";
  const std::string data(1536, 'x');
  std::vector<double> ms;
  for (int i = 0; i < 50; ++i) {
    const absl::Time t0 = absl::Now();
    const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return "cannot write " + temp;
    const bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(temp.c_str(), path.c_str()) != 0) return "cannot write " + temp;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  unlink(path.c_str());
  return absl::StrFormat("p50 %.2f ms, p99 %.2f ms", Percentile(ms, 0.5), Percentile(ms, 0.99));
}

std::vector<std::string> SplitList(absl::string_view text) {
  return absl::StrSplit(text, ',', absl::SkipEmpty());
}

int Main(int argc, char** argv) {
  Options options;
  Driver ours, ref;
  ours.label = ours.tag = "ours";
  ref.label = "reference";
  ref.tag = "ref";
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    const bench::FlagArg flag("edgeaccel-dra-compare", arg);
    std::string list;
    if (flag.Value("--kubeconfig", &options.kubeconfig) || flag.Value("--namespace", &options.namespace_name) ||
        flag.Value("--node", &options.node) || flag.Value("--ours-root", &ours.root) ||
        flag.Value("--ours-driver", &ours.name) || flag.Value("--ref-root", &ref.root) ||
        flag.Value("--ref-driver", &ref.name) || flag.Number("--rounds", 0, &options.rounds) ||
        flag.Number("--warmup", 0, &options.warmup) || flag.Number("--batch", 0, &options.batch) ||
        flag.Number("--pause-ms", 0, &options.pause_ms) || flag.Number("--idle-seconds", 0, &options.idle_seconds) ||
        flag.Number("--ours-pid", 0, &ours.pid) || flag.Number("--ref-pid", 0, &ref.pid)) {
      continue;
    }
    if (flag.Value("--ours-devices", &list)) {
      ours.devices = SplitList(list);
    } else if (flag.Value("--ref-devices", &list)) {
      ref.devices = SplitList(list);
    } else {
      Fail(absl::StrCat("unknown argument ", argv[i], " (see the comment at the top of bench/dra_compare_main.cc)"));
    }
  }
  for (const auto& [flag, text] : std::vector<std::pair<const char*, std::string>>{
           {"--kubeconfig", options.kubeconfig}, {"--namespace", options.namespace_name},
           {"--node", options.node}, {"--ours-root", ours.root}, {"--ours-driver", ours.name},
           {"--ref-root", ref.root}, {"--ref-driver", ref.name}}) {
    if (text.empty()) Fail(absl::StrCat(flag, " is required"));
  }
  if (options.rounds < 1 || options.batch < 1) Fail("--rounds and --batch must be at least 1");
  for (Driver* driver : {&ours, &ref}) {
    if (static_cast<int>(driver->devices.size()) < options.batch) {
      Fail(absl::StrCat(driver->label, ": ", driver->devices.size(), " devices, fewer than --batch=",
                        options.batch, " (each claim of a batch holds a device of its own)"));
    }
  }

  absl::StatusOr<ApiServerConfig> config = KubeconfigConfig(options.node, options.kubeconfig);
  if (!config.ok()) Fail(config.status().ToString());
  ApiClient api(*config);
  const int total_rounds = options.warmup + options.rounds;
  const absl::Time make_start = absl::Now();
  std::map<Driver*, std::vector<std::vector<MadeClaim>>> claims;
  for (Driver* driver : {&ours, &ref}) claims[driver] = MakeClaims(api, options, *driver, total_rounds);
  printf("claims: %d per driver made and allocated in %.1f s (namespace %s)\n",
         total_rounds * (2 + options.batch), absl::ToDoubleSeconds(absl::Now() - make_start),
         options.namespace_name.c_str());

  for (Driver* driver : {&ours, &ref}) {
    driver->kubelet = std::make_unique<DraKubelet>(driver->root);
    driver->kubelet->Start();
    absl::StatusOr<DraKubelet::Registration> registration =
        driver->kubelet->WaitForRegistration(driver->name, absl::Seconds(30));
    if (!registration.ok()) Fail(absl::StrCat(driver->label, ": ", registration.status().ToString()));
    printf("%s: %s registered, %s at %s\n", driver->label.c_str(), driver->name.c_str(),
           registration->service.c_str(), registration->endpoint.c_str());
  }
  fflush(stdout);

  printf("disk under %s: write+fsync+rename of a small file %s\n", ours.root.c_str(),
         FsyncProbe(ours.root).c_str());
  std::map<Driver*, Samples> samples;
  const std::string one = "1 claim/call", many = absl::StrCat(options.batch, " claims/call");
  const absl::Time run_start = absl::Now();
  for (int r = 0; r < total_rounds; ++r) {
    const bool record = r >= options.warmup;
    const std::vector<Driver*> order = r % 2 == 0 ? std::vector<Driver*>{&ours, &ref}
                                                  : std::vector<Driver*>{&ref, &ours};
    auto pick = [&](int from, int count) {
      std::map<Driver*, std::vector<MadeClaim>> out;
      for (Driver* driver : {&ours, &ref}) {
        out[driver].assign(claims[driver][r].begin() + from, claims[driver][r].begin() + from + count);
      }
      return out;
    };
    SubRound(options, order, pick(0, 1), one, record, &samples);
    SubRound(options, order, pick(2, options.batch), many, record, &samples);
    SubRound(options, order, pick(1, 1), one, record, &samples);
  }
  printf("calls: %d rounds (+%d warm-up) in %.1f s, %d ms pause before each call, order alternating each round\n",
         options.rounds, options.warmup, absl::ToDoubleSeconds(absl::Now() - run_start), options.pause_ms);
  printf("disk after the calls: write+fsync+rename of a small file %s\n", FsyncProbe(ours.root).c_str());
  printf("%-28s %8s %8s   %8s %8s   %7s %7s\n", "latency (ms)", "ours p50", "p99", "ref p50", "p99",
         "ratio50", "ratio99");
  for (const std::string& size : {one, many}) {
    for (const char* phase : {"prepare cold", "prepare warm", "unprepare"}) {
      const std::string kind = absl::StrCat(phase, ", ", size);
      const std::vector<double>& a = samples[&ours].ms[kind];
      const std::vector<double>& b = samples[&ref].ms[kind];
      const double a50 = Percentile(a, 0.5), a99 = Percentile(a, 0.99);
      const double b50 = Percentile(b, 0.5), b99 = Percentile(b, 0.99);
      printf("%-28s %8.2f %8.2f   %8.2f %8.2f   %6.2fx %6.2fx   (n=%zu each)\n", kind.c_str(), a50, a99, b50, b99,
             a50 / b50, a99 / b99, a.size());
    }
  }
  fflush(stdout);

  if (ours.pid > 0 && ref.pid > 0 && options.idle_seconds > 0) {
    // Both still registered with their kubelet double (connection and health stream open).
    absl::SleepFor(absl::Seconds(2));
    const ProcFigures a0 = ReadProc(ours.pid), b0 = ReadProc(ref.pid);
    absl::SleepFor(absl::Seconds(options.idle_seconds));
    const ProcFigures a1 = ReadProc(ours.pid), b1 = ReadProc(ref.pid);
    printf("idle %d s after the calls (both registered, health streams open):\n", options.idle_seconds);
    printf("  %-10s CPU %6.0f ms  context switches %6lld  threads %3d  RSS %6.1f MiB\n", "ours",
           a1.cpu_ms - a0.cpu_ms, a1.switches - a0.switches, a1.threads, a1.rss_kib / 1024.0);
    printf("  %-10s CPU %6.0f ms  context switches %6lld  threads %3d  RSS %6.1f MiB\n", "reference",
           b1.cpu_ms - b0.cpu_ms, b1.switches - b0.switches, b1.threads, b1.rss_kib / 1024.0);
    printf("  CPU over the whole run so far: ours %.0f ms, reference %.0f ms\n", a1.cpu_ms, b1.cpu_ms);
  }
  fflush(stdout);
  for (Driver* driver : {&ours, &ref}) driver->kubelet->Stop();
  return 0;
}

}  // namespace
}  // namespace edgeaccel

int main(int argc, char** argv) {
  FLAGS_minloglevel = 2;  // the kubelet double's INFO/WARNING lines are noise here
  return edgeaccel::Main(argc, argv);
}
