// DaemonConfig: everything the daemon is told on its command line, checked in one place.
#ifndef EDGEACCEL_DAEMON_CONFIG_H_
#define EDGEACCEL_DAEMON_CONFIG_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "edgeaccel/kubelet/kubelet_api.h"
#include "edgeaccel/kubelet/registrar.h"
#include "edgeaccel/nvml/nvml_supervisor.h"

namespace edgeaccel {

struct DaemonConfig {
  std::string host_root = "/";
  std::string kubelet_root = std::string(kDefaultKubeletRoot);
  std::string device_plugin_dir = std::string(kDefaultDevicePluginDir);
  RegistrationMode registration = RegistrationMode::kAuto;
  absl::Duration probe_interval = absl::Seconds(5);
  // Celsius; unset: each Edge TPU's own hw_temp_warn2.
  std::optional<double> temperature_threshold_celsius;
  double temperature_hysteresis_celsius = 2.0;
  absl::Duration register_timeout = absl::Seconds(10);
  // Device families to look for (coral-pcie, coral-usb, tegra, nvidia); empty: all of them.
  std::set<std::string> families;
  // Families published through DRA (ResourceSlices, the kubelet's DRAPlugin) instead of the
  // device plugin API; empty: none (docs/dra.md).
  std::set<std::string> dra_families;
  absl::Duration dra_resync = absl::Minutes(5);
  // How long a device's NoExecute condition (its node gone, a critical Xid) must hold before its
  // DRA taint is NoExecute (evicting); NoSchedule until then.
  absl::Duration dra_no_execute_after = absl::Seconds(30);
  // Of dra_families, the GPU families (tegra, nvidia) whose devices several ResourceClaims may
  // share (allowMultipleAllocations, KEP-5075); empty: every device goes to one claim at a time.
  std::set<std::string> dra_shared;
  // Resources to register even where another plugin serves them (--take-over).
  std::set<std::string> take_over;
  // How long a resource another plugin served before a kubelet restart is left to it.
  absl::Duration neighbour_grace = absl::Minutes(5);
  // Time-sliced replicas per resource ("nvidia.com/gpu" -> 4); absent: 1.
  std::map<std::string, int> replicas;
  // Answer NVIDIA container runtime envs for nvidia.com/gpu.
  bool nvidia_runtime_envs = true;
  // Hand out a Jetson's display nodes with its iGPU.
  bool tegra_display_nodes = false;
  // Hand out the NVIDIA driver's libraries with nvidia.com/gpu (NvidiaOptions::driver_libraries),
  // a discrete GPU's in this container directory.
  bool nvidia_driver_libraries = true;
  // One more container directory for them ("" none: the loader's own directories always).
  std::string nvidia_driver_libraries_dir;
  // Which sets of them (ParseDriverCapabilities), and NVIDIA_DRIVER_CAPABILITIES.
  std::string nvidia_driver_capabilities = "compute,utility";
  // Ask NVML (through edgeaccel-nvml-helper) about discrete GPUs: facts, Xid health, telemetry.
  bool nvml = true;
  std::string nvml_helper;  // empty: edgeaccel-nvml-helper beside this executable
  absl::Duration nvml_timeout = absl::Seconds(10);
  absl::Duration nvml_check_interval = absl::Seconds(30);
  absl::Duration nvml_xid_recovery = absl::Minutes(10);
  std::set<int> nvml_ignored_xids = DefaultIgnoredXids();
  // Answer CDI device names and keep CDI specs in cdi_dir (as this process sees it).
  bool cdi = false;
  std::string cdi_dir = "/var/run/cdi";
  // host:port for /metrics and /healthz; empty: off.
  std::string metrics_address = ":9405";
  // Node Feature Discovery's features.d directory for our labels; empty: off.
  std::string nfd_features_dir;
  // Also the seed system's plain gpu.* labels.
  bool seed_labels = false;
  // Patch our own Node's labels through the Kubernetes API.
  bool label_node = false;
  // With label_node: also record Events on our Node (health changes, refused registrations,
  // resources left to another plugin).
  bool node_events = true;
  std::string node_name;   // NODE_NAME
  std::string kubeconfig;  // outside a pod: the kubeconfig to use
  std::string api_server;  // https://host:port; empty: in-cluster (KUBERNETES_SERVICE_HOST/PORT)
  std::string api_token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string api_ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
};

// Every family the daemon knows, with the resource it serves.
const std::map<std::string, std::string>& KnownFamilies();

// Whether the daemon looks for `family` at all (--families).
bool LooksFor(const DaemonConfig& config, const std::string& family);
// Whether some family of `resource` that the daemon looks for goes through DRA (--dra), or
// through the device plugin API.
bool ServesThroughDra(const DaemonConfig& config, const std::string& resource);
bool ServesThroughTheDevicePlugin(const DaemonConfig& config, const std::string& resource);

// "coral-pcie,tegra" or "all".
absl::StatusOr<std::set<std::string>> ParseFamilies(absl::string_view text);
// --dra: "coral-pcie,coral-usb,tegra", "all", or empty (none).
absl::StatusOr<std::set<std::string>> ParseDraFamilies(absl::string_view text);
// --dra-shared: "tegra,nvidia", or empty / "none". An Edge TPU family is an error: Edge TPUs are
// only ever given to one claim at a time.
absl::StatusOr<std::set<std::string>> ParseDraShared(absl::string_view text);
// "nvidia.com/gpu,coral.ai/edgetpu" (or empty).
absl::StatusOr<std::set<std::string>> ParseTakeOver(absl::string_view text);
// "nvidia.com/gpu=4,coral.ai/edgetpu=2" (or empty).
absl::StatusOr<std::map<std::string, int>> ParseReplicas(absl::string_view text);

// "13,31,43,45,68,109", or "none" (every Xid is critical).
absl::StatusOr<std::set<int>> ParseXids(absl::string_view text);

// Settles flags that are moot together, so that no combination a chart or an overlay renders
// stops a node: a --dra family that --families does not look for is dropped (not served at all),
// a --dra-shared family not published through DRA is dropped, and --take-over or --replicas of a
// resource that only DRA serves is dropped. Returns one line for the log per setting dropped.
// Nothing is refused here: a family list is a statement of what to serve, and a narrower one
// wins over a wider one (the chart's default --dra names every edge family, its --families may
// name fewer).
std::vector<std::string> ResolveConfig(DaemonConfig* config);

// Says exactly what is wrong with a configuration, in terms of the flag to change. A
// configuration ResolveConfig settled has none of the contradictions between --families, --dra,
// --dra-shared, --take-over and --replicas.
// kFlagsOnly leaves out what depends on the machine it runs on (that --host-root exists), for
// --check-config on a machine that is not the node.
enum class ConfigCheck { kOnThisHost, kFlagsOnly };
absl::Status ValidateConfig(const DaemonConfig& config, ConfigCheck check = ConfigCheck::kOnThisHost);

}  // namespace edgeaccel

#endif  // EDGEACCEL_DAEMON_CONFIG_H_
