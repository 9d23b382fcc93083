#include "edgeaccel/daemon/config.h"

#include <sys/stat.h>
#include <sys/un.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "edgeaccel/daemon/metrics.h"
#include "edgeaccel/discovery/driver_libraries.h"
#include "edgeaccel/discovery/resource_names.h"

namespace edgeaccel {

const std::map<std::string, std::string>& KnownFamilies() {
  static const auto* families = new std::map<std::string, std::string>{
      {"coral-pcie", std::string(kResourceEdgeTpu)},
      {"coral-usb", std::string(kResourceEdgeTpu)},
      {"tegra", std::string(kResourceNvidiaGpu)},
      {"nvidia", std::string(kResourceNvidiaGpu)},
  };
  return *families;
}

bool LooksFor(const DaemonConfig& config, const std::string& family) {
  return config.families.empty() || config.families.count(family) > 0;
}

namespace {

// Whether a family of `resource` that is looked for goes the way `dra` says.
bool ServesThrough(const DaemonConfig& config, const std::string& resource, bool dra) {
  for (const auto& [family, family_resource] : KnownFamilies()) {
    if (family_resource == resource && LooksFor(config, family) &&
        (config.dra_families.count(family) > 0) == dra) {
      return true;
    }
  }
  return false;
}

// Removes every element of `set` that `keep` refuses, with the note `why` gives for each.
template <typename Container, typename Keep, typename Why>
void DropUnless(Container* set, Keep keep, Why why, std::vector<std::string>* notes) {
  for (auto it = set->begin(); it != set->end();) {
    if (keep(*it)) {
      ++it;
    } else {
      notes->push_back(why(*it));
      it = set->erase(it);
    }
  }
}

// "coral-pcie,tegra": each a known family, or an error naming `flag` and the words it also takes.
absl::StatusOr<std::set<std::string>> ParseFamilyList(absl::string_view text, absl::string_view flag,
                                                      absl::string_view other_words) {
  std::set<std::string> families;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (!KnownFamilies().count(std::string(name))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": unknown family \"", absl::CHexEscape(name.substr(0, 40)), "\" (known: ",
          other_words, "coral-pcie, coral-usb, nvidia, tegra)"));
    }
    families.insert(std::string(name));
  }
  return families;
}

}  // namespace

absl::StatusOr<std::set<std::string>> ParseFamilies(absl::string_view text) {
  if (text == "all" || text.empty()) return std::set<std::string>();
  return ParseFamilyList(text, "--families", "all, ");
}

absl::StatusOr<std::set<std::string>> ParseDraFamilies(absl::string_view text) {
  std::set<std::string> families;
  if (absl::StripAsciiWhitespace(text).empty() || text == "none") return families;
  if (text == "all") {
    for (const auto& [family, resource] : KnownFamilies()) families.insert(family);
    return families;
  }
  return ParseFamilyList(text, "--dra", "all, none, ");
}

absl::StatusOr<std::set<std::string>> ParseDraShared(absl::string_view text) {
  std::set<std::string> families;
  if (absl::StripAsciiWhitespace(text).empty() || text == "none") return families;
  absl::StatusOr<std::set<std::string>> named = ParseFamilyList(text, "--dra-shared", "none, ");
  if (!named.ok()) return named.status();
  for (const std::string& family : *named) {
    if (KnownFamilies().at(family) != kResourceNvidiaGpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dra-shared: ", family, " is an Edge TPU family, and an Edge TPU is only ever given to "
          "one claim at a time; sharing is for the GPU families (tegra, nvidia)"));
    }
  }
  return named;
}

absl::StatusOr<std::set<std::string>> ParseTakeOver(absl::string_view text) {
  std::set<std::string> resources;
  if (text.empty()) return resources;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name != kResourceEdgeTpu && name != kResourceNvidiaGpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--take-over: unknown resource \"", absl::CHexEscape(name.substr(0, 60)),
          "\" (known: coral.ai/edgetpu, nvidia.com/gpu)"));
    }
    resources.insert(std::string(name));
  }
  return resources;
}

