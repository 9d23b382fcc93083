#include "edgeaccel/nvml/nvml_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

extern char** environ;

namespace edgeaccel {
namespace {

// What the Xids that most often mean a broken GPU say (NVIDIA's Xid catalogue).
std::string XidMeaning(int xid) {
  switch (xid) {
    case 48: return "double-bit ECC error";
    case 61: return "internal micro-controller breakpoint";
    case 62: return "internal micro-controller halt";
    case 63: return "ECC page retirement or row remapping recorded";
    case 64: return "ECC page retirement or row remapping failed";
    case 74: return "NVLink error";
    case 79: return "GPU has fallen off the bus";
    case 92: return "high single-bit ECC error rate";
    case 94: return "contained ECC error";
    case 95: return "uncontained ECC error";
    case 119: return "GSP RPC timeout";
    case 120: return "GSP error";
    case 999: return "unknown Xid";
  }
  return "";
}

std::string XidText(int xid) {
  const std::string meaning = XidMeaning(xid);
  return meaning.empty() ? absl::StrCat("Xid ", xid) : absl::StrCat("Xid ", xid, " (", meaning, ")");
}

std::string ExitText(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return "ended";
}

}  // namespace

NvmlSupervisor::NvmlSupervisor(const Host* host, NvmlOptions options)
    : host_(host),
      options_(std::move(options)),
      backoff_(options_.restart_initial, options_.restart_max, 0.2),
      own_loop_(options_.loop == nullptr ? std::make_unique<PollLoop>("ea-nvml") : nullptr),
      loop_(options_.loop != nullptr ? options_.loop : own_loop_.get()) {}

NvmlSupervisor::~NvmlSupervisor() { Stop(); }

void NvmlSupervisor::EnsureStarted() {
  absl::MutexLock lock(&start_mu_);
  if (in_loop_ || stopped_) return;
  if (wake_fd_.load() < 0) wake_fd_.store(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake_fd_.load() < 0) {
    LOG(ERROR) << "NVML: cannot set up its eventfd: " << strerror(errno)
               << "; discrete GPUs are served without NVML";
    return;
  }
  loop_->Add(this);
  in_loop_ = true;
}

void NvmlSupervisor::Wake() {
  const int fd = wake_fd_.load();
  if (fd < 0) return;
  uint64_t one = 1;
  (void)!write(fd, &one, sizeof(one));
}

void NvmlSupervisor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  {
    absl::MutexLock lock(&start_mu_);
    if (in_loop_) loop_->Remove(this);  // no step runs from here on
    in_loop_ = false;
    stopped_ = true;
    own_loop_.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    if (pid_ >= 0) KillHelper("");
  }
  if (const int fd = wake_fd_.exchange(-1); fd >= 0) close(fd);
}

pid_t NvmlSupervisor::helper_pid() const {
  absl::MutexLock lock(&mu_);
  return pid_;
}

PollLoop::Fds NvmlSupervisor::WaitFds() { return {wake_fd_.load(), watched_fd_.load(), -1, -1}; }

absl::Time NvmlSupervisor::Step(const PollLoop::Events& ready) {
  absl::Time next;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (ready[0] & POLLIN) {
      uint64_t count;
      (void)!read(wake_fd_.load(), &count, sizeof(count));
    }
    if (ready[1] != 0) HandleOutput();  // output, or its end (POLLHUP)
    if (stopping_) return absl::InfiniteFuture();  // Stop() kills the helper
    const absl::Time now = absl::Now();
    if (pid_ < 0 && wanted_ && now >= next_start_) StartHelper();
    if (pid_ >= 0 && state_ == State::kStarting && now - started_at_ >= options_.timeout) {
      KillHelper(absl::StrCat("it did not list the GPUs within ",
                              absl::FormatDuration(options_.timeout), " (a hung NVML call)"));
    }
    if (pid_ >= 0 && sample_pending_ && now - sample_sent_at_ >= options_.timeout) {
      KillHelper(absl::StrCat("it did not answer a sample within ",
                              absl::FormatDuration(options_.timeout), " (a hung NVML call)"));
    }
    if (state_ == State::kReady && now >= next_check_) {
      next_check_ = options_.check_interval > absl::ZeroDuration()
                        ? now + options_.check_interval
                        : absl::InfiniteFuture();
      if (!sample_pending_) RequestSample();
    }
    // A GPU whose critical Xid is old enough may be Healthy again: the rescan decides.
    if (options_.xid_recovery > absl::ZeroDuration()) {
      for (auto& [uuid, health] : health_) {
        if (health.critical_xid != 0 && now >= health.critical_at + options_.xid_recovery) {
          health.critical_xid = 0;
          LOG(INFO) << "NVML: " << uuid << ": no critical Xid for "
                    << absl::FormatDuration(options_.xid_recovery)
                    << "; Healthy again if NVML answers for it";
          Changed();
        }
      }
    }
    next = NextWake();
    changed = changed_;
    changed_ = false;
  }
  if (changed && options_.on_change) options_.on_change();
  return next;
}

