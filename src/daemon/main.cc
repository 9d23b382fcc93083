// edgeaccel-device-plugin: makes Edge TPUs and NVIDIA GPUs schedulable through the kubelet's
// device plugin API. See README.md for how to run it.
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "edgeaccel/daemon/config.h"
#include "edgeaccel/daemon/daemon.h"
#include "edgeaccel/kubelet/grpc_event_engine.h"
#include "edgeaccel/kubelet/grpc_timers.h"
#include "glog/logging.h"

// absl flag support for the registration mode.
namespace edgeaccel {
bool AbslParseFlag(absl::string_view text, RegistrationMode* mode, std::string* error) {
  if (ParseRegistrationMode(text, mode)) return true;
  *error = "must be one of auto, plugin-watcher, kubelet";
  return false;
}
std::string AbslUnparseFlag(RegistrationMode mode) {
  return std::string(RegistrationModeName(mode));
}
}  // namespace edgeaccel

ABSL_FLAG(std::string, host_root, "/",
          "Where the host's / is visible to the daemon (e.g. /host in a container). Devices, "
          "sysfs and /proc are read under it; paths handed to the kubelet are host paths.");
ABSL_FLAG(std::string, device_plugin_dir, "/var/lib/kubelet/device-plugins",
          "Where the kubelet's kubelet.sock is and our device plugin sockets go. The kubelet "
          "fixes this path; it does not follow its --root-dir.");
ABSL_FLAG(std::string, kubelet_root, "/var/lib/kubelet",
          "The kubelet's --root-dir, holding plugins_registry/ (the plugin watcher) "
          "(microk8s: "
          "/var/snap/microk8s/common/var/lib/kubelet).");
ABSL_FLAG(edgeaccel::RegistrationMode, registration, edgeaccel::RegistrationMode::kAuto,
          "How to register with the kubelet: kubelet (Register on device-plugins/kubelet.sock), "
          "plugin-watcher (a socket in plugins_registry/), or auto (kubelet when "
          "device-plugins/ exists, else plugin-watcher when plugins_registry/ exists).");
ABSL_FLAG(absl::Duration, probe_interval, absl::Seconds(5),
          "How often to read what the kernel does not announce (Edge TPU temperature and driver "
          "status); device nodes appearing or vanishing are seen at once through inotify. "
          "0 turns the probe off.");
ABSL_FLAG(double, temperature_threshold, 0,
          "Edge TPU die temperature in °C at which a device turns Unhealthy. 0: each device's "
          "own hw_temp_warn2 (the chip's shutdown line, 99.8 °C with driver defaults).");
ABSL_FLAG(double, temperature_hysteresis, 2.0,
          "An overheated Edge TPU is Healthy again once this many °C below the threshold.");
ABSL_FLAG(absl::Duration, register_timeout, absl::Seconds(10),
          "How long one Register call to the kubelet may take before it is retried.");
ABSL_FLAG(std::string, families, "all",
          "Device families to look for, comma-separated: coral-pcie, coral-usb (coral.ai/edgetpu), "
          "tegra, nvidia (nvidia.com/gpu), or all. A resource is registered once it has a device.");
ABSL_FLAG(std::string, dra, "",
          "Families to publish through Dynamic Resource Allocation (Kubernetes 1.34+, "
          "resource.k8s.io/v1) instead of the device plugin API, comma-separated (coral-pcie, "
          "coral-usb, tegra, nvidia) or all; empty: none. Their devices go to ResourceSlices of "
          "drivers edgetpu.edgeaccel.io and gpu.edgeaccel.io; needs the API server (as "
          "--label-node does) and --node-name.");
ABSL_FLAG(absl::Duration, dra_resync, absl::Minutes(5),
          "With --dra: how long one watch of this node's ResourceSlices lasts before it is "
          "renewed (the API server ends it after a random time between this and twice this), "
          "and how often prepared claims whose ResourceClaim is gone are cleaned up. Where the "
          "watch is refused, the slices are listed this often instead. At least 1s.");
ABSL_FLAG(absl::Duration, dra_no_execute_after, absl::Seconds(30),
          "With --dra: a device whose node vanished or that had a critical Xid is tainted "
          "NoSchedule at once and NoExecute (its pods are evicted, which cannot be undone) only "
          "once the condition has held this long without a break; 0: NoExecute at once.");
