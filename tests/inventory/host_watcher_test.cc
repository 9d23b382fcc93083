// HostWatcher against real inotify on a real fixture tree.
#include "edgeaccel/inventory/host_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/tegra.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::ReadFileText;
using ::edgeaccel::testing::WaitForChange;

constexpr absl::Duration kPatience = absl::Seconds(5);  // generous for loaded CI machines

// A discoverer that asks for what the kernel never delivers: a sysfs and a procfs directory.
class SysfsWatchingDiscoverer : public Discoverer {
 public:
  std::string ResourceName() const override { return "example.com/thing"; }
  std::string Family() const override { return "sysfs-watcher"; }
  std::vector<Device> Scan() override { return {}; }
  std::vector<WatchSpec> WatchPaths() const override {
    return {{"/sys/class/thing", ""}, {"/proc/driver/thing", ""}, {"/dev", "thing"}};
  }
  std::vector<std::string> UeventSubsystems() const override { return subsystems; }
  std::string NothingFoundHint() const override { return "no thing"; }
  std::vector<std::string> subsystems;
};

// A discoverer whose devices change where no host event can tell (NVML's Xid errors): only its
// own source, through RequestRescan.
class SourceDrivenDiscoverer : public Discoverer {
 public:
  std::string ResourceName() const override { return "example.com/thing"; }
  std::string Family() const override { return "source-driven"; }
  std::vector<Device> Scan() override {
    Device d;
    d.id = "thing0";
    if (broken.load()) d.health = Health::kUnhealthy;
    return {d};
  }
  std::vector<WatchSpec> WatchPaths() const override { return {}; }
  std::string NothingFoundHint() const override { return "no thing"; }
  std::atomic<bool> broken{false};
};

class HealthTest : public ::testing::Test {
 protected:
  void StartWatcher(absl::Duration probe = absl::ZeroDuration(), Discoverer* discoverer = nullptr) {
    HostWatcher::Options options;
    options.probe_interval = probe;
    watcher_ = std::make_unique<HostWatcher>(&host_, options);
    watcher_->Add(discoverer != nullptr ? discoverer : &coral_, &set_);
    ASSERT_TRUE(watcher_->Start().ok());
  }
  // A Jetson and a discrete GPU with its driver's files, both into `gpus`, probed every 20 ms
  // (no uevents: the machine's own devices must not rescan).
  void StartJetsonAndDiscreteGpu(DeviceSet* gpus) {
    fixture_.AddJetson(FixtureHost::Jetson::kIgxOrinR36);
    fixture_.AddNvidiaGpu({});
    fixture_.AddNvidiaDriverFiles({});
    HostWatcher::Options options;
    options.probe_interval = absl::Milliseconds(20);
    options.uevents = false;
    watcher_ = std::make_unique<HostWatcher>(&host_, options);
    watcher_->Add(Own<TegraGpuDiscoverer>(&host_, NvidiaOptions{}), gpus);
    watcher_->Add(Own<NvidiaGpuDiscoverer>(&host_, NvidiaOptions{}), gpus);
    ASSERT_TRUE(watcher_->Start().ok());
  }
  // Waits until the watcher has handled a batch of events after `handled` were.
  bool EventsHandledAfter(uint64_t handled) {
    return Eventually([&] { return watcher_->events_handled() != handled; }, kPatience);
  }
  // Waits for the next version and returns it.
  std::shared_ptr<const Snapshot> NextSnapshot() {
    const uint64_t version = set_.Current()->version;
    return WaitUntil([version](const Snapshot& s) { return s.version > version; });
  }
  // Waits until the watcher has done `n` more probes than `probes`.
  bool ProbesAfter(uint64_t probes, uint64_t n = 1) {
    return Eventually([&] { return watcher_->probes() >= probes + n; }, kPatience);
  }
  // Waits until `done` holds for the set's snapshot, looking again at each new version (the
  // set's listener tells), and returns the last one looked at.
  std::shared_ptr<const Snapshot> WaitUntil(const std::function<bool(const Snapshot&)>& done) {
    std::shared_ptr<const Snapshot> s;
    WaitForChange(versions_mu_, versions_, [&] { return done(*(s = set_.Current())); }, kPatience);
    return s;
  }

