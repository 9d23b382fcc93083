#include "edgeaccel/kubelet/grpc_event_engine.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"

// 1 where cmake/grpc_internals.cmake found that this compiles against the installed gRPC's
// EventEngine interface (experimental: it changed after 1.51). Otherwise gRPC keeps its own engine.
#ifndef EDGEACCEL_GRPC_EVENT_ENGINE
#define EDGEACCEL_GRPC_EVENT_ENGINE 0
#endif

namespace edgeaccel {
#if EDGEACCEL_GRPC_EVENT_ENGINE
namespace {

using grpc_event_engine::experimental::EndpointConfig;
using grpc_event_engine::experimental::EventEngine;
using grpc_event_engine::experimental::MemoryAllocator;
using grpc_event_engine::experimental::MemoryAllocatorFactory;

class OneThreadEventEngine final : public EventEngine {
 public:
  explicit OneThreadEventEngine(std::string thread_name) : state_(std::make_shared<State>()) {
    // The thread holds the state too: gRPC may destroy the engine from a closure it runs, and
    // the loop still needs the state until it sees it is stopping.
    thread_ = std::thread([state = state_, name = std::move(thread_name)] {
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      Loop(*state);
    });
  }
  ~OneThreadEventEngine() override { StopThread(); }

  // Ends the thread; closures asked for afterwards are kept, never run. For the engine's end, and
  // the process's (see UseOneThreadGrpcEventEngine).
  void StopThread() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stopping = true;
      state_->wake.notify_one();
    }
    if (!thread_.joinable()) return;
    // Stopped on its own thread (destroyed from a closure): that thread cannot join itself, and
    // ends once the closure returns.
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

  bool IsWorkerThread() override { return std::this_thread::get_id() == thread_.get_id(); }

  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback, absl::AnyInvocable<void(absl::Status)>, const EndpointConfig&,
      std::unique_ptr<MemoryAllocatorFactory>) override {
    return absl::UnimplementedError("edgeaccel's gRPC event engine makes no listeners");
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress&,
                           const EndpointConfig&, MemoryAllocator, Duration) override {
    Run([on_connect = std::move(on_connect)]() mutable {
      on_connect(absl::UnimplementedError("edgeaccel's gRPC event engine makes no connections"));
    });
    return {{0, 0}};
  }
  bool CancelConnect(ConnectionHandle) override { return false; }
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions&) override {
    return nullptr;
  }

  void Run(Closure* closure) override { Run([closure] { closure->Run(); }); }
  void Run(absl::AnyInvocable<void()> closure) override {
    // Notified under the lock: once the closure runs it may destroy the engine, condition
    // variable included, and a notify after unlocking would touch it.
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->ready.push_back(std::move(closure));
    state_->wake.notify_one();
  }
  TaskHandle RunAfter(Duration when, Closure* closure) override {
    return RunAfter(when, [closure] { closure->Run(); });
  }
  TaskHandle RunAfter(Duration when, absl::AnyInvocable<void()> closure) override {
    const auto at = Clock::now() + when;
    std::lock_guard<std::mutex> lock(state_->mu);
    const intptr_t id = ++state_->last_id;
    state_->timers.emplace(std::make_pair(at, id), std::move(closure));
    state_->wake.notify_one();
    return TaskHandle{{id, 0}};
  }
  bool Cancel(TaskHandle handle) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto it = state_->timers.begin(); it != state_->timers.end(); ++it) {
      if (it->first.second == handle.keys[0]) {
        state_->timers.erase(it);
        return true;
      }
    }
    return false;  // already run (or running): the caller is told so, as the interface says
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct State {
    std::mutex mu;
    std::condition_variable wake;
    bool stopping = false;
    intptr_t last_id = 0;
    std::deque<absl::AnyInvocable<void()>> ready;
    // By deadline, then by the order they were asked for.
    std::multimap<std::pair<Clock::time_point, intptr_t>, absl::AnyInvocable<void()>> timers;
  };

  static void Loop(State& state) {
    std::unique_lock<std::mutex> lock(state.mu);
    while (!state.stopping) {
      const Clock::time_point now = Clock::now();
      while (!state.timers.empty() && state.timers.begin()->first.first <= now) {
        state.ready.push_back(std::move(state.timers.begin()->second));
        state.timers.erase(state.timers.begin());
      }
      if (!state.ready.empty()) {
        absl::AnyInvocable<void()> closure = std::move(state.ready.front());
        state.ready.pop_front();
        lock.unlock();
        closure();
        closure = nullptr;  // whatever it holds goes before the lock is taken again
        lock.lock();
        continue;
      }
      // No deadline when nothing is pending: an idle daemon's gRPC wakes nobody.
      if (state.timers.empty()) {
        state.wake.wait(lock);
      } else {
        // A copy: a Cancel while we wait frees the entry, and wait_until reads its deadline again
        // when it wakes.
        const Clock::time_point deadline = state.timers.begin()->first.first;
        state.wake.wait_until(lock, deadline);
      }
    }
  }

  const std::shared_ptr<State> state_;
  std::thread thread_;
};

