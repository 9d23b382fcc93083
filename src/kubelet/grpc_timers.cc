#include "edgeaccel/kubelet/grpc_timers.h"

#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <grpcpp/version_info.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/base/options.h"
#include "absl/status/status.h"

// gRPC 1.51's internal timer interface, as src/core/lib/iomgr/timer.h and closure.h declare it.
// EDGEACCEL_GRPC_TIMERS is 1 only where CMake's configure-time probe (cmake/grpc_internals.cmake)
// built this file against the installed gRPC and ran it: the symbols below link, and timers
// made, fired and cancelled through gRPC's public API behave as they must with the layouts
// below. EDGEACCEL_ABSL_MANGLED_NAMESPACE is absl's inline namespace as the Itanium ABI spells
// it in a symbol name ("7debian3" on Debian 12, "7debian7" on Debian 13): it is part of
// ExecCtx::Run's name.
#ifndef EDGEACCEL_GRPC_TIMERS
#define EDGEACCEL_GRPC_TIMERS 0
#endif
#define EDGEACCEL_GRPC_TIMERS_KNOWN EDGEACCEL_GRPC_TIMERS
#define EDGEACCEL_STRINGIZE(x) EDGEACCEL_STRINGIZE_EXPANDED(x)
#define EDGEACCEL_STRINGIZE_EXPANDED(x) #x
#define EDGEACCEL_MANGLED_NAMESPACE EDGEACCEL_STRINGIZE(EDGEACCEL_ABSL_MANGLED_NAMESPACE)

#if EDGEACCEL_GRPC_TIMERS_KNOWN
// The types by the layout gRPC gives them (named, not anonymous: the functions below that take
// them are gRPC's, with external linkage).
namespace edgeaccel::grpc_abi {

// grpc_core::Timestamp: milliseconds after gRPC's process epoch (a point on CLOCK_MONOTONIC), one
// int64_t, trivially copyable, so passed and returned in a register like this struct.
struct GrpcTimestamp {
  int64_t millis;
};
constexpr int64_t kInfFuture = std::numeric_limits<int64_t>::max();

// grpc_closure up to the fields used here (the rest, debug fields included, follow them).
struct GrpcClosure {
  void* next_data;
  void (*cb)(void* arg, absl::Status error);
  void* cb_arg;
};

// grpc_timer up to `closure`: the implementation owns the struct while the timer is pending, and
// gRPC itself never reads a field of it, so these are our own storage inside gRPC's struct (which
// in 1.51 is larger: an EventEngine task handle follows). What gRPC does read, the vtable's order
// and signatures, the Timestamp's ABI and ExecCtx::Run's, is what the configure-time probe tries.
struct GrpcTimer {
  int64_t deadline;
  uint32_t heap_index;
  bool pending;
  GrpcTimer* next;
  GrpcTimer* prev;
  GrpcClosure* closure;
};

enum GrpcTimerCheckResult { kTimersNotChecked, kTimersCheckedAndEmpty, kTimersFired };

}  // namespace edgeaccel::grpc_abi

// grpc_timer_vtable. Its name is what grpc_set_timer_impl's mangled name carries.
struct grpc_timer_vtable {
  void (*init)(edgeaccel::grpc_abi::GrpcTimer* timer, edgeaccel::grpc_abi::GrpcTimestamp deadline,
               edgeaccel::grpc_abi::GrpcClosure* closure);
  void (*cancel)(edgeaccel::grpc_abi::GrpcTimer* timer);
  edgeaccel::grpc_abi::GrpcTimerCheckResult (*check)(edgeaccel::grpc_abi::GrpcTimestamp* next);
  void (*list_init)();
  void (*list_shutdown)();
  void (*consume_kick)();
};

// grpc_core::DebugLocation: empty in a release build, {file, line} in a debug one; ExecCtx::Run
// reads it only in a debug build.
struct GrpcDebugLocation {
  const char* file;
  int line;
};

// The functions, by their (Itanium-mangled) symbol names in libgrpc.
void grpc_set_default_iomgr_platform();
void grpc_set_timer_impl(grpc_timer_vtable* vtable);
void grpc_timer_manager_set_threading(bool enabled);
void grpc_timer_manager_tick();
void GrpcExecutorSetThreadingAll(bool enable) __asm__("_ZN9grpc_core8Executor15SetThreadingAllEb");
void GrpcExecutorSetThreadingDefault(bool enable)
    __asm__("_ZN9grpc_core8Executor19SetThreadingDefaultEb");
