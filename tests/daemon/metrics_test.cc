#include "edgeaccel/daemon/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"
#include "serving_thread.h"

namespace edgeaccel {
namespace {

using ::testing::HasSubstr;
using ::edgeaccel::testing::Occurrences;
using ::edgeaccel::testing::ServingThread;
using ::edgeaccel::testing::Threads;
using ::edgeaccel::testing::ThreadsCalled;

ResourceMetrics TpuMetrics(DeviceSet* set, PluginCounters* counters) {
  Device hot;
  hot.id = "0000:03:00.0";
  hot.health = Health::kUnhealthy;
  hot.telemetry["temperature_celsius"] = 100.05;
  hot.telemetry["temperature_threshold_celsius"] = 99.8;
  hot.telemetry["trip_point0_temp_celsius"] = 84.8;
  Device cool;
  cool.id = "0000:04:00.0";
  cool.telemetry["temperature_celsius"] = 45.05;
  set->Update({hot, cool});
  counters->allocations = 7;
  counters->allocate_errors = 2;
  return {set->resource_name(), set->Current(), counters, true, 3, 2};
}

TEST(MetricsTest, RendersPrometheusText) {
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  const std::string text = RenderMetrics({TpuMetrics(&set, &counters)});
  EXPECT_THAT(text, HasSubstr("# TYPE edgeaccel_devices gauge\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_devices{resource=\"coral.ai/edgetpu\",api=\"device-plugin\",health=\"Healthy\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_devices{resource=\"coral.ai/edgetpu\",api=\"device-plugin\",health=\"Unhealthy\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_edgetpu_temperature_celsius{resource=\"coral.ai/edgetpu\","
                              "device=\"0000:03:00.0\",api=\"device-plugin\"} 100.05\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_edgetpu_temperature_threshold_celsius{resource=\"coral.ai/"
                              "edgetpu\",device=\"0000:03:00.0\",api=\"device-plugin\"} 99.8\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_device_healthy{resource=\"coral.ai/edgetpu\",device=\"0000:03:00.0\",api=\"device-plugin\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE edgeaccel_allocations_total counter\nedgeaccel_allocations_total{resource=\"coral.ai/edgetpu\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_kubelet_restarts_total{resource=\"coral.ai/edgetpu\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_build_info{version=\"0.1.0\"} 1\n"));
  // Each family's HELP/TYPE appears once.
  EXPECT_EQ(text.find("# TYPE edgeaccel_edgetpu_temperature_celsius"),
            text.rfind("# TYPE edgeaccel_edgetpu_temperature_celsius"));
}

TEST(MetricsTest, ListenAddresses) {
  EXPECT_EQ(*ParseListenAddress(":9405"), std::make_pair(std::string("0.0.0.0"), 9405));
  EXPECT_EQ(*ParseListenAddress("127.0.0.1:0"), std::make_pair(std::string("127.0.0.1"), 0));
  EXPECT_EQ(*ParseListenAddress("[::1]:9405"), std::make_pair(std::string("::1"), 9405));
  for (const char* bad : {"9405", "host:", "host:99999", ":x"}) {
    EXPECT_FALSE(ParseListenAddress(bad).ok()) << bad;
  }
}

TEST(MetricsTest, ServesMetricsAndHealth) {
  DeviceSet set("coral.ai/edgetpu");
  PluginCounters counters;
  ResourceMetrics metrics = TpuMetrics(&set, &counters);
  bool healthy = true;
  MetricsServer server(
      "127.0.0.1:0", [&] { return RenderMetrics({metrics}); },
      [&](std::string* why) {
        if (!healthy) *why = "coral.ai/edgetpu is not registered with the kubelet";
        return healthy;
      });
  ASSERT_TRUE(server.Listen().ok());
  ServingThread serving(server, "ea-metrics");
  httplib::Client client("127.0.0.1", server.port());
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(response->body, HasSubstr("edgeaccel_allocate_errors_total{resource=\"coral.ai/edgetpu\"} 2"));
  EXPECT_EQ(client.Get("/healthz")->status, 200);
  healthy = false;
  auto unhealthy = client.Get("/healthz");
  EXPECT_EQ(unhealthy->status, 503);
  EXPECT_THAT(unhealthy->body, HasSubstr("not registered"));
  EXPECT_EQ(client.Get("/nope")->status, 404);

  // The same port again: a clear error, not a crash.
  MetricsServer second("127.0.0.1:" + std::to_string(server.port()), [] { return ""; },
                       [](std::string*) { return true; });
  absl::Status status = second.Listen();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot listen on 127.0.0.1:"));
  server.Stop();
}

// The daemon's main thread answers /metrics while it waits for a stop signal: Listen() binds (a
// taken port is its error), Serve() answers on the caller's thread and returns once
// the descriptor it was given is readable, leaving it unread; the port is closed by Stop().
TEST(MetricsTest, ServesOnTheCallersThreadUntilItsDescriptorIsReadable) {
  MetricsServer server("127.0.0.1:0", [] { return std::string("edgeaccel_up 1\n"); },
                       [](std::string*) { return true; });
  ASSERT_TRUE(server.Listen().ok());
  MetricsServer second("127.0.0.1:" + std::to_string(server.port()), [] { return ""; },
                       [](std::string*) { return true; });
  EXPECT_EQ(second.Listen().code(), absl::StatusCode::kUnavailable);

  const int until = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(until, 0);
  std::atomic<bool> returned{false};
  std::atomic<bool> served{false};
  std::thread caller([&] {
    pthread_setname_np(pthread_self(), "caller");
    served = server.Serve(until);
    returned = true;
  });
  httplib::Client client("127.0.0.1", server.port());
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->body, "edgeaccel_up 1\n");
  EXPECT_EQ(client.Get("/healthz")->status, 200);
  // No thread of its own: the caller answered, and nothing is named ea-metrics.
  const std::string threads = Threads(getpid());
  EXPECT_EQ(ThreadsCalled(threads, "caller"), 1) << threads;
  EXPECT_EQ(ThreadsCalled(threads, "ea-metrics"), 0) << threads;
  EXPECT_FALSE(returned.load());

