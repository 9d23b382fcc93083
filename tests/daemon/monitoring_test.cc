// The monitoring objects in manifests/components/monitoring, checked with the real tools: the
// PrometheusRule's alerts by promtool (its lint, and the unit tests in
// tests/monitoring/alerts_test.yaml), and the Grafana dashboard's shape. prometheus_test runs
// every expression in both against a real Prometheus scraping the daemon.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "daemon_process.h"
#include "fixture_host.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::RunCommand;
using ::edgeaccel::testing::TempDir;

const std::string kMonitoring = std::string(EDGEACCEL_SOURCE_DIR) + "/manifests/components/monitoring";

TEST(MonitoringTest, PromtoolLintsAndUnitTestsTheAlerts) {
  TempDir dir;
  YAML::Node rule = YAML::LoadFile(kMonitoring + "/prometheusrule.yaml");
  ASSERT_EQ(rule["kind"].as<std::string>(), "PrometheusRule");
  // What the operator hands Prometheus: the spec, as a rules file.
  YAML::Emitter rules;
  rules << rule["spec"];
  std::ofstream(dir.path() + "/alerts.rules.yaml") << rules.c_str() << "\n";
  std::ifstream tests(std::string(EDGEACCEL_SOURCE_DIR) + "/tests/monitoring/alerts_test.yaml");
  std::ofstream(dir.path() + "/alerts_test.yaml") << tests.rdbuf();

  auto check = RunCommand("/usr/bin/promtool", {"check", "rules", dir.path() + "/alerts.rules.yaml"});
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_THAT(check.out, ::testing::HasSubstr("SUCCESS: 10 rules found"));
  auto unit = RunCommand("/usr/bin/promtool", {"test", "rules", dir.path() + "/alerts_test.yaml"});
  EXPECT_EQ(unit.exit_code, 0) << unit.out << unit.err;
}

TEST(MonitoringTest, EveryAlertIsUnitTested) {
  YAML::Node rule = YAML::LoadFile(kMonitoring + "/prometheusrule.yaml");
  std::ifstream file(std::string(EDGEACCEL_SOURCE_DIR) + "/tests/monitoring/alerts_test.yaml");
  std::stringstream tests;
  tests << file.rdbuf();
  for (const auto& group : rule["spec"]["groups"]) {
    for (const auto& alert : group["rules"]) {
      const std::string name = alert["alert"].as<std::string>();
      EXPECT_THAT(tests.str(), ::testing::HasSubstr("alertname: " + name)) << name;
      EXPECT_TRUE(alert["annotations"]["summary"].IsDefined()) << name;
      EXPECT_TRUE(alert["labels"]["severity"].IsDefined()) << name;
    }
  }
}

TEST(MonitoringTest, TheDashboardIsAGrafanaDashboardOverOurMetrics) {
  std::ifstream file(kMonitoring + "/dashboard.json");
  nlohmann::json dashboard = nlohmann::json::parse(file, nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  EXPECT_EQ(dashboard["uid"], "edgeaccel-device-plugin");
  std::set<int> ids;
  int targets = 0;
  for (const auto& panel : dashboard["panels"]) {
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << "duplicate panel id";
    EXPECT_EQ(panel["datasource"]["uid"], "${datasource}") << panel["title"];
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"];
      EXPECT_THAT(expr, ::testing::HasSubstr("edgeaccel_")) << panel["title"];
      EXPECT_THAT(expr, ::testing::HasSubstr("node=~\"$node\"")) << panel["title"];
      targets++;
    }
  }
  EXPECT_GE(targets, 8);
}

}  // namespace
}  // namespace edgeaccel
