#include "edgeaccel/discovery/tegra.h"

#include <regex>

#include "absl/algorithm/container.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/discovery/resource_names.h"

namespace edgeaccel {
namespace {

constexpr absl::string_view kDevfreqDir = "/sys/class/devfreq";
// /proc/device-tree is a link to the kernel's /sys/firmware/devicetree/base; a container that
// mounts only the host's /sys (the DaemonSet does) sees the device tree at the second place.
constexpr absl::string_view kDeviceTreeDirs[] = {"/proc/device-tree",
                                                 "/sys/firmware/devicetree/base"};
constexpr absl::string_view kGpuNames[] = {"gk20a", "gm20b", "gp10b", "gv11b", "ga10b", "gb10b"};

// Names in /dev that belong to the integrated GPU and its engines.
bool IsTegraGpuNodeName(absl::string_view name) {
  return absl::StartsWith(name, "nvhost-") || name == "nvmap" || name == "host1x-fence" ||
         absl::StartsWith(name, "nvidia") || name == "nvsciipc";
}

}  // namespace

absl::StatusOr<TegraRelease> ParseTegraRelease(absl::string_view text) {
  static const std::regex kLine(
      "# R([0-9]+) \\(release\\), REVISION: ([0-9]+(?:\\.[0-9]+)*),(?: GCID: [0-9]+,)? BOARD: "
      "([A-Za-z0-9_-]+)");
  absl::string_view first = text.substr(0, text.find('\n'));
  std::match_results<absl::string_view::const_iterator> match;
  if (!std::regex_search(first.begin(), first.end(), match, kLine) || match.position(0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not an L4T release line: \"", absl::CHexEscape(first.substr(0, 120)), "\""));
  }
  return TegraRelease{match[1].str(), match[2].str(), match[3].str()};
}

std::optional<std::string> TegraSocFromCompatible(absl::string_view compatible) {
  // Entries are NUL-separated; match whole entries so "nvidia,tegra210" is not found inside
  // another name. Without any NUL (a copy that lost them) fall back to a search.
  static const std::regex kSoc("nvidia,(tegra[0-9]{3})");
  std::match_results<absl::string_view::const_iterator> match;
  for (absl::string_view entry : absl::StrSplit(compatible, '\0', absl::SkipEmpty())) {
    if (std::regex_match(entry.begin(), entry.end(), match, kSoc)) return match[1].str();
  }
  if (compatible.find('\0') == absl::string_view::npos &&
      std::regex_search(compatible.begin(), compatible.end(), match, kSoc)) {
    return match[1].str();
  }
  return std::nullopt;
}

std::optional<TegraGpuModel> TegraGpuForSoc(absl::string_view soc) {
  // CUDA architecture per SoC (jtop's CUDA_TABLE; TK1 from NVIDIA's CUDA GPU list).
  if (soc == "tegra124") return TegraGpuModel{"gk20a", "3.2"};
  if (soc == "tegra210") return TegraGpuModel{"gm20b", "5.3"};
  if (soc == "tegra186") return TegraGpuModel{"gp10b", "6.2"};
  if (soc == "tegra194") return TegraGpuModel{"gv11b", "7.2"};
  if (soc == "tegra234") return TegraGpuModel{"ga10b", "8.7"};
  if (soc == "tegra264") return TegraGpuModel{"gb10b", "11.0"};
  return std::nullopt;
}

TegraGpuDiscoverer::TegraGpuDiscoverer(const Host* host, NvidiaOptions options)
    : host_(host), options_(options) {}

std::string TegraGpuDiscoverer::ResourceName() const { return std::string(kResourceNvidiaGpu); }

std::vector<WatchSpec> TegraGpuDiscoverer::WatchPaths() const {
  std::vector<WatchSpec> specs = {{"/dev", "nv"},
                                  {"/dev", "host1x"},
                                  {"/dev/dri", ""},
                                  {"/dev/nvgpu", ""}};
  absl::StatusOr<std::vector<std::string>> gpus = host_->ListDirectory("/dev/nvgpu");
  if (gpus.ok()) {
    for (const std::string& gpu : *gpus) specs.push_back({absl::StrCat("/dev/nvgpu/", gpu), ""});
  }
  return specs;
}

