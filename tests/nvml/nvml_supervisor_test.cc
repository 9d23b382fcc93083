// The NVML supervisor with the real helper process (edgeaccel-nvml-helper) and the fake
// libnvidia-ml.so.1 (tests/support/fake_nvml.cc) in a fixture host: facts, telemetry, Xid
// health and recovery, GPUs NVML stops answering for, MIG, and every way the helper can fail
// (no library, nvmlInit failing, a hang, a crash, a failed event wait, a kill).
#include "edgeaccel/nvml/nvml_supervisor.h"

#include <poll.h>
#include <sys/eventfd.h>

#include "edgeaccel/host/poll_loop.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::FixtureHost;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr const char* kLibrary = FixtureHost::kNvmlLibrary;
constexpr char kUuid0[] = "GPU-e3004cd3-73c7-d4d7-4325-ef6f655d34ec";
constexpr char kUuid1[] = "GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689";

// Two GPUs as NVML describes the H100 of docs/host-facts.md §5.6, and an L4.
std::string TwoGpus(const std::string& gpu0_extra = "", const std::string& gpu1_extra = "") {
  return absl::StrCat(
      "driver=580.159.04\ncuda=13000\n",
      "gpu uuid=", kUuid0,
      " name=NVIDIA_H100_80GB_HBM3 minor=0 memory_mib=81559 cc=9.0 mig=disabled ecc=enabled "
      "temperature=34 power_mw=71234 util=3 mem_util=1 used_mib=2 sbe=0 dbe=0 throttle=1 ",
      gpu0_extra, "\n", "gpu uuid=", kUuid1,
      " name=NVIDIA_L4 minor=1 memory_mib=22491 cc=8.9 mig=unsupported ecc=disabled "
      "temperature=41 power_mw=16000 ",
      gpu1_extra, "\n");
}

bool HasThread(const std::string& name) {
  DIR* tasks = opendir("/proc/self/task");
  bool found = false;
  while (dirent* task = readdir(tasks)) {
    std::ifstream comm(absl::StrCat("/proc/self/task/", task->d_name, "/comm"));
    std::string line;
    if (std::getline(comm, line) && line == name) found = true;
  }
  closedir(tasks);
  return found;
}

class NvmlSupervisorTest : public ::testing::Test {
 protected:
  void Install(const std::string& script) { host_.AddFakeNvml(script); }
  void Script(const std::string& script) { host_.NvmlScript(script); }
  void Event(const std::string& line) { host_.NvmlEvent(line); }

  NvmlSupervisor& Start(NvmlOptions options = {}) {
    options.helper_path = EDGEACCEL_NVML_HELPER_PATH;
    if (options.timeout == absl::Seconds(10)) options.timeout = absl::Seconds(2);
    if (options.restart_initial == absl::Seconds(1)) {
      options.restart_initial = absl::Milliseconds(50);
      options.restart_max = absl::Milliseconds(200);
    }
    options.on_change = [this] { changes_.fetch_add(1); };
    supervisor_ = std::make_unique<NvmlSupervisor>(&view_, options);
    Scan();
    return *supervisor_;
  }

  // What the discoverer would hand over: the two GPUs as /proc lists them, Healthy.
  std::vector<Device> Scan() {
    std::vector<Device> devices(2);
    devices[0].id = kUuid0;
    devices[1].id = kUuid1;
    supervisor_->Amend(&devices);
    return devices;
  }
  const Device* Find(const std::vector<Device>& devices, const std::string& id) {
    for (const Device& d : devices) {
      if (d.id == id) return &d;
    }
    return nullptr;
  }
  bool Ready() { return supervisor_->Status().state == "ready"; }
  bool Healthy(const std::string& id) {
    std::vector<Device> devices = Scan();
    const Device* d = Find(devices, id);
    return d != nullptr && d->health == Health::kHealthy;
  }
  std::string Reason(const std::string& id) {
    std::vector<Device> devices = Scan();
    const Device* d = Find(devices, id);
    return d == nullptr ? "(left out)" : d->unhealthy_reason;
  }