void NvmlSupervisor::Changed() { changed_ = true; }

absl::Time NvmlSupervisor::NextWake() const {
  absl::Time next = absl::InfiniteFuture();
  if (pid_ < 0 && wanted_ && !stopping_) next = std::min(next, next_start_);
  if (pid_ >= 0 && state_ == State::kStarting) next = std::min(next, started_at_ + options_.timeout);
  if (pid_ >= 0 && sample_pending_) next = std::min(next, sample_sent_at_ + options_.timeout);
  if (state_ == State::kReady) next = std::min(next, next_check_);
  if (options_.xid_recovery > absl::ZeroDuration()) {
    for (const auto& [uuid, health] : health_) {
      if (health.critical_xid != 0) next = std::min(next, health.critical_at + options_.xid_recovery);
    }
  }
  // At least a millisecond ahead: what is due now was done by this step.
  if (next != absl::InfiniteFuture()) next = std::max(next, absl::Now() + absl::Milliseconds(1));
  return next;
}

void NvmlSupervisor::Unavailable(const std::string& why) {
  state_ = State::kUnavailable;
  reason_ = why;
  const absl::Duration wait = backoff_.Next();
  next_start_ = absl::Now() + wait;
  if (logged_reason_ == why) return;  // said once, until something else happens
  logged_reason_ = why;
  LOG(WARNING) << "NVML is not available: " << why
               << "; discrete GPUs are served without NVML's facts (memory, compute "
                  "capability, MIG), Xid health and telemetry; looking again in "
               << absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(wait)));
}

void NvmlSupervisor::StartHelper() {
  ++start_attempts_;
  const absl::Time now = absl::Now();
  absl::StatusOr<NvmlLibrary> library = FindNvmlLibrary(*host_);
  if (!library.ok()) {
    Unavailable(std::string(library.status().message()));
    return;
  }
  library_ = *library;
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) {
    Unavailable(absl::StrCat("pipe: ", strerror(errno)));
    return;
  }
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    Unavailable(absl::StrCat("pipe: ", strerror(errno)));
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  std::string library_arg = absl::StrCat("--library=", library_.open_path);
  char* argv[] = {const_cast<char*>(options_.helper_path.c_str()), library_arg.data(), nullptr};
  // The daemon blocks its stop signals in every thread and ignores SIGHUP; the helper gets the
  // defaults back, so a signal sent to it does what a signal does.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGHUP);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, options_.helper_path.c_str(), &actions, &attributes, argv, environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (spawned != 0) {
    close(to_child[1]);
    close(from_child[0]);
    Unavailable(absl::StrCat("cannot start the helper ", options_.helper_path, ": ",
                             strerror(spawned)));
    return;
  }
  pid_ = pid;
  to_helper_ = to_child[1];
  from_helper_ = from_child[0];
  fcntl(to_helper_, F_SETFL, O_NONBLOCK);  // a request never waits for a hung helper
  fcntl(from_helper_, F_SETFL, O_NONBLOCK);
  watched_fd_.store(from_helper_);
  state_ = State::kStarting;
  reason_.clear();
  started_at_ = now;
  listing_.clear();
  partial_line_.clear();
  VLOG(1) << "NVML: started " << options_.helper_path << " (pid " << pid_ << ") with "
          << library_.open_path;
}

void NvmlSupervisor::HandleOutput() {
  char buffer[16384];
  while (from_helper_ >= 0) {
    const ssize_t n = read(from_helper_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      HelperEnded("");
      return;
    }
    partial_line_.append(buffer, static_cast<size_t>(n));
    size_t start = 0, newline;
    while ((newline = partial_line_.find('\n', start)) != std::string::npos) {
      const absl::string_view line(partial_line_.data() + start, newline - start);
      start = newline + 1;
      std::optional<NvmlRecord> record = DecodeNvmlRecord(std::string_view(line.data(), line.size()));
      if (!record.has_value()) {
        LOG(WARNING) << "NVML: the helper said something that is no record ("
                     << line.substr(0, 120) << "); ignored";
        continue;
      }
      HandleRecord(*record);
      if (from_helper_ < 0) return;  // the record ended it
    }
    partial_line_.erase(0, start);
    if (partial_line_.size() > (1 << 20)) {
      KillHelper("it wrote a line longer than 1 MiB");
      return;
    }
  }
}

