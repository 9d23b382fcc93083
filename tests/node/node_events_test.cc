// NodeEventRecorder against a local HTTPS server standing in for the API server: the Events it
// creates, how repeats aggregate, the spam filter, and what a refusing API server gets.
#include "edgeaccel/node/node_events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/time/clock.h"
#include "captured_log.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestApiServer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class EventsApiTest : public ::testing::Test {
 protected:
  ApiServerConfig Config() {
    ApiServerConfig config;
    config.host = "127.0.0.1";
    config.port = api_.port();
    config.ca_file = api_.ca_file();
    config.token_file = api_.token_file();
    config.node_name = "node-1";
    config.timeout = absl::Seconds(2);
    return config;
  }
  nlohmann::json Only() {
    std::vector<nlohmann::json> events = api_.Events();
    EXPECT_EQ(events.size(), 1u);
    return events.empty() ? nlohmann::json() : events.front();
  }

  TestApiServer api_;
};

const NodeEvent kHot{true, "EdgeTPUUnhealthy",
                     "0000:03:00.0: temperature 101.2 °C ≥ 99.8 °C (hw_temp_warn2)"};

TEST_F(EventsApiTest, AnEventLooksLikeTheKubeletsOwn) {
  NodeEventRecorder recorder(Config());
  recorder.Start();
  recorder.Record(kHot);
  ASSERT_TRUE(Eventually([&] { return recorder.created() == 1; }));
  nlohmann::json event = Only();
  EXPECT_THAT(event["metadata"]["name"].get<std::string>(), StartsWith("node-1."));
  EXPECT_EQ(event["involvedObject"],
            nlohmann::json({{"kind", "Node"}, {"name", "node-1"}, {"uid", "node-1"}}));
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["reason"], "EdgeTPUUnhealthy");
  EXPECT_EQ(event["message"], kHot.message);
  EXPECT_EQ(event["count"], 1);
  EXPECT_EQ(event["source"]["component"], "edgeaccel-device-plugin");
  EXPECT_EQ(event["source"]["host"], "node-1");
  EXPECT_EQ(event["firstTimestamp"], event["lastTimestamp"]);
}

TEST_F(EventsApiTest, RepeatsRaiseTheCountOfOneEvent) {
  NodeEventRecorder recorder(Config());
  recorder.Start();
  for (int i = 0; i < 3; ++i) recorder.Record(kHot);
  recorder.Record({false, "EdgeTPUHealthy", "0000:03:00.0: healthy again"});
  ASSERT_TRUE(Eventually([&] { return recorder.created() == 2 && recorder.aggregated() == 2; }));
  EXPECT_EQ(api_.event_posts(), 2);
  EXPECT_EQ(api_.event_patches(), 2);
  int hot = 0;
  for (const nlohmann::json& event : api_.Events()) {
    if (event["reason"] == "EdgeTPUUnhealthy") {
      hot++;
      EXPECT_EQ(event["count"], 3);
    } else {
      EXPECT_EQ(event["type"], "Normal");
      EXPECT_EQ(event["count"], 1);
    }
  }
  EXPECT_EQ(hot, 1);
}

TEST_F(EventsApiTest, AnExpiredEventIsRecordedAnew) {
  NodeEventRecorder recorder(Config());
  recorder.Start();
  recorder.Record(kHot);
  ASSERT_TRUE(Eventually([&] { return recorder.created() == 1; }));
  api_.ExpireEvents();  // the API server dropped it (events live an hour)
  recorder.Record(kHot);
  ASSERT_TRUE(Eventually([&] { return recorder.created() == 2; }));
  EXPECT_EQ(Only()["count"], 1);
}

TEST_F(EventsApiTest, AFlappingDeviceCannotFloodTheApiServer) {
  NodeEventRecorder::Limits limits;
  limits.spam_burst = 5;
  limits.spam_refill = absl::Hours(1);
  NodeEventRecorder recorder(Config(), limits);
  CapturedLog log;
  recorder.Start();
  for (int i = 0; i < 20; ++i) {
    recorder.Record({true, "EdgeTPUUnhealthy", "flap " + std::to_string(i % 2)});
  }
  ASSERT_TRUE(Eventually([&] { return recorder.dropped() == 15; }));
  EXPECT_EQ(recorder.created() + recorder.aggregated(), 5u);
  EXPECT_EQ(log.Count("too many events"), 1);
}

TEST_F(EventsApiTest, RefusalsAreLoggedOncePerReasonAndNothingWaits) {
  for (int code : {403, 422, 429}) {
    api_.RefuseEventsWith(code);
    CapturedLog log;
    NodeEventRecorder recorder(Config());
    recorder.Start();
    for (int i = 0; i < 3; ++i) recorder.Record({true, "R", "m" + std::to_string(i)});
    ASSERT_TRUE(Eventually([&] { return recorder.failed() == 3; })) << code;
    EXPECT_EQ(log.Count(absl::StrCat("HTTP ", code)), 1) << code;
    if (code == 403) EXPECT_EQ(log.Count("resources: [\"events\"]"), 1);
  }
}

TEST(NodeEventRecorderTest, RecordingNeverWaitsForTheApiServer) {
  // Nothing listens: every send fails after the connect attempt; Record must not wait for it.
  ApiServerConfig config;
  config.host = "127.0.0.1";
  config.port = 1;
  config.ca_pem = "not used";
  config.node_name = "node-1";
  NodeEventRecorder::Limits limits;
  limits.queue = 8;
  NodeEventRecorder recorder(config, limits);
  recorder.Start();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) recorder.Record({true, "R", std::to_string(i)});
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_GE(recorder.dropped(), 1000u - 8u - 1u);  // the queue holds 8 (one may be in flight)
  recorder.Stop();
}

}  // namespace
}  // namespace edgeaccel
