// DaemonConfig: everything the daemon is told on its command line, checked in one place.
#ifndef EDGEACCEL_CONFIG_H_
#define EDGEACCEL_CONFIG_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "edgeaccel/constants.h"
#include "edgeaccel/registration.h"

namespace edgeaccel {

struct DaemonConfig {
  std::string host_root = "/";
  std::string kubelet_root = std::string(kDefaultKubeletRoot);
  RegistrationMode registration = RegistrationMode::kAuto;
  absl::Duration probe_interval = absl::Seconds(5);
  // Celsius; unset: each Edge TPU's own hw_temp_warn2.
  std::optional<double> temperature_threshold_celsius;
  double temperature_hysteresis_celsius = 2.0;
  absl::Duration register_timeout = absl::Seconds(10);
};

// Says exactly what is wrong with a configuration, in terms of the flag to change.
absl::Status ValidateConfig(const DaemonConfig& config);

}  // namespace edgeaccel

#endif  // EDGEACCEL_CONFIG_H_