  FixtureHost host_;
  Host view_{host_.root()};
  std::atomic<int> changes_{0};
  std::unique_ptr<NvmlSupervisor> supervisor_;
};

TEST_F(NvmlSupervisorTest, WithoutGpusTheHelperIsNeverStarted) {
  Install(TwoGpus());
  NvmlSupervisor supervisor(&view_, NvmlOptions{.helper_path = EDGEACCEL_NVML_HELPER_PATH});
  std::vector<Device> none;
  supervisor.Amend(&none);
  EXPECT_FALSE(supervisor.started());
  EXPECT_EQ(supervisor.helper_pid(), -1);
  EXPECT_EQ(supervisor.Status().state, "not started");
  EXPECT_FALSE(HasThread("ea-nvml"));
  EXPECT_THAT(supervisor.Remarks(), IsEmpty());
}

TEST_F(NvmlSupervisorTest, GpusGetNvmlsFactsAndTelemetry) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(supervisor.WaitSettled(absl::Seconds(10)));
  ASSERT_TRUE(Ready()) << supervisor.Status().reason;
  EXPECT_TRUE(HasThread("ea-nvml"));
  // The listing asks for a rescan: on the supervisor's thread, just after it has settled (the
  // callback runs outside its lock), so not always by the time WaitSettled returns.
  EXPECT_TRUE(Eventually([&] { return changes_.load() >= 1; }));
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  const Device& h100 = *Find(devices, kUuid0);
  EXPECT_EQ(h100.health, Health::kHealthy);
  EXPECT_EQ(h100.facts.at("memory_mib"), "81559");
  EXPECT_EQ(h100.facts.at("compute_capability"), "9.0");
  EXPECT_EQ(h100.facts.at("cuda_version"), "13.0");
  EXPECT_EQ(h100.facts.at("ecc_enabled"), "true");
  EXPECT_EQ(h100.facts.at("mig_capable"), "true");
  EXPECT_EQ(h100.facts.at("mig_mode"), "disabled");
  EXPECT_EQ(h100.facts.at("xid_events"), "registered");
  const Device& l4 = *Find(devices, kUuid1);
  EXPECT_EQ(l4.facts.at("mig_capable"), "false");
  EXPECT_EQ(l4.facts.at("ecc_enabled"), "false");
  EXPECT_EQ(l4.facts.count("mig_mode"), 0u);

  NvmlStatus status = supervisor.Status();
  EXPECT_EQ(status.library, kLibrary);
  EXPECT_EQ(status.found_by, "the driver directories");
  EXPECT_EQ(status.driver, "580.159.04");
  EXPECT_EQ(status.cuda, "13.0");
  EXPECT_THAT(supervisor.Remarks(),
              Contains(HasSubstr("NVML: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 (found by the "
                                 "driver directories), driver 580.159.04, CUDA 13.0")));

  std::vector<NvmlTelemetry> telemetry = supervisor.Telemetry(absl::Seconds(5));
  ASSERT_EQ(telemetry.size(), 2u);
  const NvmlTelemetry& t = telemetry[0].uuid == kUuid0 ? telemetry[0] : telemetry[1];
  EXPECT_EQ(t.values.at("temperature_c"), 34);
  EXPECT_DOUBLE_EQ(t.values.at("power_w"), 71.234);
  EXPECT_EQ(t.values.at("sm_util_percent"), 3);
  EXPECT_EQ(t.values.at("memory_util_percent"), 1);
  EXPECT_EQ(t.values.at("memory_used_mib"), 2);
  EXPECT_EQ(t.values.at("memory_total_mib"), 81559);
  EXPECT_EQ(t.values.at("ecc_corrected"), 0);
  EXPECT_EQ(t.values.at("throttle_reasons"), 1);
  EXPECT_EQ(t.lost, "");
}

