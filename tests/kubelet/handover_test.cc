// One edgeaccel replacing another, any registration mode to any mode, across a restart, in one
// process and in a rollout with maxSurge, under every kubelet generation's rules
// (docs/kubelet-behaviour.md §2.1): once the new one is registered, every pod that arrives is
// admitted, and the kubelet never drops its endpoint. Up to 1.36 the plugin watcher unregisters a
// removed plugins_registry/ socket up to a reconciler period late, by resource name: a
// registration through kubelet.sock made before that pass would be stopped by it.
#include <gtest/gtest.h>
#include <stdio.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "captured_log.h"
#include "edgeaccel/discovery/resource_names.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/registrar.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::KubeletProfile;
using ::edgeaccel::testing::KubeletProfileTestName;
using ::edgeaccel::testing::RegistrarOptionsFor;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestKubelet;

const std::string kTpu(kResourceEdgeTpu);

Device Tpu(const std::string& id) {
  Device d;
  d.id = id;
  d.nodes.push_back({"/dev/null", "/dev/null", "rw"});
  return d;
}

class HandoverTest : public ::testing::TestWithParam<KubeletProfile> {
 protected:
  void SetUp() override {
    old_tpus_.Update({Tpu("apex_0"), Tpu("apex_1")});
    new_tpus_.Update({Tpu("apex_0"), Tpu("apex_1")});
    // Four times the kubelet's pace: what is asserted follows from the order of the watcher's
    // operations, not from its period (the issue's own sequence runs at the real 1 s).
    kubelet_.SetReconcilePeriod(absl::Milliseconds(250));
  }
  std::unique_ptr<ResourceRegistrar> StartRegistrar(DeviceSet* set, RegistrationMode mode) {
    auto registrar =
        std::make_unique<ResourceRegistrar>(RegistrarOptionsFor(kubelet_, mode), set);
    EXPECT_TRUE(registrar->Start().ok());
    return registrar;
  }
  // Both devices healthy at the kubelet, on an open stream, registered `via`.
  bool Served(const std::string& via) {
    return kubelet_.WaitFor([&] {
      return kubelet_.RegisteredVia(kTpu) == via && kubelet_.StreamOpen(kTpu) &&
             kubelet_.Allocatable(kTpu) == 2;
    });
  }
  // A rollout with maxSurge: 1, the kubelet started: the old daemon serves registered
  // `old_mode`, and the new one, started `new_mode` beside it, has seen it and waits. Returns
  // just after a pass of the plugin watcher.
  // `watcher_period`: the plugin watcher's reconciler period from then on.
  void ARolloutWithMaxSurge(RegistrationMode old_mode, RegistrationMode new_mode,
                            const CapturedLog& log, std::unique_ptr<ResourceRegistrar>* old,
                            std::unique_ptr<ResourceRegistrar>* next,
                            absl::Duration watcher_period = absl::Milliseconds(250)) {
    kubelet_.SetReconcilePeriod(watcher_period);
    kubelet_.Start();
    *old = StartRegistrar(&old_tpus_, old_mode);
    ASSERT_TRUE(Served(old_mode == RegistrationMode::kKubelet ? "kubelet" : "plugin-watcher"));
    *next = StartRegistrar(&new_tpus_, new_mode);
    ASSERT_TRUE(Eventually([&] { return log.Contains("an earlier edgeaccel still serves"); }));
    JustAfterAWatcherPass();
  }
  // Returns just after a pass of the plugin watcher's reconciler: its next one is a whole period
  // away, the longest a late deregistration can be.
  void JustAfterAWatcherPass() {
    const uint64_t passes = kubelet_.ReconcilerPasses();
    ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.ReconcilerPasses() > passes; }));
  }
  // Pods keep arriving, one every few milliseconds, until the plugin watcher's reconciler has
  // passed twice more (whatever it still had to do about the old socket is done by then): each
  // must be admitted, and the kubelet must not have lost the endpoint meanwhile.
  void EveryPodIsAdmittedUntilTheWatcherHasPassedTwice() {
    const int drops = kubelet_.Disconnections(kTpu);
    const int registrations = kubelet_.Registrations(kTpu);
    const uint64_t until = kubelet_.ReconcilerPasses() + 2;
    int admitted = 0;
    while (kubelet_.ReconcilerPasses() < until) {
      absl::StatusOr<std::string> pod = kubelet_.Admit(kTpu, 1);
      ASSERT_TRUE(pod.ok()) << "pod " << admitted + 1 << " after the new registration: "
                            << pod.status();
      kubelet_.DeletePod(*pod);
      ++admitted;
      absl::SleepFor(absl::Milliseconds(5));  // the next pod's arrival
    }
    EXPECT_EQ(kubelet_.Disconnections(kTpu), drops) << "the kubelet dropped the new endpoint";
    EXPECT_EQ(kubelet_.Registrations(kTpu), registrations) << "registered again: it was dropped";
    RecordProperty("pods_admitted", std::to_string(admitted));
  }

  // `leaving`, registered through the plugin watcher, goes as the daemon's stop makes it go
  // (LeavePluginWatcher, then WaitForTheWatcherToLetGo and Stop) while pods keep arriving: each is
  // admitted until the watcher's deregistration drops it, and its successor is registered through
  // kubelet.sock before the watcher's next pass.
  void LeavesAndIsReplacedInTheSamePass(ResourceRegistrar* leaving) {
    const int drops = kubelet_.Disconnections(kTpu);
    ASSERT_TRUE(leaving->LeavePluginWatcher());
    std::thread stopping([leaving] {
      leaving->WaitForTheWatcherToLetGo(absl::Now() + absl::Milliseconds(2500));
      leaving->Stop();
    });
    int admitted = 0;
    std::string refused_while_served;
    while (kubelet_.Disconnections(kTpu) == drops) {
      absl::StatusOr<std::string> pod = kubelet_.Admit(kTpu, 1);
      if (!pod.ok()) {  // only once the watcher has dropped the leaving endpoint
        if (kubelet_.Disconnections(kTpu) == drops) {
          refused_while_served = absl::StrCat("pod ", admitted + 1, ": ", pod.status().ToString());
        }
        break;
      }
      kubelet_.DeletePod(*pod);
      ++admitted;
      absl::SleepFor(absl::Milliseconds(5));  // the next pod's arrival
    }
    const uint64_t pass = kubelet_.ReconcilerPasses();
    const bool served = Served("kubelet");
    const uint64_t pass_when_served = kubelet_.ReconcilerPasses();
    stopping.join();
    EXPECT_EQ(refused_while_served, "");
    ASSERT_TRUE(served);
    EXPECT_EQ(pass_when_served, pass) << "registered a watcher pass after the leaving one went";
    EXPECT_GT(admitted, 0) << "the leaving daemon stopped serving before the watcher let go of it";
  }

  TempDir dir_;
  TestKubelet kubelet_{dir_.path() + "/kubelet", GetParam()};
  DeviceSet old_tpus_{kTpu};
  DeviceSet new_tpus_{kTpu};
};