void NvmlSupervisor::HandleRecord(const NvmlRecord& record) {
  const absl::Time now = absl::Now();
  if (record.kind == "unavailable") {
    reason_ = record.Get("reason");
  } else if (record.kind == "hello") {
    driver_ = record.Get("driver");
    cuda_ = record.Get("cuda");
  } else if (record.kind == "gpu") {
    Gpu gpu;
    for (const auto& [key, value] : record.fields) {
      if (key == "events") {
        gpu.events = value;
      } else if (key != "uuid" && key != "index" && !value.empty()) {
        gpu.facts[key] = value;
      }
    }
    listing_[record.Get("uuid")] = std::move(gpu);
  } else if (record.kind == "ready") {
    gpus_ = std::move(listing_);
    listing_.clear();
    state_ = State::kReady;
    reason_.clear();
    logged_reason_.clear();
    event_wait_failed_.clear();
    backoff_.Reset();
    std::vector<std::string> events;
    for (const auto& [uuid, gpu] : gpus_) events.push_back(absl::StrCat(uuid, ": ", gpu.events));
    LOG(INFO) << "NVML: " << library_.host_path << " (found by " << library_.found_by
              << "), driver " << (driver_.empty() ? "unknown" : driver_) << ", CUDA "
              << (cuda_.empty() ? "unknown" : cuda_) << ": " << gpus_.size()
              << " GPU(s); Xid events: " << (events.empty() ? "none" : absl::StrJoin(events, "; "));
    // Whether each GPU answers now, before anyone scrapes.
    RequestSample();
    next_check_ = options_.check_interval > absl::ZeroDuration() ? now + options_.check_interval
                                                                 : absl::InfiniteFuture();
    Changed();
  } else if (record.kind == "xid") {
    const std::string uuid = record.Get("uuid");
    int xid = 0;
    if (!absl::SimpleAtoi(record.Get("xid"), &xid)) return;
    if (record.Get("type") != "xid") {
      VLOG(1) << "NVML: " << uuid << ": " << record.Get("type") << " ECC event";
      return;
    }
    ++xid_counts_[{uuid, xid}];
    if (options_.ignored_xids.count(xid) > 0) {
      LOG(INFO) << "NVML: " << uuid << ": " << XidText(xid)
                << ", an application error, not counted against the GPU (--nvml_ignored_xids)";
      return;
    }
    GpuHealth& health = health_[uuid];
    health.critical_xid = xid;
    health.critical_at = now;
    LOG(WARNING) << "NVML: " << uuid << ": critical " << XidText(xid) << "; the GPU is Unhealthy"
                 << (options_.xid_recovery > absl::ZeroDuration()
                         ? absl::StrCat(" until none comes for ",
                                        absl::FormatDuration(options_.xid_recovery))
                         : std::string(" until the daemon restarts (--nvml_xid_recovery=0)"));
    Changed();
  } else if (record.kind == "event_wait_failed") {
    event_wait_failed_ = record.Get("reason");
    LOG(ERROR) << "NVML: waiting for Xid events failed: " << event_wait_failed_
               << "; every GPU is Unhealthy until a fresh helper sees them again";
    Changed();
  } else if (record.kind == "sample") {
    NvmlTelemetry& telemetry = sampling_[record.Get("uuid")];
    telemetry.uuid = record.Get("uuid");
    for (const auto& [key, value] : record.fields) {
      double number;
      if (key == "lost") {
        telemetry.lost = value;
      } else if (key != "uuid" && absl::SimpleAtod(value, &number)) {
        telemetry.values[key] = number;
      }
    }
  } else if (record.kind == "sampled") {
    telemetry_ = std::move(sampling_);
    sampling_.clear();
    sampled_at_ = now;
    sample_pending_ = false;
    for (const auto& [uuid, telemetry] : telemetry_) {
      GpuHealth& health = health_[uuid];
      if (health.lost != telemetry.lost) {
        if (telemetry.lost.empty()) {
          LOG(INFO) << "NVML: " << uuid << " answers again";
        } else {
          LOG(WARNING) << "NVML: " << uuid << " no longer answers: " << telemetry.lost;
        }
        health.lost = telemetry.lost;
        Changed();
      }
    }
  }
}