// The device tree property `name` and the path it was read from.
std::optional<std::pair<std::string, std::string>> TegraGpuDiscoverer::ReadDeviceTree(
    absl::string_view name) const {
  for (absl::string_view dir : kDeviceTreeDirs) {
    std::string path = absl::StrCat(dir, "/", name);
    if (absl::StatusOr<std::string> value = host_->ReadFile(path); value.ok()) {
      return std::make_pair(std::move(path), *std::move(value));
    }
  }
  return std::nullopt;
}

std::string TegraGpuDiscoverer::NothingFoundHint() const {
  return "not a Jetson (no /etc/nv_tegra_release, no Tegra in /sys/devices/soc0/family or "
         "/proc/device-tree/compatible)";
}

std::optional<std::string> TegraGpuDiscoverer::FindDevfreq() const {
  absl::StatusOr<std::vector<std::string>> entries = host_->ListDirectory(kDevfreqDir);
  if (!entries.ok()) return std::nullopt;
  for (const std::string& entry : *entries) {
    // "57000000.gpu" (Nano, R36 Orin), "17000000.gv11b" (Xavier), "17000000.ga10b" (Orin R35).
    absl::string_view suffix = entry;
    size_t dot = entry.rfind('.');
    if (dot != std::string::npos) suffix = absl::string_view(entry).substr(dot + 1);
    bool gpu = suffix == "gpu";
    for (absl::string_view name : kGpuNames) gpu |= suffix == name;
    if (!gpu) {
      absl::StatusOr<std::string> of_name =
          host_->ReadAttribute(absl::StrCat(kDevfreqDir, "/", entry, "/device/of_node/name"));
      gpu = of_name.ok() && (*of_name == "gpu" || absl::c_linear_search(kGpuNames, *of_name));
    }
    if (gpu) return entry;
  }
  return std::nullopt;
}