// What gRPC's factory hands out: the one engine, never destroyed with gRPC's last reference (gRPC
// keeps its default engine only weakly, and would otherwise make and unmake a thread each time).
class SharedEngine final : public EventEngine {
 public:
  explicit SharedEngine(EventEngine* engine) : engine_(engine) {}
  bool IsWorkerThread() override { return engine_->IsWorkerThread(); }
  absl::StatusOr<std::unique_ptr<Listener>> CreateListener(
      Listener::AcceptCallback on_accept, absl::AnyInvocable<void(absl::Status)> on_shutdown,
      const EndpointConfig& config, std::unique_ptr<MemoryAllocatorFactory> factory) override {
    return engine_->CreateListener(std::move(on_accept), std::move(on_shutdown), config,
                                   std::move(factory));
  }
  ConnectionHandle Connect(OnConnectCallback on_connect, const ResolvedAddress& addr,
                           const EndpointConfig& args, MemoryAllocator allocator,
                           Duration timeout) override {
    return engine_->Connect(std::move(on_connect), addr, args, std::move(allocator), timeout);
  }
  bool CancelConnect(ConnectionHandle handle) override { return engine_->CancelConnect(handle); }
  std::unique_ptr<DNSResolver> GetDNSResolver(const DNSResolver::ResolverOptions& o) override {
    return engine_->GetDNSResolver(o);
  }
  void Run(Closure* closure) override { engine_->Run(closure); }
  void Run(absl::AnyInvocable<void()> closure) override { engine_->Run(std::move(closure)); }
  TaskHandle RunAfter(Duration when, Closure* closure) override {
    return engine_->RunAfter(when, closure);
  }
  TaskHandle RunAfter(Duration when, absl::AnyInvocable<void()> closure) override {
    return engine_->RunAfter(when, std::move(closure));
  }
  bool Cancel(TaskHandle handle) override { return engine_->Cancel(handle); }

 private:
  EventEngine* const engine_;
};

}  // namespace

std::unique_ptr<EventEngine> MakeOneThreadEventEngine(std::string thread_name) {
  return std::make_unique<OneThreadEventEngine>(std::move(thread_name));
}

EventEngine* UseOneThreadGrpcEventEngine() {
  // Made once and kept for the process's life. Its thread is ended at exit, after main: gRPC's
  // objects are gone by then, and a thread left running makes ThreadSanitizer's runtime sleep a
  // second before the process ends (atexit_sleep_ms), which a SIGTERM test of a TSan build then
  // counts as a slow stop.
  static OneThreadEventEngine* const engine = [] {
    static OneThreadEventEngine* made = new OneThreadEventEngine("ea-grpc-timer");
    std::atexit([] { made->StopThread(); });
    grpc_event_engine::experimental::SetEventEngineFactory(
        []() -> std::unique_ptr<EventEngine> { return std::make_unique<SharedEngine>(made); });
    return made;
  }();
  return engine;
}

#else  // !EDGEACCEL_GRPC_EVENT_ENGINE

std::unique_ptr<grpc_event_engine::experimental::EventEngine> MakeOneThreadEventEngine(std::string) {
  return nullptr;
}

grpc_event_engine::experimental::EventEngine* UseOneThreadGrpcEventEngine() { return nullptr; }

#endif  // EDGEACCEL_GRPC_EVENT_ENGINE

}  // namespace edgeaccel
