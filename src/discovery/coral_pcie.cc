#include "edgeaccel/discovery/coral_pcie.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/discovery/resource_names.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr absl::string_view kApexClassDir = "/sys/class/apex";
constexpr unsigned kApexMajor = 120;

// "apex_0" .. "apex_255": exactly what gasket names its devices ("%s_%u").
bool ParseApexName(absl::string_view name, unsigned* index) {
  if (!absl::ConsumePrefix(&name, "apex_") || name.empty() || name.size() > 3) return false;
  for (char c : name) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(name, index) && *index <= 255;
}

// "0000:03:00.0": the kernel's dev_name() of a PCI function.
bool IsPciAddress(absl::string_view s) {
  if (s.size() != 12) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == 4 || i == 7) {
      if (c != ':') return false;
    } else if (i == 10) {
      if (c != '.') return false;
    } else if (i == 11) {
      if (c < '0' || c > '7') return false;
    } else if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) {
      return false;
    }
  }
  return true;
}

std::string Celsius(int64_t millidegrees) {
  return absl::StrFormat("%.2f °C", static_cast<double>(millidegrees) / 1000.0);
}

}  // namespace

CoralPcieDiscoverer::CoralPcieDiscoverer(const Host* host, CoralHealthPolicy policy)
    : host_(host), policy_(policy), inputs_(host) {}

std::string CoralPcieDiscoverer::ResourceName() const { return std::string(kResourceEdgeTpu); }

std::vector<WatchSpec> CoralPcieDiscoverer::WatchPaths() const {
  // devtmpfs (/dev) reports node creation and removal; the kernel creates /dev/apex_N after
  // /sys/class/apex/apex_N is complete and removes it first. sysfs itself sends no inotify events
  // (checked on a real kernel: not for new entries, not for changed values), so what only sysfs
  // says (driver status, temperature) is read on the probe.
  return {{"/dev", "apex_"}};
}

std::vector<std::string> CoralPcieDiscoverer::UeventSubsystems() const {
  return {"apex"};  // the driver's class: add and remove of apex_N
}

std::string CoralPcieDiscoverer::NothingFoundHint() const {
  return "no PCIe Edge TPU found (looked for /sys/class/apex/apex_N with /dev/apex_N); "
         "is the gasket/apex driver loaded? (lsmod | grep apex)";
}

std::vector<Device> CoralPcieDiscoverer::Scan() {
  std::vector<Device> devices;
  inputs_.Clear();
  const absl::flat_hash_set<std::string> overheated_before = overheated_;
  absl::StatusOr<std::vector<std::string>> names = inputs_.ListDirectory(kApexClassDir);
  if (!names.ok()) {
    if (!absl::IsNotFound(names.status())) {
      LOG_EVERY_N(WARNING, 100) << "cannot list Edge TPUs: " << names.status().message();
    }
    overheated_.clear();
    overheat_changed_ = overheated_ != overheated_before;
    return devices;
  }
  absl::flat_hash_set<std::string> still_present;
  for (const std::string& name : *names) {
    unsigned index;
    if (!ParseApexName(name, &index)) {
      VLOG(1) << "ignoring " << kApexClassDir << "/" << absl::CHexEscape(name)
              << ": not an apex_N device";
      continue;
    }
    std::optional<Device> device = ScanOne(name);
    if (!device.has_value()) continue;
    still_present.insert(device->id);
    devices.push_back(*std::move(device));
  }
  // Forget overheat state of devices that are gone.
  for (auto it = overheated_.begin(); it != overheated_.end();) {
    if (!still_present.contains(*it)) {
      overheated_.erase(it++);
    } else {
      ++it;
    }
  }
  overheat_changed_ = overheated_ != overheated_before;
  return devices;
}