  FixtureHost fixture_;
  Host host_{fixture_.root()};
  CoralPcieDiscoverer coral_{&host_, {}};
  absl::Mutex versions_mu_;
  uint64_t versions_ ABSL_GUARDED_BY(versions_mu_) = 0;  // new versions the set has announced
  DeviceSet set_{"coral.ai/edgetpu"};
  const uint64_t versions_listener_ = set_.Subscribe([this](std::shared_ptr<const Snapshot>) {
    absl::MutexLock lock(&versions_mu_);
    ++versions_;
  });
  // Discoverers a test brings: owned here, so they outlive the watcher's thread.
  template <typename T, typename... Args>
  T* Own(Args&&... args) {
    owned_.push_back(std::make_unique<T>(std::forward<Args>(args)...));
    return static_cast<T*>(owned_.back().get());
  }
  std::vector<std::unique_ptr<Discoverer>> owned_;
  std::unique_ptr<HostWatcher> watcher_;
};

TEST_F(HealthTest, RemovedNodeTurnsUnhealthyAndComesBack) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher();
  ASSERT_EQ(set_.Current()->HealthyCount(), 1);

  fixture_.Remove("/dev/apex_0");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  ASSERT_EQ(s->devices.size(), 1u);
  EXPECT_EQ(s->devices[0].health, Health::kUnhealthy);

  fixture_.MakeCharDevice("/dev/apex_0", 120, 0);
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, HotPluggedDeviceAppearsAndUnpluggedOneGoes) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  StartWatcher();
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 2; });
  EXPECT_EQ(s->devices.size(), 2u);

  fixture_.UnplugCoralPcie(1, "0000:04:00.0");
  s = WaitUntil([](const Snapshot& s) { return s.devices.size() == 1; });
  EXPECT_EQ(s->devices.size(), 1u);
  EXPECT_EQ(s->devices[0].id, "0000:03:00.0");
}

TEST_F(HealthTest, DriverLoadedAfterStartIsNoticed) {
  // Neither /dev nor /sys/class/apex exists yet: their ancestors are watched.
  StartWatcher();
  EXPECT_TRUE(set_.Current()->devices.empty());
  fixture_.AddCoralPcie({.index = 0});
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, TemperatureIsReadOnTheProbeInterval) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher(absl::Milliseconds(100));
  fixture_.SetApexAttribute(0, "temp", "100050\n");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  EXPECT_THAT(s->devices[0].unhealthy_reason, ::testing::HasSubstr("100.05 °C"));
  fixture_.SetApexAttribute(0, "temp", "50050\n");
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
}

TEST_F(HealthTest, IdleWithoutProbeMeansNoRescans) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher();
  const uint64_t scans = watcher_->scans();
  // Unrelated activity in /dev does not rescan either: seen, and left alone.
  const uint64_t handled = watcher_->events_handled();
  fixture_.WriteFile("/dev/ttyS0", "");
  ASSERT_TRUE(EventsHandledAfter(handled));
  EXPECT_EQ(watcher_->scans(), scans);
}

TEST_F(HealthTest, ARequestedRescanIsTheOnlyWayASourceDrivenChangeIsSeenWithoutTheProbe) {
  auto* source = Own<SourceDrivenDiscoverer>();
  StartWatcher(absl::ZeroDuration(), source);  // no probe: nothing else would rescan it
  ASSERT_EQ(set_.Current()->HealthyCount(), 1);
  source->broken = true;
  uint64_t scans = watcher_->scans();
  watcher_->RequestRescan(source);
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  EXPECT_EQ(s->HealthyCount(), 0);
  EXPECT_EQ(watcher_->scans(), scans + 1);  // the request's rescan, and no other
  // Another discoverer's request rescans only that one (here: none of ours).
  source->broken = false;
  scans = watcher_->scans();
  watcher_->RequestRescan(&coral_);
  watcher_->RequestRescan(source);
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
  EXPECT_EQ(watcher_->scans(), scans + 1);
}