  const uint64_t one = 1;
  ASSERT_EQ(write(until, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  caller.join();
  EXPECT_TRUE(served.load());
  uint64_t left = 0;  // unread by Serve()
  EXPECT_EQ(read(until, &left, sizeof(left)), static_cast<ssize_t>(sizeof(left)));
  EXPECT_EQ(left, 1u);
  close(until);
  server.Stop();
  EXPECT_FALSE(client.Get("/metrics"));  // the port is closed
}

// Prometheus keeps its connection open between scrapes. Two such scrapers must not hold both
// workers, idle between their scrapes, while the kubelet's liveness probe waits for /healthz (it
// gives up after 1 s, and the pod is restarted after a few such failures).
TEST(MetricsTest, HealthzIsAnsweredBesideKeepAliveScrapers) {
  MetricsServer server(
      "127.0.0.1:0", [] { return std::string(20000, '#') + "\n"; },
      [](std::string*) { return true; });
  ASSERT_TRUE(server.Listen().ok());
  ServingThread serving(server, "ea-metrics");
  std::atomic<bool> stop{false};
  std::atomic<int> scraping{0};  // scrapers whose kept-alive connection has had an answer
  std::vector<std::thread> scrapers;
  for (int i = 0; i < 2; ++i) {
    scrapers.emplace_back([&] {
      httplib::Client client("127.0.0.1", server.port());
      client.set_keep_alive(true);
      bool answered = false;
      while (!stop.load()) {
        if (client.Get("/metrics") && !answered) {
          answered = true;
          scraping++;
        }
        absl::SleepFor(absl::Milliseconds(300));  // a scrape interval, the connection kept
      }
    });
  }
  // The probes below go in while both scrapers hold their connections open.
  EXPECT_TRUE(::edgeaccel::testing::Eventually([&] { return scraping.load() == 2; }));
  httplib::Client probe("127.0.0.1", server.port());
  probe.set_connection_timeout(1, 0);
  probe.set_read_timeout(1, 0);
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    auto health = probe.Get("/healthz");
    ASSERT_TRUE(health) << "probe " << i << " got no answer within 1 s";
    EXPECT_EQ(health->status, 200);
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500)) << "probe " << i;
  }
  stop.store(true);
  for (std::thread& t : scrapers) t.join();
  server.Stop();
}

