// The metrics as Prometheus itself sees them: promtool's lint, and a real Prometheus server on
// loopback scraping the running daemon, queried through its HTTP API.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "daemon_process.h"
#include "edgeaccel/discovery/resource_names.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_api_server.h"
#include "test_kubelet.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::DaemonProcess;
using ::edgeaccel::testing::FixtureHost;
using ::edgeaccel::testing::MetricsPort;
using ::edgeaccel::testing::RunCommand;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestApiServer;
using ::edgeaccel::testing::TestKubelet;

// A port nobody listens on right now (Prometheus cannot be told to pick one itself).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(PrometheusTest, PromtoolAcceptsOurMetricsAndPrometheusScrapesTheTemperature) {
  FixtureHost host;
  host.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0", .temp_mc = 47300});
  host.AddJetson(FixtureHost::Jetson::kNanoR32);
  // A discrete GPU with NVML (the fake library), for the GPU telemetry and Xid panels.
  const std::string uuid = "GPU-e3004cd3-73c7-d4d7-4325-ef6f655d34ec";
  host.AddNvidiaGpu({.pci_address = "0000:00:06.0", .minor = 0, .uuid = uuid});
  host.AddFakeNvml("driver=580.159.04\ncuda=13000\ngpu uuid=" + uuid +
                   " name=NVIDIA_H100_80GB_HBM3 memory_mib=81559 cc=9.0 mig=disabled "
                   "temperature=36 power_mw=70500 util=12 used_mib=1024\n");
  TempDir dir;
  TestKubelet kubelet(dir.path() + "/kubelet");
  kubelet.Start();
  // A DRA driver too (the USB Edge TPUs, none here), for the DRA panels: it needs the API server.
  TestApiServer api_server("node-1");
  DaemonProcess daemon(EDGEACCEL_DAEMON_PATH,
                       {"--host-root=" + host.root(), "--kubelet-root=" + kubelet.root(),
                        "--device-plugin-dir=" + kubelet.DevicePluginsDir(),
                        "--metrics-address=127.0.0.1:0", "--dra=coral-usb", "--node-name=node-1",
                        "--api-server=" + api_server.url(), "--api-token-file=" + api_server.token_file(),
                        "--api-ca-file=" + api_server.ca_file(), "--cdi-dir=" + dir.path() + "/cdi"});
  const int port = MetricsPort(daemon);
  ASSERT_GT(port, 0) << daemon.Log();
  ASSERT_TRUE(kubelet.WaitFor([&] {
    return kubelet.Allocatable(std::string(kResourceEdgeTpu)) == 1 &&
           kubelet.Allocatable(std::string(kResourceNvidiaGpu)) == 2;
  }));

  // promtool's lint of the exposition, NVML's families included (an application Xid, which
  // leaves the GPU Healthy, gives the Xid counter a series).
  httplib::Client client("127.0.0.1", port);
  host.NvmlEvent(uuid + " 13");
  std::string body;
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] {
    auto answer = client.Get("/metrics");
    body = answer ? answer->body : "";
    return absl::StrContains(body, "edgeaccel_nvml_up{state=\"ready\"} 1") &&
           absl::StrContains(body, "edgeaccel_gpu_xid_errors_total{") &&
           absl::StrContains(body, "edgeaccel_dra_request_duration_seconds_bucket{");
  })) << daemon.Log();
  std::ofstream(dir.path() + "/metrics.txt") << body;
  auto lint = RunCommand("/bin/sh", {"-c", "promtool check metrics < " + dir.path() + "/metrics.txt"});
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;

  // A real Prometheus scraping the daemon every second.
  const int prometheus_port = FreePort();
  std::ofstream(dir.path() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: edgeaccel\n"
      << "    static_configs:\n      - targets: ['127.0.0.1:" << port << "']\n"
      << "        labels: {node: test-node}\n";  // as the PodMonitor's relabeling adds it
  DaemonProcess prometheus("/usr/bin/prometheus",
                           {"--config.file=" + dir.path() + "/prometheus.yml",
                            "--storage.tsdb.path=" + dir.path() + "/data",
                            "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port)});
  httplib::Client api("127.0.0.1", prometheus_port);
  std::string value, device, seen;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline && value.empty()) {
    auto answer = api.Get("/api/v1/query?query=edgeaccel_edgetpu_temperature_celsius");
    if (answer && answer->status == 200) {
      seen = answer->body;
      nlohmann::json json = nlohmann::json::parse(answer->body, nullptr, false);
      if (!json.is_discarded() && json["data"]["result"].is_array() && !json["data"]["result"].empty()) {
        value = json["data"]["result"][0]["value"][1].get<std::string>();
        device = json["data"]["result"][0]["metric"]["device"].get<std::string>();
      }
    }
    if (value.empty()) absl::SleepFor(absl::Milliseconds(250));  // test side: Prometheus has no push
  }
  EXPECT_EQ(value, "47.3") << seen << "\n" << prometheus.Log().substr(0, 4000);
  EXPECT_EQ(device, "0000:03:00.0");
  auto load = api.Get("/api/v1/query?query=edgeaccel_gpu_load_ratio");
  ASSERT_TRUE(load);
  EXPECT_THAT(load->body, ::testing::HasSubstr("\"0.125\""));

  // Every expression of the Grafana dashboard and the alerts, against this Prometheus: each must
  // parse; each of the dashboard's must return series for this daemon (the node variable set to
  // its node, $__rate_interval to what Grafana would pick for a 1 s scrape).
  auto query = [&](const std::string& expr) {
    auto answer = api.Get("/api/v1/query?query=" + httplib::detail::encode_query_param(expr));
    // A bad expression is HTTP 400 with {"status":"error","error":...}.
    nlohmann::json json = answer ? nlohmann::json::parse(answer->body, nullptr, false)
                                 : nlohmann::json();
    return json.is_object() ? json : nlohmann::json::object();
  };
  const std::string monitoring = std::string(EDGEACCEL_SOURCE_DIR) + "/manifests/components/monitoring";
  std::ifstream dashboard_file(monitoring + "/dashboard.json");
  nlohmann::json dashboard = nlohmann::json::parse(dashboard_file, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  std::vector<std::string> exprs;
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      std::string expr = target["expr"];
      exprs.push_back(absl::StrReplaceAll(expr, {{"$node", "test-node"}, {"$__rate_interval", "1m"}}));
    }
  }
  // Rates need two scrapes in their window: a second or two on an idle machine, its scrape
  // loop's own time on a loaded one. Looked for until every expression has series (or 60 s).
  const absl::Time series_deadline = absl::Now() + absl::Seconds(60);
  auto every_one_has_series = [&] {
    for (const std::string& expr : exprs) {
      if (query(expr)["data"]["result"].empty()) return false;
    }
    return true;
  };
  while (!every_one_has_series() && absl::Now() < series_deadline) {
    absl::SleepFor(absl::Milliseconds(250));  // test side: Prometheus has no push
  }
  int checked = 0;
  for (const std::string& expr : exprs) {
    nlohmann::json answer = query(expr);
    EXPECT_EQ(answer.value("status", ""), "success") << expr << "\n" << answer.dump();
    EXPECT_FALSE(answer["data"]["result"].empty()) << "no series: " << expr;
    checked++;
  }
  EXPECT_GE(checked, 8);
  YAML::Node rule = YAML::LoadFile(monitoring + "/prometheusrule.yaml");
  for (const auto& group : rule["spec"]["groups"]) {
    for (const auto& alert : group["rules"]) {
      const std::string expr = alert["expr"].as<std::string>();
      EXPECT_EQ(query(expr).value("status", ""), "success") << alert["alert"].as<std::string>();
    }
  }
}

}  // namespace
}  // namespace edgeaccel
