#include "edgeaccel/inventory/host_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/inventory/replicas.h"
#include "glog/logging.h"

namespace edgeaccel {

HostWatcher::HostWatcher(const Host* host, Options options)
    : host_(host), options_(options), loop_("ea-hostwatch") {}

HostWatcher::~HostWatcher() { Stop(); }

namespace {

// epoll data of a family's probe inputs (data.u64: the tag above, the family's index below);
// every other fd is registered as data.fd, which leaves the upper half 0.
constexpr uint64_t kInputsTag = uint64_t{1} << 32;

}  // namespace

void HostWatcher::Add(Discoverer* discoverer, DeviceSet* set) {
  families_.push_back({discoverer, set, {}, discoverer->ProbeInputs()});
}

void HostWatcher::SetReplicas(DeviceSet* set, int replicas) { replicas_[set] = replicas; }

void HostWatcher::ScanAll() {
  absl::flat_hash_set<DeviceSet*> sets;
  for (Family& family : families_) {
    scans_.fetch_add(1);
    family.last = family.discoverer->Scan();
    sets.insert(family.set);
  }
  for (DeviceSet* set : sets) Publish(set);
}

void HostWatcher::Rescan(size_t family) {
  scans_.fetch_add(1);
  families_[family].last = families_[family].discoverer->Scan();
  Publish(families_[family].set);
}

void HostWatcher::Probe() {
  if (!watcher_.complete()) {
    ScanAll();
  } else {
    absl::flat_hash_set<DeviceSet*> sets;
    for (Family& family : families_) {
      if (family.discoverer->InputsUnchanged()) continue;
      scans_.fetch_add(1);
      family.last = family.discoverer->Scan();
      sets.insert(family.set);
    }
    for (DeviceSet* set : sets) Publish(set);
  }
  probes_.fetch_add(1);
}

void HostWatcher::Publish(DeviceSet* set) {
  std::vector<Device> devices;
  for (const Family& family : families_) {
    if (family.set == set) devices.insert(devices.end(), family.last.begin(), family.last.end());
  }
  // Each physical device's node modes once, before replicas copy them.
  LookUpHostModes(*host_, &devices);
  auto replicas = replicas_.find(set);
  set->Update(ExpandReplicas(std::move(devices), replicas == replicas_.end() ? 1 : replicas->second));
}

void HostWatcher::RequestRescan(const Discoverer* discoverer) {
  absl::MutexLock lock(&rescan_mu_);
  if (rescan_fd_ < 0) return;
  for (size_t f = 0; f < families_.size(); ++f) {
    if (families_[f].discoverer == discoverer) rescan_requested_.insert(f);
  }
  uint64_t one = 1;
  (void)!write(rescan_fd_, &one, sizeof(one));
}

absl::Status HostWatcher::Start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  {
    absl::MutexLock lock(&rescan_mu_);
    rescan_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  if (epoll_fd_ < 0 || rescan_fd_ < 0) {
    return absl::InternalError(absl::StrCat("cannot set up epoll: ", strerror(errno)));
  }
  settle_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (settle_fd_ < 0) return absl::InternalError(absl::StrCat("timerfd: ", strerror(errno)));
  bool wants_uevents = false;
  for (const Family& family : families_) wants_uevents |= !family.discoverer->UeventSubsystems().empty();
  if (options_.uevents && wants_uevents) {
    if (absl::Status opened = uevents_.Open(); opened.ok()) {
      LOG(INFO) << "listening to kernel uevents: hot-plug is seen through them and through /dev";
    } else {
      LOG(INFO) << opened.message() << "; hot-plug is seen through /dev (devtmpfs) and the probe";
    }
  }
  if (!watcher_.Open()) {
    // The node's fs.inotify.max_user_instances is shared by every process of the user (root):
    // other pods can use it up. Look every second, and take an instance once one is free.
    LOG(WARNING) << "no inotify instance (" << strerror(errno)
                 << "; is fs.inotify.max_user_instances used up?): looking at the devices every "
                    "second until one is free";
  }
  for (size_t f = 0; f < families_.size(); ++f) {
    if (families_[f].inputs != nullptr) families_[f].inputs->WakeThrough(epoll_fd_, kInputsTag | f);
  }
  for (int fd : {watcher_.fd(), uevents_.fd(), settle_fd_, rescan_fd_}) {
    if (fd < 0) continue;
    struct epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  // Arm before the first scan so nothing that happens in between is missed.
  ArmWatches();
  ScanAll();
  for (const Family& family : families_) {
    if (family.set->Current()->devices.empty()) {
      LOG(INFO) << family.set->resource_name() << ": " << family.discoverer->NothingFoundHint()
                << "; watching for devices to appear";
    }
  }
  loop_.Add(this);  // its thread ("ea-hostwatch", as top -H and the benchmark show it) starts
  started_ = true;
  return absl::OkStatus();
}

void HostWatcher::Stop() {
  if (started_) {
    loop_.Remove(this);  // no step runs from here on
    started_ = false;
  }
  // Only while started: a second Stop (the destructor's) may come after the discoverers are gone.
  if (epoll_fd_ >= 0) {
    for (Family& family : families_) {
      if (family.inputs != nullptr) family.inputs->WakeThrough(-1, 0);
    }
  }
  for (int* fd : {&settle_fd_, &epoll_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  absl::MutexLock lock(&rescan_mu_);
  if (rescan_fd_ >= 0) close(rescan_fd_);
  rescan_fd_ = -1;
}

void HostWatcher::ArmWatches() {
  std::vector<std::string> directories;
  targets_.clear();
  for (size_t f = 0; f < families_.size(); ++f) {
    for (const WatchSpec& spec : families_[f].discoverer->WatchPaths()) {
      if (host_->IsSilentToInotify(spec.directory)) {
        // Watching it would work only in a test fixture, and make tests pass that a node fails.
        if (silent_logged_.insert(spec.directory).second) {
          LOG(WARNING) << families_[f].discoverer->Family() << ": not watching " << spec.directory
                       << ": sysfs and procfs send no inotify events; it is read every probe";
        }
        continue;
      }
      directories.push_back(host_->Resolve(spec.directory));
      targets_.push_back({f, spec.name_prefix});
    }
  }
  watcher_.Arm(directories);
}

PollLoop::Fds HostWatcher::WaitFds() { return {epoll_fd_, -1, -1, -1}; }

absl::Time HostWatcher::Step(const PollLoop::Events& ready) {
  const absl::Time now = absl::Now();
  if (next_probe_ == absl::InfinitePast()) {  // the first step, when added
    next_probe_ = now + options_.probe_interval;
    next_look_ = now + kLookInterval;
  }
  if (ready[0] != 0) HandleEvents();
  if (!watcher_.complete() && now >= next_look_) {
    if (!watcher_.ok() && watcher_.Open()) {
      struct epoll_event ev = {};
      ev.events = EPOLLIN;
      ev.data.fd = watcher_.fd();
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watcher_.fd(), &ev);
      LOG(INFO) << "inotify is available again: device nodes are watched";
    }
    ArmWatches();
    ScanAll();
    next_look_ = now + kLookInterval;
  }
  const bool probing = options_.probe_interval > absl::ZeroDuration();
  if (probing && now >= next_probe_) {
    Probe();
    // On the same beat; a probe late by more than an interval (a stopped process) counts from
    // now rather than running the missed ones back to back.
    next_probe_ += options_.probe_interval;
    if (next_probe_ <= now) next_probe_ = now + options_.probe_interval;
  }
  absl::Time wake = probing ? next_probe_ : absl::InfiniteFuture();
  if (!watcher_.complete()) wake = std::min(wake, next_look_);
  return wake;
}

void HostWatcher::HandleEvents() {
  struct epoll_event events[8];
  const int n = epoll_wait(epoll_fd_, events, 8, 0);
  if (n < 0) {
    if (errno != EINTR) LOG(ERROR) << "epoll_wait failed: " << strerror(errno);
    return;
  }
  // First what the families' probe inputs reported: a probe due in this batch reads their
  // queues (and only theirs).
  for (int i = 0; i < n; ++i) {
    if ((events[i].data.u64 & kInputsTag) != 0) {
      families_[events[i].data.u64 & ~kInputsTag].inputs->EventsReady();
    }
  }
  for (int i = 0; i < n; ++i) {
    if ((events[i].data.u64 & kInputsTag) != 0) continue;
    const int fd = events[i].data.fd;
    if (fd == settle_fd_) {
      // Re-armed by a change handled earlier in this batch: not due yet.
      uint64_t expirations;
      if (read(settle_fd_, &expirations, sizeof(expirations)) != sizeof(expirations)) continue;
      absl::flat_hash_set<size_t> settling = std::move(settling_);
      settling_.clear();
      for (size_t f : settling) Rescan(f);
    } else if (fd == rescan_fd_) {
      uint64_t requests;
      (void)!read(rescan_fd_, &requests, sizeof(requests));
      absl::flat_hash_set<size_t> requested;
      {
        absl::MutexLock lock(&rescan_mu_);
        requested.swap(rescan_requested_);
      }
      for (size_t f : requested) Rescan(f);
    } else if (fd == watcher_.fd()) {
      HandleInotify();
      events_handled_.fetch_add(1);
    } else if (fd == uevents_.fd()) {
      HandleUevents();
      events_handled_.fetch_add(1);
    }
  }
}

void HostWatcher::HandleInotify() {
  bool rearm = false;
  absl::flat_hash_set<size_t> dirty;
  for (const DirectoryWatcher::Event& event : watcher_.Drain(&rearm)) {
    const Target& target = targets_[event.directory];
    if (absl::StartsWith(event.name, target.name_prefix)) dirty.insert(target.family);
  }
  if (rearm) {
    // A directory appeared or vanished, or events were lost: look at everything again.
    for (size_t f = 0; f < families_.size(); ++f) dirty.insert(f);
  }
  // Re-arm after every batch: some families watch directories that come and go with devices
  // (/dev/bus/usb/NNN). A handful of inotify_add_watch calls cost microseconds.
  ArmWatches();
  RescanChanged(dirty);
}

void HostWatcher::HandleUevents() {
  bool lost = false;
  absl::flat_hash_set<size_t> dirty;
  for (const Uevent& event : uevents_.Drain(&lost)) {
    for (size_t f = 0; f < families_.size(); ++f) {
      for (const std::string& subsystem : families_[f].discoverer->UeventSubsystems()) {
        if (event.subsystem != subsystem) continue;
        VLOG(1) << "uevent " << event.action << " " << event.devpath << " (" << event.subsystem
                << ")";
        dirty.insert(f);
      }
    }
  }
  if (lost) {
    LOG(WARNING) << "kernel uevents were lost (receive buffer overrun); looking at everything";
    for (size_t f = 0; f < families_.size(); ++f) dirty.insert(f);
  }
  if (dirty.empty()) return;
  ArmWatches();  // a new bus directory under /dev/bus/usb, for example
  RescanChanged(dirty);
}

void HostWatcher::RescanChanged(const absl::flat_hash_set<size_t>& dirty) {
  if (dirty.empty()) return;
  for (size_t f : dirty) {
    VLOG(1) << families_[f].set->resource_name() << ": host changed, rescanning";
    Rescan(f);
    settling_.insert(f);
  }
  struct itimerspec spec = {};
  spec.it_value = absl::ToTimespec(options_.settle);
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  timerfd_settime(settle_fd_, 0, &spec, nullptr);
}

}  // namespace edgeaccel
