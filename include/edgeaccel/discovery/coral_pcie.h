// Google Coral Edge TPU on PCIe / M.2 / Mini-PCIe (gasket + apex kernel drivers).
//
// A device is a /sys/class/apex/apex_N entry; the container needs /dev/apex_N, a character
// device (major 120). Health is read from the driver: the node must be there and match the
// driver's major:minor, sysfs `status` must be ALIVE, and the die temperature must stay below
// the threshold (default: the chip's own shutdown line, hw_temp_warn2).
#ifndef EDGEACCEL_DISCOVERY_CORAL_PCIE_H_
#define EDGEACCEL_DISCOVERY_CORAL_PCIE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

struct CoralHealthPolicy {
  // Unhealthy at or above this die temperature, in millidegrees C. Unset: each device's own
  // hw_temp_warn2 (99800 with driver defaults).
  std::optional<int64_t> temperature_threshold_mc;
  // An overheated device is Healthy again only once it is this much below the threshold, so a
  // temperature sitting on the line does not flap the device in and out of Allocatable.
  int64_t temperature_hysteresis_mc = 2000;
};

class CoralPcieDiscoverer : public Discoverer {
 public:
  CoralPcieDiscoverer(const Host* host, CoralHealthPolicy policy);

  std::string ResourceName() const override;
  std::string Family() const override { return "coral-pcie"; }
  std::vector<Device> Scan() override;
  std::vector<WatchSpec> WatchPaths() const override;
  std::vector<std::string> UeventSubsystems() const override;
  std::string NothingFoundHint() const override;
  // Reads again the class directory's entries, each entry's identity, and what the driver says
  // of each device at any time: status, temperature and the temperature lines. False after a
  // scan that found a device newly over (or back under) its threshold: the next scan says it
  // with the hysteresis, from the same readings.
  bool InputsUnchanged() override { return !overheat_changed_ && inputs_.Unchanged(); }
  ScanInputs* ProbeInputs() override { return &inputs_; }

 private:
  // nullopt when the entry's sysfs tree vanished while it was being read (a removal in
  // progress; the device node's removal from /dev brings the next scan).
  std::optional<Device> ScanOne(const std::string& name);

  const Host* host_;
  CoralHealthPolicy policy_;
  ScanInputs inputs_;
  OnceLogger log_;
  absl::flat_hash_set<std::string> overheated_;  // ids currently over the threshold
  bool overheat_changed_ = false;                // by the last scan
};

// Driver default for hw_temp_warn2 as read back from sysfs (100000 encodes to 99800).
inline constexpr int64_t kApexDefaultShutdownTempMc = 99800;
// A device's own hw_temp_warn2 outside these is not trusted (the default is used instead):
// lowered for a hot enclosure is fine, 0 or above what the silicon survives is not.
inline constexpr int64_t kMinPlausibleShutdownTempMc = 60000;
inline constexpr int64_t kMaxPlausibleShutdownTempMc = 125000;

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_CORAL_PCIE_H_
