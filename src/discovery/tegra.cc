#include "edgeaccel/discovery/tegra.h"

#include <regex>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
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

// What a /dev entry is to the integrated GPU, judged by its name, and how the kernel must have
// registered it for the name to be believed. Sources: the nvgpu, nvhost, nvmap, host1x-fence and
// tegra_dc drivers in NVIDIA's L4T kernels (R32, R35, R36), NVIDIA's devices.csv for R36, and the
// node sets nvidia-ctk lists on real boards (docs/tegra-device-nodes.md has the details).
enum class NodeRole { kNone, kCompute, kDisplay };

struct NodeRule {
  NodeRole role = NodeRole::kNone;
  // /proc/devices names the node's major may have; empty: not known, not checked. kGpuRegion
  // stands for the GPU platform device's name ("57000000.gpu"), which nvgpu registers under.
  std::vector<std::string> regions;
  // Made by device_create, so /sys/dev/char/M:m names it (DEVNAME). False for nodes made with
  // mknod by a helper (nvidia-modprobe, a udev RUN rule).
  bool kernel_named = true;
  // A fixed major:minor, where the node is a stand-in (JetPack's v4l2 codec markers are c 1 3).
  std::optional<std::pair<unsigned, unsigned>> fixed;
};

NodeRule Rule(NodeRole role, std::vector<std::string> regions, bool kernel_named = true,
              std::optional<std::pair<unsigned, unsigned>> fixed = std::nullopt) {
  NodeRule rule;
  rule.role = role;
  rule.regions = std::move(regions);
  rule.kernel_named = kernel_named;
  rule.fixed = fixed;
  return rule;
}

constexpr absl::string_view kGpuRegion = "<gpu>";
constexpr absl::string_view kEngines[] = {"vic", "nvdec", "msenc", "nvenc", "nvjpg",
                                          "ofa", "nvdla", "pva"};

NodeRule RuleFor(absl::string_view name, absl::string_view soc) {
  const bool thor = soc == "tegra264";  // its iGPU runs on OpenRM: /dev/nvidia* are compute
  auto digits = [](absl::string_view s) {
    return !s.empty() && absl::c_all_of(s, [](char c) { return absl::ascii_isdigit(c); });
  };
  NodeRule rule;
  if (name == "nvmap") {
    rule = Rule(NodeRole::kCompute, {"misc"});
  } else if (absl::StartsWith(name, "nvgpu/igpu") ||
             (absl::StartsWith(name, "nvhost-") && absl::EndsWith(name, "-gpu")) ||
             name == "nvhost-gpu") {
    rule = Rule(NodeRole::kCompute, {std::string(kGpuRegion)});
  } else if (name == "nvhost-ctrl") {
    rule = Rule(NodeRole::kCompute, {"nvhost"});
  } else if (absl::StartsWith(name, "nvhost-")) {
    absl::string_view engine = absl::StripPrefix(absl::StripPrefix(name, "nvhost-"), "ctrl-");
    for (absl::string_view known : kEngines) {
      if (absl::StartsWith(engine, known) && digits(engine.substr(known.size())) ==
                                                 (engine.size() > known.size())) {
        rule = Rule(NodeRole::kCompute, {"nvhost"});
      }
    }
  } else if (name == "host1x-fence") {
    rule = Rule(NodeRole::kCompute, {"host1x-fence"});
  } else if (name == "nvsciipc") {
    rule = Rule(NodeRole::kCompute, {});  // its driver's region name is not known: DEVNAME decides
  } else if (absl::StartsWith(name, "dri/renderD") && digits(name.substr(11))) {
    rule = Rule(NodeRole::kCompute, {"drm"});
  } else if (name == "v4l2-nvenc" || name == "v4l2-nvdec") {
    rule = Rule(NodeRole::kCompute, {"mem"}, false, std::make_pair(1u, 3u));
  } else if (absl::StartsWith(name, "dri/card") && digits(name.substr(8))) {
    rule = Rule(NodeRole::kDisplay, {"drm"});
  } else if (absl::StartsWith(name, "fb") && digits(name.substr(2))) {
    rule = Rule(NodeRole::kDisplay, {"fb"});
  } else if (absl::StartsWith(name, "tegra_dc_")) {
    rule = Rule(NodeRole::kDisplay, {"tegra_dc_ext"});
  } else if (name == "nvidia-modeset") {
    rule = Rule(NodeRole::kDisplay, {"nvidia-frontend", "nvidia"}, false);
  } else if (name == "nvidiactl" || (absl::StartsWith(name, "nvidia") && digits(name.substr(6)))) {
    // Orin's nvidia.ko is its display driver (NVIDIA calls it "the iGPU display kernel driver").
    rule = Rule(thor ? NodeRole::kCompute : NodeRole::kDisplay, {"nvidia-frontend", "nvidia"}, false);
  } else if (thor && (name == "nvidia-uvm" || name == "nvidia-uvm-tools")) {
    rule = Rule(NodeRole::kCompute, {"nvidia-uvm"}, false);
  }
  return rule;
}

