// A GoogleTest fixture for end-to-end tests: a fixture host, a test kubelet under a temporary
// kubelet root, and the real daemon binary started against both.
#ifndef EDGEACCEL_TESTS_SUPPORT_DAEMON_TEST_H_
#define EDGEACCEL_TESTS_SUPPORT_DAEMON_TEST_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon_process.h"
#include "fixture_host.h"
#include "test_kubelet.h"

namespace edgeaccel::testing {

class DaemonTest : public ::testing::Test {
 protected:
  // The kubelet's container runtime finds device nodes in the fixture host.
  DaemonTest() { kubelet_.SetHostRoot(host_.root()); }

  // The daemon on this test's host and kubelet root, probing every 100 ms, metrics on a free
  // loopback port; `extra` flags come last (and so win).
  std::unique_ptr<DaemonProcess> StartDaemon(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--host-root=" + host_.root(),
                                     "--kubelet-root=" + kubelet_.root(),
                                     "--device-plugin-dir=" + kubelet_.DevicePluginsDir(), "--probe-interval=100ms",
                                     "--metrics-address=127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    // EDGEACCEL_DAEMON_UNDER_TEST runs another build of the daemon against the same tests (to
    // show a test failing on an older one).
    const char* other = getenv("EDGEACCEL_DAEMON_UNDER_TEST");
    return std::make_unique<DaemonProcess>(other != nullptr ? other : EDGEACCEL_DAEMON_PATH, args);
  }

  // Waits until the kubelet shows `resource` with this capacity and allocatable, on an open
  // ListAndWatch stream.
  bool Advertised(const std::string& resource, int capacity, int allocatable) {
    return kubelet_.WaitFor([&] {
      return kubelet_.StreamOpen(resource) && kubelet_.Capacity(resource) == capacity &&
             kubelet_.Allocatable(resource) == allocatable;
    });
  }

  FixtureHost host_;
  TempDir dir_;
  TestKubelet kubelet_{dir_.path() + "/kubelet"};
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_DAEMON_TEST_H_