bool NvmlSupervisor::RequestSample() {
  if (to_helper_ < 0 || state_ != State::kReady) return false;
  static constexpr char kSample[] = "sample\n";
  if (write(to_helper_, kSample, sizeof(kSample) - 1) != sizeof(kSample) - 1) return false;
  sample_pending_ = true;
  sample_sent_at_ = absl::Now();
  sampling_.clear();
  Wake();  // the loop's next step sets the timeout
  return true;
}

void NvmlSupervisor::KillHelper(const std::string& why) {
  if (pid_ < 0) return;
  if (!why.empty()) {
    ++hangs_;
    LOG(ERROR) << "NVML: killing the helper (pid " << pid_ << "): " << why;
  }
  kill(pid_, SIGKILL);
  HelperEnded(why);
}

void NvmlSupervisor::HelperEnded(const std::string& why) {
  watched_fd_.store(-1);
  close(from_helper_);
  close(to_helper_);
  from_helper_ = to_helper_ = -1;
  // Its stdout closed: it is exiting, or was killed. Never left a zombie.
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  const pid_t pid = pid_;
  pid_ = -1;
  if (sample_pending_) {
    sample_pending_ = false;
    sampling_.clear();
  }
  if (stopping_) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    Unavailable(reason_);  // what its `unavailable` record said
    return;
  }
  const absl::Duration wait = backoff_.Next();
  next_start_ = absl::Now() + wait;
  ++restarts_;
  state_ = State::kRestarting;
  // Why it ended: what we killed it for, what it said last (a failed event wait), or its exit.
  if (!why.empty()) {
    reason_ = why;
  } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 4)) {
    reason_ = absl::StrCat("the helper ", ExitText(status));
  } else {
    reason_ = absl::StrCat("NVML's wait for Xid events failed: ", event_wait_failed_);
  }
  LOG(WARNING) << "NVML: the helper (pid " << pid << ") " << ExitText(status) << "; starting it "
               << "again in " << absl::FormatDuration(absl::Milliseconds(absl::ToInt64Milliseconds(wait)))
               << " (GPUs keep their last known health)";
}

void NvmlSupervisor::Amend(std::vector<Device>* devices) {
  bool start = false;
  std::vector<Device> kept;
  {
    absl::MutexLock lock(&mu_);
    if (!devices->empty() && !wanted_ && !stopping_) {
      wanted_ = true;
      start = true;
    }
    const absl::Time now = absl::Now();
    std::vector<std::string> left_out;
    for (Device& device : *devices) {
      auto gpu = gpus_.find(device.id);
      std::vector<std::string> problems;
      if (gpu != gpus_.end()) {
        for (const auto& [key, value] : gpu->second.facts) {
          if (key == "name" || key == "minor") continue;  // /proc's are the ones we serve by
          device.facts[key] = value;
        }
        if (!cuda_.empty()) device.facts["cuda_version"] = cuda_;
        device.facts["xid_events"] = gpu->second.events;
        if (gpu->second.events.rfind("failed", 0) == 0) {
          // As NVIDIA's device plugin: a GPU whose Xid errors cannot be seen is not trusted.
          problems.push_back(absl::StrCat("NVML cannot watch it for Xid errors (",
                                          gpu->second.events, ")"));
          device.problems.push_back({ProblemKind::kNvmlUnresponsive, "xid-watch-failed"});
        }
        if (!event_wait_failed_.empty()) {
          problems.push_back(absl::StrCat("NVML's wait for Xid errors failed (", event_wait_failed_,
                                          ")"));
          device.problems.push_back({ProblemKind::kNvmlUnresponsive, "xid-wait-failed"});
        }
      }
      auto health = health_.find(device.id);
      if (health != health_.end()) {
        if (!health->second.lost.empty()) {
          problems.push_back(
              absl::StrCat("NVML no longer answers for this GPU: ", health->second.lost));
          device.problems.push_back({ProblemKind::kNvmlUnresponsive, "no-answer"});
        }
        if (health->second.critical_xid != 0) {
          device.problems.push_back(
              {ProblemKind::kNvmlXid, absl::StrCat(health->second.critical_xid)});
          problems.push_back(absl::StrCat(
              "critical ", XidText(health->second.critical_xid), " at ",
              absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", health->second.critical_at, absl::UTCTimeZone()),
              options_.xid_recovery > absl::ZeroDuration()
                  ? absl::StrCat("; Healthy again ",
                                 absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(
                                     health->second.critical_at + options_.xid_recovery - now))),
                                 " after the last one")
                  : std::string()));
        }
      }
      if (!problems.empty()) {
        std::string reason = absl::StrJoin(problems, "; ");
        if (device.health == Health::kUnhealthy && !device.unhealthy_reason.empty()) {
          reason = absl::StrCat(device.unhealthy_reason, "; ", reason);
        }
        device.health = Health::kUnhealthy;
        device.unhealthy_reason = std::move(reason);
      }
      if (gpu != gpus_.end() && gpu->second.facts.count("mig_mode") > 0 &&
          gpu->second.facts.at("mig_mode") == "enabled") {
        left_out.push_back(absl::StrCat(
            device.id, ": MIG mode is enabled, so the GPU as a whole is not allocatable; its MIG "
                       "devices are not served yet: left out of nvidia.com/gpu"));
        continue;
      }
      kept.push_back(std::move(device));
    }
    if (left_out != left_out_) {
      for (const std::string& line : left_out) LOG(WARNING) << line;
      left_out_ = std::move(left_out);
    }
  }
  *devices = std::move(kept);
  if (start) {
    EnsureStarted();
    Wake();
  }
}