// Character-device majors and the names their drivers registered, from /proc/devices.
absl::flat_hash_map<unsigned, std::string> CharacterMajors(absl::string_view text) {
  absl::flat_hash_map<unsigned, std::string> majors;
  bool characters = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line == "Character devices:") {
      characters = true;
      continue;
    }
    if (line.empty() || line == "Block devices:") {
      characters = false;
      continue;
    }
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    unsigned major;
    if (characters && parts.size() == 2 && absl::SimpleAtoi(parts[0], &major)) {
      majors[major] = std::string(parts[1]);
    }
  }
  return majors;
}

// The lines of /proc/meminfo whose first word is "MemTotal:".
std::string MemTotalLines(absl::string_view meminfo) {
  std::vector<absl::string_view> kept;
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!parts.empty() && parts[0] == "MemTotal:") kept.push_back(line);
  }
  return absl::StrJoin(kept, "\n");
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
    : host_(host), options_(options), inputs_(host), host_files_(host) {}

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
    absl::string_view name) {
  for (absl::string_view dir : kDeviceTreeDirs) {
    std::string path = absl::StrCat(dir, "/", name);
    if (absl::StatusOr<std::string> value =
            inputs_.ReadFile(path, 64 * 1024, ScanInputs::Reread::kFixedAtBoot);
        value.ok()) {
      return std::make_pair(std::move(path), *std::move(value));
    }
  }
  return std::nullopt;
}

std::string TegraGpuDiscoverer::NothingFoundHint() const {
  return "not a Jetson (no /etc/nv_tegra_release, no Tegra in /sys/devices/soc0/family or "
         "/proc/device-tree/compatible)";
}

std::optional<std::string> TegraGpuDiscoverer::FindDevfreq() {
  absl::StatusOr<std::vector<std::string>> entries = inputs_.ListDirectory(kDevfreqDir);
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
          inputs_.ReadAttribute(absl::StrCat(kDevfreqDir, "/", entry, "/device/of_node/name"));
      gpu = of_name.ok() && (*of_name == "gpu" || absl::c_linear_search(kGpuNames, *of_name));
    }
    if (gpu) return entry;
  }
  return std::nullopt;
}

