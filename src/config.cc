#include "edgeaccel/config.h"

#include <sys/stat.h>
#include <sys/un.h>

#include "absl/strings/str_cat.h"

namespace edgeaccel {

absl::Status ValidateConfig(const DaemonConfig& config) {
  struct stat st;
  if (config.host_root.empty() || config.host_root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-root must be an absolute path, got \"", config.host_root, "\""));
  }
  if (stat(config.host_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-root ", config.host_root, " is not a directory"));
  }
  if (config.kubelet_root.empty() || config.kubelet_root[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kubelet-root must be an absolute path, got \"", config.kubelet_root, "\""));
  }
  // The longest socket path we bind must fit a sockaddr_un.
  const size_t longest = config.kubelet_root.size() + 1 + kPluginsRegistryDir.size() + 1 +
                         SocketFileName(kResourceEdgeTpu).size() + 8;
  if (longest >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kubelet-root ", config.kubelet_root, " is too long: socket paths under it would exceed ",
        sizeof(sockaddr_un::sun_path) - 1, " bytes, the Unix socket limit"));
  }
  if (config.probe_interval < absl::ZeroDuration() ||
      (config.probe_interval > absl::ZeroDuration() &&
       config.probe_interval < absl::Milliseconds(100))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--probe-interval must be 0 (off) or at least 100ms, got ",
                     absl::FormatDuration(config.probe_interval)));
  }
  if (config.temperature_threshold_celsius.has_value() &&
      !(*config.temperature_threshold_celsius > 0 && *config.temperature_threshold_celsius < 150)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature-threshold must be between 0 and 150 °C (0 means: each "
                     "device's own shutdown threshold), got ",
                     *config.temperature_threshold_celsius));
  }
  if (!(config.temperature_hysteresis_celsius >= 0 &&
        config.temperature_hysteresis_celsius <= 50)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature-hysteresis must be between 0 and 50 °C, got ",
                     config.temperature_hysteresis_celsius));
  }
  if (config.register_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(absl::StrCat("--register-timeout must be at least 100ms, got ",
                                                   absl::FormatDuration(config.register_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace edgeaccel
