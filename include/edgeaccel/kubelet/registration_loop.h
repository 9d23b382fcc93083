// RegistrationLoop: one thread ("ea-register") on which the registration of every resource of
// the daemon runs. A Jetson with an M.2 Edge TPU registers two resources; what each one waits
// for (inotify on the kubelet's two directories, a finished Register call, a stream's end, its
// machine's wake time) is rare and quick to handle, so one thread polls for all of them and steps
// each resource in turn. A step can take up to the neighbour look's budget (1 s): a change for
// another resource waits that long at most.
//
// Members are added and removed from any thread but the loop's own. After Remove() returns, the
// loop never calls the member again, and no step of it is running.
#ifndef EDGEACCEL_KUBELET_REGISTRATION_LOOP_H_
#define EDGEACCEL_KUBELET_REGISTRATION_LOOP_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace edgeaccel {

class RegistrationLoop {
 public:
  // The most descriptors one member waits on.
  static constexpr int kMaxFds = 4;
  using Fds = std::array<int, kMaxFds>;         // -1: none in that place
  using Events = std::array<short, kMaxFds>;    // poll's revents, in the same places

  // One resource's registration as the loop drives it. Both calls run on the loop's thread.
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

  RegistrationLoop() = default;
  // Ends the thread. Every member must have been removed.
  ~RegistrationLoop();
  RegistrationLoop(const RegistrationLoop&) = delete;
  RegistrationLoop& operator=(const RegistrationLoop&) = delete;

  // Adds `member` (its first step runs at once on the loop's thread), starting the thread with
  // the first member. Where the loop's eventfd cannot be made (this process at its fd limit), the
  // loop tries again at each wait, and waits at most a second meanwhile: an added member is then
  // stepped within a second, and Remove() and the destructor wait that long at most.
  void Add(Member* member);
  // Removes `member`, waiting for its step in progress, if any, to end.
  void Remove(Member* member);

 private:
  struct Entry {
    Member* member;
    uint64_t id;  // never reused: a member added again at the same address is another entry
    absl::Time wake;
  };
  void Run();
  void Wake();
  Entry* Find(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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

#endif  // EDGEACCEL_KUBELET_REGISTRATION_LOOP_H_
