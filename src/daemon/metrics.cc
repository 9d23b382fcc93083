#include "edgeaccel/daemon/metrics.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr char kVersion[] = "0.1.0";

std::string Escape(absl::string_view value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

// One metric family: HELP and TYPE once, then its samples.
class Family {
 public:
  Family(std::string* out, absl::string_view name, absl::string_view type, absl::string_view help)
      : out_(out), name_(name) {
    absl::StrAppend(out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void Sample(const std::vector<std::pair<std::string, std::string>>& labels, double value) {
    SampleOf("", labels, value);
  }
  // A sample of the family's `suffix` series (a histogram's "_bucket", "_sum", "_count").
  void SampleOf(absl::string_view suffix, const std::vector<std::pair<std::string, std::string>>& labels,
                double value) {
    absl::StrAppend(out_, name_, suffix);
    if (!labels.empty()) {
      absl::StrAppend(out_, "{");
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(out_, i ? "," : "", labels[i].first, "=\"", Escape(labels[i].second), "\"");
      }
      absl::StrAppend(out_, "}");
    }
    absl::StrAppend(out_, " ", absl::StrFormat("%.15g", value), "\n");
  }

 private:
  std::string* out_;
  std::string name_;
};

// The DRA drivers' families (NVIDIA's DRA driver exports the same measures: requests_total,
// request_duration_seconds, requests_inflight, prepared_devices, node_prepare_errors_total).
void RenderDraMetrics(const std::vector<DraMetrics>& drivers, std::string* out) {
  using Labels = std::vector<std::pair<std::string, std::string>>;
  struct Method {
    const char* name;
    const DraCallCounters& (*of)(const DraCounters&);
  };
  const Method kMethods[] = {
      {"NodePrepareResources", [](const DraCounters& c) -> const DraCallCounters& { return c.prepare; }},
      {"NodeUnprepareResources", [](const DraCounters& c) -> const DraCallCounters& { return c.unprepare; }},
  };
  auto per_method = [&](Family* family, double (*value)(const DraCallCounters&)) {
    for (const DraMetrics& d : drivers) {
      for (const Method& method : kMethods) {
        family->Sample({{"driver", d.driver}, {"method", method.name}}, value(method.of(*d.counters)));
      }
    }
  };
  Family requests(out, "edgeaccel_dra_requests_total", "counter",
                  "NodePrepareResources and NodeUnprepareResources calls the DRA driver answered.");
  per_method(&requests, [](const DraCallCounters& c) { return static_cast<double>(c.calls.load()); });
  Family errors(out, "edgeaccel_dra_claim_errors_total", "counter",
                "Claims the DRA driver answered with an error (each claim of a call counts once); "
                "the kubelet retries them and the pod waits.");
  per_method(&errors, [](const DraCallCounters& c) { return static_cast<double>(c.claim_errors.load()); });
  Family in_flight(out, "edgeaccel_dra_requests_inflight", "gauge",
                   "Calls arrived and not yet answered.");
  per_method(&in_flight, [](const DraCallCounters& c) { return static_cast<double>(c.in_flight.load()); });
  Family duration(out, "edgeaccel_dra_request_duration_seconds", "histogram",
                  "How long the DRA driver took to answer a call (the kubelet gives it 45 s).");
  for (const DraMetrics& d : drivers) {
    for (const Method& method : kMethods) {
      const DurationHistogram::Reading reading = method.of(*d.counters).duration.Read();
      const Labels labels = {{"driver", d.driver}, {"method", method.name}};
      for (size_t i = 0; i < DurationHistogram::kBoundsSeconds.size(); ++i) {
        Labels bucket = labels;
        bucket.push_back({"le", absl::StrFormat("%.15g", DurationHistogram::kBoundsSeconds[i])});
        duration.SampleOf("_bucket", bucket, static_cast<double>(reading.cumulative[i]));
      }
      Labels infinite = labels;
      infinite.push_back({"le", "+Inf"});
      duration.SampleOf("_bucket", infinite, static_cast<double>(reading.count));
      duration.SampleOf("_sum", labels, reading.sum_seconds);
      duration.SampleOf("_count", labels, static_cast<double>(reading.count));
    }
  }
  Family claims(out, "edgeaccel_dra_prepared_claims", "gauge",
                "ResourceClaims prepared on this node now (each has a CDI spec and a record).");
  Family devices(out, "edgeaccel_dra_prepared_devices", "gauge",
                 "Devices of the ResourceClaims prepared on this node now.");
  for (const DraMetrics& d : drivers) {
    claims.Sample({{"driver", d.driver}}, static_cast<double>(d.prepared_claims));
    devices.Sample({{"driver", d.driver}}, static_cast<double>(d.prepared_devices));
  }
  Family cleaned(out, "edgeaccel_dra_claims_cleaned_up_total", "counter",
                 "Prepared claims the DRA driver unprepared itself because the API server no longer "
                 "had them for this node (gone, made again under the name, or deallocated): the "
                 "kubelet never unprepared them.");
  for (const DraMetrics& d : drivers) {
    for (CleanupReason reason : kCleanupReasons) {
      cleaned.Sample({{"driver", d.driver}, {"reason", CleanupReasonName(reason)}},
                     static_cast<double>(d.counters->cleaned_up_for(reason)));
    }
  }
  Family streams(out, "edgeaccel_dra_health_streams_total", "counter",
                 "NodeWatchResources streams the kubelet opened (1.36 opens one per DRA plugin).");
  for (const DraMetrics& d : drivers) {
    streams.Sample({{"driver", d.driver}}, static_cast<double>(d.counters->health_streams.load()));
  }
  // The driver's own state, as edgeaccel_registered is the device plugin's.
  struct Gauge {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const DraMetrics&);
  };
  const Gauge kDriverState[] = {
      {"edgeaccel_dra_serving", "gauge",
       "1 while the DRA driver serves its kubelet plugin sockets (0: no device yet, or an "
       "earlier daemon of the node still drives it).",
       [](const DraMetrics& d) { return d.serving ? 1.0 : 0.0; }},
      {"edgeaccel_dra_registered", "gauge",
       "1 while the kubelet's plugin watcher has the DRA driver registered.",
       [](const DraMetrics& d) { return d.registered ? 1.0 : 0.0; }},
      {"edgeaccel_dra_waiting_for_earlier_daemon", "gauge",
       "1 while an earlier daemon of the node still drives the DRA driver (a rollout with "
       "maxSurge): this one takes over when it goes.",
       [](const DraMetrics& d) { return d.waiting ? 1.0 : 0.0; }},
      {"edgeaccel_dra_slice_published", "gauge",
       "1 while the node's ResourceSlice on the API server holds what the driver publishes.",
       [](const DraMetrics& d) { return d.slice.published ? 1.0 : 0.0; }},
      {"edgeaccel_dra_slice_publish_failing", "gauge",
       "1 while the last attempt to publish the ResourceSlice failed (the log and /healthz say "
       "why); retried with backoff.",
       [](const DraMetrics& d) { return d.slice.last_error.empty() ? 0.0 : 1.0; }},
      {"edgeaccel_dra_slice_devices", "gauge", "Devices in the published ResourceSlice.",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.devices); }},
      {"edgeaccel_dra_slice_tainted_devices", "gauge",
       "Devices in the published ResourceSlice with a taint (Unhealthy, or held by a "
       "device-plugin pod).",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.tainted); }},
      {"edgeaccel_dra_slice_taints_dropped", "gauge",
       "1 when the API server does not keep device taints (DRADeviceTaints off): Unhealthy "
       "devices are left out of the slice instead.",
       [](const DraMetrics& d) { return d.slice.taints_dropped ? 1.0 : 0.0; }},
      {"edgeaccel_dra_slice_watch_refused", "gauge",
       "1 when the API server refuses to watch ResourceSlices: the driver lists every --dra-resync "
       "instead.",
       [](const DraMetrics& d) { return d.slice.watch_refused ? 1.0 : 0.0; }},
      {"edgeaccel_dra_slice_writes_total", "counter",
       "ResourceSlice creates, updates and deletes sent.",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.writes); }},
      {"edgeaccel_dra_slice_conflicts_total", "counter",
       "ResourceSlice writes the API server answered 409 Conflict (listed again and retried).",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.conflicts); }},
      {"edgeaccel_dra_slice_lists_total", "counter", "ResourceSlice LISTs sent.",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.lists); }},
      {"edgeaccel_dra_slice_watches_total", "counter", "ResourceSlice WATCHes started.",
       [](const DraMetrics& d) { return static_cast<double>(d.slice.watches); }},
  };
  for (const Gauge& gauge : kDriverState) {
    Family family(out, gauge.name, gauge.type, gauge.help);
    for (const DraMetrics& d : drivers) family.Sample({{"driver", d.driver}}, gauge.value(d));
  }
}

}  // namespace

