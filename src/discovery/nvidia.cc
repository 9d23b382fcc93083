#include "edgeaccel/discovery/nvidia.h"

#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "edgeaccel/discovery/resource_names.h"

namespace edgeaccel {
namespace {

constexpr absl::string_view kGpusDir = "/proc/driver/nvidia/gpus";
constexpr unsigned kNvidiaMajor = 195;
// Control nodes a CUDA container needs besides its GPU's node, when the host has them.
constexpr absl::string_view kControlNodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                               "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"};

bool IsGpuUuid(absl::string_view s) {
  static const std::regex kUuid(
      "GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}");
  return std::regex_match(s.begin(), s.end(), kUuid);
}

bool IsPciAddress(absl::string_view s) {
  static const std::regex kPci("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]");
  return std::regex_match(s.begin(), s.end(), kPci);
}

}  // namespace

std::map<std::string, std::string> ParseNvidiaInformation(absl::string_view text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    std::string key(absl::StripAsciiWhitespace(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (!key.empty()) out.emplace(std::move(key), std::move(value));
  }
  return out;
}

absl::StatusOr<std::string> ParseNvidiaDriverVersion(absl::string_view text) {
  static const std::regex kVersion("Kernel Module(?: for [A-Za-z0-9_]+)?\\s+([0-9]+(?:\\.[0-9]+)+)");
  std::match_results<absl::string_view::const_iterator> match;
  absl::string_view first_line = text.substr(0, text.find('\n'));
  if (!std::regex_search(first_line.begin(), first_line.end(), match, kVersion)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no driver version in \"", absl::CHexEscape(first_line.substr(0, 120)), "\""));
  }
  return match[1].str();
}

NvidiaGpuDiscoverer::NvidiaGpuDiscoverer(const Host* host, NvidiaOptions options,
                                         GpuFactSource* facts)
    : host_(host),
      options_(options),
      facts_(facts),
      inputs_(host),
      libraries_(host, DriverLibraryOptions{options_.driver_capabilities, options_.driver_library_dir}) {}

bool NvidiaGpuDiscoverer::InputsUnchanged() {
  return !counting_down_ && inputs_.Unchanged();
}

std::vector<std::string> NvidiaGpuDiscoverer::Remarks() const {
  return facts_ != nullptr ? facts_->Remarks() : std::vector<std::string>{};
}

std::string NvidiaGpuDiscoverer::ResourceName() const { return std::string(kResourceNvidiaGpu); }

std::vector<WatchSpec> NvidiaGpuDiscoverer::WatchPaths() const {
  // /proc has no inotify; the driver creates and removes /dev/nvidiaN (via nvidia-modprobe or
  // udev) together with its /proc entries, and the probe interval covers the rest.
  return {{"/dev", "nvidia"}};
}

std::vector<std::string> NvidiaGpuDiscoverer::UeventSubsystems() const {
  return {"pci"};  // the driver binding to (or leaving) a GPU
}

std::string NvidiaGpuDiscoverer::NothingFoundHint() const {
  return "no discrete NVIDIA GPU found (looked for /proc/driver/nvidia/gpus/*/information); is "
         "the nvidia kernel module loaded?";
}

std::string NvidiaGpuDiscoverer::StaleHostView() const {
  absl::MutexLock lock(&stale_mu_);
  return stale_;
}

std::vector<Device> NvidiaGpuDiscoverer::Scan() {
  std::vector<Device> devices;
  inputs_.Clear();
  counting_down_ = false;
  // The DaemonSet bind-mounts the host's /proc/driver/nvidia. When the driver is unloaded or
  // reloaded, that mount keeps the old, removed directory: it is still there but empty (the live
  // one always holds "version"), or deleted outright (no links). The GPUs would simply vanish
  // from a pod whose view can never come back; say so, and fail /healthz so it is restarted.
  std::string stale;
  absl::StatusOr<FileInfo> dir = inputs_.Stat("/proc/driver/nvidia");
  if (dir.ok() && dir->type == FileInfo::Type::kDirectory &&
      (dir->links == 0 || absl::IsNotFound(inputs_.Stat("/proc/driver/nvidia/version").status()))) {
    stale = "/proc/driver/nvidia is a stale mount (the NVIDIA driver was unloaded or reloaded "
            "since this pod started): restart the pod for a fresh one";
  }
  {
    absl::MutexLock lock(&stale_mu_);
    stale_ = stale;
  }
  if (!stale.empty()) log_.Warn(stale);  // once /healthz says it too
  if (!stale.empty()) return devices;
  // No driver: its GPUs directory is not there either (not looked at: the probe need not either).
  if (absl::IsNotFound(dir.status())) return devices;
  absl::StatusOr<std::vector<std::string>> buses = inputs_.ListDirectory(kGpusDir);
  if (!buses.ok()) return devices;  // no driver: nothing to say beyond the start-up hint
  std::string driver_version;
  absl::StatusOr<std::string> version_text = inputs_.ReadFile("/proc/driver/nvidia/version");
  if (version_text.ok()) {
    absl::StatusOr<std::string> version = ParseNvidiaDriverVersion(*version_text);
    if (version.ok()) {
      driver_version = *version;
    } else {
      log_.Warn(absl::StrCat("/proc/driver/nvidia/version: ", version.status().message()));
    }
  }
  for (const std::string& bus : *buses) {
    std::optional<Device> device = ScanOne(bus, driver_version);
    if (device.has_value()) devices.push_back(std::move(*device));
  }
  if (options_.driver_libraries && !devices.empty()) {
    // One driver serves every GPU: each gets the same files.
    DriverFiles files = libraries_.Find(driver_version, &inputs_);
    for (Device& device : devices) device.mounts = files.mounts;
  }
  if (facts_ != nullptr) facts_->Amend(&devices);
  for (const Device& device : devices) {
    for (const HealthProblem& problem : device.problems) {
      counting_down_ |= problem.kind == ProblemKind::kNvmlXid;
    }
  }
  return devices;
}

