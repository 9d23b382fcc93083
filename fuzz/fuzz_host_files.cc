// Every discoverer against host files with fuzzed content: apex sysfs values, USB sysfs ids and
// numbers, NVIDIA /proc files, Jetson identity files. A real fixture tree, rewritten per input.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "edgeaccel/discovery/coral_pcie.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/nvidia.h"
#include "edgeaccel/discovery/tegra.h"

namespace {

std::string Root() {
  static const std::string root = [] {
    char templ[] = "/tmp/edgeaccel-fuzz-XXXXXX";
    std::string dir = mkdtemp(templ);
    for (const char* d : {"/sys", "/sys/class", "/sys/class/apex", "/sys/class/apex/apex_0",
                          "/sys/bus", "/sys/bus/usb", "/sys/bus/usb/devices",
                          "/sys/bus/usb/devices/2-1", "/dev", "/dev/bus", "/dev/bus/usb",
                          "/dev/bus/usb/002", "/proc", "/proc/driver", "/proc/driver/nvidia",
                          "/proc/driver/nvidia/gpus", "/proc/driver/nvidia/gpus/0000:01:00.0",
                          "/etc", "/proc/device-tree"}) {
      mkdir((dir + d).c_str(), 0755);
    }
    mknod((dir + "/dev/apex_0").c_str(), S_IFCHR | 0600, makedev(120, 0));
    mknod((dir + "/dev/bus/usb/002/003").c_str(), S_IFCHR | 0600, makedev(189, 130));
    return dir;
  }();
  return root;
}

void Write(const std::string& path, const std::string& content) {
  int fd = open((Root() + path).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  (void)!write(fd, content.data(), content.size());
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider input(data, size);
  for (const char* file : {"/sys/class/apex/apex_0/status", "/sys/class/apex/apex_0/temp",
                           "/sys/class/apex/apex_0/hw_temp_warn2", "/sys/class/apex/apex_0/dev",
                           "/sys/class/apex/apex_0/pci_address",
                           "/sys/bus/usb/devices/2-1/idVendor", "/sys/bus/usb/devices/2-1/idProduct",
                           "/sys/bus/usb/devices/2-1/busnum", "/sys/bus/usb/devices/2-1/devnum",
                           "/proc/driver/nvidia/version",
                           "/proc/driver/nvidia/gpus/0000:01:00.0/information",
                           "/etc/nv_tegra_release", "/proc/device-tree/compatible",
                           "/proc/device-tree/model"}) {
    Write(file, input.ConsumeRandomLengthString(200));
  }
  edgeaccel::Host host(Root());
  edgeaccel::CoralPcieDiscoverer pcie(&host, {});
  edgeaccel::CoralUsbDiscoverer usb(&host);
  edgeaccel::NvidiaGpuDiscoverer nvidia(&host, {});
  edgeaccel::TegraGpuDiscoverer tegra(&host, {});
  for (edgeaccel::Discoverer* d : std::initializer_list<edgeaccel::Discoverer*>{&pcie, &usb, &nvidia, &tegra}) {
    for (const edgeaccel::Device& device : d->Scan()) {
      // Paths handed out come only from what exists under the root, never from file content
      // that could point elsewhere.
      for (const edgeaccel::DeviceNode& node : device.nodes) {
        if (node.host_path.find("..") != std::string::npos || node.host_path.rfind("/dev/", 0) != 0) {
          __builtin_trap();
        }
      }
    }
  }
  return 0;
}