// sysfs and procfs send no inotify events on a node; the fixture's sys/ and proc/ must not
// either, or tests pass that a node fails.
TEST_F(HealthTest, ChangesUnderSysAloneAreNotSeenWithoutTheProbe) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher();  // no probe
  const uint64_t scans = watcher_->scans();
  fixture_.MakeDirectory("/sys/devices/pci0000:00/0000:04:00.0/apex/apex_1");
  fixture_.Symlink("../../devices/pci0000:00/0000:04:00.0/apex/apex_1", "/sys/class/apex/apex_1");
  fixture_.SetApexAttribute(0, "status", "DEAD\n");
  // A marker in /dev, which is watched: inotify hands events over in order, so once the marker
  // is handled, any event the sys/ changes had made would have been handled too.
  const uint64_t handled = watcher_->events_handled();
  fixture_.WriteFile("/dev/ttyS0", "");
  ASSERT_TRUE(EventsHandledAfter(handled));
  EXPECT_EQ(watcher_->scans(), scans);
  EXPECT_EQ(set_.Current()->HealthyCount(), 1);
}

TEST_F(HealthTest, DriverStatusDeadIsSeenAtTheProbe) {
  fixture_.AddCoralPcie({.index = 0});
  StartWatcher(absl::Milliseconds(100));
  fixture_.SetApexAttribute(0, "status", "DEAD\n");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  ASSERT_EQ(s->devices.size(), 1u);
  EXPECT_THAT(s->devices[0].unhealthy_reason, ::testing::HasSubstr("DEAD"));
}

// Where `published` (what the watcher published) and `scanned` (a full scan, published the same
// way) differ, one line per difference; empty when they are the same.
std::string Differences(const std::vector<Device>& published, std::vector<Device> scanned,
                        const Host& host) {
  LookUpHostModes(host, &scanned);
  if (published.size() != scanned.size()) {
    return absl::StrCat(published.size(), " devices published, ", scanned.size(), " scanned");
  }
  std::string out;
  for (size_t i = 0; i < published.size(); ++i) {
    const Device& a = published[i];
    const Device& b = scanned[i];
    if (a.id != b.id) absl::StrAppend(&out, "id ", a.id, " / ", b.id, "\n");
    if (AdvertisementDiffers(a, b)) absl::StrAppend(&out, a.id, ": advertisement\n");
    if (a.unhealthy_reason != b.unhealthy_reason) {
      absl::StrAppend(&out, a.id, ": \"", a.unhealthy_reason, "\" / \"", b.unhealthy_reason, "\"\n");
    }
    if (a.problems != b.problems) absl::StrAppend(&out, a.id, ": problems\n");
    if (a.facts != b.facts) absl::StrAppend(&out, a.id, ": facts\n");
    if (a.telemetry != b.telemetry) absl::StrAppend(&out, a.id, ": telemetry\n");
  }
  return out;
}

// The probe reads again only what can change unannounced (here an Edge TPU's temperature) and
// scans when it differs: it finds what scanning at every probe finds, at the same probe.
TEST_F(HealthTest, ATemperatureCrossingTheThresholdIsSeenByTheProbeAsAFullScanSeesIt) {
  fixture_.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
  fixture_.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
  HostWatcher::Options options;
  options.probe_interval = absl::Milliseconds(20);
  options.uevents = false;
  watcher_ = std::make_unique<HostWatcher>(&host_, options);
  watcher_->Add(&coral_, &set_);
  ASSERT_TRUE(watcher_->Start().ok());
  // A discoverer that scans at every probe, as the probe did before it read less.
  CoralPcieDiscoverer full(&host_, {});
  full.Scan();

  fixture_.SetApexAttribute(1, "temp", "100050\n");
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  ASSERT_EQ(s->HealthyCount(), 1);
  EXPECT_THAT(s->Find("0000:04:00.0")->unhealthy_reason, ::testing::HasSubstr("100.05 °C"));
  // Two more probes: the one after a crossing scans again (the hysteresis now applies), the
  // next has nothing new. The full scans do the same.
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 2));
  full.Scan();
  EXPECT_EQ(Differences(set_.Current()->devices, full.Scan(), host_), "");
  EXPECT_THAT(set_.Current()->Find("0000:04:00.0")->unhealthy_reason,
              ::testing::HasSubstr("less the hysteresis"));

  // Cooler, but not below the threshold less the hysteresis: still Unhealthy, a new reading.
  fixture_.SetApexAttribute(1, "temp", "98800\n");
  // A reading alone publishes silently, under the same version: looked at until it is there.
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    return set_.Current()->Find("0000:04:00.0")->telemetry.at("temperature_celsius") == 98.8;
  }));
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 2));
  EXPECT_EQ(Differences(set_.Current()->devices, full.Scan(), host_), "");
  EXPECT_EQ(set_.Current()->HealthyCount(), 1);

  fixture_.SetApexAttribute(1, "temp", "50050\n");
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 2; });
  ASSERT_EQ(s->HealthyCount(), 2);
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 2));
  EXPECT_EQ(Differences(set_.Current()->devices, full.Scan(), host_), "");
}