absl::StatusOr<std::map<std::string, int>> ParseReplicas(absl::string_view text) {
  std::map<std::string, int> replicas;
  if (text.empty()) return replicas;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t equals = entry.rfind('=');
    int count = 0;
    const std::string resource(equals == absl::string_view::npos ? entry : entry.substr(0, equals));
    if (equals == absl::string_view::npos ||
        !absl::SimpleAtoi(entry.substr(equals + 1), &count)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicas: \"", absl::CHexEscape(entry.substr(0, 60)),
          "\" is not <resource>=<count>, e.g. nvidia.com/gpu=4"));
    }
    if (resource != kResourceEdgeTpu && resource != kResourceNvidiaGpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicas: unknown resource \"", absl::CHexEscape(resource.substr(0, 60)),
          "\" (known: coral.ai/edgetpu, nvidia.com/gpu)"));
    }
    if (count < 1 || count > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("--replicas: ", resource, " wants 1 to 64 replicas, got ", count));
    }
    if (!replicas.emplace(resource, count).second) {
      return absl::InvalidArgumentError(absl::StrCat("--replicas: ", resource, " given twice"));
    }
  }
  return replicas;
}

absl::StatusOr<std::set<int>> ParseXids(absl::string_view text) {
  std::set<int> xids;
  text = absl::StripAsciiWhitespace(text);
  if (text == "none" || text.empty()) return xids;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int xid = 0;
    if (!absl::SimpleAtoi(entry, &xid) || xid < 1 || xid > 999) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nvml-ignored-xids: \"", absl::CHexEscape(entry.substr(0, 60)),
          "\" is not an Xid (1 to 999); give a comma-separated list, or none"));
    }
    xids.insert(xid);
  }
  return xids;
}

bool ServesThroughDra(const DaemonConfig& config, const std::string& resource) {
  return ServesThrough(config, resource, /*dra=*/true);
}

bool ServesThroughTheDevicePlugin(const DaemonConfig& config, const std::string& resource) {
  return ServesThrough(config, resource, /*dra=*/false);
}

std::vector<std::string> ResolveConfig(DaemonConfig* config) {
  std::vector<std::string> notes;
  // A family --dra names is published through DRA only where it is looked for at all.
  DropUnless(
      &config->dra_families, [config](const std::string& family) { return LooksFor(*config, family); },
      [](const std::string& family) {
        return absl::StrCat("--dra names ", family, ", which --families does not look for: ", family,
                            " is not served on this node (add it to --families to publish it "
                            "through DRA)");
      },
      &notes);
  DropUnless(
      &config->dra_shared,
      [config](const std::string& family) { return config->dra_families.count(family) > 0; },
      [](const std::string& family) {
        return absl::StrCat("--dra-shared names ", family,
                            ", which is not published through DRA here (--dra, --families): "
                            "nothing of it is shared");
      },
      &notes);
  // --take-over and --replicas act on the device plugin: moot for a resource none of whose
  // looked-for families the device plugin serves.
  if (!config->dra_families.empty()) {
    DropUnless(
        &config->take_over,
        [config](const std::string& resource) { return ServesThroughTheDevicePlugin(*config, resource); },
        [](const std::string& resource) {
          return absl::StrCat("--take-over names ", resource,
                              ", which only DRA serves here (--dra): it has no device plugin to register");
        },
        &notes);
    DropUnless(
        &config->replicas,
        [config](const auto& entry) { return ServesThroughTheDevicePlugin(*config, entry.first); },
        [](const auto& entry) {
          return absl::StrCat("--replicas names ", entry.first,
                              ", which only DRA serves here (--dra): its devices are not "
                              "replicated (DRA shares GPUs with --dra-shared)");
        },
        &notes);
  }
  return notes;
}