std::vector<DeviceNode> TegraGpuDiscoverer::GpuNodes() const {
  std::vector<std::string> paths;
  auto add_char_devices = [&](const std::string& dir, auto&& wanted) {
    absl::StatusOr<std::vector<std::string>> names = host_->ListDirectory(dir);
    if (!names.ok()) return;
    for (const std::string& name : *names) {
      if (!wanted(name)) continue;
      const std::string path = absl::StrCat(dir, "/", name);
      absl::StatusOr<FileInfo> info = host_->Stat(path);
      if (info.ok() && info->type == FileInfo::Type::kCharDevice) paths.push_back(path);
    }
  };
  add_char_devices("/dev", IsTegraGpuNodeName);
  add_char_devices("/dev", [](absl::string_view name) { return absl::StartsWith(name, "v4l2-nv"); });
  add_char_devices("/dev/dri", [](absl::string_view name) {
    return absl::StartsWith(name, "renderD") || absl::StartsWith(name, "card");
  });
  absl::StatusOr<std::vector<std::string>> gpus = host_->ListDirectory("/dev/nvgpu");
  if (gpus.ok()) {
    for (const std::string& gpu : *gpus) {
      add_char_devices(absl::StrCat("/dev/nvgpu/", gpu), [](absl::string_view) { return true; });
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<DeviceNode> nodes;
  for (const std::string& path : paths) nodes.push_back({path, path, "rw"});
  return nodes;
}

std::vector<Device> TegraGpuDiscoverer::Scan() {
  std::vector<Device> devices;
  // Identity.
  std::optional<TegraRelease> release;
  if (absl::StatusOr<std::string> text = host_->ReadFile("/etc/nv_tegra_release"); text.ok()) {
    absl::StatusOr<TegraRelease> parsed = ParseTegraRelease(*text);
    if (parsed.ok()) {
      release = *parsed;
    } else {
      log_.Warn(absl::StrCat("/etc/nv_tegra_release: ", parsed.status().message(),
                             "; the L4T release is unknown"));
    }
  }
  std::optional<std::string> soc;
  if (auto compatible = ReadDeviceTree("compatible")) {
    const auto& [path, value] = *compatible;
    if (value.find('\0') == std::string::npos) {
      log_.Warn(absl::StrCat(path, " has no NUL separators (is it a copy?); reading it as one "
                             "string"));
    }
    soc = TegraSocFromCompatible(value);
  }
  std::string family;
  if (absl::StatusOr<std::string> f = host_->ReadAttribute("/sys/devices/soc0/family"); f.ok()) {
    family = *f;
  }
  const bool tegra = release.has_value() || soc.has_value() ||
                     absl::StartsWithIgnoreCase(family, "tegra");
  if (!tegra) return devices;
  if (!soc.has_value() && absl::StartsWithIgnoreCase(family, "tegra") && family.size() == 8) {
    soc = absl::AsciiStrToLower(family);  // "Tegra210" -> "tegra210"
  }

  Device device;
  device.id = absl::StrCat(soc.value_or("tegra"), "-igpu0");
  if (soc.has_value()) device.facts["soc"] = *soc;
  if (release.has_value()) {
    device.facts["l4t_release"] = release->L4t();
    device.facts["l4t_major"] = release->major;
    device.facts["l4t_revision"] = release->revision;
    device.facts["l4t_board"] = release->board;
  }
  if (auto model = ReadDeviceTree("model")) {
    // A device-tree string ends in NUL.
    absl::string_view value = absl::StripLeadingAsciiWhitespace(model->second);
    while (!value.empty() && (value.back() == '\0' || absl::ascii_isspace(value.back()))) {
      value.remove_suffix(1);
    }
    if (!value.empty()) device.facts["model"] = absl::CHexEscape(value.substr(0, 120));
  }
  if (std::optional<TegraGpuModel> gpu = soc.has_value() ? TegraGpuForSoc(*soc) : std::nullopt) {
    device.facts["gpu"] = gpu->name;
    device.facts["compute_capability"] = gpu->compute_capability;
  }
  // The iGPU shares system memory.
  if (absl::StatusOr<std::string> meminfo = host_->ReadFile("/proc/meminfo"); meminfo.ok()) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      int64_t kib;
      if (parts.size() >= 2 && parts[0] == "MemTotal:" && absl::SimpleAtoi(parts[1], &kib)) {
        device.facts["memory_mib"] = absl::StrCat(kib / 1024);
      }
    }
  }

  std::vector<std::string> problems;
  device.nodes = GpuNodes();
  auto has_node = [&](auto&& match) {
    return std::any_of(device.nodes.begin(), device.nodes.end(),
                       [&](const DeviceNode& n) { return match(n.host_path); });
  };
  if (!has_node([](const std::string& p) { return p == "/dev/nvmap"; })) {
    problems.push_back("device node /dev/nvmap is missing");
  }
  if (!has_node([](const std::string& p) {
        return p == "/dev/nvhost-ctrl-gpu" ||
               (absl::StartsWith(p, "/dev/nvgpu/") && absl::EndsWith(p, "/ctrl"));
      })) {
    problems.push_back("GPU control node missing (neither /dev/nvhost-ctrl-gpu nor /dev/nvgpu/*/ctrl)");
  }
  std::optional<std::string> devfreq = FindDevfreq();
  if (!devfreq.has_value()) {
    problems.push_back("GPU devfreq device not found in /sys/class/devfreq (driver not loaded yet?)");
  } else {
    device.facts["devfreq"] = *devfreq;
    absl::StatusOr<int64_t> load =
        host_->ReadInteger(absl::StrCat(kDevfreqDir, "/", *devfreq, "/device/load"));
    if (load.ok() && *load >= 0 && *load <= 1000) {
      device.telemetry["gpu_load_permille"] = static_cast<double>(*load);
    }
  }
  // GPU temperature: the thermal zone typed GPU-therm (R32) or gpu-thermal (R35+). -256 °C
  // means the sensor is off (rail-gated GPU), not a fault.
  if (absl::StatusOr<std::vector<std::string>> zones = host_->ListDirectory("/sys/class/thermal");
      zones.ok()) {
    for (const std::string& zone : *zones) {
      absl::StatusOr<std::string> type =
          host_->ReadAttribute(absl::StrCat("/sys/class/thermal/", zone, "/type"));
      if (!type.ok() || !absl::StartsWithIgnoreCase(*type, "gpu")) continue;
      absl::StatusOr<int64_t> temp =
          host_->ReadInteger(absl::StrCat("/sys/class/thermal/", zone, "/temp"));
      if (temp.ok() && *temp > -40000) {
        device.telemetry["gpu_temperature_celsius"] = static_cast<double>(*temp) / 1000.0;
      }
      break;
    }
  }
  if (options_.runtime_envs) {
    // The NVIDIA runtime on L4T mounts the driver libraries (CSV mode) when these are set.
    device.envs["NVIDIA_VISIBLE_DEVICES"] = "all";
    device.envs["NVIDIA_DRIVER_CAPABILITIES"] = "all";
  }
  SetHealthFromProblems(problems, &device);
  devices.push_back(std::move(device));
  return devices;
}

}  // namespace edgeaccel