std::optional<Device> CoralPcieDiscoverer::ScanOne(const std::string& name) {
  const std::string sys = absl::StrCat(kApexClassDir, "/", name);
  const std::string node_path = absl::StrCat("/dev/", name);
  Device device;
  std::vector<std::string> problems;

  device.facts["device"] = name;
  device.facts["interface"] = "pcie";
  // Which device the entry is: the kernel makes the class entry with the device, so a device
  // removed and added again under the same name has a new one. What describes the device (its
  // ids, PCI address, NUMA node, major:minor, driver versions) is fixed while it is the same.
  using Reread = ScanInputs::Reread;
  (void)inputs_.Lstat(sys);
  absl::StatusOr<std::string> pci = inputs_.ReadAttribute(sys + "/pci_address", Reread::kUntilRead);
  if (absl::IsNotFound(pci.status()) || absl::IsAborted(pci.status())) {
    // Every gasket device has pci_address, so its absence means the kernel is tearing this
    // device down (the class entry outlives its tree for a moment), and an attribute replaced
    // while being read means it was removed and added again. Reporting it now would advertise a
    // made-up id ("apex_1"); the event that re-adds it brings another scan.
    VLOG(1) << sys << ": vanished or re-created while being read; skipped this scan";
    return std::nullopt;
  }
  if (pci.ok() && IsPciAddress(*pci)) {
    device.id = *pci;
    device.facts["pci_address"] = *pci;
  } else {
    // Without a PCI address the driver index is the most stable name we have.
    device.id = name;
  }
  for (const char* attr : {"driver_version", "framework_version"}) {
    absl::StatusOr<std::string> value =
        inputs_.ReadAttribute(absl::StrCat(sys, "/", attr), Reread::kUntilRead);
    if (value.ok() && !value->empty()) device.facts[attr] = *value;
  }
  for (const auto& [attr, fact] : {std::pair<const char*, const char*>{"vendor", "vendor_id"},
                                   {"device", "product_id"}}) {
    absl::StatusOr<std::string> value =
        inputs_.ReadAttribute(absl::StrCat(sys, "/device/", attr), Reread::kUntilRead);
    if (value.ok()) device.facts[fact] = std::string(absl::StripPrefix(*value, "0x"));
  }
  // NUMA node of the PCI function; -1 means the platform has no NUMA information.
  absl::StatusOr<int64_t> numa = inputs_.ReadInteger(sys + "/device/numa_node", Reread::kUntilRead);
  if (numa.ok() && *numa >= 0 && *numa < 1024) device.numa_node = static_cast<int>(*numa);

  device.nodes.push_back({node_path, node_path, "rw"});

  // 1. The device node: present, a character device, and the one the driver registered. Its
  // changes come as inotify events on /dev (WatchPaths), so it is not an input of the probe.
  absl::StatusOr<FileInfo> node = host_->Stat(node_path);
  if (!node.ok()) {
    if (absl::IsNotFound(node.status())) {
      device.problems.push_back({ProblemKind::kDeviceNodeMissing, node_path});
    }
    problems.push_back(absl::IsNotFound(node.status())
                           ? absl::StrCat("device node ", node_path, " is missing")
                           : std::string(node.status().message()));
  } else if (node->type != FileInfo::Type::kCharDevice) {
    problems.push_back(absl::StrCat(node_path, " is ", FileTypeName(node->type),
                                    ", not a character device"));
  } else {
    unsigned want_major = kApexMajor, want_minor = 0;
    bool have_want = false;
    absl::StatusOr<std::string> dev = inputs_.ReadAttribute(sys + "/dev", Reread::kUntilRead);
    if (dev.ok()) {
      std::pair<std::string, std::string> mm = absl::StrSplit(*dev, absl::MaxSplits(':', 1));
      have_want = absl::SimpleAtoi(mm.first, &want_major) && absl::SimpleAtoi(mm.second, &want_minor);
    }
    if (have_want && (node->major != want_major || node->minor != want_minor)) {
      problems.push_back(absl::StrFormat(
          "%s is %u:%u but the driver registered %u:%u (stale device node)", node_path,
          node->major, node->minor, want_major, want_minor));
    } else if (!have_want && node->major != kApexMajor) {
      problems.push_back(absl::StrFormat("%s has major %u, not the apex driver's %u", node_path,
                                         node->major, kApexMajor));
    }
  }

  // 2. Driver status: ALIVE is the only usable state (DEAD, LAMED, DRIVER_EXITING are not).
  absl::StatusOr<std::string> status = inputs_.ReadAttribute(sys + "/status");
  if (!status.ok()) {
    problems.push_back(absl::StrCat("cannot read driver status: ", status.status().message()));
    device.problems.push_back({ProblemKind::kDriverStatus, "unreadable"});
  } else {
    device.facts["status"] = absl::CHexEscape(status->substr(0, 32));
    if (*status != "ALIVE") {
      problems.push_back(absl::StrCat("driver reports status ", device.facts["status"]));
      device.problems.push_back({ProblemKind::kDriverStatus, device.facts["status"]});
    }
  }

  // 3. Die temperature against the threshold. An unreadable temperature does not make the
  // device unusable, but it is worth a log line: we cannot protect it from overheating.
  absl::StatusOr<int64_t> temp = inputs_.ReadInteger(sys + "/temp");
  // The driver's temperature lines, each read once: the shutdown line (hw_temp_warn2) is the
  // default threshold, and all of them are telemetry. They change only when root writes them:
  // the probe compares them once a minute.
  std::vector<std::pair<const char*, absl::StatusOr<int64_t>>> lines;
  for (const char* attr : {"trip_point0_temp", "trip_point1_temp", "trip_point2_temp",
                           "hw_temp_warn1", "hw_temp_warn2"}) {
    lines.emplace_back(attr,
                       inputs_.ReadInteger(absl::StrCat(sys, "/", attr), Reread::kSetting));
  }
  int64_t threshold = kApexDefaultShutdownTempMc;
  if (policy_.temperature_threshold_mc.has_value()) {
    threshold = *policy_.temperature_threshold_mc;
  } else if (const absl::StatusOr<int64_t>& own = lines.back().second; own.ok()) {
    // The driver's shutdown line can be set to anything the chip's ADC encodes (about -90 to
    // 166 °C). One that no one would choose (0, a value above what silicon survives) would
    // mark a healthy TPU Unhealthy, or never protect it: ignored, with a warning.
    if (*own >= kMinPlausibleShutdownTempMc && *own <= kMaxPlausibleShutdownTempMc) {
      threshold = *own;
    } else {
      log_.Warn(absl::StrCat(sys, "/hw_temp_warn2 is ", Celsius(*own), ", outside ",
                             Celsius(kMinPlausibleShutdownTempMc), " to ",
                             Celsius(kMaxPlausibleShutdownTempMc), "; using ",
                             Celsius(kApexDefaultShutdownTempMc),
                             " (the driver's default) instead. Set --temperature-threshold "
                             "to choose one."));
    }
  }
  device.telemetry["temperature_threshold_celsius"] = static_cast<double>(threshold) / 1000.0;
  for (const auto& [attr, value] : lines) {
    if (value.ok()) device.telemetry[absl::StrCat(attr, "_celsius")] = *value / 1000.0;
  }
  if (!temp.ok()) {
    device.facts[std::string(kTemperatureFact)] =
        absl::StrCat("unknown (", temp.status().message(), ")");
    // Keep what we knew: a device that was too hot stays Unhealthy until a reading says
    // otherwise.
    if (overheated_.contains(device.id)) {
      problems.push_back(absl::StrCat("was over the temperature threshold, and the temperature "
                                      "cannot be read now: ", temp.status().message()));
      device.problems.push_back({ProblemKind::kTemperature, "unreadable"});
    }
  } else {
    device.telemetry["temperature_celsius"] = static_cast<double>(*temp) / 1000.0;
    device.facts[std::string(kTemperatureFact)] = Celsius(*temp);
    const bool was_hot = overheated_.contains(device.id);
    const bool hot = was_hot ? *temp > threshold - policy_.temperature_hysteresis_mc
                             : *temp >= threshold;
    if (hot) {
      overheated_.insert(device.id);
      problems.push_back(absl::StrCat("temperature ", Celsius(*temp), " is at or above ",
                                      Celsius(threshold),
                                      was_hot ? " (less the hysteresis)" : ""));
      // The threshold, not the reading: a detail that changes with every scan would rewrite
      // the ResourceSlice on every scan.
      device.problems.push_back(
          {ProblemKind::kTemperature, absl::StrFormat("threshold-%gC", threshold / 1000.0)});
    } else {
      overheated_.erase(device.id);
    }
  }

  SetHealthFromProblems(problems, &device);
  return device;
}

}  // namespace edgeaccel