std::vector<DeviceNode> TegraGpuDiscoverer::GpuNodes(absl::string_view soc,
                                                     const std::optional<std::string>& devfreq,
                                                     bool discrete_gpu,
                                                     const std::vector<std::string>* listed) {
  // Candidates by name: what the container file lists name, or else /dev, /dev/dri and
  // /dev/nvgpu/igpu*.
  std::vector<std::string> names;
  auto list = [&](const std::string& dir, absl::string_view prefix) {
    absl::StatusOr<std::vector<std::string>> entries = inputs_.ListDirectory(dir);
    if (!entries.ok()) return;
    for (const std::string& entry : *entries) names.push_back(absl::StrCat(prefix, entry));
  };
  if (listed != nullptr) {
    for (const std::string& path : *listed) {
      if (absl::StartsWith(path, "/dev/")) names.push_back(path.substr(5));
    }
  } else {
    list("/dev", "");
    list("/dev/dri", "dri/");
    if (absl::StatusOr<std::vector<std::string>> gpus = inputs_.ListDirectory("/dev/nvgpu"); gpus.ok()) {
      for (const std::string& gpu : *gpus) {
        if (absl::StartsWith(gpu, "igpu")) list(absl::StrCat("/dev/nvgpu/", gpu), absl::StrCat("nvgpu/", gpu, "/"));
      }
    }
  }

  std::optional<absl::flat_hash_map<unsigned, std::string>> majors;
  absl::StatusOr<std::string> proc_devices = inputs_.ReadFile("/proc/devices");
  // Verdicts hold while the node is the same file and the drivers' majors are unchanged (a module
  // reload re-registers them): then only the lstat is repeated on each probe.
  const std::string registered = proc_devices.ok() ? *proc_devices : std::string();
  if (registered != verdicts_registered_) {
    verdicts_.clear();
    verdicts_registered_ = registered;
  }
  if (absl::StatusOr<std::string>& text = proc_devices; text.ok()) {
    majors = CharacterMajors(*text);
  } else {
    log_.Warn(absl::StrCat("cannot read /proc/devices (", text.status().message(),
                           "); Jetson device nodes are checked by their sysfs name only"));
  }
  const bool sysfs_dev = inputs_.Exists("/sys/dev/char");
  if (!sysfs_dev) {
    log_.Warn("/sys/dev/char is missing (is the host's /sys mounted?); Jetson device nodes are "
              "checked by their driver's major only");
  }
  auto gpu_region = [&](absl::string_view region) {
    if (devfreq.has_value()) return region == *devfreq;  // devfreq is named after the device too
    absl::string_view suffix = region.substr(std::min(region.size(), region.rfind('.') + 1));
    return suffix == "gpu" || absl::c_linear_search(kGpuNames, suffix);
  };

  std::vector<std::string> paths;
  for (const std::string& name : names) {
    NodeRule rule = RuleFor(name, soc);
    if (rule.role == NodeRole::kNone) {
      if (listed == nullptr) continue;
      // Named by NVIDIA's list for this L4T (a camera or PVA node no rule here knows): the list
      // vouches for what it is; it must still be a character device.
      rule = Rule(NodeRole::kCompute, {}, /*kernel_named=*/false);
    }
    if (rule.role == NodeRole::kDisplay && !options_.display_nodes) continue;
    const bool nvidia_ko = absl::StartsWith(name, "nvidia");
    if (nvidia_ko && discrete_gpu) continue;  // the discrete GPU's nodes, never the iGPU's
    const std::string path = absl::StrCat("/dev/", name);
    auto refuse = [&](absl::string_view why) {
      log_.Warn(absl::StrCat("not handing out ", path, " with the integrated GPU: ", why));
    };
    absl::StatusOr<FileInfo> info = inputs_.Lstat(path);
    if (!info.ok()) continue;  // gone since the listing
    if (info->type != FileInfo::Type::kCharDevice) {
      refuse(absl::StrCat("it is ", FileTypeName(info->type),
                          info->type == FileInfo::Type::kSymlink ? ", which is never followed" : "",
                          ", not a character device"));
      continue;
    }
    const std::string numbers = absl::StrCat(info->major, ":", info->minor);
    // Only passes are remembered: a refusal may come from a read that fails for a while (no fd
    // to spare), and is looked at again on the next scan (logged once all the same).
    const std::string key = absl::StrCat(name, " ", numbers, " ", info->inode, " ",
                                         options_.display_nodes, discrete_gpu, sysfs_dev, " ",
                                         devfreq.value_or(""));
    if (verdicts_.contains(key)) {
      paths.push_back(path);
      continue;
    }
    if (rule.fixed.has_value()) {
      if (std::make_pair(info->major, info->minor) != *rule.fixed) {
        refuse(absl::StrFormat("it is %s; this stand-in node is always %u:%u", numbers,
                               rule.fixed->first, rule.fixed->second));
        continue;
      }
      verdicts_.insert(key);
      paths.push_back(path);
      continue;
    }
    if (majors.has_value() && !rule.regions.empty()) {
      auto region = majors->find(info->major);
      if (region == majors->end()) {
        refuse(absl::StrCat("its major ", info->major, " is not registered in /proc/devices"));
        continue;
      }
      const bool expected = absl::c_any_of(rule.regions, [&](const std::string& want) {
        return want == kGpuRegion ? gpu_region(region->second) : want == region->second;
      });
      if (!expected) {
        refuse(absl::StrCat("its major ", info->major, " belongs to \"", region->second,
                            "\" (/proc/devices), not to the driver that makes this node"));
        continue;
      }
    }
    if (rule.kernel_named && sysfs_dev) {
      absl::StatusOr<std::string> uevent =
          inputs_.ReadFile(absl::StrCat("/sys/dev/char/", numbers, "/uevent"));
      if (!uevent.ok()) {
        refuse(absl::StrCat("the kernel has no device ", numbers, " (/sys/dev/char/", numbers, ")"));
        continue;
      }
      std::string devname;
      for (absl::string_view line : absl::StrSplit(*uevent, '\n')) {
        if (absl::ConsumePrefix(&line, "DEVNAME=")) devname = std::string(line);
      }
      if (devname != name) {
        refuse(absl::StrCat("the kernel's device ", numbers, " is /dev/", devname.empty() ? "?" : devname));
        continue;
      }
    }
    if (nvidia_ko && info->major != 195) {
      refuse(absl::StrCat("its major is ", info->major, ", not the NVIDIA driver's 195"));
      continue;
    }
    verdicts_.insert(key);
    paths.push_back(path);
  }
  std::sort(paths.begin(), paths.end());
  std::vector<DeviceNode> nodes;
  for (const std::string& path : paths) nodes.push_back({path, path, "rw"});
  return nodes;
}