TEST(MetricsTest, RendersEachDraDriversCallsWhatItHoldsAndItsCleanups) {
  DraCounters counters;
  counters.prepare.calls = 3;
  counters.prepare.claim_errors = 1;
  counters.prepare.in_flight = 1;
  counters.prepare.duration.Observe(absl::Milliseconds(4));
  counters.prepare.duration.Observe(absl::Milliseconds(300));
  counters.prepare.duration.Observe(absl::Seconds(50));
  counters.unprepare.calls = 2;
  counters.cleaned_up_for(CleanupReason::kGone) = 1;
  counters.health_streams = 1;
  DraMetrics tpu;
  tpu.driver = "edgetpu.edgeaccel.io";
  tpu.counters = &counters;
  tpu.prepared_claims = 2;
  tpu.prepared_devices = 3;
  const std::string text = RenderMetrics({}, nullptr, {tpu});
  const std::string prepare = "driver=\"edgetpu.edgeaccel.io\",method=\"NodePrepareResources\"";
  EXPECT_THAT(text, HasSubstr("# TYPE edgeaccel_dra_requests_total counter\nedgeaccel_dra_requests_total{" +
                              prepare + "} 3\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_requests_total{driver=\"edgetpu.edgeaccel.io\",method="
                              "\"NodeUnprepareResources\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_claim_errors_total{" + prepare + "} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_requests_inflight{" + prepare + "} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE edgeaccel_dra_request_duration_seconds histogram\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_bucket{" + prepare + ",le=\"0.005\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_bucket{" + prepare + ",le=\"0.5\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_bucket{" + prepare + ",le=\"45\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_bucket{" + prepare + ",le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_sum{" + prepare + "} 50.304\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_request_duration_seconds_count{" + prepare + "} 3\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_prepared_claims{driver=\"edgetpu.edgeaccel.io\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_prepared_devices{driver=\"edgetpu.edgeaccel.io\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_claims_cleaned_up_total{driver=\"edgetpu.edgeaccel.io\",reason=\"gone\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_claims_cleaned_up_total{driver=\"edgetpu.edgeaccel.io\",reason=\"replaced\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_health_streams_total{driver=\"edgetpu.edgeaccel.io\"} 1\n"));
  // Without DRA drivers, no DRA families at all.
  EXPECT_THAT(RenderMetrics({}), ::testing::Not(HasSubstr("edgeaccel_dra_")));
}

