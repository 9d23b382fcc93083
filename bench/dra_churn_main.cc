// edgeaccel-dra-churn: a churn of ResourceClaims on a fleet of our DRA drivers, as the scheduler
// and each node's kubelet make it, for bench/lab-idle-requests.sh (CHURN=...) to count what the
// drivers ask of the API server meanwhile. docs/dra.md has the figures.
//
// Per node i in 1..--nodes (node --node-prefix<i>, kubelet root --root-prefix<i>), on a thread of
// its own: registers the driver as the kubelet does (the DRA kubelet double, tests/support/
// dra_kubelet.h). Once every node's is registered it prints "registered" and waits for a line
// "go" on stdin (so what a registration makes the driver do, a slice sync, is not counted as the
// churn's), then, on every node at once, --cycles times: creates a claim allocated one of --devices in turn (a POST,
// then a PATCH of its status: bench/lab_claims.h), NodePrepareResources (the driver reads the
// claim from the API server), a check that it got exactly that device, NodeUnprepareResources,
// and a DELETE of the claim. Each cycle makes 3 requests of its own (POST, PATCH, DELETE on
// resourceclaims); everything else the API server counts meanwhile is the drivers'.
//
// Usage (as root, since the kubelet double reads the drivers' sockets):
//   edgeaccel-dra-churn --kubeconfig=F --namespace=NS --nodes=N --node-prefix=P --root-prefix=R
//     --driver=NAME --devices=a,b,... [--cycles=10]
// Prints the cycles done, how long they took, and each node's failures (exit 1 if any).
// Without --wait-for-go the churn starts as soon as every node is registered.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "dra_kubelet.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "glog/logging.h"
#include "lab_claims.h"

namespace edgeaccel {
namespace {

using testing::DraKubelet;

struct Options {
  std::string kubeconfig;
  std::string namespace_name;
  std::string node_prefix;
  std::string root_prefix;
  std::string driver;
  std::vector<std::string> devices;
  int nodes = 0;
  int cycles = 10;
  bool wait_for_go = false;
};

// Every node's registration, then the start of the churn.
struct StartLine {
  int nodes = 0;
  absl::Mutex mu;
  int registered ABSL_GUARDED_BY(mu) = 0;
  absl::Notification go;
};

// One node's churn; returns what went wrong ("" for nothing).
std::string Churn(const Options& options, const ApiClient& api, int node_index, StartLine* start) {
  const std::string node = absl::StrCat(options.node_prefix, node_index);
  DraKubelet kubelet(absl::StrCat(options.root_prefix, node_index));
  kubelet.Start();
  absl::StatusOr<DraKubelet::Registration> registration =
      kubelet.WaitForRegistration(options.driver, absl::Seconds(60));
  {
    absl::MutexLock lock(&start->mu);
    ++start->registered;  // counted failed or not: the others do not wait for it
  }
  if (!registration.ok()) return absl::StrCat(node, ": ", registration.status().message());
  start->go.WaitForNotification();
  std::string failure;
  for (int c = 0; c < options.cycles && failure.empty(); ++c) {
    const std::string device = options.devices[c % options.devices.size()];
    const std::string name = absl::StrCat(node, "-", c);
    absl::StatusOr<DraKubelet::Claim> claim = bench::MakeAllocatedClaim(
        api, {options.namespace_name, name, node, options.driver, device, "edgeaccel-dra-churn"});
    if (!claim.ok()) {
      failure = std::string(claim.status().message());
      break;
    }
    absl::StatusOr<DraKubelet::PrepareAnswer> prepared = kubelet.Prepare(options.driver, {*claim});
    if (!prepared.ok()) {
      failure = absl::StrCat(name, ": prepare: ", prepared.status().message());
    } else if (auto it = prepared->claims.find(claim->uid);
               it == prepared->claims.end() || it->second.devices.size() != 1 ||
               it->second.devices[0].device != device || it->second.devices[0].pool != node) {
      failure = absl::StrCat(name, ": prepare did not answer with ", node, "/", device,
                             it == prepared->claims.end() ? "" : absl::StrCat(" (", it->second.error, ")"));
    } else if (absl::StatusOr<DraKubelet::UnprepareAnswer> unprepared = kubelet.Unprepare(options.driver, {*claim});
               !unprepared.ok()) {
      failure = absl::StrCat(name, ": unprepare: ", unprepared.status().message());
    }
    if (absl::Status deleted = bench::DeleteClaim(api, options.namespace_name, name); !deleted.ok() && failure.empty()) {
      failure = std::string(deleted.message());
    }
  }
  kubelet.Stop();
  return failure;
}

[[noreturn]] void Fail(const std::string& message) {
  fprintf(stderr, "edgeaccel-dra-churn: %s\n", message.c_str());
  exit(2);
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    const bench::FlagArg flag("edgeaccel-dra-churn", arg);
    std::string list;
    if (flag.Value("--kubeconfig", &options.kubeconfig) || flag.Value("--namespace", &options.namespace_name) ||
        flag.Value("--node-prefix", &options.node_prefix) || flag.Value("--root-prefix", &options.root_prefix) ||
        flag.Value("--driver", &options.driver) || flag.Number("--nodes", 1, &options.nodes) ||
        flag.Number("--cycles", 1, &options.cycles)) {
      continue;
    }
    if (arg == "--wait-for-go") {
      options.wait_for_go = true;
      continue;
    }
    if (flag.Value("--devices", &list)) {
      options.devices = absl::StrSplit(list, ',', absl::SkipEmpty());
    } else {
      Fail(absl::StrCat("unknown argument ", argv[i], " (see the comment at the top of bench/dra_churn_main.cc)"));
    }
  }
  if (options.kubeconfig.empty() || options.namespace_name.empty() || options.node_prefix.empty() ||
      options.root_prefix.empty() || options.driver.empty() || options.devices.empty() || options.nodes < 1) {
    Fail("--kubeconfig, --namespace, --nodes, --node-prefix, --root-prefix, --driver and --devices are required");
  }
  absl::StatusOr<ApiServerConfig> config = KubeconfigConfig("edgeaccel-dra-churn", options.kubeconfig);
  if (!config.ok()) Fail(config.status().ToString());
  ApiClient api(*config);

  std::vector<std::string> failures(options.nodes);
  std::vector<std::thread> threads;
  StartLine start_line;
  start_line.nodes = options.nodes;
  for (int i = 1; i <= options.nodes; ++i) {
    threads.emplace_back([&, i] { failures[i - 1] = Churn(options, api, i, &start_line); });
  }
  {
    absl::MutexLock lock(&start_line.mu);
    start_line.mu.Await(absl::Condition(
        +[](StartLine* line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(line->mu) { return line->registered == line->nodes; },
        &start_line));
  }
  printf("registered\n");
  fflush(stdout);
  if (options.wait_for_go) {
    std::string line;
    while (std::getline(std::cin, line) && line != "go") {
    }
  }
  const absl::Time start = absl::Now();
  start_line.go.Notify();
  for (std::thread& thread : threads) thread.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int failed = 0;
  for (const std::string& failure : failures) {
    if (failure.empty()) continue;
    ++failed;
    fprintf(stderr, "  %s\n", failure.c_str());
  }
  printf("churn: %d nodes x %d claim cycles (create, allocate, prepare, unprepare, delete) in %.1f s; %d nodes failed\n",
         options.nodes, options.cycles, seconds, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace edgeaccel

int main(int argc, char** argv) {
  FLAGS_minloglevel = 2;  // the kubelet doubles' INFO/WARNING lines are noise here
  return edgeaccel::Main(argc, argv);
}
