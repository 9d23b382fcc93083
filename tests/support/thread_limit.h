// Runs a check in a child process where no thread can be started, as on a node at its process
// limit: the child takes uid 65534 (no capabilities, so RLIMIT_NPROC applies) and a soft
// RLIMIT_NPROC of 0, and clone() answers EAGAIN, as it does under PID pressure or at a pod
// cgroup's pids.max. AllowThreads() raises the soft limit back to the hard one.
#ifndef EDGEACCEL_TESTS_SUPPORT_THREAD_LIMIT_H_
#define EDGEACCEL_TESTS_SUPPORT_THREAD_LIMIT_H_

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace edgeaccel::testing {

inline bool AllowThreads() {
  rlimit limit;
  if (getrlimit(RLIMIT_NPROC, &limit) != 0) return false;
  limit.rlim_cur = limit.rlim_max;
  return setrlimit(RLIMIT_NPROC, &limit) == 0;
}

// The child's exit code: `check`'s answer (0: it held), 100 when the limit could not be set
// (the test must run as root), 128+N when the child was killed by signal N (std::terminate is
// SIGABRT: 134).
inline int RunWhereNoThreadStarts(const std::function<bool()>& check) {
  const pid_t child = fork();
  if (child == 0) {
    rlimit limit;
    if (getrlimit(RLIMIT_NPROC, &limit) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      _exit(100);
    }
    limit.rlim_cur = 0;
    if (setrlimit(RLIMIT_NPROC, &limit) != 0) _exit(100);
    _exit(check() ? 0 : 1);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_THREAD_LIMIT_H_
