// NvmlSupervisor: runs edgeaccel-nvml-helper, the process that talks to NVML, and keeps what it
// says: facts per GPU (memory, compute capability, MIG and ECC mode, CUDA version), health
// (critical Xid errors, GPUs NVML no longer answers for) and telemetry (read when /metrics is
// scraped, at most once a second).
//
// The helper is started only once a scan finds discrete NVIDIA GPUs. It is killed when it does
// not answer in time (a hung NVML call) and restarted with backoff whenever it ends; nothing
// here ever blocks a scan, Allocate or ListAndWatch: the discoverer's Amend answers from what is
// known, and /metrics waits a bounded time for a fresh sample. Where NVML cannot be used (no
// library, nvmlInit fails) the GPUs are still served, without NVML's facts, Xid health and
// telemetry, and the log says once why.
//
// Its work runs on a PollLoop (host/poll_loop.h): the daemon's shared one, or one of its own
// ("ea-nvml"), joined when the helper is first wanted. It waits on the helper's stdout and an
// eventfd, until the next deadline, health check, Xid recovery or restart.
#ifndef EDGEACCEL_NVML_NVML_SUPERVISOR_H_
#define EDGEACCEL_NVML_NVML_SUPERVISOR_H_

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/poll_loop.h"
#include "edgeaccel/nvml/nvml_library.h"
#include "edgeaccel/nvml/nvml_protocol.h"

namespace edgeaccel {

// The Xids NVIDIA's device plugin does not count as the GPU's fault: application errors
// (13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive
// cleanup, 68 video processor exception, 109 context switch timeout). internal/rm/health.go.
inline const std::set<int>& DefaultIgnoredXids() {
  static const std::set<int> kIgnored = {13, 31, 43, 45, 68, 109};
  return kIgnored;
}

struct NvmlOptions {
  // The helper executable.
  std::string helper_path;
  // How long the helper may take to list the GPUs, or to answer one sample, before it is
  // killed and started again.
  absl::Duration timeout = absl::Seconds(10);
  // How often every GPU is asked whether it still answers (a sample); zero: only on scrapes.
  absl::Duration check_interval = absl::Seconds(30);
  // A GPU that had a critical Xid is Healthy again once it answers and no critical Xid came for
  // this long. Zero: never (NVIDIA's device plugin: until the plugin restarts).
  absl::Duration xid_recovery = absl::Minutes(10);
  std::set<int> ignored_xids = DefaultIgnoredXids();
  absl::Duration restart_initial = absl::Seconds(1);
  absl::Duration restart_max = absl::Minutes(5);
  // The health or facts of a GPU changed: rescan (called on the loop's thread).
  std::function<void()> on_change;
  // Where the supervisor's work runs (it must outlive the supervisor); null: a loop of its own.
  PollLoop* loop = nullptr;
};

// One GPU's readings, with dcgm-exporter's meanings and units.
struct NvmlTelemetry {
  std::string uuid;
  std::map<std::string, double> values;  // temperature_c, power_w, sm_util_percent, ...
  std::string lost;                      // why NVML did not answer; empty when it did
};

struct NvmlXidCount {
  std::string uuid;
  int xid = 0;
  bool critical = false;
  uint64_t count = 0;
};

struct NvmlStatus {
  std::string state;    // "not started", "starting", "ready", "unavailable", "restarting"
  std::string reason;   // why it is unavailable or restarting
  std::string library;  // the host path of the library the helper uses (or last used)
  std::string found_by;
  std::string driver;
  std::string cuda;
  uint64_t start_attempts = 0;  // looks for the library and starts of the helper
  uint64_t restarts = 0;
  uint64_t hangs = 0;  // helpers killed for not answering in time
  std::vector<NvmlXidCount> xids;
  // Each listed GPU's critical Xid while it still counts against the GPU (0: none).
  std::map<std::string, int> critical_xid;
};

class NvmlSupervisor : public GpuFactSource, private PollLoop::Member {
 public:
  NvmlSupervisor(const Host* host, NvmlOptions options);
  ~NvmlSupervisor() override;  // Stop()
  NvmlSupervisor(const NvmlSupervisor&) = delete;
  NvmlSupervisor& operator=(const NvmlSupervisor&) = delete;