void GrpcExecCtxRun(const GrpcDebugLocation& location, edgeaccel::grpc_abi::GrpcClosure* closure,
                    absl::Status error)
    __asm__("_ZN9grpc_core7ExecCtx3RunERKNS_13DebugLocationEP12grpc_closureN4absl" EDGEACCEL_MANGLED_NAMESPACE "6StatusE");
edgeaccel::grpc_abi::GrpcTimestamp GrpcTimestampFromTimespecRoundDown(gpr_timespec time)
    __asm__("_ZN9grpc_core9Timestamp21FromTimespecRoundDownE12gpr_timespec");

#endif  // EDGEACCEL_GRPC_TIMERS_KNOWN

namespace edgeaccel {
namespace {

using grpc_event_engine::experimental::EventEngine;

#if EDGEACCEL_GRPC_TIMERS_KNOWN
using grpc_abi::GrpcClosure;
using grpc_abi::GrpcTimer;
using grpc_abi::GrpcTimerCheckResult;
using grpc_abi::GrpcTimestamp;
using grpc_abi::kInfFuture;
using grpc_abi::kTimersCheckedAndEmpty;
using grpc_abi::kTimersFired;

// Runs `closure` with `error` on the calling thread's ExecCtx (after the caller's locks are
// released, when that ExecCtx flushes), as gRPC's own timers do: callers of init and cancel may
// hold locks the closure takes.
void Schedule(GrpcClosure* closure, absl::Status error) {
  static const GrpcDebugLocation kHere{__FILE__, __LINE__};
  GrpcExecCtxRun(kHere, closure, std::move(error));
}

int64_t NowMillis() { return GrpcTimestampFromTimespecRoundDown(gpr_now(GPR_CLOCK_MONOTONIC)).millis; }

// The pending timers by deadline, and the one tick asked of the engine for the earliest.
class Timers {
 public:
  void set_engine(EventEngine* engine) { engine_ = engine; }

  void Init(GrpcTimer* timer, GrpcTimestamp deadline, GrpcClosure* closure) {
    timer->closure = closure;
    timer->deadline = deadline.millis;
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) {
      timer->pending = false;
      Schedule(closure, absl::UnavailableError("Attempt to create timer before initialization"));
      return;
    }
    if (deadline.millis <= NowMillis()) {
      timer->pending = false;
      Schedule(closure, absl::OkStatus());
      return;
    }
    timer->pending = true;
    pending_.emplace(deadline.millis, timer);
    TickByLocked(deadline.millis);
  }

  void Cancel(GrpcTimer* timer) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!timer->pending) return;  // fired or cancelled already: its closure has run or will
    timer->pending = false;
    pending_.erase({timer->deadline, timer});
    Schedule(timer->closure, absl::CancelledError());
    // The tick asked for it stays: it finds nothing due and asks for the next one.
  }

  GrpcTimerCheckResult Check(GrpcTimestamp* next) {
    const int64_t now = NowMillis();
    std::lock_guard<std::mutex> lock(mu_);
    bool fired = false;
    while (!pending_.empty() && pending_.begin()->first <= now) {
      GrpcTimer* timer = pending_.begin()->second;
      pending_.erase(pending_.begin());
      timer->pending = false;
      Schedule(timer->closure, absl::OkStatus());
      fired = true;
    }
    if (!pending_.empty()) {
      if (next != nullptr) next->millis = std::min(next->millis, pending_.begin()->first);
      TickByLocked(pending_.begin()->first);
    }
    return fired ? kTimersFired : kTimersCheckedAndEmpty;
  }

  void Start() {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
  }

  // gRPC's shutdown: every pending timer's closure runs, with an error, as gRPC's own list does.
  void Shutdown() {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    for (const auto& [deadline, timer] : pending_) {
      timer->pending = false;
      Schedule(timer->closure, absl::UnavailableError("Timer list shutdown"));
    }
    pending_.clear();
  }

  int pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(pending_.size());
  }

 private:
  // Makes sure a tick runs on the engine by `deadline`: one is asked for only when none is due
  // by then. A tick that finds nothing due (its timer was cancelled) asks for the next one.
  void TickByLocked(int64_t deadline) {
    if (deadline >= tick_at_) return;
    // The later tick is not needed now (if it is already running, it finds nothing due).
    if (tick_at_ != kInfFuture) engine_->Cancel(tick_);
    tick_at_ = deadline;
    const uint64_t generation = ++tick_generation_;
    tick_ = engine_->RunAfter(std::chrono::milliseconds(std::max<int64_t>(0, deadline - NowMillis())),
                              [this, generation] { Tick(generation); });
  }

  void Tick(uint64_t generation) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Only the latest tick asked for stands for tick_at_; an older one whose Cancel came too
      // late still checks, harmlessly.
      if (generation == tick_generation_) tick_at_ = kInfFuture;
    }
    // An ExecCtx of gRPC's, Check (through grpc_timer_check), and the closures it scheduled run
    // here when that ExecCtx ends.
    grpc_timer_manager_tick();
  }

  std::mutex mu_;
  EventEngine* engine_ = nullptr;
  bool running_ = false;
  std::set<std::pair<int64_t, GrpcTimer*>> pending_;
  int64_t tick_at_ = kInfFuture;  // when the tick asked of the engine runs; none when kInfFuture
  EventEngine::TaskHandle tick_;
  uint64_t tick_generation_ = 0;
};

