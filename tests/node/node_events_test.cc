// NodeEventRecorder against a local HTTPS server standing in for the API server: the Events it
// creates, how repeats aggregate, the spam filter, and what a refusing API server gets.
#include "edgeaccel/node/node_events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "captured_log.h"
#include "edgeaccel/host/workers.h"
#include "edgeaccel/node/node_labeler.h"
#include "eventually.h"
#include "fixture_host.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::CapturedLog;
using ::edgeaccel::testing::ApiServerConfigFor;
using ::edgeaccel::testing::SilentTcpServer;
using ::edgeaccel::testing::Eventually;
using ::edgeaccel::testing::TempDir;
using ::edgeaccel::testing::TestApiServer;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class EventsApiTest : public ::testing::Test {
 protected:
  ApiServerConfig Config() { return api_.ClientConfig(absl::Seconds(2)); }
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

// A message over 1 KiB is cut, and "°C" is two bytes: cut at byte 1021 it left half a
// character, and nlohmann's dump() threw type_error.316 on the ea-events thread, which ended the
// process. The cut must fall on a character boundary wherever the long characters sit.
TEST(NodeEventObjectTest, ALongMessageIsCutBetweenCharacters) {
  for (const std::string& wide :
       {std::string("°"), std::string("≥"), std::string("\xF0\x9F\x94\xA5")}) {
    for (size_t prefix = 1010; prefix <= 1030; ++prefix) {
      std::string message(prefix, 'a');
      while (message.size() < 1100) message += wide + "C ";
      std::string object;
      ASSERT_NO_THROW(object = NodeEventObject({true, "EdgeTPUUnhealthy", message}, "node-1",
                                               "node-1.1", 1, absl::Now(), absl::Now()))
          << prefix;
      nlohmann::json parsed = nlohmann::json::parse(object, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(parsed.is_discarded()) << prefix;
      const std::string cut = parsed["message"];
      EXPECT_LE(cut.size(), 1024u) << prefix;
      EXPECT_EQ(cut.substr(cut.size() - 3), "...") << prefix;
      const std::string kept = cut.substr(0, cut.size() - 3);
      EXPECT_EQ(message.compare(0, kept.size(), kept), 0) << "a prefix of the message: " << prefix;
      EXPECT_GE(kept.size(), 1021u - wide.size() + 1) << "no more cut than one character";
    }
  }
}

// Whatever bytes the builder is given (a device's sysfs text, a node name from the environment)
// it makes JSON of, and never throws: invalid UTF-8 becomes U+FFFD, as Go's encoding/json writes
// it for client-go.
TEST(NodeEventObjectTest, InvalidUtf8AnywhereIsReplacedNotThrown) {
  const std::string bad = "bad \xFF\xC3( \xE2\x82 \xED\xA0\x80 \xC0\xAF end";
  std::string object;
  ASSERT_NO_THROW(object = NodeEventObject({true, bad, bad + std::string(2000, '\xFE')}, bad,
                                           bad, 1, absl::Now(), absl::Now()));
  nlohmann::json parsed = nlohmann::json::parse(object, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << object;
  EXPECT_THAT(parsed["reason"].get<std::string>(), StartsWith("bad \uFFFD"));
  EXPECT_THAT(parsed["involvedObject"]["name"].get<std::string>(), HasSubstr("end"));
  EXPECT_LE(parsed["message"].get<std::string>().size(), 1024u);
}

// The recorder's thread survives both: the Events are created, with whole characters.
TEST_F(EventsApiTest, TheRecorderSurvivesCutCharactersAndInvalidUtf8) {
  NodeEventRecorder recorder(Config());
  recorder.Start();
  // Bytes 1020 and 1021 are "°": a cut at byte 1021 would split it.
  const std::string hot = std::string(1020, 'x') + "°C ≥ 99.8 °C (hw_temp_warn2)";
  recorder.Record({true, "EdgeTPUUnhealthy", hot});
  recorder.Record({true, "EdgeTPUUnhealthy", "bad byte \xFF in sysfs"});
  ASSERT_TRUE(Eventually([&] { return recorder.created() == 2; }))
      << "failed " << recorder.failed() << ", dropped " << recorder.dropped();
  EXPECT_EQ(recorder.failed(), 0u);
  nlohmann::json cut = api_.WaitForEvent("EdgeTPUUnhealthy", "xxx...");
  ASSERT_FALSE(cut.is_null());
  EXPECT_EQ(cut["message"].get<std::string>(), std::string(1020, 'x') + "...");
  EXPECT_FALSE(api_.WaitForEvent("EdgeTPUUnhealthy", "bad byte \uFFFD in sysfs").is_null());
  // The same again aggregates: the PATCH body is built with the same care.
  recorder.Record({true, "EdgeTPUUnhealthy", hot});
  ASSERT_TRUE(Eventually([&] { return recorder.aggregated() == 1; }));
}

TEST(NodeEventRecorderTest, RecordingNeverWaitsForTheApiServer) {
  // An API server that takes the connection and never answers: the sender is held in its first
  // request for the whole test (its timeout is far longer), so what Record does with the rest is
  // exact, not a race with the sender.
  SilentTcpServer silent;
  TempDir dir;
  const ApiServerConfig config = ApiServerConfigFor(silent.port(), dir.path(), absl::Minutes(10));
  ASSERT_FALSE(config.host.empty());
  NodeEventRecorder::Limits limits;
  limits.queue = 8;
  NodeEventRecorder recorder(config, limits);
  recorder.Start();
  recorder.Record({true, "R", "0"});
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10)));  // the sender holds event 0
  const absl::Time start = absl::Now();
  for (int i = 1; i < 1000; ++i) recorder.Record({true, "R", std::to_string(i)});
  // Had Record waited for the sender, it would still be waiting (ten minutes).
  EXPECT_LT(absl::Now() - start, absl::Minutes(5));
  EXPECT_EQ(recorder.dropped(), 999u - 8u);  // the queue keeps the newest 8
  // Stop cancels the request in flight instead of waiting out its timeout.
  const absl::Time stop = absl::Now();
  recorder.Stop();
  EXPECT_LT(absl::Now() - stop, absl::Minutes(5)) << "half the request's timeout: the cancel ended it";
}