// On a host where nothing changes, a probe reads what can change unannounced and scans nothing;
// a change scans the one family it concerns.
TEST_F(HealthTest, AProbeOfAnUnchangedHostScansNoFamily) {
  fixture_.AddCoralPcie({.index = 0});
  fixture_.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
  HostWatcher::Options options;
  options.probe_interval = absl::Milliseconds(20);
  options.uevents = false;  // the machine's own USB devices must not rescan
  watcher_ = std::make_unique<HostWatcher>(&host_, options);
  watcher_->Add(&coral_, &set_);
  watcher_->Add(Own<CoralUsbDiscoverer>(&host_), &set_);
  ASSERT_TRUE(watcher_->Start().ok());
  ASSERT_EQ(set_.Current()->HealthyCount(), 2);
  uint64_t scans = watcher_->scans();
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 5));
  EXPECT_EQ(watcher_->scans(), scans);

  fixture_.SetApexAttribute(0, "temp", "46050\n");
  // A reading alone publishes silently, under the same version: looked at until it is there.
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    return set_.Current()->Find("0000:03:00.0")->telemetry.at("temperature_celsius") == 46.05;
  }));
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 3));
  EXPECT_EQ(watcher_->scans(), scans + 1);  // coral-pcie, once; not coral-usb
}

TEST_F(HealthTest, AProbeOfAnUnchangedJetsonAndDiscreteGpuScansNoFamily) {
  DeviceSet gpus("nvidia.com/gpu");
  StartJetsonAndDiscreteGpu(&gpus);
  ASSERT_EQ(gpus.Current()->devices.size(), 2u);
  ASSERT_EQ(gpus.Current()->HealthyCount(), 2);
  const uint64_t scans = watcher_->scans();
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 5));
  EXPECT_EQ(watcher_->scans(), scans);

  // /proc/meminfo changes all the time; only its MemTotal is the Jetson's.
  fixture_.WriteFile("/proc/meminfo", "MemTotal:        3964656 kB\nMemFree:          654321 kB\n");
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 3));
  EXPECT_EQ(watcher_->scans(), scans);
  fixture_.WriteFile("/proc/meminfo", "MemTotal:        7929312 kB\nMemFree:          654321 kB\n");
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] {
    // Hold the snapshot: a range-for over a temporary's member frees it before the loop runs.
    const std::shared_ptr<const Snapshot> snapshot = gpus.Current();
    for (const Device& d : snapshot->devices) {
      if (d.facts.count("memory_mib") > 0 && d.facts.at("memory_mib") == "7743") return true;
    }
    return false;
  }));
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 3));
  EXPECT_EQ(watcher_->scans(), scans + 1);  // tegra, once; not nvidia
  // A GPU the driver excludes: the driver decides it as it binds the GPU (NVreg_ExcludedGpus;
  // nv_check_and_exclude_gpu in its PCI probe), so the GPU is unbound and bound again with its
  // /proc entry made anew, and its /proc file says so; only the probe can see it.
  const std::string entry = "/proc/driver/nvidia/gpus/0000:01:00.0";
  std::string text = ReadFileText(fixture_.Path(entry + "/information"));
  ASSERT_NE(text.find("GPU Excluded:\t No"), std::string::npos);
  text.replace(text.find("GPU Excluded:\t No"), 17, "GPU Excluded:\t Yes");
  fixture_.Remove(entry);
  fixture_.WriteFile(entry + "/information", text);
  EXPECT_TRUE(
      ::edgeaccel::testing::Eventually([&] { return gpus.Current()->HealthyCount() == 1; }));
  // The watcher publishes into `gpus`, which goes at the end of this body: it stops first (a
  // publish may still be finishing when the snapshot above is seen).
  watcher_->Stop();
}

