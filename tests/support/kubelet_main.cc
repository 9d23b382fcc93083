// edgeaccel-test-kubelet: the tests' kubelet stand-in as a program, for checks of a daemon that
// runs elsewhere (scripts/images.sh runs the image as the DaemonSet would and points it here).
// Serves kubelet.sock under ROOT/device-plugins (and watches ROOT/plugins_registry), waits until
// each RESOURCE is advertised with COUNT healthy devices over an open ListAndWatch, then
// allocates one device of each and prints the device nodes (mounts, CDI names) it was given.
// Exit 0 on success, 1 with the reason after --timeout. With HOLD_SECONDS set in the
// environment it then keeps serving (streams open, as a kubelet does) that long before exiting,
// for measuring an idle daemon.
//   edgeaccel-test-kubelet ROOT TIMEOUT_SECONDS RESOURCE=COUNT...
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "test_kubelet.h"

int main(int argc, char** argv) {
  int timeout_seconds = 0;
  if (argc < 4 || !absl::SimpleAtoi(argv[2], &timeout_seconds)) {
    std::cerr << "usage: edgeaccel-test-kubelet ROOT TIMEOUT_SECONDS RESOURCE=COUNT...\n";
    return 2;
  }
  std::vector<std::pair<std::string, int>> expected;
  for (int i = 3; i < argc; ++i) {
    std::vector<std::string> parts = absl::StrSplit(argv[i], '=');
    int count;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &count)) {
      std::cerr << "edgeaccel-test-kubelet: expected RESOURCE=COUNT, got " << argv[i] << "\n";
      return 2;
    }
    expected.emplace_back(parts[0], count);
  }
  edgeaccel::testing::TestKubelet kubelet(argv[1]);
  kubelet.Start();
  std::printf("kubelet.sock ready\n");
  std::fflush(stdout);
  const bool advertised = kubelet.WaitFor(
      [&] {
        for (const auto& [resource, count] : expected) {
          if (!kubelet.StreamOpen(resource) || kubelet.Allocatable(resource) != count) return false;
        }
        return true;
      },
      absl::Seconds(timeout_seconds));
  if (!advertised) {
    for (const auto& [resource, count] : expected) {
      std::printf("%s: want %d healthy, have %d (stream %s, registered via \"%s\")\n",
                  resource.c_str(), count, kubelet.Allocatable(resource),
                  kubelet.StreamOpen(resource) ? "open" : "closed",
                  kubelet.RegisteredVia(resource).c_str());
    }
    for (const std::string& error : kubelet.Errors()) std::printf("kubelet error: %s\n", error.c_str());
    return 1;
  }
  for (const auto& [resource, count] : expected) {
    const std::vector<v1beta1::Device> devices = kubelet.Devices(resource);
    const std::string id = devices.front().id();
    absl::StatusOr<v1beta1::AllocateResponse> response = kubelet.Allocate(resource, {id});
    if (!response.ok()) {
      std::printf("%s: Allocate %s failed: %s\n", resource.c_str(), id.c_str(),
                  std::string(response.status().message()).c_str());
      return 1;
    }
    const auto& specs = response->container_responses(0).devices();
    std::printf("%s: %d healthy, registered via %s; Allocate %s -> %d node%s:", resource.c_str(),
                count, kubelet.RegisteredVia(resource).c_str(), id.c_str(), specs.size(),
                specs.size() == 1 ? "" : "s");
    for (int i = 0; i < specs.size(); ++i) {
      if (specs.size() > 4 && i == 2) {  // the first two, the last
        std::printf(" …");
        i = specs.size() - 1;
      }
      std::printf(" %s", specs[i].host_path().c_str());
    }
    for (const auto& mount : response->container_responses(0).mounts()) {
      std::printf("; mount %s -> %s%s", mount.host_path().c_str(), mount.container_path().c_str(),
                  mount.read_only() ? " (ro)" : "");
    }
    for (const auto& cdi : response->container_responses(0).cdi_devices()) {
      std::printf("; CDI %s", cdi.name().c_str());
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  int hold_seconds = 0;
  if (const char* hold = std::getenv("HOLD_SECONDS"); hold != nullptr &&
      absl::SimpleAtoi(hold, &hold_seconds) && hold_seconds > 0) {
    absl::SleepFor(absl::Seconds(hold_seconds));
  }
  return 0;
}