std::vector<std::string> NvmlSupervisor::Remarks() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  if (!wanted_) return out;
  switch (state_) {
    case State::kNotStarted:
    case State::kStarting:
      out.push_back("NVML: starting the helper");
      break;
    case State::kReady:
      out.push_back(absl::StrCat("NVML: ", library_.host_path, " (found by ", library_.found_by,
                                 "), driver ", driver_.empty() ? "unknown" : driver_, ", CUDA ",
                                 cuda_.empty() ? "unknown" : cuda_));
      break;
    case State::kUnavailable:
      out.push_back(absl::StrCat("NVML: not available: ", reason_));
      break;
    case State::kRestarting:
      out.push_back(absl::StrCat("NVML: restarting the helper: ", reason_));
      break;
  }
  out.insert(out.end(), left_out_.begin(), left_out_.end());
  return out;
}

bool NvmlSupervisor::WaitSettled(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  // Ready, unavailable, or the helper ended before it listed the GPUs (a crash or a hang).
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == State::kReady || state_ == State::kUnavailable ||
           state_ == State::kRestarting;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
}

std::vector<NvmlTelemetry> NvmlSupervisor::Telemetry(absl::Duration wait) {
  std::vector<NvmlTelemetry> out;
  absl::MutexLock lock(&mu_);
  if (state_ == State::kReady && absl::Now() - sampled_at_ >= absl::Seconds(1)) {
    if (sample_pending_ || RequestSample()) {
      auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !sample_pending_; };
      mu_.AwaitWithTimeout(absl::Condition(&answered), wait);
    }
  }
  for (const auto& [uuid, telemetry] : telemetry_) out.push_back(telemetry);
  return out;
}

bool NvmlSupervisor::started() const {
  absl::MutexLock lock(&mu_);
  return wanted_;
}

std::vector<std::map<std::string, std::string>> NvmlSupervisor::AllGpuFacts() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::map<std::string, std::string>> out;
  for (const auto& [uuid, gpu] : gpus_) {
    out.push_back(gpu.facts);
    out.back()["uuid"] = uuid;
  }
  return out;
}

NvmlStatus NvmlSupervisor::Status() const {
  absl::MutexLock lock(&mu_);
  NvmlStatus status;
  switch (state_) {
    case State::kNotStarted: status.state = "not started"; break;
    case State::kStarting: status.state = "starting"; break;
    case State::kReady: status.state = "ready"; break;
    case State::kUnavailable: status.state = "unavailable"; break;
    case State::kRestarting: status.state = "restarting"; break;
  }
  status.reason = reason_;
  status.library = library_.host_path;
  status.found_by = library_.found_by;
  status.driver = driver_;
  status.cuda = cuda_;
  status.start_attempts = start_attempts_;
  status.restarts = restarts_;
  status.hangs = hangs_;
  for (const auto& [uuid, gpu] : gpus_) {
    auto health = health_.find(uuid);
    status.critical_xid[uuid] = health == health_.end() ? 0 : health->second.critical_xid;
  }
  for (const auto& [key, count] : xid_counts_) {
    status.xids.push_back({key.first, key.second, options_.ignored_xids.count(key.second) == 0,
                           count});
  }
  return status;
}

}  // namespace edgeaccel
