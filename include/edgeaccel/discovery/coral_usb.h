// Google Coral USB Accelerator.
//
// Found in /sys/bus/usb/devices/<bus>-<port>[.<port>...] by its ids: 1a6e:089a before its
// firmware is loaded (DFU mode), 18d1:9302 after. The id is the USB port path ("2-1"), which stays
// the same when the device re-enumerates with a new device number as its firmware loads; the
// container gets /dev/bus/usb/BBB/DDD of the moment.
//
// A container keeps the device node it started with. When the Accelerator re-enumerates (firmware
// load, replug), that node is gone and the device cgroup does not allow the new one, so a
// container cannot survive it, and one started on a DFU-mode device would lose it the moment its
// own runtime loaded the firmware. So a DFU-mode device is advertised Unhealthy ("firmware not
// loaded"): it becomes Healthy (and allocatable) once the host has initialised it, and a
// running container is never handed a device about to vanish under it.
#ifndef EDGEACCEL_DISCOVERY_CORAL_USB_H_
#define EDGEACCEL_DISCOVERY_CORAL_USB_H_

#include <string>
#include <vector>

#include "edgeaccel/discovery/discoverer.h"
#include "edgeaccel/discovery/scan_inputs.h"
#include "edgeaccel/host/host.h"
#include "edgeaccel/host/once_logger.h"

namespace edgeaccel {

class CoralUsbDiscoverer : public Discoverer {
 public:
  explicit CoralUsbDiscoverer(const Host* host);

  std::string ResourceName() const override;
  std::string Family() const override { return "coral-usb"; }
  std::vector<Device> Scan() override;
  std::vector<WatchSpec> WatchPaths() const override;
  std::vector<std::string> UeventSubsystems() const override;
  std::string NothingFoundHint() const override;
  // Reads again the USB devices' directory and each device's identity: what describes a USB
  // device (ids, speed, bus and device numbers) is fixed until it enumerates again.
  bool InputsUnchanged() override { return inputs_.Unchanged(); }
  ScanInputs* ProbeInputs() override { return &inputs_; }

 private:
  const Host* host_;
  ScanInputs inputs_;
  OnceLogger log_;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DISCOVERY_CORAL_USB_H_