std::optional<Device> NvidiaGpuDiscoverer::ScanOne(const std::string& bus,
                                                   const std::string& driver_version) {
  // Which GPU the entry is: the driver makes it when it binds the GPU, and anew when it binds it
  // again. What `information` says is fixed while the GPU stays bound (the exclusion too: the
  // driver decides it as it binds the GPU, from NVreg_ExcludedGpus), and reading it is not
  // free: every read asks the driver's resource manager (the GSP firmware on recent GPUs) for
  // the UUID, VBIOS and firmware versions, and takes a power reference that wakes a GPU in
  // runtime D3. So it is read once per binding, not on every probe.
  const std::string entry = absl::StrCat(kGpusDir, "/", bus);
  (void)inputs_.Lstat(entry);
  const std::string info_path = absl::StrCat(entry, "/information");
  absl::StatusOr<std::string> text =
      inputs_.ReadFile(info_path, 64 * 1024, ScanInputs::Reread::kUntilRead);
  if (!text.ok()) {
    log_.Warn(absl::StrCat("ignoring GPU ", absl::CHexEscape(bus), ": ", text.status().message()));
    return std::nullopt;
  }
  std::map<std::string, std::string> info = ParseNvidiaInformation(*text);
  // Without these we cannot name the device or its node: never make one up.
  const std::string& uuid = info["GPU UUID"];
  const std::string& minor_text = info["Device Minor"];
  unsigned minor = 0;
  std::vector<std::string> missing;
  if (!IsGpuUuid(uuid)) missing.push_back("\"GPU UUID\"");
  if (!absl::SimpleAtoi(minor_text, &minor) || minor > 254) missing.push_back("\"Device Minor\"");
  if (!missing.empty()) {
    log_.Warn(absl::StrCat("ignoring GPU ", absl::CHexEscape(bus), ": ", info_path,
                           " lacks a valid ", absl::StrJoin(missing, " and ")));
    return std::nullopt;
  }
  Device device;
  device.id = uuid;
  device.facts["uuid"] = uuid;
  device.facts["minor"] = minor_text;
  if (!info["Model"].empty()) device.facts["model"] = info["Model"];
  if (!info["Video BIOS"].empty()) device.facts["video_bios"] = info["Video BIOS"];
  if (!driver_version.empty()) device.facts["driver_version"] = driver_version;
  std::string pci = absl::AsciiStrToLower(info["Bus Location"]);
  if (!IsPciAddress(pci)) pci = IsPciAddress(bus) ? bus : "";
  if (!pci.empty()) {
    device.facts["pci_address"] = pci;
    absl::StatusOr<int64_t> numa = inputs_.ReadInteger(
        absl::StrCat("/sys/bus/pci/devices/", pci, "/numa_node"), ScanInputs::Reread::kUntilRead);
    if (numa.ok() && *numa >= 0 && *numa < 1024) device.numa_node = static_cast<int>(*numa);
  }

  std::vector<std::string> problems;
  const std::string node = absl::StrCat("/dev/nvidia", minor);
  // The device nodes are announced by inotify on /dev (WatchPaths): not inputs of the probe.
  absl::StatusOr<FileInfo> stat = host_->Lstat(node);  // a symlink is never a device node
  if (!stat.ok()) {
    problems.push_back(absl::StrCat("device node ", node, " is missing"));
    device.problems.push_back({ProblemKind::kDeviceNodeMissing, node});
  } else if (stat->type != FileInfo::Type::kCharDevice || stat->major != kNvidiaMajor ||
             stat->minor != minor) {
    problems.push_back(absl::StrFormat("%s is not the character device %u:%u", node, kNvidiaMajor,
                                       minor));
  }
  device.nodes.push_back({node, node, "rw"});
  for (absl::string_view control : kControlNodes) {
    absl::StatusOr<FileInfo> control_stat = host_->Lstat(control);
    if (control_stat.ok() && control_stat->type == FileInfo::Type::kCharDevice) {
      device.nodes.push_back({std::string(control), std::string(control), "rw"});
    } else if (control == "/dev/nvidiactl") {
      problems.push_back("control node /dev/nvidiactl is missing");
      device.problems.push_back({ProblemKind::kDeviceNodeMissing, "/dev/nvidiactl"});
    }
  }
  if (absl::EqualsIgnoreCase(info["GPU Excluded"], "Yes")) {
    problems.push_back("the driver reports the GPU as excluded");
    device.problems.push_back({ProblemKind::kDriverStatus, "excluded"});
  }
  if (options_.runtime_envs) {
    device.envs["NVIDIA_VISIBLE_DEVICES"] = uuid;
    device.envs["NVIDIA_DRIVER_CAPABILITIES"] = DriverCapabilitiesText(options_.driver_capabilities);
  }
  SetHealthFromProblems(problems, &device);
  return device;
}

}  // namespace edgeaccel
