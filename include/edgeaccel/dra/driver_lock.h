// DriverLock: one process at a time drives a DRA driver on a node.
//
// During a DaemonSet rollout with maxSurge two edgeaccel daemons of one node run together. Both
// would serve <kubelet-root>/plugins/<driver>/dra.sock and write its checkpoint.json, and a claim
// the old one prepares after the new one read the checkpoint would be lost from it. So the driver
// (its checkpoint, sockets and slices) belongs to whoever holds an flock(2) on
// plugins/<driver>/edgeaccel.lock, taken before the checkpoint is read and held until the process
// ends: the kernel lets go of it however the process ends, SIGKILL included. A predecessor from
// before the lock (edgeaccel up to stop 46) is known by its service socket answering, so the
// driver also waits until nobody answers on dra.sock.
//
// The wait is a PollLoop member the kernel wakes: inotify on the lock file (the holder's
// descriptor closes when it lets go or ends) and on the plugin directory (dra.sock removed), and a
// connection held open to the predecessor's socket (hung up when it stops serving or dies). Where
// one of those cannot be had (inotify limits, the predecessor's backlog full), it looks again
// every second.
#ifndef EDGEACCEL_DRA_DRIVER_LOCK_H_
#define EDGEACCEL_DRA_DRIVER_LOCK_H_

#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "edgeaccel/host/poll_loop.h"

namespace edgeaccel {

inline constexpr const char kDriverLockName[] = "edgeaccel.lock";

class DriverLock final : public PollLoop::Member {
 public:
  // `plugin_dir`: the driver's DraPluginDir, made if missing; the service socket is dra.sock in
  // it. `on_acquired` runs once, on the loop's thread, when a wait ends with the lock ours.
  DriverLock(std::string plugin_dir, std::function<void()> on_acquired);
  // Lets go of the lock. Must have been removed from its loop.
  ~DriverLock() override;
  DriverLock(const DriverLock&) = delete;
  DriverLock& operator=(const DriverLock&) = delete;

  // Takes the lock if nobody else drives the driver: true when ours now, false when another
  // process does (then add it to a loop to wait; waiting() says who). An error when no lock can
  // be had here (the directory cannot be made, the file cannot be opened or locked): the caller
  // goes on without one, as before the lock, and says so.
  absl::StatusOr<bool> TryAcquire();
  // Lets go of it, so a daemon waiting to take over can at once.
  void Release();
  bool held() const;
  // Who we wait for, for a log line ("" when not waiting).
  std::string waiting() const;

  PollLoop::Fds WaitFds() override;
  absl::Time Step(const PollLoop::Events& ready) override;

 private:
  // Takes the lock and checks the socket: true when the driver is ours. `lock_error`, when
  // given, is set to flock's errno where it fails for another reason than another holder.
  bool Check(int* lock_error = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets up what wakes the wait (inotify, the connection to the predecessor); false when some of
  // it could not be had.
  bool Arm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseWaitFds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string plugin_dir_;
  const std::string lock_path_;
  const std::string service_socket_;
  const std::function<void()> on_acquired_;
  mutable absl::Mutex mu_;
  int lock_fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool locked_ ABSL_GUARDED_BY(mu_) = false;  // flock taken on lock_fd_
  bool acquired_ ABSL_GUARDED_BY(mu_) = false;  // locked and nobody answers on the socket
  std::string waiting_ ABSL_GUARDED_BY(mu_);
  int inotify_fd_ ABSL_GUARDED_BY(mu_) = -1;
  int probe_fd_ ABSL_GUARDED_BY(mu_) = -1;  // connected to the predecessor's dra.sock
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DRA_DRIVER_LOCK_H_
