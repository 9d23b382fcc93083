#include "daemon_process.h"

#include <grp.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel::testing {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

pid_t Spawn(const std::string& binary, const std::vector<std::string>& args,
            const std::string& out_path, const std::string& err_path,
            std::optional<uid_t> uid = std::nullopt) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  PCHECK(pid >= 0) << "fork";
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out, 1);
    dup2(err, 2);
    // Start with a clean signal state, whatever the test runner blocked.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // Another user entirely, as a non-root container runs: no supplementary groups (root's
    // group 0 would open group-readable files), and setuid from root clears every capability.
    if (uid.has_value() && (setgroups(0, nullptr) != 0 || setgid(*uid) != 0 || setuid(*uid) != 0)) {
      _exit(126);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

std::optional<int> WaitPid(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    }
    if (absl::Now() >= deadline) return std::nullopt;
    // A child's exit has no fd to wait on without pidfd (not in every libc); short sleeps are
    // test-side only.
    absl::SleepFor(absl::Milliseconds(2));
  }
}

}  // namespace

CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         absl::Duration timeout, std::optional<uid_t> uid) {
  TempDir dir("edgeaccel-cmd");
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  close(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  close(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  chmod(dir.path().c_str(), 0777);  // a child running as another user writes its output here
  chmod(out.c_str(), 0666);
  chmod(err.c_str(), 0666);
  pid_t pid = Spawn(binary, args, out, err, uid);
  CommandResult result;
  std::optional<int> code = WaitPid(pid, timeout);
  if (!code.has_value()) {
    kill(pid, SIGKILL);
    code = WaitPid(pid, absl::Seconds(5));
  }
  result.exit_code = code.value_or(-1);
  result.out = ReadWhole(out);
  result.err = ReadWhole(err);
  return result;
}

DaemonProcess::DaemonProcess(const std::string& binary, const std::vector<std::string>& args)
    : dir_("edgeaccel-daemon"), log_path_(dir_.path() + "/stderr") {
  // glog writes to stderr only, so the stderr file is the log. Create it before the child runs
  // so WaitForLog can always watch it.
  close(open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  pid_ = Spawn(binary, args, dir_.path() + "/stdout", log_path_);
}

DaemonProcess::~DaemonProcess() {
  if (Running()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(5));
  }
}

void DaemonProcess::Signal(int signal_number) { kill(pid_, signal_number); }

std::optional<int> DaemonProcess::Wait(absl::Duration timeout) {
  if (!exit_code_.has_value()) exit_code_ = WaitPid(pid_, timeout);
  return exit_code_;
}

bool DaemonProcess::Running() { return !Wait(absl::ZeroDuration()).has_value(); }

std::string DaemonProcess::Log() const { return ReadWhole(log_path_); }

bool DaemonProcess::WaitForLog(absl::string_view needle, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  int fd = inotify_init1(IN_CLOEXEC);
  inotify_add_watch(fd, log_path_.c_str(), IN_MODIFY);
  bool found = false;
  while (true) {
    if (absl::StrContains(Log(), needle)) {
      found = true;
      break;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) > 0) {
      char buffer[4096];
      (void)!read(fd, buffer, sizeof(buffer));
    }
  }
  close(fd);
  return found;
}

int MetricsPort(const DaemonProcess& daemon) {
  const std::string marker = "serving /metrics and /healthz on 127.0.0.1:";
  if (!daemon.WaitForLog(marker)) return 0;
  const std::string log = daemon.Log();
  return std::atoi(log.c_str() + log.find(marker) + marker.size());
}

}  // namespace edgeaccel::testing