ABSL_FLAG(std::string, dra_shared, "",
          "Of the --dra families, the GPU families (tegra, nvidia) whose devices several "
          "ResourceClaims may share (allowMultipleAllocations, Kubernetes 1.36+ or the "
          "DRAConsumableCapacity gate), comma-separated; empty: none. A claim that asks for part "
          "of a GPU's memory shares it; one that asks for none takes the whole GPU. Sharers are "
          "not isolated from each other. Edge TPUs are never shared.");
ABSL_FLAG(std::string, take_over, "",
          "Resources to register even where another device plugin on the node already serves "
          "them (e.g. NVIDIA's for nvidia.com/gpu), comma-separated. Without it such a resource "
          "is left to that plugin, and registered once that plugin is gone.");
ABSL_FLAG(absl::Duration, neighbour_grace, absl::Minutes(5),
          "A resource the kubelet knows from another device plugin that has not registered it "
          "again (after a kubelet restart or a reboot, plugins return in no particular order) is "
          "left to that plugin for this long before edgeaccel registers its own devices. "
          "--take-over skips the wait.");
ABSL_FLAG(std::string, replicas, "",
          "Time-sliced sharing: advertise each device as N replicas, e.g. nvidia.com/gpu=4. "
          "Replica ids are <device id>::<n>; pods sharing a device are not isolated.");
ABSL_FLAG(bool, nvidia_runtime_envs, true,
          "Answer NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES for nvidia.com/gpu, for "
          "the NVIDIA container runtime (on Jetson it mounts the driver libraries from them).");
ABSL_FLAG(bool, tegra_display_nodes, false,
          "On Jetson, also hand out the display nodes with the integrated GPU (/dev/dri/card*, "
          "/dev/fb*, /dev/tegra_dc_*, Orin's /dev/nvidia*), for containers that drive a display. "
          "Off: the GPU's compute and media nodes only.");
ABSL_FLAG(bool, nvidia_driver_libraries, true,
          "Hand out the NVIDIA driver's user-space libraries with nvidia.com/gpu, so that a runtime "
          "without NVIDIA's (containerd or CRI-O, with CDI or without) runs CUDA: discrete GPUs get "
          "the libraries of --nvidia-driver-capabilities and nvidia-smi of the running driver "
          "(found through the host's /etc/ld.so.cache, or the GPU Operator's /run/nvidia/driver) "
          "as read-only mounts under their soname where the container's loader looks by default "
          "(/usr/lib/<triplet> and /usr/lib64; LD_LIBRARY_PATH is left as the image set it); a "
          "Jetson gets what L4T's container file lists "
          "(/etc/nvidia-container-runtime/host-files-for-container.d/*.csv) name and the host "
          "has. Turn off on nodes that keep NVIDIA's runtime, which mounts them itself.");
ABSL_FLAG(std::string, nvidia_driver_libraries_dir, "",
          "One more container directory a discrete GPU's driver libraries are mounted in (with "
          "--nvidia-driver-libraries), for images that look only there; empty: none.");
ABSL_FLAG(std::string, nvidia_driver_capabilities, "compute,utility",
          "Which of the NVIDIA driver's library sets a discrete GPU's containers get, as NVIDIA's "
          "toolkit names them: compute, utility, video (NVDEC, NVENC), graphics (OpenGL, EGL, "
          "Vulkan), or all; also the NVIDIA_DRIVER_CAPABILITIES answered with "
          "--nvidia-runtime-envs.");
ABSL_FLAG(bool, nvml, true,
          "Where discrete NVIDIA GPUs are found, ask NVML (the host's libnvidia-ml.so.1, found "
          "through its /etc/ld.so.cache and the driver directories, /run/nvidia/driver too) in "
          "a helper process: memory, compute capability, CUDA version, MIG and ECC mode as node "
          "labels; critical Xid errors as health; temperature, power, utilisation, memory and "
          "ECC errors on /metrics. Without NVML the GPUs are served as before.");
ABSL_FLAG(std::string, nvml_helper, "",
          "The NVML helper executable; default: edgeaccel-nvml-helper beside this one.");
ABSL_FLAG(absl::Duration, nvml_timeout, absl::Seconds(10),
          "How long NVML may take to list the GPUs or answer one reading before its helper is "
          "killed and started again (a hung NVML call never blocks serving).");