INSTANTIATE_TEST_SUITE_P(Kubelets, HandoverTest,
                         ::testing::ValuesIn(::edgeaccel::testing::kAllKubeletProfiles),
                         [](const auto& info) { return KubeletProfileTestName(info.param); });

// The sequence measured on real kubelets 1.20.2 and 1.36: a daemon that registered through
// plugins_registry/ exits, and the next one registers through kubelet.sock well within a second.
TEST_P(HandoverTest, FromThePluginWatcherToKubeletSockAcrossARestart) {
  CapturedLog log;
  kubelet_.SetReconcilePeriod(absl::Seconds(1));  // loopSleepDuration
  kubelet_.Start();
  auto old = StartRegistrar(&old_tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(Served("plugin-watcher"));
  JustAfterAWatcherPass();
  old.reset();  // exits: its socket goes
  auto next = StartRegistrar(&new_tpus_, RegistrationMode::kKubelet);
  ASSERT_TRUE(Served("kubelet"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_TRUE(next->registered());
  EXPECT_EQ(next->registrations(), 1u);
  EXPECT_FALSE(log.Contains("it dropped our endpoint"));
}

// --registration=auto in one process: plugins_registry/ alone at first (the plugin watcher),
// then device-plugins/ appears (kubelet.sock).
TEST_P(HandoverTest, FromThePluginWatcherToKubeletSockInOneProcess) {
  kubelet_.Start();
  const std::string device_plugins = kubelet_.DevicePluginsDir();
  const std::string hidden = kubelet_.root() + "/device-plugins-later";
  ASSERT_EQ(rename(device_plugins.c_str(), hidden.c_str()), 0);
  auto registrar = StartRegistrar(&new_tpus_, RegistrationMode::kAuto);
  ASSERT_TRUE(Served("plugin-watcher"));
  JustAfterAWatcherPass();
  ASSERT_EQ(rename(hidden.c_str(), device_plugins.c_str()), 0);
  ASSERT_TRUE(Served("kubelet"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(registrar->registrations(), 2u);  // once each way
}

TEST_P(HandoverTest, FromKubeletSockToThePluginWatcher) {
  kubelet_.Start();
  auto old = StartRegistrar(&old_tpus_, RegistrationMode::kKubelet);
  ASSERT_TRUE(Served("kubelet"));
  old.reset();
  auto next = StartRegistrar(&new_tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(Served("plugin-watcher"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(next->registrations(), 1u);
}

// Both through plugins_registry/, on the same socket path: the plugin watcher unregisters the
// path's old socket before it asks the new one.
TEST_P(HandoverTest, FromThePluginWatcherToThePluginWatcher) {
  kubelet_.Start();
  auto old = StartRegistrar(&old_tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(Served("plugin-watcher"));
  const int registrations = kubelet_.Registrations(kTpu);
  JustAfterAWatcherPass();
  old.reset();
  auto next = StartRegistrar(&new_tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(kubelet_.WaitFor([&] { return kubelet_.Registrations(kTpu) > registrations; }));
  ASSERT_TRUE(Served("plugin-watcher"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(next->registrations(), 1u);
}

// A rollout with maxSurge: 1 that also changes the mode: the new daemon starts while the old one
// serves through plugins_registry/, and takes over when the old one goes.
TEST_P(HandoverTest, ARolloutWithMaxSurgeFromThePluginWatcherToKubeletSock) {
  CapturedLog log;
  std::unique_ptr<ResourceRegistrar> old, next;
  ASSERT_NO_FATAL_FAILURE(ARolloutWithMaxSurge(RegistrationMode::kPluginWatcher,
                                               RegistrationMode::kKubelet, log, &old, &next));
  old.reset();
  ASSERT_TRUE(Served("kubelet"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(next->registrations(), 1u);
}

// The same rollout as the daemon's stop makes it, with pods arriving all along: the old daemon
// removes its plugins_registry/ socket and keeps serving until the watcher's deregistration ends
// its stream, then asks the new one's probe GetInfo. Pods are admitted until that pass, and the
// new daemon registers through kubelet.sock before the next one. It used to wait for the watcher
// to ask its probe, a pass later, with every device Unhealthy at the kubelet meanwhile (0.9 and
// 2.0 s on the real 1.36.2).
TEST_P(HandoverTest, ARolloutFromThePluginWatcherToKubeletSockRegistersInThePassThatDroppedTheOld) {
  CapturedLog log;
  std::unique_ptr<ResourceRegistrar> old, next;
  ASSERT_NO_FATAL_FAILURE(ARolloutWithMaxSurge(RegistrationMode::kPluginWatcher,
                                               RegistrationMode::kKubelet, log, &old, &next,
                                               absl::Seconds(1)));
  LeavesAndIsReplacedInTheSamePass(old.get());
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(next->registrations(), 1u);
  EXPECT_TRUE(log.Contains("the kubelet's plugin watcher unregistered us after"));
}

// A rollout with maxSurge: 1 towards the plugin watcher, pods arriving all along: the new daemon
// registers through kubelet.sock the moment the old one is gone, not on the watcher's next pass
// (0.28 to 0.53 s on the real 1.36.2, about 5 pods in 10 a second refused per change). The
// watcher's registration then replaces that client; the kubelet.sock stream stays open.
TEST_P(HandoverTest, ARolloutWithMaxSurgeFromKubeletSockToThePluginWatcherRegistersBeforeItsPass) {
  CapturedLog log;
  std::unique_ptr<ResourceRegistrar> old, next;
  ASSERT_NO_FATAL_FAILURE(ARolloutWithMaxSurge(RegistrationMode::kKubelet,
                                               RegistrationMode::kPluginWatcher, log, &old, &next,
                                               absl::Seconds(1)));
  const uint64_t pass = kubelet_.ReconcilerPasses();
  old.reset();
  ASSERT_TRUE(Served("kubelet"));
  EXPECT_EQ(kubelet_.ReconcilerPasses(), pass) << "registered on the watcher's pass, not before";
  ASSERT_TRUE(Served("plugin-watcher"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(next->registrations(), 2u);  // kubelet.sock for the handover, then the watcher
  EXPECT_TRUE(next->registered());
  EXPECT_TRUE(log.Contains("registered through kubelet.sock for the handover"));
  EXPECT_FALSE(log.Contains("it dropped our endpoint"));
}

// Three daemons in two rollouts: kubelet.sock, then the plugin watcher (bridged through
// kubelet.sock, so serving on two registrations), then the plugin watcher again, on the same
// path. The middle one removes its sockets and serves until the watcher's deregistration, ends
// its other stream, and tells the path's new server; the new one registers through kubelet.sock
// in that same pass (the watcher would register it only on the next: the path's operation is
// busy with the deregistration). Pods arrive all along; none is refused while the middle one
// serves, and the kubelet never drops the last one.
TEST_P(HandoverTest, ABridgedDaemonHandsOverToThePluginWatcherInThePassThatDroppedIt) {
  CapturedLog log;
  kubelet_.SetReconcilePeriod(absl::Seconds(1));  // loopSleepDuration
  kubelet_.Start();
  DeviceSet last_tpus{kTpu};
  last_tpus.Update({Tpu("apex_0"), Tpu("apex_1")});
  auto first = StartRegistrar(&old_tpus_, RegistrationMode::kKubelet);
  ASSERT_TRUE(Served("kubelet"));
  auto middle = StartRegistrar(&new_tpus_, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(Eventually([&] { return !middle->left_to().empty(); }));
  first.reset();
  ASSERT_TRUE(Served("plugin-watcher"));
  ASSERT_TRUE(Eventually([&] { return middle->registrations() == 2u; }));  // both ways
  auto last = StartRegistrar(&last_tpus, RegistrationMode::kPluginWatcher);
  ASSERT_TRUE(Eventually([&] { return !last->left_to().empty(); }));
  JustAfterAWatcherPass();
  LeavesAndIsReplacedInTheSamePass(middle.get());
  ASSERT_TRUE(Served("plugin-watcher"));
  EveryPodIsAdmittedUntilTheWatcherHasPassedTwice();
  EXPECT_EQ(last->registrations(), 2u);
  EXPECT_TRUE(last->registered());
}

}  // namespace
}  // namespace edgeaccel
