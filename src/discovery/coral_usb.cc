#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "edgeaccel/discovery/coral_usb.h"
#include "edgeaccel/discovery/resource_names.h"

namespace edgeaccel {
namespace {

constexpr absl::string_view kUsbDevicesDir = "/sys/bus/usb/devices";
constexpr unsigned kUsbDeviceMajor = 189;

// "2-1", "3-1.4.2": a USB device (interfaces have a ':'; root hubs are "usbN").
bool IsPortPath(absl::string_view name) {
  static const std::regex kPortPath("[0-9]{1,3}-[0-9]{1,3}(\\.[0-9]{1,3}){0,6}");
  return std::regex_match(name.begin(), name.end(), kPortPath);
}

// idVendor/idProduct as the kernel writes them: exactly 4 lowercase hex digits.
bool IsKernelUsbId(absl::string_view id) {
  if (id.size() != 4) return false;
  for (char c : id) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

enum class CoralUsbState { kNone, kDfu, kReady };

CoralUsbState Classify(absl::string_view vendor, absl::string_view product) {
  if (vendor == "1a6e" && product == "089a") return CoralUsbState::kDfu;
  if (vendor == "18d1" && product == "9302") return CoralUsbState::kReady;
  return CoralUsbState::kNone;
}

}  // namespace

CoralUsbDiscoverer::CoralUsbDiscoverer(const Host* host) : host_(host), inputs_(host) {}

std::string CoralUsbDiscoverer::ResourceName() const { return std::string(kResourceEdgeTpu); }

std::vector<WatchSpec> CoralUsbDiscoverer::WatchPaths() const {
  // The device nodes under /dev/bus/usb are what the kernel announces (devtmpfs), including the
  // bus directories, which appear with the first device on a bus. sysfs sends no inotify events.
  std::vector<WatchSpec> specs = {{"/dev/bus/usb", ""}};
  // Device nodes live one level down, in a directory per bus.
  absl::StatusOr<std::vector<std::string>> buses = host_->ListDirectory("/dev/bus/usb");
  if (buses.ok()) {
    for (const std::string& bus : *buses) specs.push_back({absl::StrCat("/dev/bus/usb/", bus), ""});
  }
  return specs;
}

std::vector<std::string> CoralUsbDiscoverer::UeventSubsystems() const { return {"usb"}; }

std::string CoralUsbDiscoverer::NothingFoundHint() const {
  return "no USB Edge TPU found (looked in /sys/bus/usb/devices for 1a6e:089a or 18d1:9302)";
}

std::vector<Device> CoralUsbDiscoverer::Scan() {
  std::vector<Device> devices;
  inputs_.Clear();
  absl::StatusOr<std::vector<std::string>> names = inputs_.ListDirectory(kUsbDevicesDir);
  if (!names.ok()) return devices;
  using Reread = ScanInputs::Reread;
  for (const std::string& name : *names) {
    if (!IsPortPath(name)) continue;
    const std::string sys = absl::StrCat(kUsbDevicesDir, "/", name);
    // Which device the entry is: each enumeration (a replug, the firmware loading) makes a new
    // one. What describes the device is fixed while it is the same.
    (void)inputs_.Lstat(sys);
    absl::StatusOr<std::string> vendor =
        inputs_.ReadAttribute(sys + "/idVendor", Reread::kUntilRead);
    absl::StatusOr<std::string> product =
        inputs_.ReadAttribute(sys + "/idProduct", Reread::kUntilRead);
    if (!vendor.ok() || !product.ok()) continue;  // a device mid-removal
    if (!IsKernelUsbId(*vendor) || !IsKernelUsbId(*product)) {
      // Not what the kernel writes. If it would be a Coral ignoring case, say so once.
      if (Classify(absl::AsciiStrToLower(*vendor), absl::AsciiStrToLower(*product)) !=
          CoralUsbState::kNone) {
        log_.Warn(absl::StrCat("ignoring USB device ", name, ": ids \"",
                               absl::CHexEscape(*vendor), ":", absl::CHexEscape(*product),
                               "\" are not 4 lowercase hex digits as the kernel writes them"));
      }
      continue;
    }
    const CoralUsbState state = Classify(*vendor, *product);
    if (state == CoralUsbState::kNone) continue;

    Device device;
    device.id = name;
    device.facts["interface"] = "usb";
    device.facts["usb_port"] = name;
    device.facts["vendor_id"] = *vendor;
    device.facts["product_id"] = *product;
    device.facts["state"] = state == CoralUsbState::kDfu ? "dfu (firmware not loaded)" : "ready";
    absl::StatusOr<std::string> speed = inputs_.ReadAttribute(sys + "/speed", Reread::kUntilRead);
    if (speed.ok()) device.facts["speed_mbps"] = absl::CHexEscape(speed->substr(0, 8));

    std::vector<std::string> problems;
    absl::StatusOr<int64_t> busnum = inputs_.ReadInteger(sys + "/busnum", Reread::kUntilRead);
    absl::StatusOr<int64_t> devnum = inputs_.ReadInteger(sys + "/devnum", Reread::kUntilRead);
    if (!busnum.ok() || !devnum.ok() || *busnum < 1 || *busnum > 999 || *devnum < 1 ||
        *devnum > 127) {
      // No trustworthy node path: the device is listed (it is there) but cannot be allocated.
      problems.push_back(absl::StrCat("cannot tell its device node: busnum/devnum unreadable in ",
                                      sys));
    } else {
      const std::string node = absl::StrFormat("/dev/bus/usb/%03d/%03d", *busnum, *devnum);
      device.nodes.push_back({node, node, "rw"});
      const unsigned want_minor = static_cast<unsigned>((*busnum - 1) * 128 + (*devnum - 1));
      // Announced by inotify on /dev/bus/usb/BBB (WatchPaths): not an input of the probe.
      absl::StatusOr<FileInfo> stat = host_->Stat(node);
      if (!stat.ok()) {
        problems.push_back(absl::StrCat("device node ", node, " is missing"));
        device.problems.push_back({ProblemKind::kDeviceNodeMissing, node});
      } else if (stat->type != FileInfo::Type::kCharDevice || stat->major != kUsbDeviceMajor ||
                 stat->minor != want_minor) {
        problems.push_back(absl::StrFormat("%s is not the character device %u:%u", node,
                                           kUsbDeviceMajor, want_minor));
      }
    }
    if (state == CoralUsbState::kDfu) {
      device.problems.push_back({ProblemKind::kDriverStatus, "firmware-not-loaded"});
      problems.push_back(
          "firmware not loaded (1a6e:089a): run any Edge TPU program on the host once, or "
          "replug it where its firmware is loaded at boot; a container would lose the device "
          "when it re-enumerates");
    }
    SetHealthFromProblems(problems, &device);
    devices.push_back(std::move(device));
  }
  return devices;
}

}  // namespace edgeaccel