ABSL_FLAG(absl::Duration, nvml_check_interval, absl::Seconds(30),
          "How often each GPU is asked whether NVML still answers for it (a GPU that does not is "
          "Unhealthy); 0: only when /metrics is scraped.");
ABSL_FLAG(absl::Duration, nvml_xid_recovery, absl::Minutes(10),
          "A GPU that had a critical Xid error is Healthy again once NVML answers for it and no "
          "critical Xid came for this long; 0: never (until the daemon restarts), as NVIDIA's "
          "device plugin does.");
ABSL_FLAG(std::string, nvml_ignored_xids, "13,31,43,45,68,109",
          "Xid errors that do not make a GPU Unhealthy (default: the application errors NVIDIA's "
          "device plugin ignores); remove a code to count it, add one to skip it; none: every "
          "Xid counts.");
ABSL_FLAG(bool, cdi, false,
          "Also answer CDI device names (edgeaccel.io/edgetpu=<id>, edgeaccel.io/gpu=<id>) and "
          "keep matching CDI specs in --cdi-dir, one per resource that has devices. Specs stay "
          "on exit: the kubelet replays cached CDI names when a container restarts while the "
          "daemon is down or restarting. The runtime must have CDI on: containerd 2.x fails "
          "every container that names a CDI device when its config sets enable_cdi = false (as "
          "containerd 1.7's 'config default' writes); remove that line, or set enable_cdi = true "
          "and cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"], and restart containerd.");
ABSL_FLAG(std::string, cdi_dir, "/var/run/cdi", "Where CDI specs are written (with --cdi).");
ABSL_FLAG(std::string, metrics_address, ":9405",
          "host:port serving /metrics (Prometheus) and /healthz; empty turns it off.");
ABSL_FLAG(std::string, nfd_features_dir, "",
          "Write the node labels as a Node Feature Discovery feature file into this directory "
          "(e.g. /etc/kubernetes/node-feature-discovery/features.d); empty: off.");
ABSL_FLAG(bool, seed_labels, false,
          "Also the plain labels gpu.model, gpu.driver, gpu.resource, gpu.vendor.id, gpu.product.id.");
ABSL_FLAG(bool, label_node, false,
          "Keep the node labels on this node's Node object through the Kubernetes API (merge "
          "patch, only on change; needs get/patch on nodes).");
ABSL_FLAG(bool, node_events, true,
          "With --label-node: also record Kubernetes Events on this node (a device turning "
          "Unhealthy or healthy again or going away, a refused registration, a resource left to "
          "another plugin), as kubectl describe node shows them; needs create/patch on events.");
ABSL_FLAG(std::string, node_name, "", "This node's name; default: the NODE_NAME environment variable.");
ABSL_FLAG(std::string, kubeconfig, "",
          "With --label-node outside a pod: the kubeconfig whose current context to use (server, "
          "CA, token or client certificate).");
ABSL_FLAG(std::string, api_server, "",
          "Kubernetes API server as https://host:port; default: in-cluster "
          "(KUBERNETES_SERVICE_HOST/PORT).");
ABSL_FLAG(std::string, api_token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "Bearer token for the API server (re-read for every request).");
ABSL_FLAG(std::string, api_ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "CA bundle that signed the API server's certificate.");
ABSL_FLAG(bool, discover, false,
          "Print what would be advertised on this host (resources, device ids, health, device "
          "nodes, facts) and exit.");
ABSL_FLAG(bool, check_config, false,
          "Check the flags as the daemon would start with them, print what it would serve and "
          "how, and exit: 0 when it would start, 2 (with the reason) when not. Reads nothing of "
          "the node (--host-root need not exist), so a rendered chart or overlay can be checked "
          "anywhere.");
ABSL_FLAG(int, verbosity, 0, "Log verbosity: 0 normal, 1 every rescan and allocation, 2 more.");

namespace {

// SIGTERM and SIGINT: the main thread takes them (a signalfd) once the daemon serves, and stops
// it cleanly. SIGHUP does nothing (it is ignored): there is no configuration to reload, devices
// are watched all the time, and a hang-up of the terminal that started the daemon by hand must
// not end it without its clean stop.
sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

// A signal is delivered to any thread that does not block it, and a thread takes the mask of the
// thread that made it. So the stop signals are blocked before anything can make a thread: before
// main(), ahead of every other static initialiser of the (static) binary (priority 101 is the
// first one the toolchain leaves to programs). A SIGTERM that arrives at any moment after this
// stays pending until main() waits for it: during the first scan, the registration, or the stop
// (a second one is then simply absorbed).
__attribute__((constructor(101))) void BlockStopSignalsInEveryThread() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGHUP, SIG_IGN);
}

