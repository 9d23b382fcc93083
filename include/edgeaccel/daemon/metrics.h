// Prometheus metrics and a health endpoint over HTTP (HttpEndpoint: answered on the
// daemon's main thread).
//
//   /metrics  Prometheus text format: devices per resource and health, Edge TPU temperature and
//             thresholds, Jetson GPU load and temperature, allocations and Allocate errors,
//             registrations, kubelet restarts seen, ListAndWatch updates sent, build info; with
//             --dra, each DRA driver's kubelet calls (count, claim errors, duration, in flight),
//             what it has prepared, and the claims it unprepared itself.
//   /healthz  200 while every resource that has devices is registered and serving, and every
//             DRA driver that serves is registered and has its ResourceSlice published; 503 with
//             the reason otherwise (the DaemonSet's readiness probe).
//   /livez    the same without what a restart cannot cure (the API server refusing or not
//             answering a slice): the DaemonSet's liveness probe.
#ifndef EDGEACCEL_DAEMON_METRICS_H_
#define EDGEACCEL_DAEMON_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "edgeaccel/daemon/http_endpoint.h"
#include "edgeaccel/dra/dra_counters.h"
#include "edgeaccel/dra/slice_publisher.h"
#include "edgeaccel/inventory/device_set.h"
#include "edgeaccel/kubelet/device_plugin_service.h"
#include "edgeaccel/nvml/nvml_supervisor.h"

namespace edgeaccel {

// What one resource contributes to /metrics.
struct ResourceMetrics {
  std::string resource;
  std::shared_ptr<const Snapshot> snapshot;
  const PluginCounters* counters = nullptr;
  bool registered = false;
  uint64_t registrations = 0;
  uint64_t kubelet_restarts = 0;
  // Left to another plugin that serves it, on purpose (not registered, and not a fault).
  bool left_to_other_plugin = false;
  uint64_t registration_failures = 0;
  // Looks at the other plugins and what the kubelet holds (see kubelet/neighbours.h).
  uint64_t neighbour_looks = 0;
  absl::Duration longest_look;
  uint64_t holdings_unreadable = 0;
  uint64_t checkpoint_unreadable = 0;
};

// What one DRA driver contributes to /metrics.
struct DraMetrics {
  std::string driver;
  const DraCounters* counters = nullptr;
  size_t prepared_claims = 0;
  size_t prepared_devices = 0;
  // Its devices, as the device plugin's are (api="dra"), under the extended resource name the
  // shipped DeviceClass maps (`resource`).
  std::string resource;
  std::shared_ptr<const Snapshot> snapshot;
  bool serving = false;     // its sockets are up (a driver with no device yet waits)
  bool registered = false;  // the kubelet's plugin watcher registered it
  bool waiting = false;     // an earlier daemon of the node still drives it (a rollout)
  SlicePublisher::Status slice;
};

// What NVML says about discrete GPUs, for /metrics (with --nvml, once a GPU was found).
struct NvmlMetrics {
  NvmlStatus status;
  std::vector<NvmlTelemetry> gpus;
  std::string api = "device-plugin";  // what publishes the GPUs: "device-plugin" or "dra"
};

// The Prometheus text exposition for `resources` (and NVML's GPUs, when `nvml` is set, and the
// DRA drivers, when there are any).
std::string RenderMetrics(const std::vector<ResourceMetrics>& resources,
                          const NvmlMetrics* nvml = nullptr, const std::vector<DraMetrics>& dra = {});

// "host:port", ":port" (all interfaces) or "[::1]:port"; port 0 picks a free one.
absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(absl::string_view address);

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Returns true when healthy; otherwise fills `why`.
  using Check = std::function<bool(std::string* why)>;

  // `live` answers /livez (null: /livez answers as /healthz does).
  MetricsServer(std::string address, Render render, Check check, Check live = nullptr);
  ~MetricsServer();

  // Binds (a taken port is an error that names it), to answer on a thread of the caller's with
  // Serve() until Stop() or until `until_fd` is readable (HttpEndpoint::Serve): the daemon's main
  // thread does that while it waits for a stop signal.
  absl::Status Listen();
  bool Serve(int until_fd = -1);
  void Stop();
  int port() const { return port_; }

 private:
  const std::string address_;
  Render render_;
  Check check_;
  Check live_;
  std::unique_ptr<HttpEndpoint> server_;
  int port_ = 0;
};

}  // namespace edgeaccel

#endif  // EDGEACCEL_DAEMON_METRICS_H_