  void Amend(std::vector<Device>* devices) override;
  std::vector<std::string> Remarks() const override;

  // Each GPU's readings, at most a second old when the helper answers within `wait`; else the
  // last ones known (empty before the first).
  std::vector<NvmlTelemetry> Telemetry(absl::Duration wait);

  NvmlStatus Status() const;

  // True once a scan found discrete GPUs (the helper is wanted, whatever its state).
  bool started() const;

  // The facts of every GPU NVML listed, those left out of nvidia.com/gpu (MIG mode) too, for
  // the node labels.
  std::vector<std::map<std::string, std::string>> AllGpuFacts() const;

  // Waits until the helper listed the GPUs or NVML turned out unavailable (true), or `timeout`
  // passed (false). For --discover.
  bool WaitSettled(absl::Duration timeout) const;

  // Leaves the loop (a loop of its own ends) and kills the helper; nothing is restarted.
  void Stop();

  // The helper's process id while one runs, else -1 (tests kill it).
  pid_t helper_pid() const;

 private:
  enum class State { kNotStarted, kStarting, kReady, kUnavailable, kRestarting };
  struct Gpu {
    std::map<std::string, std::string> facts;
    std::string events;  // registered | unsupported: ... | failed: ...
  };
  struct GpuHealth {
    int critical_xid = 0;  // the last critical one; 0: none
    absl::Time critical_at = absl::InfinitePast();
    std::string lost;
  };

  // Joins the loop, once.
  void EnsureStarted();
  // PollLoop::Member: the eventfd and the helper's stdout; a step reads what arrived, acts on
  // what is due and returns when it must act next.
  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;
  // Locked helpers, on the loop's thread.
  void StartHelper() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NVML cannot be used (`why`): looked at again after the backoff; logged once per reason.
  void Unavailable(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleOutput() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleRecord(const NvmlRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `why` it ended, when we killed it; empty: it ended by itself (its exit status says why).
  void HelperEnded(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KillHelper(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RequestSample() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next time the loop must step it.
  absl::Time NextWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  const Host* host_;
  const NvmlOptions options_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNotStarted;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::string logged_reason_ ABSL_GUARDED_BY(mu_);  // "says once why"
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // on_change is due, once the lock is released
  absl::Time next_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Backoff backoff_ ABSL_GUARDED_BY(mu_);
  NvmlLibrary library_ ABSL_GUARDED_BY(mu_);
  std::string driver_ ABSL_GUARDED_BY(mu_);
  std::string cuda_ ABSL_GUARDED_BY(mu_);
  pid_t pid_ ABSL_GUARDED_BY(mu_) = -1;
  int to_helper_ ABSL_GUARDED_BY(mu_) = -1;
  int from_helper_ ABSL_GUARDED_BY(mu_) = -1;
  std::string partial_line_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Gpu> listing_ ABSL_GUARDED_BY(mu_);  // while the helper lists them
  std::map<std::string, Gpu> gpus_ ABSL_GUARDED_BY(mu_);     // by uuid, from the last listing
  std::map<std::string, GpuHealth> health_ ABSL_GUARDED_BY(mu_);
  std::string event_wait_failed_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, uint64_t> xid_counts_ ABSL_GUARDED_BY(mu_);
  bool sample_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time sample_sent_at_ ABSL_GUARDED_BY(mu_);
  absl::Time sampled_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<std::string, NvmlTelemetry> telemetry_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NvmlTelemetry> sampling_ ABSL_GUARDED_BY(mu_);
  uint64_t start_attempts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t restarts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hangs_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> left_out_ ABSL_GUARDED_BY(mu_);  // remarks of the last Amend

  absl::Mutex start_mu_;  // joining and leaving the loop
  // Where NvmlOptions::loop is null; ended (its thread joined) by Stop().
  std::unique_ptr<PollLoop> own_loop_ ABSL_GUARDED_BY(start_mu_);
  PollLoop* const loop_;
  bool in_loop_ ABSL_GUARDED_BY(start_mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(start_mu_) = false;
  std::atomic<int> wake_fd_{-1};  // made when it joins the loop
  // from_helper_ as the loop's wait reads it (without mu_, which a step holds).
  std::atomic<int> watched_fd_{-1};
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_NVML_NVML_SUPERVISOR_H_