// --help lists the flags defined in this file (all of the daemon's own flags).
bool IsOurFlagFile(absl::string_view file) { return absl::StrContains(file, "src/daemon/main.cc"); }

// Kubernetes tools spell flags with dashes (--host-root); absl names them with underscores.
// Accept both by rewriting the name part of every "--flag[=value]" argument.
void NormalizeFlagNames(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (arg[0] != '-' || arg[1] != '-') continue;
    if (arg[2] == '\0') break;  // "--" ends the flags
    for (char* p = arg + 2; *p != '\0' && *p != '='; ++p) {
      if (*p == '-') *p = '_';
    }
  }
}

absl::StatusOr<edgeaccel::DaemonConfig> ConfigFromFlags() {
  edgeaccel::DaemonConfig config;
  absl::StatusOr<std::set<std::string>> families =
      edgeaccel::ParseFamilies(absl::GetFlag(FLAGS_families));
  if (!families.ok()) return families.status();
  config.families = *families;
  absl::StatusOr<std::set<std::string>> dra = edgeaccel::ParseDraFamilies(absl::GetFlag(FLAGS_dra));
  if (!dra.ok()) return dra.status();
  config.dra_families = *dra;
  config.dra_resync = absl::GetFlag(FLAGS_dra_resync);
  config.dra_no_execute_after = absl::GetFlag(FLAGS_dra_no_execute_after);
  absl::StatusOr<std::set<std::string>> dra_shared =
      edgeaccel::ParseDraShared(absl::GetFlag(FLAGS_dra_shared));
  if (!dra_shared.ok()) return dra_shared.status();
  config.dra_shared = *dra_shared;
  absl::StatusOr<std::set<std::string>> take_over =
      edgeaccel::ParseTakeOver(absl::GetFlag(FLAGS_take_over));
  if (!take_over.ok()) return take_over.status();
  config.take_over = *take_over;
  config.neighbour_grace = absl::GetFlag(FLAGS_neighbour_grace);
  if (config.neighbour_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--neighbour-grace must not be negative");
  }
  absl::StatusOr<std::map<std::string, int>> replicas =
      edgeaccel::ParseReplicas(absl::GetFlag(FLAGS_replicas));
  if (!replicas.ok()) return replicas.status();
  config.replicas = *replicas;
  config.nvidia_runtime_envs = absl::GetFlag(FLAGS_nvidia_runtime_envs);
  config.tegra_display_nodes = absl::GetFlag(FLAGS_tegra_display_nodes);
  config.nvidia_driver_libraries = absl::GetFlag(FLAGS_nvidia_driver_libraries);
  config.nvidia_driver_libraries_dir = absl::GetFlag(FLAGS_nvidia_driver_libraries_dir);
  config.nvidia_driver_capabilities = absl::GetFlag(FLAGS_nvidia_driver_capabilities);
  config.nvml = absl::GetFlag(FLAGS_nvml);
  config.nvml_helper = absl::GetFlag(FLAGS_nvml_helper);
  config.nvml_timeout = absl::GetFlag(FLAGS_nvml_timeout);
  config.nvml_check_interval = absl::GetFlag(FLAGS_nvml_check_interval);
  config.nvml_xid_recovery = absl::GetFlag(FLAGS_nvml_xid_recovery);
  absl::StatusOr<std::set<int>> xids = edgeaccel::ParseXids(absl::GetFlag(FLAGS_nvml_ignored_xids));
  if (!xids.ok()) return xids.status();
  config.nvml_ignored_xids = *xids;
  config.cdi = absl::GetFlag(FLAGS_cdi);
  config.cdi_dir = absl::GetFlag(FLAGS_cdi_dir);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  config.nfd_features_dir = absl::GetFlag(FLAGS_nfd_features_dir);
  config.seed_labels = absl::GetFlag(FLAGS_seed_labels);
  config.label_node = absl::GetFlag(FLAGS_label_node);
  config.node_events = absl::GetFlag(FLAGS_node_events);
  config.node_name = absl::GetFlag(FLAGS_node_name);
  if (config.node_name.empty() && getenv("NODE_NAME") != nullptr) config.node_name = getenv("NODE_NAME");
  config.kubeconfig = absl::GetFlag(FLAGS_kubeconfig);
  config.api_server = absl::GetFlag(FLAGS_api_server);
  config.api_token_file = absl::GetFlag(FLAGS_api_token_file);
  config.api_ca_file = absl::GetFlag(FLAGS_api_ca_file);
  config.host_root = absl::GetFlag(FLAGS_host_root);
  config.kubelet_root = absl::GetFlag(FLAGS_kubelet_root);
  config.device_plugin_dir = absl::GetFlag(FLAGS_device_plugin_dir);
  config.registration = absl::GetFlag(FLAGS_registration);
  config.probe_interval = absl::GetFlag(FLAGS_probe_interval);
  if (double t = absl::GetFlag(FLAGS_temperature_threshold); t != 0) {
    config.temperature_threshold_celsius = t;
  }
  config.temperature_hysteresis_celsius = absl::GetFlag(FLAGS_temperature_hysteresis);
  config.register_timeout = absl::GetFlag(FLAGS_register_timeout);
  return config;
}