TEST_F(NvmlSupervisorTest, NoLibraryLeavesTheGpusAsTheyAreAndSaysWhy) {
  CapturedLog log;
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(supervisor.WaitSettled(absl::Seconds(10)));
  NvmlStatus status = supervisor.Status();
  EXPECT_EQ(status.state, "unavailable");
  EXPECT_THAT(status.reason, HasSubstr("no libnvidia-ml.so.1 on the host; looked at "
                                       "/etc/ld.so.cache"));
  EXPECT_EQ(supervisor.helper_pid(), -1);
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].health, Health::kHealthy);
  EXPECT_EQ(devices[0].facts.count("memory_mib"), 0u);
  EXPECT_THAT(supervisor.Remarks(), Contains(HasSubstr("NVML: not available: no libnvidia-ml")));
  // Looked at again with backoff, and said once, not at every look.
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().start_attempts >= 3; }));
  EXPECT_EQ(log.Count("NVML is not available: no libnvidia-ml.so.1"), 1) << log.Text();
  // Installed later (the GPU Operator's driver container came up): found at the next look.
  Install(TwoGpus());
  EXPECT_TRUE(Eventually([&] { return Ready(); })) << supervisor.Status().reason;
}

TEST_F(NvmlSupervisorTest, AFailingNvmlInitIsUnavailableWithNvmlsOwnWords) {
  Install("init=fail:9\n" + TwoGpus());
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(supervisor.WaitSettled(absl::Seconds(10)));
  EXPECT_EQ(supervisor.Status().state, "unavailable");
  EXPECT_EQ(supervisor.Status().reason, "nvmlInit_v2 failed: Driver Not Loaded (9)");
  EXPECT_TRUE(Healthy(kUuid0));
}

TEST_F(NvmlSupervisorTest, ALibraryThatIsNotNvmlIsUnavailable) {
  host_.WriteFile(kLibrary, "not an ELF file");
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(supervisor.WaitSettled(absl::Seconds(10)));
  EXPECT_EQ(supervisor.Status().state, "unavailable");
  EXPECT_THAT(supervisor.Status().reason, HasSubstr("cannot load"));
}

TEST_F(NvmlSupervisorTest, AHelperThatCannotBeStartedIsUnavailable) {
  Install(TwoGpus());
  supervisor_ = std::make_unique<NvmlSupervisor>(
      &view_, NvmlOptions{.helper_path = host_.root() + "/no-such-helper"});
  Scan();
  ASSERT_TRUE(supervisor_->WaitSettled(absl::Seconds(10)));
  EXPECT_EQ(supervisor_->Status().state, "unavailable");
  EXPECT_THAT(supervisor_->Status().reason, HasSubstr("cannot start the helper"));
}

TEST_F(NvmlSupervisorTest, AHangInNvmlInitIsKilledAndTheHelperStartedAgain) {
  Install("init=hang\n" + TwoGpus());
  // The reason is read before the restart (2 s on) clears it.
  NvmlSupervisor& supervisor = Start({.timeout = absl::Seconds(1),
                                      .restart_initial = absl::Seconds(2),
                                      .restart_max = absl::Seconds(2)});
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().hangs >= 1; }));
  std::vector<Device> devices = Scan();  // answers at once, from what is known
  EXPECT_EQ(devices.size(), 2u);
  EXPECT_THAT(supervisor.Status().reason, HasSubstr("did not list the GPUs within 1s"));
  Script(TwoGpus());
  EXPECT_TRUE(Eventually([&] { return Ready(); })) << supervisor.Status().reason;
  EXPECT_TRUE(Healthy(kUuid0));
}