std::string RenderMetrics(const std::vector<ResourceMetrics>& resources, const NvmlMetrics* nvml,
                          const std::vector<DraMetrics>& dra) {
  std::string out;
  Family(&out, "edgeaccel_build_info", "gauge", "Build of the running daemon.")
      .Sample({{"version", kVersion}}, 1);

  // Every device, whichever API gives it out: the device plugin's resources, and the DRA drivers'
  // devices under the extended resource their DeviceClass maps; `api` says which.
  struct Published {
    const std::string& resource;
    const char* api;
    const Snapshot& snapshot;
  };
  std::vector<Published> published;
  for (const auto& r : resources) published.push_back({r.resource, "device-plugin", *r.snapshot});
  for (const DraMetrics& d : dra) {
    if (d.snapshot != nullptr) published.push_back({d.resource, "dra", *d.snapshot});
  }
  Family devices(&out, "edgeaccel_devices", "gauge",
                 "Devices by health, as given out (replicas count), by API: the device plugin "
                 "or DRA.");
  for (const Published& p : published) {
    const int healthy = p.snapshot.HealthyCount();
    devices.Sample({{"resource", p.resource}, {"api", p.api}, {"health", "Healthy"}}, healthy);
    devices.Sample({{"resource", p.resource}, {"api", p.api}, {"health", "Unhealthy"}},
                   static_cast<double>(p.snapshot.devices.size() - healthy));
  }
  Family device_up(&out, "edgeaccel_device_healthy", "gauge",
                   "1 if the physical device is Healthy, 0 if not.");
  // Telemetry per physical device, gathered first so each family is printed once.
  std::map<std::string, std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, double>>>
      telemetry;
  const std::map<std::string, std::pair<std::string, double>> kTelemetry = {
      {"temperature_celsius", {"edgeaccel_edgetpu_temperature_celsius", 1}},
      {"temperature_threshold_celsius", {"edgeaccel_edgetpu_temperature_threshold_celsius", 1}},
      {"trip_point0_temp_celsius", {"edgeaccel_edgetpu_throttle_temperature_celsius", 1}},
      {"gpu_load_permille", {"edgeaccel_gpu_load_ratio", 0.001}},
      {"gpu_temperature_celsius", {"edgeaccel_gpu_temperature_celsius", 1}},
  };
  // NVML's readings of discrete GPUs, with dcgm-exporter's meanings and units (docs/nvml.md):
  // key in the helper's sample -> metric, and the dcgm-exporter field it matches.
  const std::map<std::string, std::string> kNvmlGauges = {
      {"temperature_c", "edgeaccel_gpu_temperature_celsius"},          // DCGM_FI_DEV_GPU_TEMP
      {"power_w", "edgeaccel_gpu_power_watts"},                        // DCGM_FI_DEV_POWER_USAGE
      {"sm_util_percent", "edgeaccel_gpu_utilization_percent"},        // DCGM_FI_DEV_GPU_UTIL
      {"memory_util_percent", "edgeaccel_gpu_memory_copy_utilization_percent"},  // _MEM_COPY_UTIL
      {"memory_used_mib", "edgeaccel_gpu_memory_used_mib"},            // DCGM_FI_DEV_FB_USED
      {"memory_total_mib", "edgeaccel_gpu_memory_total_mib"},          // DCGM_FI_DEV_FB_TOTAL
      {"throttle_reasons", "edgeaccel_gpu_throttle_reasons"},  // DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
  };
  if (nvml != nullptr) {
    for (const NvmlTelemetry& gpu : nvml->gpus) {
      for (const auto& [key, value] : gpu.values) {
        auto metric = kNvmlGauges.find(key);
        if (metric == kNvmlGauges.end()) continue;
        telemetry[metric->second].push_back(
            {{{"resource", "nvidia.com/gpu"}, {"device", gpu.uuid}, {"api", nvml->api}}, value});
      }
    }
  }
  for (const Published& p : published) {
    std::set<std::string> seen;
    for (const Device& d : p.snapshot.devices) {
      const std::string& id = PhysicalId(d);
      if (!seen.insert(id).second) continue;
      device_up.Sample({{"resource", p.resource}, {"device", id}, {"api", p.api}},
                       d.health == Health::kHealthy ? 1 : 0);
      for (const auto& [key, value] : d.telemetry) {
        auto metric = kTelemetry.find(key);
        if (metric == kTelemetry.end()) continue;
        telemetry[metric->second.first].push_back(
            {{{"resource", p.resource}, {"device", id}, {"api", p.api}}, value * metric->second.second});
      }
    }
  }
  Family device_held(&out, "edgeaccel_device_held", "gauge",
                     "1 while the physical device is given out through the other API (a "
                     "device-plugin pod after the node moved to DRA, or a DRA claim after it moved "
                     "back): Unhealthy on purpose, not faulty.");
  for (const Published& p : published) {
    std::set<std::string> seen;
    for (const Device& d : p.snapshot.devices) {
      const std::string& id = PhysicalId(d);
      if (!seen.insert(id).second) continue;
      const bool held = std::any_of(d.problems.begin(), d.problems.end(), [](const HealthProblem& problem) {
        return problem.kind == ProblemKind::kHeldElsewhere;
      });
      device_held.Sample({{"resource", p.resource}, {"device", id}, {"api", p.api}}, held ? 1 : 0);
    }
  }
  const std::map<std::string, std::string> kTelemetryHelp = {
      {"edgeaccel_edgetpu_temperature_celsius", "Edge TPU die temperature."},
      {"edgeaccel_edgetpu_temperature_threshold_celsius",
       "Temperature at which the Edge TPU is reported Unhealthy."},
      {"edgeaccel_edgetpu_throttle_temperature_celsius",
       "Temperature at which the apex driver starts throttling (trip point 0)."},
      {"edgeaccel_gpu_load_ratio", "Jetson GPU load, 0 to 1."},
      {"edgeaccel_gpu_temperature_celsius", "GPU temperature (Jetson: thermal zone; discrete: NVML)."},
      {"edgeaccel_gpu_power_watts", "Discrete GPU power draw (NVML), watts."},
      {"edgeaccel_gpu_utilization_percent",
       "Percent of the last sample period in which a kernel ran on the discrete GPU (NVML)."},
      {"edgeaccel_gpu_memory_copy_utilization_percent",
       "Percent of the last sample period in which the discrete GPU's memory was read or written."},
      {"edgeaccel_gpu_memory_used_mib", "Discrete GPU framebuffer memory in use, MiB."},
      {"edgeaccel_gpu_memory_total_mib", "Discrete GPU framebuffer memory, MiB."},
      {"edgeaccel_gpu_throttle_reasons",
       "Why the discrete GPU's clocks are held down now: NVML's clocks-event reason bits (0: "
       "not throttled; 0x1 idle, 0x4 power cap, 0x8 hardware slowdown, 0x20 software thermal, "
       "0x40 hardware thermal, 0x80 power brake)."},
  };
  for (const auto& [name, samples] : telemetry) {
    Family family(&out, name, "gauge", kTelemetryHelp.at(name));
    for (const auto& [labels, value] : samples) family.Sample(labels, value);
  }

  struct Counter {
    const char* name;
    const char* help;
    std::function<double(const ResourceMetrics&)> value;
  };
  const Counter counters[] = {
      {"edgeaccel_allocations_total", "Allocate calls answered.",
       [](const ResourceMetrics& r) { return static_cast<double>(r.counters->allocations.load()); }},
      {"edgeaccel_allocate_errors_total", "Allocate calls refused (unknown or unhealthy devices).",
       [](const ResourceMetrics& r) { return static_cast<double>(r.counters->allocate_errors.load()); }},
      {"edgeaccel_list_and_watch_updates_total", "Device lists sent on ListAndWatch streams.",
       [](const ResourceMetrics& r) {
         return static_cast<double>(r.counters->list_and_watch_updates.load());
       }},
      {"edgeaccel_registrations_total", "Successful registrations with the kubelet.",
       [](const ResourceMetrics& r) { return static_cast<double>(r.registrations); }},
      {"edgeaccel_kubelet_restarts_total", "Kubelet restarts seen (kubelet.sock re-created).",
       [](const ResourceMetrics& r) { return static_cast<double>(r.kubelet_restarts); }},
      {"edgeaccel_registration_failures_total",
       "Register calls the kubelet refused or did not answer in time (each retried with backoff).",
       [](const ResourceMetrics& r) { return static_cast<double>(r.registration_failures); }},
      {"edgeaccel_neighbour_looks_total",
       "Looks at the other device plugins and at what the kubelet holds, to decide who serves "
       "the resource.",
       [](const ResourceMetrics& r) { return static_cast<double>(r.neighbour_looks); }},
      {"edgeaccel_kubelet_holdings_unreadable_total",
       "Looks that could read neither the kubelet's pod-resources API nor its checkpoint.",
       [](const ResourceMetrics& r) { return static_cast<double>(r.holdings_unreadable); }},
      {"edgeaccel_kubelet_checkpoint_unreadable_total",
       "Looks that found the kubelet's device checkpoint, or some of its entries, in a shape "
       "edgeaccel does not know.",
       [](const ResourceMetrics& r) { return static_cast<double>(r.checkpoint_unreadable); }},
  };
  for (const Counter& c : counters) {
    Family family(&out, c.name, "counter", c.help);
    for (const auto& r : resources) {
      if (r.counters != nullptr) family.Sample({{"resource", r.resource}}, c.value(r));
    }
  }
  Family longest_look(&out, "edgeaccel_neighbour_look_max_seconds", "gauge",
                      "The longest look at the other device plugins so far (bounded by a 1 s "
                      "budget).");
  for (const auto& r : resources) {
    if (r.counters != nullptr) {
      longest_look.Sample({{"resource", r.resource}}, absl::ToDoubleSeconds(r.longest_look));
    }
  }
  if (nvml != nullptr) {
    Family ecc(&out, "edgeaccel_gpu_ecc_errors_total", "counter",
               "ECC errors in the discrete GPU's memory since the driver loaded (NVML's volatile "
               "counts; dcgm-exporter's DCGM_FI_DEV_ECC_SBE_VOL_TOTAL and _DBE_VOL_TOTAL).");
    for (const NvmlTelemetry& gpu : nvml->gpus) {
      for (const auto& [key, type] : {std::pair<std::string, std::string>{"ecc_corrected", "corrected"},
                                      {"ecc_uncorrected", "uncorrected"}}) {
        auto value = gpu.values.find(key);
        if (value == gpu.values.end()) continue;
        ecc.Sample({{"resource", "nvidia.com/gpu"}, {"device", gpu.uuid}, {"api", nvml->api}, {"type", type}},
                   value->second);
      }
    }
    Family answering(&out, "edgeaccel_gpu_nvml_answering", "gauge",
                     "1 if NVML answered for the discrete GPU at the last sample, 0 if not (the "
                     "GPU is then Unhealthy).");
    for (const NvmlTelemetry& gpu : nvml->gpus) {
      answering.Sample({{"resource", "nvidia.com/gpu"}, {"device", gpu.uuid}, {"api", nvml->api}},
                       gpu.lost.empty() ? 1 : 0);
    }
    Family xids(&out, "edgeaccel_gpu_xid_errors_total", "counter",
                "Xid errors NVML reported for the discrete GPU since the daemon started; "
                "critical=\"true\" ones make the GPU Unhealthy (--nvml-ignored-xids lists the rest).");
    for (const NvmlXidCount& count : nvml->status.xids) {
      xids.Sample({{"resource", "nvidia.com/gpu"},
                   {"device", count.uuid},
                   {"api", nvml->api},
                   {"xid", absl::StrCat(count.xid)},
                   {"critical", count.critical ? "true" : "false"}},
                  static_cast<double>(count.count));
    }
    Family critical(&out, "edgeaccel_gpu_critical_xid", "gauge",
                    "The critical Xid that makes the discrete GPU Unhealthy now (0: none); it "
                    "counts until --nvml-xid-recovery passes without another.");
    for (const auto& [uuid, xid] : nvml->status.critical_xid) {
      critical.Sample({{"resource", "nvidia.com/gpu"}, {"device", uuid}, {"api", nvml->api}}, xid);
    }
    Family up(&out, "edgeaccel_nvml_up", "gauge",
              "1 while the NVML helper has listed the GPUs and answers; 0 while it is "
              "unavailable or restarting.");
    up.Sample({{"state", nvml->status.state}}, nvml->status.state == "ready" ? 1 : 0);
    Family restarts(&out, "edgeaccel_nvml_helper_restarts_total", "counter",
                    "NVML helper processes that ended (a crash, a failed event wait, or killed "
                    "for hanging) and were started again.");
    restarts.Sample({}, static_cast<double>(nvml->status.restarts));
    Family hangs(&out, "edgeaccel_nvml_helper_hangs_total", "counter",
                 "NVML helper processes killed because NVML did not answer within --nvml-timeout.");
    hangs.Sample({}, static_cast<double>(nvml->status.hangs));
  }
  Family registered(&out, "edgeaccel_registered", "gauge",
                    "1 while the resource is registered with the kubelet and serving.");
  for (const auto& r : resources) registered.Sample({{"resource", r.resource}}, r.registered ? 1 : 0);
  Family left(&out, "edgeaccel_left_to_other_plugin", "gauge",
              "1 while the resource is left to another device plugin that serves it (not "
              "registered on purpose; --take-over would replace it).");
  for (const auto& r : resources) {
    left.Sample({{"resource", r.resource}}, r.left_to_other_plugin ? 1 : 0);
  }
  if (!dra.empty()) RenderDraMetrics(dra, &out);
  return out;
}

absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-address \"", address, "\" is not host:port (e.g. :9405 or 127.0.0.1:9405)"));
  }
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  return std::make_pair(host, port);
}

MetricsServer::MetricsServer(std::string address, Render render, Check check, Check live)
    : address_(std::move(address)),
      render_(std::move(render)),
      check_(std::move(check)),
      live_(live != nullptr ? std::move(live) : check_) {}

MetricsServer::~MetricsServer() { Stop(); }

absl::Status MetricsServer::Listen() {
  absl::StatusOr<std::pair<std::string, int>> listen = ParseListenAddress(address_);
  if (!listen.ok()) return listen.status();
  const auto& [host, port] = *listen;
  std::map<std::string, HttpEndpoint::Handler> handlers;
  handlers["/metrics"] = [this] {
    return HttpAnswer{200, "text/plain; version=0.0.4; charset=utf-8", render_()};
  };
  for (const auto& [path, check] : {std::pair<std::string, Check*>{"/healthz", &check_}, {"/livez", &live_}}) {
    handlers[path] = [check = check] {
      std::string why;
      if ((*check)(&why)) return HttpAnswer{200, "text/plain; charset=utf-8", "ok\n"};
      return HttpAnswer{503, "text/plain; charset=utf-8", why + "\n"};
    };
  }
  server_ = std::make_unique<HttpEndpoint>(host, port, std::move(handlers));
  if (absl::Status started = server_->Listen(); !started.ok()) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address_, " for /metrics and /healthz (", started.message(),
        "; port taken? another edgeaccel-device-plugin?); choose another --metrics-address, or "
        "--metrics-address= to turn it off"));
  }
  port_ = server_->port();
  LOG(INFO) << "serving /metrics and /healthz on " << host << ":" << port_;
  return absl::OkStatus();
}

bool MetricsServer::Serve(int until_fd) { return server_ != nullptr && server_->Serve(until_fd); }

void MetricsServer::Stop() {
  // The endpoint stays (a Serve() on another thread may be about to start: it returns false).
  if (server_ != nullptr) server_->Stop();
}

}  // namespace edgeaccel