// --discover: the scan runs on a thread of its own while the main thread waits for it or for a
// stop signal, so SIGTERM or ^C ends a scan that waits for a hung NVML (up to --nvml-timeout,
// twice) at once: the NVML helper is killed (it must not outlive us) and the process exits
// 128+signal without waiting for the scan.
int Discover(const edgeaccel::DaemonConfig& config) {
  FLAGS_minloglevel = google::GLOG_WARNING;  // the report on stdout is the answer
  edgeaccel::Daemon daemon(config);
  const sigset_t stop_signals = StopSignals();
  const int signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
  const int done_fd = eventfd(0, EFD_CLOEXEC);
  std::string report;
  std::thread scan;
  if (signal_fd >= 0 && done_fd >= 0) {
    try {
      scan = std::thread([&daemon, &report, done_fd] {
        daemon.ScanOnce();
        report = daemon.Describe();
        eventfd_write(done_fd, 1);
      });
    } catch (const std::system_error& e) {
      LOG(WARNING) << "cannot start a thread for the scan (" << e.what()
                   << "); scanning on the main thread, where a stop signal waits for the scan";
    }
  }
  if (!scan.joinable()) {  // no thread or descriptor to spare: scan here
    daemon.ScanOnce();
    std::cout << daemon.Describe();
    return 0;
  }
  pollfd fds[2] = {{signal_fd, POLLIN, 0}, {done_fd, POLLIN, 0}};
  while (poll(fds, 2, -1) < 0 && errno == EINTR) {
  }
  if ((fds[1].revents & POLLIN) == 0) {
    struct signalfd_siginfo info = {};
    const int signal_number =
        read(signal_fd, &info, sizeof(info)) == sizeof(info) ? static_cast<int>(info.ssi_signo) : SIGTERM;
    if (const pid_t helper = daemon.NvmlHelperPid(); helper > 0) kill(helper, SIGKILL);
    std::cerr << "edgeaccel-device-plugin: " << strsignal(signal_number)
              << " during --discover; stopped before the scan finished\n";
    std::cerr.flush();
    scan.detach();  // it may be waiting on NVML: not joined, and the exit ends it
    _exit(128 + signal_number);
  }
  scan.join();
  std::cout << report;
  return 0;
}