// A file outside sysfs and procfs (an L4T upgrade rewrites /etc/nv_tegra_release) is watched:
// its event is reported to the watcher's epoll, and the probe after it scans that family, once;
// the probes before it and after read no event queue of the family.
TEST_F(HealthTest, AnEventOnAWatchedInputIsSeenByTheNextProbeWhichScansOnlyItsFamily) {
  DeviceSet gpus("nvidia.com/gpu");
  StartJetsonAndDiscreteGpu(&gpus);
  auto l4t_revision = [&]() -> std::string {
    const std::shared_ptr<const Snapshot> snapshot = gpus.Current();
    for (const Device& d : snapshot->devices) {
      if (d.facts.count("l4t_revision") > 0) return d.facts.at("l4t_revision");
    }
    return "";
  };
  ASSERT_EQ(l4t_revision(), "4.7");
  const uint64_t scans = watcher_->scans();
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 5));
  EXPECT_EQ(watcher_->scans(), scans);

  std::string release = ReadFileText(fixture_.Path("/etc/nv_tegra_release"));
  release.replace(release.find("REVISION: 4.7"), 13, "REVISION: 4.8");
  fixture_.OverwriteInPlace("/etc/nv_tegra_release", release, {1, 0});
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return l4t_revision() == "4.8"; }));
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 5));
  EXPECT_EQ(watcher_->scans(), scans + 1);  // tegra, once; not nvidia
}

// The daemon stops its watcher, then destroys its discoverers, then the watcher (whose destructor
// stops it again): the second stop must not reach the discoverers' probe inputs (ASan and TSan
// saw the daemon's exit read a freed ScanInputs).
TEST_F(HealthTest, AWatcherStoppedBeforeItsDiscoverersGoIsDestroyedAfterThem) {
  fixture_.AddCoralPcie({.index = 0});
  auto discoverer = std::make_unique<CoralPcieDiscoverer>(&host_, CoralHealthPolicy{});
  StartWatcher(absl::Milliseconds(20), discoverer.get());
  ASSERT_TRUE(ProbesAfter(watcher_->probes(), 2));  // the probe inputs' wake is in place
  watcher_->Stop();
  discoverer.reset();
  watcher_.reset();
}

TEST_F(HealthTest, SysfsAndProcfsWatchesAreRefused) {
  fixture_.MakeDirectory("/sys/class/thing");
  fixture_.MakeDirectory("/proc/driver/thing");
  fixture_.MakeDirectory("/dev");
  StartWatcher(absl::ZeroDuration(), Own<SysfsWatchingDiscoverer>());
  uint64_t scans = watcher_->scans();
  fixture_.WriteFile("/sys/class/thing/thing0", "");
  fixture_.WriteFile("/proc/driver/thing/thing0", "");
  const uint64_t handled = watcher_->events_handled();
  fixture_.WriteFile("/dev/ttyS0", "");  // the marker (see ChangesUnderSysAlone...)
  ASSERT_TRUE(EventsHandledAfter(handled));
  EXPECT_EQ(watcher_->scans(), scans);
  // /dev is devtmpfs on a node, and is watched: a rescan now, and the settle look after it.
  fixture_.MakeCharDevice("/dev/thing0", 240, 0);
  Eventually([&] { return watcher_->scans() >= scans + 2; }, kPatience);
  EXPECT_EQ(watcher_->scans(), scans + 2);
}

