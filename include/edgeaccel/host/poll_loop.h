// PollLoop: one thread that waits (poll) for the descriptors and wake times of several members
// and steps each in turn. The daemon runs every resource's registration (kubelet/registrar.h),
// the NVML supervisor (nvml/nvml_supervisor.h) and every DRA driver's ResourceSlice watch
// (dra/slice_publisher.h) on one: what each waits for (inotify on the kubelet's directories, a
// finished Register call, a stream's end, the NVML helper's output, a watch event, a deadline) is
// rare and quick to handle. A member never waits on a server in its step: what would (a request
// to the API server) it hands to a worker. A step can take up to a registration's neighbour look
// budget (1 s): another member's event waits that long at most.
//
// A loop runs on a thread of its own, started with its first member, or on the caller's thread
// (RunOnCallersThread: the daemon's main thread serves /metrics and /healthz so while it waits
// for a stop signal).
//
// Members are added and removed from any thread but the loop's own while it runs. After Remove()
// returns, the loop never calls the member again, and no step of it is running.
#ifndef EDGEACCEL_HOST_POLL_LOOP_H_
#define EDGEACCEL_HOST_POLL_LOOP_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace edgeaccel {

class PollLoop {
 public:
  // The most descriptors one member waits on.
  static constexpr int kMaxFds = 4;
  using Fds = std::array<int, kMaxFds>;         // -1: none in that place
  using Events = std::array<short, kMaxFds>;    // poll's revents, in the same places

  // What the loop drives. Both calls run on the loop's thread.
  class Member {
   public:
    virtual ~Member() = default;
    // What to wait on until the next step (read before every wait).
    virtual Fds WaitFds() = 0;
    // Runs once when added, then whenever one of its descriptors is ready (`ready`: what poll
    // said of each; all 0 when the wake time came) or its wake time has come. Returns the next
    // wake time (absl::InfiniteFuture() for none).
    virtual absl::Time Step(const Events& ready) = 0;
  };

  // `thread_name`: what the thread is called (at most 15 characters).
  explicit PollLoop(std::string thread_name) : thread_name_(std::move(thread_name)) {}
  // A loop with no thread of its own: it steps its members only inside RunOnCallersThread().
  // `name`: what its log lines call it.
  struct CallersThread {};
  PollLoop(CallersThread, std::string name) : thread_name_(std::move(name)), callers_thread_(true) {}
  // Ends the thread. Every member must have been removed.
  ~PollLoop();
  PollLoop(const PollLoop&) = delete;
  PollLoop& operator=(const PollLoop&) = delete;

  // Adds `member` (its first step runs at once on the loop's thread), starting the thread with
  // the first member. Where the loop's eventfd cannot be made (this process at its fd limit), the
  // loop tries again at each wait, and waits at most a second meanwhile: an added member is then
  // stepped within a second, and Remove() and the destructor wait that long at most.
  void Add(Member* member);
  // Removes `member`, waiting for its step in progress, if any, to end.
  void Remove(Member* member);

  // For a loop made with CallersThread: steps the members on the calling thread until `until_fd`
  // (the caller's: a signalfd, an eventfd) becomes readable, which it leaves unread (true), or
  // until no member is left (false; at once when it has none). One caller at a time.
  bool RunOnCallersThread(int until_fd);

 private:
  struct Entry {
    Member* member;
    uint64_t id;  // never reused: a member added again at the same address is another entry
    absl::Time wake;
  };
  // Steps the members until `until_fd` is readable (true), or the loop stops or, on the
  // caller's thread, has no member left (false).
  bool Run(int until_fd);
  void Wake();
  Entry* Find(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string thread_name_;
  const bool callers_thread_ = false;
  absl::Mutex mu_;
  absl::CondVar stepped_;  // a step ended
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  Member* stepping_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> wake_fd_{-1};  // an eventfd, -1 while it cannot be made
  std::thread thread_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_HOST_POLL_LOOP_H_
