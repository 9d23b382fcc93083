// Runs the real edgeaccel-device-plugin binary as a child process, with its log captured.
#ifndef EDGEACCEL_TESTS_SUPPORT_DAEMON_PROCESS_H_
#define EDGEACCEL_TESTS_SUPPORT_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fixture_host.h"

namespace edgeaccel::testing {

struct CommandResult {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

// Runs `binary args...` to completion (killed after `timeout`) and captures its output. With
// `uid` set, the child drops to that user (and its group) first, with no supplementary groups
// and no capabilities: as NFD's worker (65534, capabilities dropped) reads our files.
// For a one-shot run (--discover): --kubelet-root and --device-plugin-dir at a path inside the
// fixture host `root` that holds nothing, so what the kubelet holds (its checkpoint, DRA claims
// prepared under its plugins/) is never read from the machine the tests run on, which may run a
// kubelet of its own.
inline std::string KubeletRootFlagIn(const std::string& root) {
  return "--kubelet-root=" + root + "/var/lib/kubelet";
}
inline std::string DevicePluginDirFlagIn(const std::string& root) {
  return "--device-plugin-dir=" + root + "/var/lib/kubelet/device-plugins";
}

CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         absl::Duration timeout = absl::Seconds(30),
                         std::optional<uid_t> uid = std::nullopt);

class DaemonProcess {
 public:
  DaemonProcess(const std::string& binary, const std::vector<std::string>& args);
  ~DaemonProcess();  // SIGKILL if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal_number);
  // The exit code (128+N if killed by signal N), or nullopt if still running after `timeout`.
  std::optional<int> Wait(absl::Duration timeout);
  bool Running();

  // Everything the daemon logged so far.
  std::string Log() const;
  // Waits (inotify on the log file, no polling) until the log contains `needle`.
  bool WaitForLog(absl::string_view needle, absl::Duration timeout = absl::Seconds(10)) const;

 private:
  TempDir dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// The port a daemon started with --metrics-address=127.0.0.1:0 picked, read from its log
// (0 if it did not say within 10 s).
int MetricsPort(const DaemonProcess& daemon);

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_DAEMON_PROCESS_H_
