#include "edgeaccel/host/poll_loop.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "glog/logging.h"

namespace edgeaccel {

PollLoop::~PollLoop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    Wake();
  }
  if (thread_.joinable()) thread_.join();
  if (wake_fd_.load() >= 0) close(wake_fd_.load());
}

void PollLoop::Add(Member* member) {
  absl::MutexLock lock(&mu_);
  // The eventfd is made here before the thread starts, and otherwise only by Run(): one maker at
  // a time (a loop on the caller's thread makes it when it runs).
  if (!callers_thread_ && !thread_.joinable()) {
    wake_fd_.store(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), thread_name_.c_str());
      Run(-1);
    });
  }
  entries_.push_back({member, next_id_++, absl::InfinitePast()});
  Wake();
}

void PollLoop::Remove(Member* member) {
  absl::MutexLock lock(&mu_);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [member](const Entry& e) { return e.member == member; }),
                 entries_.end());
  Wake();  // its descriptors leave the wait
  while (stepping_ == member) stepped_.Wait(&mu_);
}

void PollLoop::Wake() {
  uint64_t one = 1;
  if (const int fd = wake_fd_.load(); fd >= 0) (void)!write(fd, &one, sizeof(one));
}

PollLoop::Entry* PollLoop::Find(uint64_t id) {
  for (Entry& entry : entries_) {
    if (entry.id == id) return &entry;
  }
  return nullptr;
}

bool PollLoop::RunOnCallersThread(int until_fd) {
  CHECK(callers_thread_) << "RunOnCallersThread on a loop with a thread of its own";
  return Run(until_fd);
}

bool PollLoop::Run(int until_fd) {
  // In `fds`: the wake eventfd, `until_fd` (-1: none, which poll skips), then each member's.
  constexpr size_t kFirstMember = 2;
  std::vector<struct pollfd> fds;
  std::vector<uint64_t> ids;  // the members waited for, in the order of their descriptors
  while (true) {
    if (wake_fd_.load() < 0) wake_fd_.store(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    const int wake_fd = wake_fd_.load();
    fds.assign({{wake_fd, POLLIN, 0}, {until_fd, POLLIN, 0}});
    ids.clear();
    absl::Time wake = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&mu_);
      // A loop on the caller's thread serves its members: with none left, it returns.
      if (stopping_ || (callers_thread_ && entries_.empty())) return false;
      for (const Entry& entry : entries_) {
        for (int fd : entry.member->WaitFds()) fds.push_back({fd, POLLIN, 0});  // -1: ignored
        wake = std::min(wake, entry.wake);
        ids.push_back(entry.id);
      }
    }
    int timeout_ms = -1;
    if (wake != absl::InfiniteFuture()) {
      // A wake time computed from an earlier clock reading may have passed: poll, do not sleep.
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(absl::Ceil(wake - absl::Now(), absl::Milliseconds(1)))));
    }
    if (wake_fd < 0) timeout_ms = timeout_ms < 0 ? 1000 : std::min(timeout_ms, 1000);
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      LOG(ERROR) << thread_name_ << ": poll failed: " << strerror(errno);
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count;
      (void)!read(wake_fd, &count, sizeof(count));
    }
    if (fds[1].revents != 0) return true;
    // Who is due is decided from the time of the wait, once: a wake time that passes during
    // another member's long step is acted on after the next wait, which also sees what arrived
    // on that member's descriptors meanwhile (an answer that beat its deadline).
    const absl::Time now = absl::Now();
    bool stepped = false;  // a step ran since the wait: what it said of the others may be old
    for (size_t i = 0; i < ids.size(); ++i) {
      // A member stepped after another (for its own descriptor or wake time) is told what its
      // descriptors say now, not at the wait: an answer that came during the other's step is
      // read before the member judges a deadline by the clock.
      if (stepped) poll(&fds[kFirstMember + i * kMaxFds], kMaxFds, 0);
      Events ready = {};
      bool any = false;
      for (int k = 0; k < kMaxFds; ++k) {
        ready[k] = fds[kFirstMember + i * kMaxFds + k].revents;
        any = any || ready[k] != 0;
      }
      Member* member;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return false;
        Entry* entry = Find(ids[i]);
        if (entry == nullptr || (!any && entry->wake > now)) continue;  // removed, or not due
        member = entry->member;
        stepping_ = member;
      }
      const absl::Time next = member->Step(ready);
      stepped = true;
      absl::MutexLock lock(&mu_);
      stepping_ = nullptr;
      stepped_.SignalAll();
      if (Entry* entry = Find(ids[i]); entry != nullptr) entry->wake = next;
    }
  }
}

}  // namespace edgeaccel