// The daemon's way: the labeller and the recorder share one worker (one thread, and only while
// there is work). Labels and Events both reach the API server, the Events in the order recorded.
TEST_F(EventsApiTest, TheLabellerAndTheRecorderShareOneWorker) {
  Workers worker("test-api", {.exit_when_idle = true});
  NodeLabeler labeler(Config(), &worker);
  NodeEventRecorder recorder(Config(), &worker);
  labeler.Start();
  recorder.Start();
  labeler.Set({{"coral.ai/edgetpu.present", "true"}});
  recorder.Record(kHot);
  recorder.Record({false, "EdgeTPUHealthy", "0000:03:00.0: healthy again"});
  ASSERT_TRUE(Eventually([&] { return labeler.patches() == 1 && recorder.created() == 2; }));
  EXPECT_EQ(api_.Node()["metadata"]["labels"]["coral.ai/edgetpu.present"], "true");
  ASSERT_TRUE(Eventually([&] { return !worker.thread_running(); }));  // idle: no thread
  std::vector<nlohmann::json> events = api_.Events();
  ASSERT_EQ(events.size(), 2u);
  std::sort(events.begin(), events.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["metadata"]["name"].get<std::string>() < b["metadata"]["name"].get<std::string>();
  });
  EXPECT_EQ(events[0]["reason"], "EdgeTPUUnhealthy");
  EXPECT_EQ(events[1]["reason"], "EdgeTPUHealthy");
  worker.Stop();
}

// One request in flight against an API server that never answers: stopping the shared worker
// cancels it (the labeller's and the recorder's stop hooks) instead of waiting out its timeout,
// and what waits behind it is dropped.
TEST(SharedApiWorkerTest, StopCancelsTheRequestInFlightOfEitherSink) {
  SilentTcpServer silent;
  TempDir dir;
  const ApiServerConfig config = ApiServerConfigFor(silent.port(), dir.path(), absl::Minutes(10));
  ASSERT_FALSE(config.host.empty());
  Workers worker("test-api", {.exit_when_idle = true});
  NodeLabeler labeler(config, &worker);
  NodeEventRecorder recorder(config, &worker);
  labeler.Start();
  recorder.Start();
  labeler.Set({{"coral.ai/edgetpu.present", "true"}});
  recorder.Record(kHot);
  ASSERT_TRUE(silent.WaitForConnections(1, absl::Seconds(10)));  // the labeller's GET hangs
  const absl::Time start = absl::Now();
  worker.Stop();
  EXPECT_LT(absl::Now() - start, absl::Minutes(5)) << "half the request's timeout: the cancel ended it";
  EXPECT_EQ(labeler.failures(), 0u) << "a cancelled request is the stop, not a failure";
  EXPECT_EQ(recorder.created(), 0u);
  EXPECT_EQ(recorder.failed(), 0u);
  labeler.Stop();
  recorder.Stop();
}

}  // namespace
}  // namespace edgeaccel