absl::Status ValidateConfig(const DaemonConfig& config, ConfigCheck check) {
  struct stat st;
  if (config.host_root.empty() || config.host_root[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-root must be an absolute path, got \"", config.host_root, "\""));
  }
  if (check == ConfigCheck::kOnThisHost &&
      (stat(config.host_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host-root ", config.host_root, " is not a directory"));
  }
  // Both are absolute, and the longest socket path we bind in each must fit a sockaddr_un.
  auto check_socket_dir = [](absl::string_view flag, const std::string& value,
                             const std::string& dir) -> absl::Status {
    if (value.empty() || value[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be an absolute path, got \"", value, "\""));
    }
    const size_t longest = dir.size() + 1 + SocketFileName(kResourceEdgeTpu).size() + 8;
    if (longest >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " ", value, " is too long: socket paths under it would exceed ",
          sizeof(sockaddr_un::sun_path) - 1, " bytes, the Unix socket limit"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check_socket_dir(
          "--kubelet-root", config.kubelet_root,
          absl::StrCat(config.kubelet_root, "/", kPluginsRegistryDir));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_socket_dir("--device-plugin-dir", config.device_plugin_dir,
                                        config.device_plugin_dir);
      !s.ok()) {
    return s;
  }
  if (config.nvml_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nvml-timeout must be at least 100ms, got ", absl::FormatDuration(config.nvml_timeout)));
  }
  if (config.nvml_check_interval < absl::ZeroDuration() ||
      config.nvml_xid_recovery < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--nvml-check-interval and --nvml-xid-recovery must not be negative (0 turns them off)");
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
  if (absl::StatusOr<unsigned> capabilities =
          ParseDriverCapabilities(config.nvidia_driver_capabilities);
      !capabilities.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvidia-driver-capabilities: ", capabilities.status().message()));
  }
  if (config.nvidia_driver_libraries && !config.nvidia_driver_libraries_dir.empty()) {
    // The directory is a path in every GPU container: absolute, plain, and none of the
    // directories a runtime sets up itself.
    const std::string& dir = config.nvidia_driver_libraries_dir;
    bool plain = !dir.empty() && dir[0] == '/' && dir.back() != '/';
    for (absl::string_view step : absl::StrSplit(dir, '/')) {
      if (step == "." || step == "..") plain = false;
    }
    for (absl::string_view runtime_dir : {"/dev", "/proc", "/sys"}) {
      if (dir == runtime_dir || absl::StartsWith(dir, absl::StrCat(runtime_dir, "/"))) plain = false;
    }
    if (!plain || dir.find("//") != std::string::npos || dir.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nvidia-driver-libraries-dir must be an absolute directory path without \".\", "
          "\"..\", \":\" or a trailing \"/\", outside /dev, /proc and /sys; got \"",
          absl::CHexEscape(dir.substr(0, 120)), "\""));
    }
  }
  if (config.cdi && (config.cdi_dir.empty() || config.cdi_dir[0] != '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cdi-dir must be an absolute path, got \"", config.cdi_dir, "\""));
  }
  if (!config.metrics_address.empty()) {
    absl::StatusOr<std::pair<std::string, int>> listen = ParseListenAddress(config.metrics_address);
    if (!listen.ok()) return listen.status();
  }
  if (!config.nfd_features_dir.empty() && config.nfd_features_dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--nfd-features-dir must be an absolute path, got \"", config.nfd_features_dir, "\""));
  }
  if (!config.dra_families.empty()) {
    if (config.node_name.empty()) {
      return absl::InvalidArgumentError(
          "--dra needs this node's name (--node-name or NODE_NAME): it names the ResourceSlice's pool");
    }
    if (config.dra_no_execute_after < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--dra-no-execute-after must not be negative (0: at once)");
    }
    if (config.dra_resync < absl::Seconds(1)) {
      return absl::InvalidArgumentError(absl::StrCat("--dra-resync must be at least 1s, got ",
                                                     absl::FormatDuration(config.dra_resync)));
    }
    for (const std::string& family : config.dra_families) {
      if (!config.families.empty() && config.families.count(family) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--dra names ", family,
                                                       ", which --families does not look for"));
      }
      if (config.take_over.count(KnownFamilies().at(family)) > 0 ||
          config.replicas.count(KnownFamilies().at(family)) > 0) {
        bool other_plugin_family = false;  // the resource still has device-plugin families
        for (const auto& [name, resource] : KnownFamilies()) {
          if (resource == KnownFamilies().at(family) && config.dra_families.count(name) == 0) {
            other_plugin_family = true;
          }
        }
        if (!other_plugin_family) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--take-over and --replicas are for the device plugin; ", KnownFamilies().at(family),
              " is published through DRA (--dra)"));
        }
      }
    }
  }
  for (const std::string& family : config.dra_shared) {
    if (KnownFamilies().count(family) == 0 || KnownFamilies().at(family) != kResourceNvidiaGpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dra-shared: ", family, " is not a GPU family (tegra, nvidia)"));
    }
    if (config.dra_families.count(family) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--dra-shared names ", family, ", which is not published through DRA: add it to --dra"));
    }
  }
  if (config.register_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(absl::StrCat("--register-timeout must be at least 100ms, got ",
                                                   absl::FormatDuration(config.register_timeout)));
  }
  return absl::OkStatus();
}

}  // namespace edgeaccel