// --check-config: what the daemon would serve, and how.
void PrintConfig(const edgeaccel::DaemonConfig& config, const std::vector<std::string>& notes) {
  std::cout << "configuration: the daemon would start\n";
  for (const auto& [family, resource] : edgeaccel::KnownFamilies()) {
    std::cout << "  " << family << " (" << resource << "): "
              << (!edgeaccel::LooksFor(config, family) ? "not looked for"
                  : config.dra_families.count(family) ? (config.dra_shared.count(family) ? "DRA, shared" : "DRA")
                                                       : "device plugin")
              << "\n";
  }
  for (const std::string& note : notes) std::cout << "  note: " << note << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  // glibc gives each thread that allocates under contention an arena of its own and keeps what
  // is freed there; with gRPC's thread pools that lets a small, steady daemon's RSS creep up.
  // Two arenas are plenty for this load.
  mallopt(M_ARENA_MAX, 2);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = IsOurFlagFile;
  usage_config.contains_helpshort_flags = IsOurFlagFile;
  usage_config.version_string = [] { return std::string("edgeaccel-device-plugin 0.1.0\n"); };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(
      "Kubernetes device plugin for edge accelerators (Coral Edge TPU, NVIDIA Jetson and GPUs).\n"
      "Usage: edgeaccel-device-plugin [flags]   (--host-root and --host_root are the same flag)");
  NormalizeFlagNames(argc, argv);
  absl::ParseCommandLine(argc, argv);

  // Logs go to stderr (the container log); glog's own flags are not parsed by absl.
  FLAGS_logtostderr = true;
  FLAGS_v = absl::GetFlag(FLAGS_verbosity);
  google::InitGoogleLogging(argv[0]);

  absl::StatusOr<edgeaccel::DaemonConfig> parsed = ConfigFromFlags();
  const bool check_only = absl::GetFlag(FLAGS_check_config);
  std::vector<std::string> notes;
  if (parsed.ok()) notes = edgeaccel::ResolveConfig(&*parsed);
  absl::Status valid =
      parsed.ok() ? edgeaccel::ValidateConfig(*parsed, check_only ? edgeaccel::ConfigCheck::kFlagsOnly
                                                                  : edgeaccel::ConfigCheck::kOnThisHost)
                  : parsed.status();
  if (!valid.ok()) {
    std::cerr << "edgeaccel-device-plugin: " << valid.message() << "\n";
    return 2;
  }
  const edgeaccel::DaemonConfig& config = *parsed;
  if (check_only) {
    PrintConfig(config, notes);
    return 0;
  }
  for (const std::string& note : notes) LOG(WARNING) << note;

  if (absl::GetFlag(FLAGS_discover)) return Discover(config);

  // gRPC's client channels (Register on kubelet.sock, the look at another plugin's socket) poll
  // every 5 s in the background while they exist, for pollers that cannot wait on a socket;
  // ours always can (epoll, and a thread of ours waits in every call). Off, unless set.
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "0", /*overwrite=*/0);
  // gRPC's deferred work and all its timers on one thread of ours, not on a pool sized by the
  // core count and timer threads that wake every second (kubelet/grpc_event_engine.h,
  // kubelet/grpc_timers.h). Before any channel or server is made.
  const std::string grpc_threads = edgeaccel::RunGrpcTimersOn(edgeaccel::UseOneThreadGrpcEventEngine());
  // Sockets we create are for root (the kubelet) only.
  umask(0077);
  signal(SIGPIPE, SIG_IGN);

  LOG(INFO) << "edgeaccel-device-plugin starting: host root " << config.host_root
            << ", kubelet root " << config.kubelet_root << ", registration "
            << edgeaccel::RegistrationModeName(config.registration) << "; " << grpc_threads;
  edgeaccel::Daemon daemon(config);
  if (absl::Status status = daemon.Start(); !status.ok()) {
    LOG(ERROR) << "cannot start: " << status;
    return 1;
  }

  // The main thread waits for the stop signal on a signalfd and, meanwhile, answers /metrics and
  // /healthz: no thread of their own.
  const sigset_t stop_signals = StopSignals();
  int signal_number = 0;
  const int signal_fd = signalfd(-1, &stop_signals, SFD_CLOEXEC);
  if (signal_fd >= 0) {
    daemon.ServeUntil(signal_fd);
    struct signalfd_siginfo info = {};
    if (read(signal_fd, &info, sizeof(info)) == sizeof(info)) signal_number = static_cast<int>(info.ssi_signo);
    close(signal_fd);
  } else {
    // Out of descriptors at this very moment: the signal still stops the daemon (nothing of
    // /metrics is answered then; the log says why).
    LOG(ERROR) << "signalfd: " << strerror(errno) << "; /metrics and /healthz are not answered";
    sigwait(&stop_signals, &signal_number);
  }
  const absl::Time stop_started = absl::Now();
  LOG(INFO) << "received " << strsignal(signal_number) << "; stopping";
  daemon.Stop();
  LOG(INFO) << "stopped cleanly in " << absl::FormatDuration(absl::Now() - stop_started);
  return 0;
}