Timers& TheTimers() {
  static Timers* const timers = new Timers();  // used by gRPC until the process ends
  return *timers;
}

grpc_timer_vtable kEngineTimers = {
    [](GrpcTimer* timer, GrpcTimestamp deadline, GrpcClosure* closure) {
      TheTimers().Init(timer, deadline, closure);
    },
    [](GrpcTimer* timer) { TheTimers().Cancel(timer); },
    [](GrpcTimestamp* next) { return TheTimers().Check(next); },
    [] { TheTimers().Start(); },
    [] { TheTimers().Shutdown(); },
    [] {},  // nothing to consume: no timer thread of gRPC's is kicked
};

bool installed = false;

#endif  // EDGEACCEL_GRPC_TIMERS_KNOWN

}  // namespace

std::string RunGrpcTimersOn(EventEngine* engine) {
#if EDGEACCEL_GRPC_TIMERS_KNOWN
  if (engine == nullptr) {
    return "gRPC " GRPC_CPP_VERSION_STRING ": no event engine of ours: gRPC's own timer threads kept";
  }
  if (installed) return "gRPC's timers already run on the event engine";
  installed = true;
  TheTimers().set_engine(engine);
  // The default platform first: grpc_init sets it (and with it gRPC's own timers) only when no
  // platform was set, so ours is not replaced.
  grpc_set_default_iomgr_platform();
  grpc_set_timer_impl(&kEngineTimers);
  grpc_init();  // kept: a last grpc_shutdown and a new grpc_init would start the threads again
  // Given back at exit, so gRPC's last thread (the default executor) is joined before the process
  // ends, as it was when gRPC shut down with its last object: a thread still running at exit
  // makes ThreadSanitizer's runtime sleep a second (atexit_sleep_ms). Registered after the
  // engine's own handler, so it runs first, while the engine still runs.
  std::atexit([] { grpc_shutdown(); });
  grpc_timer_manager_set_threading(false);
  // The resolver executor runs blocking DNS lookups, which Unix-socket targets never need: off,
  // a closure given to it then runs on the thread that scheduled it. The default executor stays:
  // it runs the TCP write backup poller (tcp_posix.cc cover_self, for a write that would block),
  // a loop that polls for up to 10 s at a time, which must not run on a thread of ours.
  GrpcExecutorSetThreadingAll(false);
  GrpcExecutorSetThreadingDefault(true);
  return "gRPC " GRPC_CPP_VERSION_STRING
         ": timers on the event engine's thread, no timer or resolver threads";
#else
  (void)engine;
  return "gRPC " GRPC_CPP_VERSION_STRING
         ": gRPC's own timer threads (which wake once a second) and resolver thread are kept (the "
         "configure-time probe of its internals did not pass, or was not run)";
#endif
}

int PendingGrpcTimers() {
#if EDGEACCEL_GRPC_TIMERS_KNOWN
  return installed ? TheTimers().pending() : 0;
#else
  return 0;
#endif
}

}  // namespace edgeaccel