TEST_F(NvmlSupervisorTest, AHungSampleDelaysMetricsOnlyUntilTheWaitAndTheHelperIsReplaced) {
  Install(TwoGpus());
  // The reason is read before the restart (2 s on) clears it.
  NvmlSupervisor& supervisor = Start({.timeout = absl::Seconds(3),
                                      .restart_initial = absl::Seconds(2),
                                      .restart_max = absl::Seconds(2)});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  ASSERT_EQ(supervisor.Telemetry(absl::Seconds(5)).size(), 2u);
  const pid_t first = supervisor.helper_pid();
  const uint64_t hangs = supervisor.Status().hangs;  // a slow start may have counted one
  Script("sample=hang\n" + TwoGpus());
  absl::SleepFor(absl::Milliseconds(1100));  // the cached sample is more than a second old
  const absl::Time asked = absl::Now();
  std::vector<NvmlTelemetry> telemetry = supervisor.Telemetry(absl::Milliseconds(100));
  // Bounded by the 100 ms wait, not by the hang, which lasts until the kill 3 s on: the helper
  // still hangs, uncounted and not yet replaced, when Telemetry has returned.
  EXPECT_EQ(supervisor.Status().hangs, hangs) << "Telemetry waited for the hang's end ("
                                              << absl::Now() - asked << ")";
  EXPECT_EQ(supervisor.helper_pid(), first);
  EXPECT_EQ(telemetry.size(), 2u);  // the last readings known
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().hangs == hangs + 1; },
                         absl::Seconds(15)));
  EXPECT_THAT(supervisor.Status().reason, HasSubstr("did not answer a sample within 3s"));
  Script(TwoGpus());
  ASSERT_TRUE(Eventually([&] { return Ready() && supervisor.helper_pid() != first; }));
  EXPECT_TRUE(Healthy(kUuid0));  // a hung helper is our problem, not the GPU's
}

TEST_F(NvmlSupervisorTest, ACrashedOrKilledHelperIsRestartedAndTheGpusKeepTheirHealth) {
  Install(TwoGpus());
  // The reason is read, and NVML fixed, before the restart (2 s on).
  NvmlSupervisor& supervisor = Start({.check_interval = absl::Milliseconds(100),
                                      .restart_initial = absl::Seconds(2),
                                      .restart_max = absl::Seconds(2)});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  Script("sample=crash\n" + TwoGpus());  // the next periodic check crashes it
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().restarts == 1; }));
  EXPECT_THAT(supervisor.Status().reason, HasSubstr("killed by signal 6"));
  EXPECT_TRUE(Healthy(kUuid0));
  Script(TwoGpus());
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  // Killed from outside (an OOM kill, an operator): the same.
  const pid_t pid = supervisor.helper_pid();
  ASSERT_GT(pid, 0);
  kill(pid, SIGKILL);
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().restarts == 2; }));
  EXPECT_TRUE(Eventually([&] { return Ready() && supervisor.helper_pid() != pid; }));
}

TEST_F(NvmlSupervisorTest, ACriticalXidMakesItsGpuUnhealthyUntilTheRecoveryTimePasses) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start({.xid_recovery = absl::Seconds(3)});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  // Waited for by what it does, not by the change counter: a change from the start (the first
  // sample's answer) may still be on its way and would be taken for the Xid's.
  const int before = changes_.load();
  Event(std::string(kUuid0) + " 79");
  ASSERT_TRUE(Eventually([&] {
    return Reason(kUuid0).find("critical Xid 79 (GPU has fallen off the bus) at ") != std::string::npos;
  })) << Reason(kUuid0);
  EXPECT_FALSE(Healthy(kUuid0));
  EXPECT_TRUE(Eventually([&] { return changes_.load() > before; }));  // a rescan is asked for
  EXPECT_TRUE(Healthy(kUuid1));
  // No other critical Xid for 3 s (room for a busy machine to look first): Healthy again, and a
  // rescan is asked for then.
  const int after_xid = changes_.load();
  ASSERT_TRUE(Eventually([&] { return Healthy(kUuid0); }, absl::Seconds(10)));
  EXPECT_TRUE(Eventually([&] { return changes_.load() > after_xid; }));
  NvmlStatus status = supervisor.Status();
  ASSERT_EQ(status.xids.size(), 1u);
  EXPECT_EQ(status.xids[0].uuid, kUuid0);
  EXPECT_EQ(status.xids[0].xid, 79);
  EXPECT_TRUE(status.xids[0].critical);
  EXPECT_EQ(status.xids[0].count, 1u);
}