std::vector<Device> TegraGpuDiscoverer::Scan() {
  std::vector<Device> devices;
  inputs_.Clear();
  // Identity.
  std::optional<TegraRelease> release;
  if (absl::StatusOr<std::string> text = inputs_.ReadFile("/etc/nv_tegra_release"); text.ok()) {
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
  if (absl::StatusOr<std::string> f =
          inputs_.ReadAttribute("/sys/devices/soc0/family", ScanInputs::Reread::kFixedAtBoot);
      f.ok()) {
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
  // The iGPU shares system memory. Only its MemTotal lines are an input: the rest of
  // /proc/meminfo changes all the time.
  if (absl::StatusOr<std::string> meminfo = inputs_.ReadPart("/proc/meminfo", MemTotalLines);
      meminfo.ok()) {
    for (absl::string_view line : absl::StrSplit(*meminfo, '\n')) {
      std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      int64_t kib;
      if (parts.size() >= 2 && parts[0] == "MemTotal:" && absl::SimpleAtoi(parts[1], &kib)) {
        device.facts["memory_mib"] = absl::StrCat(kib / 1024);
      }
    }
  }

  // A discrete NVIDIA GPU beside the iGPU (an IGX board in dGPU mode): its driver lists it here.
  // Not on Thor, whose iGPU itself runs on that driver (OpenRM) and is likely listed there too.
  absl::StatusOr<std::vector<std::string>> discrete = inputs_.ListDirectory("/proc/driver/nvidia/gpus");
  const bool discrete_gpu = soc != "tegra264" && discrete.ok() && !discrete->empty();

  std::vector<std::string> problems;
  std::optional<std::string> devfreq = FindDevfreq();
  TegraHostFiles host_files;
  if (options_.driver_libraries) host_files = host_files_.Read(&inputs_);
  device.nodes = GpuNodes(soc.value_or(""), devfreq, discrete_gpu,
                          host_files.listed ? &host_files.device_paths : nullptr);
  device.mounts = std::move(host_files.mounts);
  auto has_node = [&](auto&& match) {
    return std::any_of(device.nodes.begin(), device.nodes.end(),
                       [&](const DeviceNode& n) { return match(n.host_path); });
  };
  if (!has_node([](const std::string& p) { return p == "/dev/nvmap"; })) {
    problems.push_back("device node /dev/nvmap is missing");
    device.problems.push_back({ProblemKind::kDeviceNodeMissing, "/dev/nvmap"});
  }
  if (!has_node([](const std::string& p) {
        return p == "/dev/nvhost-ctrl-gpu" ||
               (absl::StartsWith(p, "/dev/nvgpu/") && absl::EndsWith(p, "/ctrl"));
      })) {
    problems.push_back("GPU control node missing (neither /dev/nvhost-ctrl-gpu nor /dev/nvgpu/*/ctrl)");
    device.problems.push_back({ProblemKind::kDeviceNodeMissing, "/dev/nvhost-ctrl-gpu"});
  }
  if (!devfreq.has_value()) {
    problems.push_back("GPU devfreq device not found in /sys/class/devfreq (driver not loaded yet?)");
    device.problems.push_back({ProblemKind::kDriverStatus, "devfreq-missing"});
  } else {
    device.facts["devfreq"] = *devfreq;
    absl::StatusOr<int64_t> load =
        inputs_.ReadInteger(absl::StrCat(kDevfreqDir, "/", *devfreq, "/device/load"));
    if (load.ok() && *load >= 0 && *load <= 1000) {
      device.telemetry["gpu_load_permille"] = static_cast<double>(*load);
    }
  }
  // GPU temperature: the thermal zone typed GPU-therm (R32) or gpu-thermal (R35+). -256 °C
  // means the sensor is off (rail-gated GPU), not a fault.
  if (absl::StatusOr<std::vector<std::string>> zones = inputs_.ListDirectory("/sys/class/thermal");
      zones.ok()) {
    for (const std::string& zone : *zones) {
      absl::StatusOr<std::string> type =
          inputs_.ReadAttribute(absl::StrCat("/sys/class/thermal/", zone, "/type"));
      if (!type.ok() || !absl::StartsWithIgnoreCase(*type, "gpu")) continue;
      absl::StatusOr<int64_t> temp =
          inputs_.ReadInteger(absl::StrCat("/sys/class/thermal/", zone, "/temp"));
      if (temp.ok() && *temp > -40000) {
        device.telemetry["gpu_temperature_celsius"] = static_cast<double>(*temp) / 1000.0;
      }
      break;
    }
  }
  if (options_.runtime_envs && !discrete_gpu) {
    // The NVIDIA runtime on L4T mounts the driver libraries (CSV mode) when these are set. The
    // board has this one GPU, so "all" names exactly what was allocated.
    device.envs["NVIDIA_VISIBLE_DEVICES"] = "all";
    device.envs["NVIDIA_DRIVER_CAPABILITIES"] = "all";
  } else if (options_.runtime_envs) {
    // With a discrete GPU beside it, the runtime would add the discrete GPU's nodes (and "all"
    // would name both): the iGPU's answer carries its own device nodes only.
    log_.Warn("a discrete NVIDIA GPU is present too: the integrated GPU is allocated with its own "
              "device nodes only, without NVIDIA_VISIBLE_DEVICES");
  }
  SetHealthFromProblems(problems, &device);
  devices.push_back(std::move(device));
  return devices;
}

}  // namespace edgeaccel