// A node moved to DRA is as visible as one on the device plugin: every device's health,
// temperature and hold, under the resource name its DeviceClass maps, with api="dra"; and the
// driver's own state beside its calls.
TEST(MetricsTest, DraDevicesHaveTheDevicePluginsSeriesAndTheDriverItsState) {
  DeviceSet tpus("edgetpu.edgeaccel.io");
  PluginCounters unused;
  (void)TpuMetrics(&tpus, &unused);  // one hot (Unhealthy) TPU, one cool
  DraCounters counters;
  DraMetrics driver;
  driver.driver = "edgetpu.edgeaccel.io";
  driver.counters = &counters;
  driver.resource = "coral.ai/edgetpu";
  driver.snapshot = tpus.Current();
  driver.serving = true;
  driver.registered = true;
  driver.slice.published = false;
  driver.slice.last_error = "403 Forbidden";
  driver.slice.devices = 2;
  driver.slice.tainted = 1;
  driver.slice.writes = 4;
  driver.slice.watches = 1;
  const std::string text = RenderMetrics({}, nullptr, {driver});
  const std::string hot = "resource=\"coral.ai/edgetpu\",device=\"0000:03:00.0\",api=\"dra\"";
  EXPECT_THAT(text, HasSubstr("edgeaccel_device_healthy{" + hot + "} 0\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_device_healthy{resource=\"coral.ai/edgetpu\",device=\"0000:04:00.0\","
                              "api=\"dra\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_edgetpu_temperature_celsius{" + hot + "} 100.05\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_edgetpu_temperature_threshold_celsius{" + hot + "} 99.8\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_device_held{" + hot + "} 0\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_devices{resource=\"coral.ai/edgetpu\",api=\"dra\",health=\"Unhealthy\"} 1\n"));
  const std::string of = "{driver=\"edgetpu.edgeaccel.io\"}";
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_serving" + of + " 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_registered" + of + " 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_waiting_for_earlier_daemon" + of + " 0\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_slice_published" + of + " 0\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_slice_publish_failing" + of + " 1\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_slice_tainted_devices" + of + " 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE edgeaccel_dra_slice_writes_total counter\nedgeaccel_dra_slice_writes_total" + of + " 4\n"));
  EXPECT_THAT(text, HasSubstr("edgeaccel_dra_slice_watches_total" + of + " 1\n"));
  // Each family once, with the device plugin's resources beside.
  DeviceSet usb("coral.ai/edgetpu");
  PluginCounters usb_counters;
  const std::string both = RenderMetrics({TpuMetrics(&usb, &usb_counters)}, nullptr, {driver});
  EXPECT_EQ(Occurrences(both, "# TYPE edgeaccel_device_healthy "), 1u);
  EXPECT_THAT(both, HasSubstr("edgeaccel_device_healthy{resource=\"coral.ai/edgetpu\",device=\"0000:03:00.0\","
                              "api=\"device-plugin\"} 0\n"));
  EXPECT_THAT(both, HasSubstr("edgeaccel_device_healthy{" + hot + "} 0\n"));
}

// /livez is /healthz less what a restart cannot cure; without its own check it answers as
// /healthz does.
TEST(MetricsTest, LivezHasItsOwnCheck) {
  bool ready = false;
  bool live = true;
  MetricsServer server(
      "127.0.0.1:0", [] { return std::string(); },
      [&](std::string* why) {
        *why = "DRA driver edgetpu.edgeaccel.io cannot publish its ResourceSlice: 403";
        return ready;
      },
      [&](std::string* why) {
        *why = "DRA driver edgetpu.edgeaccel.io is not registered with the kubelet";
        return live;
      });
  ASSERT_TRUE(server.Listen().ok());
  ServingThread serving(server, "ea-metrics");
  httplib::Client client("127.0.0.1", server.port());
  auto healthz = client.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 503);
  EXPECT_THAT(healthz->body, HasSubstr("cannot publish"));
  EXPECT_EQ(client.Get("/livez")->status, 200);
  live = false;
  auto livez = client.Get("/livez");
  EXPECT_EQ(livez->status, 503);
  EXPECT_THAT(livez->body, HasSubstr("not registered"));
  server.Stop();

  MetricsServer one_check("127.0.0.1:0", [] { return std::string(); }, [](std::string* why) {
    *why = "no";
    return false;
  });
  ASSERT_TRUE(one_check.Listen().ok());
  ServingThread serving_one(one_check, "ea-metrics");
  httplib::Client other("127.0.0.1", one_check.port());
  EXPECT_EQ(other.Get("/livez")->status, 503);
  one_check.Stop();
}

}  // namespace
}  // namespace edgeaccel