TEST_F(NvmlSupervisorTest, WithoutRecoveryACriticalXidLastsAndApplicationXidsNeverCount) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start({.xid_recovery = absl::ZeroDuration()});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  auto count_of = [&](const std::string& uuid, int xid) -> const NvmlXidCount {
    for (const NvmlXidCount& count : supervisor.Status().xids) {
      if (count.uuid == uuid && count.xid == xid) return count;
    }
    return {};
  };
  Event(std::string(kUuid1) + " 13");  // an application error
  Event(std::string(kUuid0) + " 48");
  ASSERT_TRUE(Eventually([&] { return !Healthy(kUuid0); }));
  EXPECT_THAT(Reason(kUuid0), HasSubstr("critical Xid 48 (double-bit ECC error)"));
  EXPECT_TRUE(Healthy(kUuid1));
  const NvmlXidCount xid13 = count_of(kUuid1, 13);
  EXPECT_FALSE(xid13.critical);
  EXPECT_EQ(xid13.count, 1u);
  // Its supervisor passed its recovery check again since (it handled a later event, and a
  // zero recovery time applied as "at once" would have made the GPU Healthy there).
  Event(std::string(kUuid1) + " 31");
  ASSERT_TRUE(Eventually([&] { return count_of(kUuid1, 31).count == 1; }));
  EXPECT_FALSE(Healthy(kUuid0));
}

TEST_F(NvmlSupervisorTest, AGpuNvmlNoLongerAnswersForIsUnhealthyUntilItAnswers) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start({.check_interval = absl::Milliseconds(100)});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  Script(TwoGpus("", "lost=15"));
  ASSERT_TRUE(Eventually([&] { return !Healthy(kUuid1); }));  // seen by the periodic check
  EXPECT_EQ(Reason(kUuid1), "NVML no longer answers for this GPU: GPU is lost (15)");
  EXPECT_TRUE(Healthy(kUuid0));
  std::vector<NvmlTelemetry> telemetry = supervisor.Telemetry(absl::Seconds(2));
  for (const NvmlTelemetry& t : telemetry) {
    EXPECT_EQ(t.lost.empty(), t.uuid == kUuid0) << t.uuid;
  }
  Script(TwoGpus());
  EXPECT_TRUE(Eventually([&] { return Healthy(kUuid1); }));
}

TEST_F(NvmlSupervisorTest, AGpuInMigModeIsLeftOutAndSaidSo) {
  std::string script = TwoGpus();
  script.replace(script.find("mig=disabled"), 12, "mig=enabled");
  Install(script);
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  std::vector<Device> devices = Scan();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].id, kUuid1);
  EXPECT_THAT(supervisor.Remarks(),
              Contains(HasSubstr(std::string(kUuid0) +
                                 ": MIG mode is enabled, so the GPU as a whole is not allocatable")));
  bool mig_on = false;
  for (const auto& facts : supervisor.AllGpuFacts()) {
    if (facts.at("uuid") == kUuid0) mig_on = facts.at("mig_mode") == "enabled";
  }
  EXPECT_TRUE(mig_on);
}

TEST_F(NvmlSupervisorTest, AFailedEventWaitMakesEveryGpuUnhealthyUntilAFreshHelperWatches) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor =
      Start({.restart_initial = absl::Seconds(2), .restart_max = absl::Seconds(2)});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  Event("fail 999");
  // The helper says so and exits; until a fresh one watches (2 s later), no GPU is trusted.
  ASSERT_TRUE(Eventually([&] { return supervisor.Status().restarts >= 1; }));
  EXPECT_THAT(Reason(kUuid0), HasSubstr("NVML's wait for Xid errors failed (Unknown Error (999))"));
  EXPECT_FALSE(Healthy(kUuid1));
  EXPECT_TRUE(Eventually([&] { return Ready() && Healthy(kUuid0) && Healthy(kUuid1); }));
}

TEST_F(NvmlSupervisorTest, GpusWithoutXidEventsAreServedAndSaySo) {
  Install("events=unsupported\n" + TwoGpus());
  Start();
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  std::vector<Device> devices = Scan();
  EXPECT_EQ(devices[0].health, Health::kHealthy);
  EXPECT_EQ(devices[0].facts.at("xid_events"), "unsupported: the GPU reports no Xid events");
}