TEST_F(HealthTest, UsbBusDirectoryThatAppearsLaterIsWatched) {
  // No /dev/bus/usb at all: the first device on bus 3 brings /dev/bus/usb/003 with it.
  StartWatcher(absl::ZeroDuration(), Own<CoralUsbDiscoverer>(&host_));
  const FixtureHost::CoralUsb tpu{.port = "3-1", .bus = 3, .dev = 4, .firmware_loaded = true};
  fixture_.AddCoralUsb(tpu);
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  ASSERT_EQ(s->HealthyCount(), 1);
  // Unplugged: the node goes first (Unhealthy at once), the sysfs side a moment later, which
  // only the settle look can see (sysfs is silent).
  fixture_.UnplugCoralUsb(tpu);
  s = WaitUntil([](const Snapshot& s) { return s.devices.empty(); });
  EXPECT_TRUE(s->devices.empty());
}

// Kernel uevents, from the real kernel: loop devices added and removed through /dev/loop-control
// announce themselves in the "block" subsystem.
TEST_F(HealthTest, KernelUeventsOfAWatchedSubsystemTriggerARescan) {
  auto* block = Own<SysfsWatchingDiscoverer>();
  block->subsystems = {"block"};
  StartWatcher(absl::ZeroDuration(), block);
  if (!watcher_->listening_to_uevents()) GTEST_SKIP() << "no uevent socket here";
  const uint64_t scans = watcher_->scans();
  absl::StatusOr<std::string> loop = testing::AnnounceLoopDevice();
  if (!loop.ok()) GTEST_SKIP() << loop.status();
  EXPECT_TRUE(Eventually([&] { return watcher_->scans() > scans; }, kPatience));
}

TEST_F(HealthTest, UeventsOfOtherSubsystemsAreIgnored) {
  auto* usb_only = Own<SysfsWatchingDiscoverer>();
  usb_only->subsystems = {"usb"};
  StartWatcher(absl::ZeroDuration(), usb_only);
  if (!watcher_->listening_to_uevents()) GTEST_SKIP() << "no uevent socket here";
  const uint64_t scans = watcher_->scans();
  const uint64_t handled = watcher_->events_handled();
  absl::StatusOr<std::string> loop = testing::AnnounceLoopDevice();
  if (!loop.ok()) GTEST_SKIP() << loop.status();
  ASSERT_TRUE(EventsHandledAfter(handled)) << "the loop device's uevents were never received";
  EXPECT_EQ(watcher_->scans(), scans);
}

// No inotify instance at start (fs.inotify.max_user_instances used up by other pods; here, every
// fd taken): the watcher still starts, looks every second, and takes an instance once it can.
TEST_F(HealthTest, NoInotifyInstanceAtStartMeansLookingEverySecondUntilOneIsFree) {
  fixture_.AddCoralPcie({.index = 0});
  CapturedLog log;
  ::edgeaccel::testing::AllFdsTaken fds;
  HostWatcher::Options options;
  options.probe_interval = absl::ZeroDuration();
  options.uevents = false;
  watcher_ = std::make_unique<HostWatcher>(&host_, options);  // its inotify instance fails here
  watcher_->Add(&coral_, &set_);
  // Room for the rescan eventfd, epoll and the settle timer only: inotify fails, and so does the
  // eventfd of the watcher's loop until fds are back (it waits a second at most meanwhile).
  fds.Give(3);
  absl::Status started = watcher_->Start();
  fds.Restore();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_TRUE(log.Contains("no inotify instance"));
  // The look every second finds the device, and takes an inotify instance now that fds are free.
  auto s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
  EXPECT_TRUE(::edgeaccel::testing::Eventually(
      [&] { return log.Contains("inotify is available again"); }));
  fixture_.Remove("/dev/apex_0");
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 0; });
  EXPECT_EQ(s->HealthyCount(), 0);
  // From now on the kernel tells us: the device's return is an inotify event, not a look's find.
  const uint64_t handled = watcher_->events_handled();
  fixture_.MakeCharDevice("/dev/apex_0", 120, 0);
  s = WaitUntil([](const Snapshot& s) { return s.HealthyCount() == 1; });
  EXPECT_EQ(s->HealthyCount(), 1);
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return watcher_->events_handled() > handled; }))
      << "no inotify event: only the look found the device";
}

}  // namespace
}  // namespace edgeaccel