TEST_F(NvmlSupervisorTest, StopEndsTheHelper) {
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start();
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  const pid_t pid = supervisor.helper_pid();
  supervisor.Stop();
  EXPECT_EQ(supervisor.helper_pid(), -1);
  EXPECT_NE(kill(pid, 0), 0);  // gone and reaped
  // Joined; its /proc entry can outlive the join by a moment.
  EXPECT_TRUE(Eventually([] { return !HasThread("ea-nvml"); }));
}

// On the daemon's shared loop a step of another member (a registration's neighbour look) can
// take a while. The supervisor, stepped after it (its own wake-up, or its deadline at the next
// wait), is told what its pipe holds then: a helper that answered in time is not killed for the
// loop's delay.
TEST_F(NvmlSupervisorTest, AnAnswerThatCameWhileTheSharedLoopWasBusyIsNotAHang) {
  // A member stepped before the supervisor: its first step holds the loop until the test
  // releases it, its second for 4 s.
  class Busy : public PollLoop::Member {
   public:
    Busy() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
    ~Busy() override { close(fd_); }
    PollLoop::Fds WaitFds() override { return {fd_, -1, -1, -1}; }
    absl::Time Step(const PollLoop::Events& ready) override {
      if (ready[0] & POLLIN) {
        uint64_t count;
        (void)!read(fd_, &count, sizeof(count));
        if (started_.fetch_add(1) == 0) {
          release_.WaitForNotification();
        } else {
          absl::SleepFor(absl::Seconds(4));
        }
        done_.fetch_add(1);
      }
      return absl::InfiniteFuture();
    }
    void Poke() {
      uint64_t one = 1;
      (void)!write(fd_, &one, sizeof(one));
    }
    std::atomic<int> started_{0};
    std::atomic<int> done_{0};
    absl::Notification release_;

   private:
    const int fd_;
  };
  PollLoop loop("ea-test-loop");
  Busy busy;
  loop.Add(&busy);
  Install(TwoGpus());
  NvmlSupervisor& supervisor = Start({.timeout = absl::Seconds(3), .loop = &loop});
  ASSERT_TRUE(Eventually([&] { return Ready(); }));
  // The sample asked for at the listing is answered before NVML turns slow.
  ASSERT_EQ(supervisor.Telemetry(absl::Seconds(5)).size(), 2u);
  const pid_t helper = supervisor.helper_pid();
  // Each GPU's sample now takes 750 ms: the answer comes 1.5 s after the request, half the
  // 3 s deadline.
  Script("sample=delay:750\n" + TwoGpus());
  absl::SleepFor(absl::Milliseconds(1100));  // the cached sample is more than a second old
  // While the first step holds the loop, a sample is asked for (the supervisor's eventfd) and
  // the busy member's next step too. Released, the loop's next wait sees both eventfds and no
  // answer yet; the busy step holds the loop 4 s, past the answer and past the deadline, and
  // the supervisor is stepped after it. Nothing here depends on how fast this thread runs: the
  // first step waits for it, and the second starts after the request.
  busy.Poke();
  ASSERT_TRUE(Eventually([&] { return busy.started_ == 1; }));
  (void)supervisor.Telemetry(absl::ZeroDuration());
  busy.Poke();
  busy.release_.Notify();
  ASSERT_TRUE(Eventually([&] { return busy.done_ == 2; }, absl::Seconds(10)));
  // The supervisor's step after the busy one reads the answer, or kills the helper for the
  // deadline: either ends the pending sample, which Telemetry waits for. NVML is quick again,
  // so a sample Telemetry asks for itself (this thread was slow, the answer is a second old)
  // is answered well inside the deadline.
  Script(TwoGpus());
  (void)supervisor.Telemetry(absl::Seconds(5));
  EXPECT_EQ(supervisor.Status().hangs, 0u) << supervisor.Status().reason;
  EXPECT_EQ(supervisor.helper_pid(), helper);
  supervisor.Stop();
  loop.Remove(&busy);
}

}  // namespace
}  // namespace edgeaccel
