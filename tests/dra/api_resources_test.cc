// The API server stand-in's resource.k8s.io/v1 (tests/support/test_api_resources.cc), checked
// through real HTTPS requests with the daemon's own client: each rule of the real server that it
// models answers as the real one does (status and Status reason, the field a 422 names), so a
// driver that passes against it does not fail against kube-apiserver for those reasons.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "edgeaccel/node/api_client.h"
#include "edgeaccel/node/api_server_config.h"
#include "eventually.h"
#include "test_api_server.h"

namespace edgeaccel {
namespace {

using ::edgeaccel::testing::TestApiServer;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;
using Answer = std::pair<int, std::string>;

constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";
constexpr char kDriver[] = "gpu.edgeaccel.io";

class ApiResourcesTest : public ::testing::Test {
 protected:
  ApiServerConfig Config() {
    return api_.ClientConfig(absl::Seconds(5));
  }
  // The answer's status and, for an error, its Status reason; the body in last_.
  Answer Call(const std::string& method, const std::string& path, const std::string& type = "",
              const std::string& body = "", std::optional<ApiServerConfig> config = std::nullopt) {
    absl::StatusOr<HttpResponse> response =
        ApiClient(config.value_or(Config())).Request(method, path, type, body);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return {0, ""};
    last_ = json::parse(response->body, nullptr, false);
    std::string reason;
    if (last_.is_object() && last_.value("kind", "") == "Status") {
      reason = last_.value("reason", "");
    }
    return {response->status, reason};
  }
  Answer Create(const json& slice, const std::string& query = "") {
    return Call("POST", kSlices + query, "application/json", slice.dump());
  }
  Answer Update(const json& slice, const std::string& query = "") {
    return Call("PUT", absl::StrCat(kSlices, "/", slice["metadata"].value("name", ""), query),
                "application/json", slice.dump());
  }
  // The fields the last 422 named, each with its cause's reason: "spec.driver FieldValueRequired".
  std::vector<std::string> Causes() {
    std::vector<std::string> out;
    for (const json& cause : last_["details"].value("causes", json::array())) {
      out.push_back(cause.value("field", "") + " " + cause.value("reason", ""));
    }
    return out;
  }
  // A slice as the driver publishes it (docs/dra.md): one Jetson GPU of node-1.
  json Slice(const std::string& node = "node-1", const std::string& driver = kDriver) {
    json owner = {{"apiVersion", "v1"},
                  {"kind", "Node"},
                  {"name", "node-1"},
                  {"uid", api_.node_uid()},
                  {"controller", true}};
    json device = {{"name", "gpu-tegra234-igpu0"}};
    device["attributes"] = {{"type", {{"string", "gpu"}}},
                            {"integrated", {{"bool", true}}},
                            {"l4tVersion", {{"version", "36.4.7"}}},
                            {"numaNode", {{"int", 0}}}};
    device["capacity"] = {{"memory", {{"value", "3871Mi"}}}};
    json slice = {{"apiVersion", "resource.k8s.io/v1"}, {"kind", "ResourceSlice"}};
    slice["metadata"]["generateName"] = node + "-" + driver + "-";
    slice["metadata"]["ownerReferences"] = json::array({owner});
    slice["spec"] = {{"driver", driver},
                     {"nodeName", node},
                     {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}}};
    slice["spec"]["devices"] = json::array({device});
    return slice;
  }
  // Creates `slice`; the stored object.
  json Created(const json& slice) {
    EXPECT_EQ(Create(slice), Answer(201, "")) << last_.dump();
    return last_;
  }

  TestApiServer api_;
  json last_;
};

TEST_F(ApiResourcesTest, AGoodSliceIsCreatedWithWhatTheServerSets) {
  const json slice = Created(Slice());
  const std::string name = slice["metadata"]["name"];
  // generateName plus 5 characters of the name generator's alphabet.
  ASSERT_THAT(name, StartsWith("node-1-gpu.edgeaccel.io-"));
  ASSERT_EQ(name.size(), std::string("node-1-gpu.edgeaccel.io-").size() + 5);
  for (char c : name.substr(name.size() - 5)) {
    EXPECT_NE(std::string("bcdfghjklmnpqrstvwxz2456789").find(c), std::string::npos) << name;
  }
  EXPECT_EQ(slice["kind"], "ResourceSlice");
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["metadata"]["uid"].get<std::string>().size(), 36u);
  EXPECT_EQ(slice["metadata"]["generation"], 1);
  EXPECT_FALSE(slice["metadata"].value("creationTimestamp", "").empty());
  EXPECT_FALSE(slice["metadata"].value("resourceVersion", "").empty());
  EXPECT_EQ(slice["metadata"]["ownerReferences"], Slice()["metadata"]["ownerReferences"]);
  EXPECT_EQ(slice["spec"], Slice()["spec"]);
  // Stored as answered.
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "/", name)), Answer(200, ""));
  EXPECT_EQ(last_, slice);
  ASSERT_EQ(api_.ResourceSlices().size(), 1u);
  EXPECT_EQ(api_.ResourceSlices()[0], slice);
  EXPECT_EQ(api_.resource_slice_writes(), 1);
  // Another generated name each time.
  EXPECT_NE(Created(Slice())["metadata"]["name"], name);
}

TEST_F(ApiResourcesTest, TheNodeCarriesTheUidOwnerReferencesName) {
  EXPECT_EQ(Call("GET", "/api/v1/nodes/node-1"), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["uid"], api_.node_uid());
  EXPECT_EQ(api_.node_uid().size(), 36u);
}

TEST_F(ApiResourcesTest, ANamedCreateTakesTheNameAndASecondIsAlreadyExists) {
  json slice = Slice();
  slice["metadata"].erase("generateName");
  slice["metadata"]["name"] = "node-1-gpu";
  slice["metadata"]["namespace"] = "default";  // cleared: slices are cluster-scoped
  EXPECT_EQ(Create(slice), Answer(201, ""));
  EXPECT_EQ(last_["metadata"]["name"], "node-1-gpu");
  EXPECT_FALSE(last_["metadata"].contains("namespace"));
  EXPECT_EQ(Create(slice), Answer(409, "AlreadyExists"));
  EXPECT_EQ(last_["message"], "resourceslices.resource.k8s.io \"node-1-gpu\" already exists");
  EXPECT_EQ(api_.ResourceSlices().size(), 1u);
}

TEST_F(ApiResourcesTest, ACreateCarryingAResourceVersionIsRefused) {
  json slice = Slice();
  slice["metadata"]["resourceVersion"] = "7";
  EXPECT_EQ(Create(slice).first, 500);
  EXPECT_EQ(last_["message"], "resourceVersion should not be set on objects to be created");
  EXPECT_TRUE(api_.ResourceSlices().empty());
}

TEST_F(ApiResourcesTest, WhatIsNotAResourceSliceInJsonIs415Or400) {
  EXPECT_EQ(Call("POST", kSlices, "application/merge-patch+json", Slice().dump()),
            Answer(415, "UnsupportedMediaType"));
  EXPECT_EQ(Call("POST", kSlices, "", Slice().dump()), Answer(415, "UnsupportedMediaType"));
  EXPECT_EQ(Call("PUT", absl::StrCat(kSlices, "/x"), "text/plain", Slice().dump()),
            Answer(415, "UnsupportedMediaType"));
  for (const char* body : {"{not json", "[1]", "\"a\"", ""}) {
    EXPECT_EQ(Call("POST", kSlices, "application/json", body), Answer(400, "BadRequest")) << body;
  }
  json other = Slice();
  other["apiVersion"] = "resource.k8s.io/v1beta2";
  EXPECT_EQ(Create(other), Answer(400, "BadRequest"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("does not match the expected API version"));
  other = Slice();
  other["kind"] = "ResourceClaim";
  EXPECT_EQ(Create(other), Answer(400, "BadRequest"));
  EXPECT_TRUE(api_.ResourceSlices().empty());
  // Without apiVersion and kind the URL's are taken.
  other = Slice();
  other.erase("apiVersion");
  other.erase("kind");
  EXPECT_EQ(Create(other), Answer(201, ""));
  EXPECT_EQ(last_["apiVersion"], "resource.k8s.io/v1");
}

TEST_F(ApiResourcesTest, AValueOfTheWrongTypeIs400) {
  const std::vector<std::function<void(json&)>> wrong = {
      [](json& s) { s["spec"]["pool"]["generation"] = "1"; },
      [](json& s) { s["spec"]["pool"]["resourceSliceCount"] = 1.5; },
      [](json& s) { s["spec"]["driver"] = 7; },
      [](json& s) { s["spec"]["devices"] = json::object(); },
      [](json& s) { s["spec"]["devices"][0]["attributes"]["numaNode"]["int"] = "0"; },
      [](json& s) { s["spec"]["devices"][0]["attributes"]["integrated"]["bool"] = "true"; },
      [](json& s) { s["spec"]["allNodes"] = 1; },
      [](json& s) { s["metadata"]["ownerReferences"] = json::object(); },
  };
  for (size_t i = 0; i < wrong.size(); i++) {
    json slice = Slice();
    wrong[i](slice);
    EXPECT_EQ(Create(slice), Answer(400, "BadRequest")) << i << " " << slice.dump();
    EXPECT_THAT(last_.value("message", ""),
                StartsWith("ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: "
                           "json: cannot unmarshal"))
        << i;
  }
  EXPECT_TRUE(api_.ResourceSlices().empty());
}

TEST_F(ApiResourcesTest, QuantitiesMustParseAndComeBackCanonical) {
  for (const char* bad : {"8GB", "1K", "", "1.2.3", "Mi", "1e", "-.", "8 Gi", "abc", "1Ki+3"}) {
    json slice = Slice();
    slice["spec"]["devices"][0]["capacity"]["memory"]["value"] = bad;
    EXPECT_EQ(Create(slice), Answer(400, "BadRequest")) << bad;
  }
  const std::vector<std::pair<json, std::string>> canonical = {
      {"3871Mi", "3871Mi"}, {"8Gi", "8Gi"},   {"1024Mi", "1Gi"},  {"1", "1"},
      {"1000m", "1"},       {"1500", "1500"}, {"2000k", "2M"},    {"1.5", "1500m"},
      {"0.5Gi", "512Mi"},   {"0.5Ki", "512"}, {"1e3", "1e3"},     {"12e6", "12e6"},
      {"100m", "100m"},     {"1Ki", "1Ki"},   {"1024", "1024"},   {"-1Gi", "-1Gi"},
      {" 2Gi ", "2Gi"},     {8, "8"},         {"0.0000000001", "1n"}, {"000", "0"},
      {"-", "0"},  // ParseQuantity's quirk: a sign alone is zero
  };
  for (const auto& [sent, stored] : canonical) {
    json slice = Slice();
    slice["spec"]["devices"][0]["capacity"]["memory"]["value"] = sent;
    ASSERT_EQ(Create(slice), Answer(201, "")) << sent << " " << last_.dump();
    EXPECT_EQ(last_["spec"]["devices"][0]["capacity"]["memory"]["value"], stored) << sent;
  }
}

// A mutation of the good slice and the field its 422 names, with the cause's reason.
struct BadSlice {
  const char* what;
  std::function<void(json&)> change;
  const char* field;
  const char* reason;
};

std::string Repeat(const std::string& part, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; i++) out += part;
  return out;
}

json Devices(size_t count, bool taints = false) {
  json devices = json::array();
  for (size_t i = 0; i < count; i++) {
    json device = {{"name", absl::StrCat("gpu-", i)}};
    if (taints) device["taints"] = json::array({{{"key", "a"}, {"effect", "NoSchedule"}}});
    devices.push_back(device);
  }
  return devices;
}

json Attributes(size_t count) {
  json attributes = json::object();
  for (size_t i = 0; i < count; i++) attributes[absl::StrCat("a", i)] = {{"int", 1}};
  return attributes;
}

TEST_F(ApiResourcesTest, EachValidationRuleIs422NamingItsField) {
  const std::string label63 = Repeat("a", 63);
  const std::vector<BadSlice> bad = {
      {"no driver", [](json& s) { s["spec"].erase("driver"); }, "spec.driver",
       "FieldValueRequired"},
      {"driver of 64", [&](json& s) { s["spec"]["driver"] = Repeat("a", 60) + ".com"; },
       "spec.driver", "FieldValueTooLong"},
      {"driver not a DNS subdomain", [](json& s) { s["spec"]["driver"] = "gpu_edgeaccel.io"; },
       "spec.driver", "FieldValueInvalid"},
      {"no pool name", [](json& s) { s["spec"]["pool"].erase("name"); }, "spec.pool.name",
       "FieldValueRequired"},
      {"pool name of 254",
       [&](json& s) {
         s["spec"]["pool"]["name"] = absl::StrCat(label63, ".", label63, ".", label63, ".",
                                                  Repeat("a", 62));
       },
       "spec.pool.name", "FieldValueTooLong"},
      {"pool name not DNS", [](json& s) { s["spec"]["pool"]["name"] = "Node_1"; },
       "spec.pool.name", "FieldValueInvalid"},
      {"negative generation", [](json& s) { s["spec"]["pool"]["generation"] = -1; },
       "spec.pool.generation", "FieldValueInvalid"},
      {"no resourceSliceCount", [](json& s) { s["spec"]["pool"].erase("resourceSliceCount"); },
       "spec.pool.resourceSliceCount", "FieldValueInvalid"},
      {"resourceSliceCount 0", [](json& s) { s["spec"]["pool"]["resourceSliceCount"] = 0; },
       "spec.pool.resourceSliceCount", "FieldValueInvalid"},
      {"no node selection", [](json& s) { s["spec"].erase("nodeName"); }, "spec",
       "FieldValueRequired"},
      {"nodeName and allNodes", [](json& s) { s["spec"]["allNodes"] = true; }, "spec",
       "FieldValueInvalid"},
      {"nodeName and perDeviceNodeSelection",
       [](json& s) { s["spec"]["perDeviceNodeSelection"] = true; }, "spec", "FieldValueInvalid"},
      {"allNodes false", [](json& s) { s["spec"]["allNodes"] = false; }, "spec.allNodes",
       "FieldValueInvalid"},
      {"empty nodeName", [](json& s) { s["spec"]["nodeName"] = ""; }, "spec.nodeName",
       "FieldValueInvalid"},
      {"nodeName not DNS", [](json& s) { s["spec"]["nodeName"] = "Node_1"; }, "spec.nodeName",
       "FieldValueInvalid"},
      {"129 devices", [](json& s) { s["spec"]["devices"] = Devices(129); }, "spec.devices",
       "FieldValueTooMany"},
      {"65 devices with taints", [](json& s) { s["spec"]["devices"] = Devices(65, true); },
       "spec.devices", "FieldValueTooMany"},
      {"device name upper case", [](json& s) { s["spec"]["devices"][0]["name"] = "GPU-0"; },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"device name of 64", [](json& s) { s["spec"]["devices"][0]["name"] = Repeat("a", 64); },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"device name starts with -", [](json& s) { s["spec"]["devices"][0]["name"] = "-gpu"; },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"device name ends with -", [](json& s) { s["spec"]["devices"][0]["name"] = "gpu-"; },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"device name with a dot", [](json& s) { s["spec"]["devices"][0]["name"] = "gpu.0"; },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"no device name", [](json& s) { s["spec"]["devices"][0].erase("name"); },
       "spec.devices[0].name", "FieldValueInvalid"},
      {"duplicate device",
       [](json& s) { s["spec"]["devices"].push_back(s["spec"]["devices"][0]); },
       "spec.devices[1]", "FieldValueDuplicate"},
      {"33 attributes and capacities",
       [](json& s) { s["spec"]["devices"][0]["attributes"] = Attributes(32); },
       "spec.devices[0]", "FieldValueInvalid"},
      {"two values",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["type"]["int"] = 1; },
       "spec.devices[0].attributes[type]", "FieldValueInvalid"},
      {"no value", [](json& s) { s["spec"]["devices"][0]["attributes"]["type"] = json::object(); },
       "spec.devices[0].attributes[type]", "FieldValueInvalid"},
      {"string of 65",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["type"]["string"] = Repeat("x", 65); },
       "spec.devices[0].attributes[type].string", "FieldValueTooLong"},
      {"version MAJOR.MINOR",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] = "36.4"; },
       "spec.devices[0].attributes[l4tVersion].version", "FieldValueInvalid"},
      {"version with a leading zero",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] = "36.04.7"; },
       "spec.devices[0].attributes[l4tVersion].version", "FieldValueInvalid"},
      {"version with a v",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] = "v1.2.3"; },
       "spec.devices[0].attributes[l4tVersion].version", "FieldValueInvalid"},
      {"version of 65",
       [](json& s) {
         s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] =
             "1.2.3-" + Repeat("a", 59);
       },
       "spec.devices[0].attributes[l4tVersion].version", "FieldValueTooLong"},
      {"name not a C identifier",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["9lives"] = {{"int", 9}}; },
       "spec.devices[0].attributes", "FieldValueInvalid"},
      {"name with a dash",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["pci-address"] = {{"string", "x"}}; },
       "spec.devices[0].attributes", "FieldValueInvalid"},
      {"name of 33",
       [](json& s) { s["spec"]["devices"][0]["attributes"][Repeat("a", 33)] = {{"int", 9}}; },
       "spec.devices[0].attributes", "FieldValueTooLong"},
      {"domain not DNS",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["gpu_x.io/model"] = {{"int", 9}}; },
       "spec.devices[0].attributes", "FieldValueInvalid"},
      {"domain of 64",
       [](json& s) {
         s["spec"]["devices"][0]["attributes"][Repeat("a", 60) + ".com/model"] = {{"int", 9}};
       },
       "spec.devices[0].attributes", "FieldValueTooLong"},
      {"empty domain",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["/model"] = {{"int", 9}}; },
       "spec.devices[0].attributes", "FieldValueInvalid"},
      {"two slashes",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["a.io/b/c"] = {{"int", 9}}; },
       "spec.devices[0].attributes", "FieldValueInvalid"},
      {"capacity name",
       [](json& s) { s["spec"]["devices"][0]["capacity"]["total-memory"] = {{"value", "1"}}; },
       "spec.devices[0].capacity", "FieldValueInvalid"},
      {"requestPolicy without allowMultipleAllocations",
       [](json& s) {
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {{"default", "1Gi"}};
       },
       "spec.devices[0].capacity[memory].requestPolicy", "FieldValueForbidden"},
      // validateRequestPolicy (pkg/apis/resource/validation, 1.36); the capacity is 3871Mi.
      {"validRange min over the capacity",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "4Gi"}, {"validRange", {{"min", "4Gi"}}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy.validRange.min", "FieldValueInvalid"},
      {"validRange default below its min",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "1Mi"}, {"validRange", {{"min", "1Gi"}}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy.validRange.min", "FieldValueInvalid"},
      {"validRange without a default",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {{"validRange", {{"min", "1Mi"}}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy.default", "FieldValueRequired"},
      {"validValues and validRange both",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "1Gi"}, {"validValues", {"1Gi"}}, {"validRange", {{"min", "1Mi"}}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy", "FieldValueForbidden"},
      {"a default not among validValues",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "2Gi"}, {"validValues", {"1Gi", "3Gi"}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy.validValues", "FieldValueInvalid"},
      {"validValues out of order",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "1Gi"}, {"validValues", {"2Gi", "1Gi"}}};
       },
       "spec.devices[0].capacity[memory].requestPolicy.validValues[1]", "FieldValueInvalid"},
      {"seventeen taints (DeviceTaintsMaxLength is 16 in 1.36)",
       [](json& s) {
         s["spec"]["devices"][0]["taints"] = Devices(1, true)[0]["taints"];
         for (int i = 0; i < 16; i++) s["spec"]["devices"][0]["taints"].push_back({{"key", "b"}});
       },
       "spec.devices[0].taints", "FieldValueTooMany"},
      {"device nodeName without perDeviceNodeSelection",
       [](json& s) { s["spec"]["devices"][0]["nodeName"] = "node-1"; }, "spec.devices[0]",
       "FieldValueInvalid"},
      {"no name", [](json& s) { s["metadata"].erase("generateName"); }, "metadata.name",
       "FieldValueRequired"},
      {"name not DNS",
       [](json& s) {
         s["metadata"].erase("generateName");
         s["metadata"]["name"] = "Node_1";
       },
       "metadata.name", "FieldValueInvalid"},
      {"generateName not DNS", [](json& s) { s["metadata"]["generateName"] = "Node_1-"; },
       "metadata.generateName", "FieldValueInvalid"},
      {"owner without uid", [](json& s) { s["metadata"]["ownerReferences"][0].erase("uid"); },
       "metadata.ownerReferences.uid", "FieldValueInvalid"},
      {"owner without kind", [](json& s) { s["metadata"]["ownerReferences"][0].erase("kind"); },
       "metadata.ownerReferences.kind", "FieldValueInvalid"},
      {"two controllers",
       [](json& s) {
         s["metadata"]["ownerReferences"].push_back(s["metadata"]["ownerReferences"][0]);
       },
       "metadata.ownerReferences", "FieldValueInvalid"},
  };
  for (const BadSlice& rule : bad) {
    json slice = Slice();
    rule.change(slice);
    EXPECT_EQ(Create(slice), Answer(422, "Invalid")) << rule.what;
    EXPECT_THAT(Causes(), ::testing::Contains(std::string(rule.field) + " " + rule.reason))
        << rule.what << ": " << last_.dump();
    EXPECT_EQ(last_["details"]["kind"], "ResourceSlice") << rule.what;
    EXPECT_EQ(last_["details"]["group"], "resource.k8s.io") << rule.what;
    EXPECT_THAT(last_.value("message", ""), HasSubstr("ResourceSlice.resource.k8s.io \""))
        << rule.what;
    EXPECT_THAT(last_.value("message", ""), HasSubstr(std::string("is invalid: ")))
        << rule.what;
  }
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(api_.resource_slice_writes(), 0);
}

TEST_F(ApiResourcesTest, The422SaysWhatTheRealOneSays) {
  json slice = Slice();
  slice["metadata"].erase("generateName");
  slice["metadata"]["name"] = "s";
  slice["spec"]["pool"]["generation"] = -1;
  EXPECT_EQ(Create(slice), Answer(422, "Invalid"));
  EXPECT_EQ(last_["message"],
            "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.pool.generation: Invalid value: "
            "-1: must be greater than or equal to zero");
  EXPECT_EQ(last_["details"]["name"], "s");
  ASSERT_EQ(last_["details"]["causes"].size(), 1u);
  EXPECT_EQ(last_["details"]["causes"][0],
            json({{"reason", "FieldValueInvalid"},
                  {"message", "Invalid value: -1: must be greater than or equal to zero"},
                  {"field", "spec.pool.generation"}}));
  slice["spec"]["devices"][0]["name"] = "GPU";
  EXPECT_EQ(Create(slice), Answer(422, "Invalid"));
  EXPECT_EQ(last_["message"],
            "ResourceSlice.resource.k8s.io \"s\" is invalid: [spec.pool.generation: Invalid value: "
            "-1: must be greater than or equal to zero, spec.devices[0].name: Invalid value: "
            "\"GPU\": a lowercase RFC 1123 label must consist of lower case alphanumeric "
            "characters or '-', and must start and end with an alphanumeric character (e.g. "
            "'my-name',  or '123-abc', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')]");
}

TEST_F(ApiResourcesTest, WhatIsAtTheLimitsIsValid) {
  const std::vector<std::pair<const char*, std::function<void(json&)>>> good = {
      {"128 devices", [](json& s) { s["spec"]["devices"] = Devices(128); }},
      {"64 devices with taints", [](json& s) { s["spec"]["devices"] = Devices(64, true); }},
      {"a shared GPU's memory as the daemon publishes it (--dra-shared)",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "3871Mi"}, {"validRange", {{"min", "1Mi"}}}};
       }},
      {"validValues with their default",
       [](json& s) {
         s["spec"]["devices"][0]["allowMultipleAllocations"] = true;
         s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = {
             {"default", "1Gi"}, {"validValues", {"512Mi", "1Gi", "3871Mi"}}};
       }},
      {"sixteen taints",
       [](json& s) {
         for (int i = 0; i < 16; i++) {
           s["spec"]["devices"][0]["taints"].push_back(
               {{"key", absl::StrCat("example.com/t", i)}, {"effect", "NoSchedule"}});
         }
       }},
      {"no devices", [](json& s) { s["spec"].erase("devices"); }},
      {"32 attributes and capacities",
       [](json& s) {
         s["spec"]["devices"][0]["attributes"] = Attributes(31);
       }},
      {"string of 64",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["type"]["string"] = Repeat("x", 64); }},
      {"empty string",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["type"]["string"] = ""; }},
      {"semver with pre-release and build",
       [](json& s) {
         s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] = "1.2.3-rc.1+build.5";
       }},
      {"version 0.0.0",
       [](json& s) { s["spec"]["devices"][0]["attributes"]["l4tVersion"]["version"] = "0.0.0"; }},
      {"qualified names",
       [](json& s) {
         s["spec"]["devices"][0]["attributes"]["edgeaccel.io/model"] = {{"string", "x"}};
         s["spec"]["devices"][0]["attributes"]["_private"] = {{"bool", false}};
         s["spec"]["devices"][0]["attributes"][Repeat("a", 32)] = {{"int", -5}};
         s["spec"]["devices"][0]["attributes"][Repeat("a", 59) + ".com/" + Repeat("b", 32)] =
             {{"int", 1}};
       }},
      {"device name of 63", [](json& s) { s["spec"]["devices"][0]["name"] = Repeat("a", 63); }},
      {"driver with upper case (a warning only)",
       [](json& s) { s["spec"]["driver"] = "GPU.edgeaccel.io"; }},
      {"pool name with slashes", [](json& s) { s["spec"]["pool"]["name"] = "node-1/gpus"; }},
      {"generation 0", [](json& s) { s["spec"]["pool"]["generation"] = 0; }},
      {"allNodes", [](json& s) {
         s["spec"].erase("nodeName");
         s["spec"]["allNodes"] = true;
         s["metadata"].erase("ownerReferences");
       }},
      {"nodeSelector", [](json& s) {
         s["spec"].erase("nodeName");
         s["spec"]["nodeSelector"] = {
             {"nodeSelectorTerms",
              json::array({{{"matchFields",
                             json::array({{{"key", "metadata.name"},
                                           {"operator", "In"},
                                           {"values", json::array({"node-1"})}}})}}})}};
       }},
      {"no ownerReferences", [](json& s) { s["metadata"].erase("ownerReferences"); }},
  };
  for (const auto& [what, change] : good) {
    json slice = Slice();
    change(slice);
    EXPECT_EQ(Create(slice), Answer(201, "")) << what << ": " << last_.dump();
  }
}

// Device taints as 1.36 serves them (KEP-5055, DRADeviceTaints beta and on): validateDeviceTaint
// (pkg/apis/resource/validation/validation.go: key a label name, value a label value, effect
// NoSchedule, NoExecute or None), timeAdded set where missing (k8s.io/api resource/v1
// DeviceTaint: "added automatically during create or update if not set").
TEST_F(ApiResourcesTest, DeviceTaintsAreValidatedAndStampedWithTheirTime) {
  json slice = Slice();
  slice["spec"]["devices"][0]["taints"] = json::array({
      {{"key", "edgeaccel.io/temperature"}, {"effect", "NoSchedule"}, {"value", "threshold-99.8C"}},
      {{"key", "edgeaccel.io/bad key"}, {"effect", "NoSchedule"}},
      {{"key", "edgeaccel.io/driver-status"}, {"effect", "PreferNoSchedule"}, {"value", "DEAD"}},
      {{"key", "edgeaccel.io/x"}, {"value", std::string(64, 'v')}}});
  EXPECT_EQ(Create(slice), Answer(422, "Invalid")) << last_.dump();
  EXPECT_THAT(Causes(), ::testing::ElementsAre(
                            "spec.devices[0].taints[1].key FieldValueInvalid",
                            "spec.devices[0].taints[2].effect FieldValueNotSupported",
                            "spec.devices[0].taints[3].value FieldValueInvalid",
                            "spec.devices[0].taints[3].effect FieldValueRequired"));
  slice["spec"]["devices"][0]["taints"] = json::array(
      {{{"key", "edgeaccel.io/temperature"}, {"effect", "NoSchedule"}, {"value", "threshold-99.8C"}}});
  json created = Created(slice);
  const json taint = created["spec"]["devices"][0]["taints"][0];
  EXPECT_TRUE(taint.contains("timeAdded")) << created.dump();
  // An update that sends the stored timeAdded back changes nothing: nothing is written.
  const int writes_before = api_.resource_slice_writes();
  const std::string version = created["metadata"]["resourceVersion"];
  EXPECT_EQ(Update(created), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["resourceVersion"], version);
  EXPECT_EQ(api_.resource_slice_writes(), writes_before + 1) << "answered 2xx, stored unchanged";
}

// With the gate off (1.33-1.35 by default) the strategy drops taints on write, silently, unless
// the stored slice already has some (dropDisabledDRADeviceTaintsFields, pkg/registry/resource/
// resourceslice/strategy.go).
TEST_F(ApiResourcesTest, WithTheGateOffTaintsAreDroppedWithoutAnError) {
  api_.DisableDeviceTaints();
  json slice = Slice();
  slice["spec"]["devices"][0]["taints"] =
      json::array({{{"key", "edgeaccel.io/driver-status"}, {"effect", "NoSchedule"}, {"value", "DEAD"}}});
  json created = Created(slice);
  EXPECT_FALSE(created["spec"]["devices"][0].contains("taints")) << created.dump();
  created["spec"]["devices"][0]["taints"] = slice["spec"]["devices"][0]["taints"];
  EXPECT_EQ(Update(created), Answer(200, ""));
  EXPECT_FALSE(last_["spec"]["devices"][0].contains("taints")) << last_.dump();
}

TEST_F(ApiResourcesTest, UnknownFieldsAreDroppedUnlessStrict) {
  json slice = Slice();
  slice["spec"]["foo"] = 1;
  slice["spec"]["devices"][0]["bar"] = "x";
  slice["spec"]["devices"][0]["basic"] = json::object();  // v1beta1's shape, not v1's
  slice["status"] = json::object();
  EXPECT_EQ(Create(slice, "?fieldValidation=Strict"), Answer(400, "BadRequest"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("strict decoding error: "));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("unknown field \"spec.foo\""));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("unknown field \"spec.devices[0].bar\""));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("unknown field \"spec.devices[0].basic\""));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("unknown field \"status\""));
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(Create(slice, "?fieldValidation=Bogus"), Answer(422, "Invalid"));
  for (const char* query : {"", "?fieldValidation=Warn", "?fieldValidation=Ignore"}) {
    EXPECT_EQ(Create(slice, query), Answer(201, "")) << query;
    EXPECT_EQ(last_["spec"], Slice()["spec"]) << query;
    EXPECT_FALSE(last_.contains("status")) << query;
  }
  // Warn, the default, says so in Warning headers (which ApiClient does not keep).
  httplib::SSLClient client("127.0.0.1", api_.port());
  client.set_ca_cert_path(api_.ca_file().c_str());
  client.enable_server_certificate_verification(true);
  const httplib::Headers auth = {{"Authorization", "Bearer secret-token"}};
  auto warned = client.Post(kSlices, auth, slice.dump(), "application/json");
  ASSERT_TRUE(warned);
  EXPECT_EQ(warned->status, 201);
  EXPECT_EQ(warned->get_header_value_count("Warning"), 4u);
  EXPECT_THAT(warned->get_header_value("Warning"), StartsWith("299 - \"unknown field \\\""));
  auto ignored = client.Post(absl::StrCat(kSlices, "?fieldValidation=Ignore").c_str(), auth,
                             slice.dump(), "application/json");
  ASSERT_TRUE(ignored);
  EXPECT_EQ(ignored->status, 201);
  EXPECT_FALSE(ignored->has_header("Warning"));
  // A driver name with upper case is valid, with a warning.
  json upper = Slice();
  upper["spec"]["driver"] = "GPU.edgeaccel.io";
  auto lower = client.Post(kSlices, auth, upper.dump(), "application/json");
  ASSERT_TRUE(lower);
  EXPECT_EQ(lower->status, 201);
  EXPECT_THAT(lower->get_header_value("Warning"), HasSubstr("driver names should be lowercase"));
}

TEST_F(ApiResourcesTest, AnUpdateIsOptimisticAndANewSpecANewGeneration) {
  json slice = Created(Slice());
  const std::string first = slice["metadata"]["resourceVersion"];
  slice["spec"]["pool"]["generation"] = 2;
  slice["spec"]["devices"][0]["attributes"]["numaNode"]["int"] = 1;
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["generation"], 2);
  EXPECT_EQ(last_["metadata"]["uid"], slice["metadata"]["uid"]);
  EXPECT_EQ(last_["metadata"]["creationTimestamp"], slice["metadata"]["creationTimestamp"]);
  const std::string second = last_["metadata"]["resourceVersion"];
  EXPECT_GT(std::stoull(second), std::stoull(first));
  // Written against the first version, which is gone.
  slice["spec"]["pool"]["generation"] = 3;
  EXPECT_EQ(Update(slice), Answer(409, "Conflict"));
  EXPECT_EQ(last_["message"],
            "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"" +
                slice["metadata"]["name"].get<std::string>() +
                "\": the object has been modified; please apply your changes to the latest "
                "version and try again");
  EXPECT_EQ(api_.ResourceSlices()[0]["spec"]["pool"]["generation"], 2);
  // The current version is written; a client's metadata.generation is not taken.
  slice["metadata"]["resourceVersion"] = second;
  slice["metadata"]["generation"] = 40;
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["generation"], 3);
  const std::string third = last_["metadata"]["resourceVersion"];
  // The same again: nothing is written, the version stays, the generation too.
  slice["metadata"]["resourceVersion"] = third;
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["resourceVersion"], third);
  EXPECT_EQ(last_["metadata"]["generation"], 3);
  // A change of metadata only is written without a new generation.
  slice["metadata"]["labels"] = {{"a", "b"}};
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_NE(last_["metadata"]["resourceVersion"], third);
  EXPECT_EQ(last_["metadata"]["generation"], 3);
  // None is unconditional (resourceslices allow it).
  slice["metadata"].erase("resourceVersion");
  slice["spec"]["pool"]["generation"] = 4;
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["generation"], 4);
  EXPECT_EQ(api_.resource_slice_writes(), 6);
}

TEST_F(ApiResourcesTest, AnUpdateOfWhatCannotChangeIsRefused) {
  const json slice = Created(Slice());
  const std::string name = slice["metadata"]["name"];
  json other = slice;
  other["metadata"]["uid"] = "0b5cbb3e-5c0f-4a6f-9d4e-0e3b8d1c0d3a";
  EXPECT_EQ(Update(other), Answer(409, "Conflict"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("Precondition failed: UID in precondition"));
  other = slice;
  other["spec"]["driver"] = "edgetpu.edgeaccel.io";
  EXPECT_EQ(Update(other), Answer(422, "Invalid"));
  EXPECT_THAT(Causes(), ::testing::Contains("spec.driver FieldValueInvalid"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("field is immutable"));
  other = slice;
  other["spec"]["nodeName"] = "node-2";
  other["spec"]["pool"]["name"] = "node-2";
  EXPECT_EQ(Update(other), Answer(422, "Invalid"));
  EXPECT_THAT(Causes(), ::testing::IsSupersetOf({"spec.nodeName FieldValueInvalid",
                                                 "spec.pool.name FieldValueInvalid"}));
  other = slice;
  other["spec"]["devices"][0]["name"] = "Bad";
  EXPECT_EQ(Update(other), Answer(422, "Invalid"));
  EXPECT_THAT(Causes(), ::testing::Contains("spec.devices[0].name FieldValueInvalid"));
  other = slice;
  other["metadata"]["name"] = "another";
  EXPECT_EQ(Call("PUT", absl::StrCat(kSlices, "/", name), "application/json", other.dump()),
            Answer(400, "BadRequest"));
  EXPECT_EQ(last_["message"],
            "the name of the object (another) does not match the name on the URL (" + name + ")");
  EXPECT_EQ(Update(other), Answer(404, "NotFound"));  // no create on update
  EXPECT_EQ(last_["message"], "resourceslices.resource.k8s.io \"another\" not found");
  EXPECT_EQ(api_.ResourceSlices(), std::vector<json>{slice});
}

TEST_F(ApiResourcesTest, AnInjectedConflictMovesTheVersionOnSoARetryMustReadAgain) {
  json slice = Created(Slice());
  api_.ConflictNextSliceUpdates(1);
  slice["spec"]["pool"]["generation"] = 2;
  EXPECT_EQ(Update(slice), Answer(409, "Conflict"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("the object has been modified"));
  // The same request again is stale now, as against a real race.
  EXPECT_EQ(Update(slice), Answer(409, "Conflict"));
  EXPECT_EQ(api_.ResourceSlices()[0]["spec"]["pool"]["generation"], 1);
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "/", slice["metadata"]["name"].get<std::string>())),
            Answer(200, ""));
  slice["metadata"]["resourceVersion"] = last_["metadata"]["resourceVersion"];
  EXPECT_EQ(Update(slice), Answer(200, ""));
  EXPECT_EQ(api_.ResourceSlices()[0]["spec"]["pool"]["generation"], 2);
}

TEST_F(ApiResourcesTest, InjectedFailuresAnswerTheirStatusThenStop) {
  api_.FailNextSliceRequests(503, 2);
  EXPECT_EQ(Call("GET", kSlices), Answer(503, "ServiceUnavailable"));
  EXPECT_EQ(Create(Slice()), Answer(503, "ServiceUnavailable"));
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(Create(Slice()), Answer(201, ""));
  api_.FailNextSliceRequests(500, 1);
  const std::string created = last_["metadata"]["name"];
  EXPECT_EQ(Call("DELETE", absl::StrCat(kSlices, "/", created)),
            Answer(500, "InternalError"));
  EXPECT_EQ(api_.ResourceSlices().size(), 1u);
  api_.FailNextSliceRequests(429, 1);
  EXPECT_EQ(Call("GET", kSlices), Answer(429, "TooManyRequests"));
  EXPECT_EQ(Call("GET", kSlices), Answer(200, ""));
}

TEST_F(ApiResourcesTest, ADeleteHonoursItsPreconditions) {
  const json slice = Created(Slice());
  const std::string path = absl::StrCat(kSlices, "/", slice["metadata"]["name"].get<std::string>());
  auto options = [](const std::string& uid, const std::string& version) {
    json preconditions = {{"uid", uid}};
    if (!version.empty()) preconditions["resourceVersion"] = version;
    return json({{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"preconditions", preconditions}})
        .dump();
  };
  const std::string uid = slice["metadata"]["uid"], version = slice["metadata"]["resourceVersion"];
  EXPECT_EQ(Call("DELETE", path, "application/json",
                 options("0b5cbb3e-5c0f-4a6f-9d4e-0e3b8d1c0d3a", "")),
            Answer(409, "Conflict"));
  EXPECT_THAT(last_.value("message", ""),
              HasSubstr("Precondition failed: UID in precondition: "
                        "0b5cbb3e-5c0f-4a6f-9d4e-0e3b8d1c0d3a, UID in object meta: " + uid));
  EXPECT_EQ(Call("DELETE", path, "application/json", options(uid, "1")), Answer(409, "Conflict"));
  EXPECT_THAT(last_.value("message", ""), HasSubstr("Precondition failed: ResourceVersion"));
  EXPECT_EQ(Call("DELETE", path, "text/plain", options(uid, version)),
            Answer(415, "UnsupportedMediaType"));
  EXPECT_EQ(api_.ResourceSlices().size(), 1u);
  EXPECT_EQ(Call("DELETE", path, "application/json", options(uid, version)), Answer(200, ""));
  EXPECT_EQ(last_, slice);  // the object deleted
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(Call("DELETE", path), Answer(404, "NotFound"));
  EXPECT_EQ(Call("GET", path), Answer(404, "NotFound"));
  // Without preconditions, unconditional.
  const json again = Created(Slice());
  const std::string name = again["metadata"]["name"];
  EXPECT_EQ(Call("DELETE", absl::StrCat(kSlices, "/", name)),
            Answer(200, ""));
  EXPECT_EQ(api_.resource_slice_writes(), 4);
}

TEST_F(ApiResourcesTest, AListSelectsByDriverAndNode) {
  const json mine = Created(Slice("node-1", kDriver));
  const json tpu = Created(Slice("node-1", "edgetpu.edgeaccel.io"));
  const json theirs = Created(Slice("node-2", kDriver));
  auto names = [&]() {
    std::vector<std::string> out;
    for (const json& item : last_["items"]) out.push_back(item["metadata"]["name"]);
    return out;
  };
  auto name = [](const json& slice) { return slice["metadata"]["name"].get<std::string>(); };
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.driver%3Dgpu.edgeaccel.io%2C"
                                              "spec.nodeName%3Dnode-1")),
            Answer(200, ""));
  EXPECT_EQ(last_["kind"], "ResourceSliceList");
  EXPECT_EQ(last_["apiVersion"], "resource.k8s.io/v1");
  EXPECT_FALSE(last_["metadata"].value("resourceVersion", "").empty());
  EXPECT_EQ(names(), std::vector<std::string>{name(mine)});
  EXPECT_FALSE(last_["items"][0].contains("kind"));  // list items carry neither
  EXPECT_EQ(last_["items"][0]["spec"], mine["spec"]);
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.nodeName=node-1")),
            Answer(200, ""));
  EXPECT_THAT(names(), ::testing::UnorderedElementsAre(name(mine), name(tpu)));
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.nodeName%21%3Dnode-1")),
            Answer(200, ""));
  EXPECT_EQ(names(), std::vector<std::string>{name(theirs)});
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=metadata.name%3D", name(tpu))),
            Answer(200, ""));
  EXPECT_EQ(names(), std::vector<std::string>{name(tpu)});
  EXPECT_EQ(Call("GET", kSlices), Answer(200, ""));
  EXPECT_EQ(names().size(), 3u);
  // Only those fields are selectable; a term without an operator is no selector.
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.pool.name%3Dnode-1")),
            Answer(400, "BadRequest"));
  EXPECT_EQ(last_["message"],
            "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: "
            "spec.pool.name");
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.driver")),
            Answer(400, "BadRequest"));
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?labelSelector=a%3Db")), Answer(501, "NotImplemented"));
}

// A watch as the apiserver's watch cache serves it: from a version, every later change the
// selector matches, one JSON event per line; DELETED carries the deletion's version; the stream
// ends at timeoutSeconds; a compacted version is one ERROR event with a 410 Expired Status.
TEST_F(ApiResourcesTest, AWatchStreamsTheSelectedChangesAfterItsVersion) {
  auto watch = [&](const std::string& query) {
    std::vector<json> events;
    absl::StatusOr<HttpResponse> response = ::edgeaccel::testing::ReadWatch(
        ApiClient(Config()), absl::StrCat(kSlices, "?watch=true&", query), absl::Now() + absl::Seconds(10),
        [&](absl::string_view line) {
          events.push_back(json::parse(line, nullptr, false));
          return absl::OkStatus();
        });
    EXPECT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response.ok() ? response->status : 0, 200);
    return events;
  };
  auto types = [](const std::vector<json>& events) {
    std::vector<std::string> out;
    for (const json& event : events) out.push_back(event.value("type", "?"));
    return out;
  };
  const json mine = Created(Slice("node-1", kDriver));
  ASSERT_EQ(Call("GET", absl::StrCat(kSlices, "?fieldSelector=spec.nodeName%3Dnode-1")), Answer(200, ""));
  const std::string listed = last_["metadata"]["resourceVersion"];
  json changed = mine;
  changed["spec"]["devices"][0]["attributes"]["numaNode"]["int"] = 1;
  ASSERT_EQ(Update(changed), Answer(200, ""));
  const json updated = last_;
  Created(Slice("node-2", kDriver));  // not selected
  const std::string name = mine["metadata"]["name"];
  ASSERT_EQ(Call("DELETE", absl::StrCat(kSlices, "/", name)), Answer(200, ""));

  std::vector<json> events =
      watch(absl::StrCat("fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=", listed, "&timeoutSeconds=1"));
  ASSERT_THAT(types(events), ::testing::ElementsAre("MODIFIED", "DELETED"));
  EXPECT_EQ(events[0]["object"], updated);
  EXPECT_EQ(events[0]["object"]["kind"], "ResourceSlice") << "event objects carry kind and apiVersion";
  EXPECT_EQ(events[1]["object"]["metadata"]["name"], name);
  EXPECT_GT(std::stoull(events[1]["object"]["metadata"]["resourceVersion"].get<std::string>()),
            std::stoull(updated["metadata"]["resourceVersion"].get<std::string>()))
      << "a DELETED object carries the deletion's version";

  // No version: ADDED for each stored slice the selector matches, then the changes.
  events = watch("fieldSelector=spec.driver%3Dgpu.edgeaccel.io&timeoutSeconds=1");
  ASSERT_THAT(types(events), ::testing::ElementsAre("ADDED"));
  EXPECT_EQ(events[0]["object"]["spec"]["nodeName"], "node-2");

  // A version older than the history kept.
  api_.CompactSliceHistory();
  events = watch(absl::StrCat("resourceVersion=", listed, "&timeoutSeconds=5"));
  ASSERT_THAT(types(events), ::testing::ElementsAre("ERROR"));
  EXPECT_EQ(events[0]["object"]["code"], 410);
  EXPECT_EQ(events[0]["object"]["reason"], "Expired");
  EXPECT_THAT(events[0]["object"]["message"].get<std::string>(),
              StartsWith(absl::StrCat("too old resource version: ", listed, " (")));
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?watch=true&resourceVersion=x")), Answer(400, "BadRequest"));
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?watch=true&fieldSelector=spec.pool.name%3Dx")),
            Answer(400, "BadRequest"));
}

// Bookmarks go only to a watch that asked for them, with just the version; EndSliceWatches ends
// every open stream (as timeoutSeconds does); a refused watch is the status RBAC answers.
TEST_F(ApiResourcesTest, BookmarksOnlyWhenAskedAndAWatchCanBeRefused) {
  std::vector<json> with, without;
  auto open = [&](const std::string& query, std::vector<json>* events) {
    return std::thread([this, query, events] {
      absl::StatusOr<HttpResponse> response = ::edgeaccel::testing::ReadWatch(
          ApiClient(Config()), absl::StrCat(kSlices, "?watch=true&resourceVersion=1&", query),
          absl::Now() + absl::Seconds(10), [events](absl::string_view line) {
            events->push_back(json::parse(line, nullptr, false));
            return absl::OkStatus();
          });
      EXPECT_TRUE(response.ok() && response->status == 200) << response.status();
    });
  };
  std::thread a = open("allowWatchBookmarks=true", &with);
  std::thread b = open("", &without);
  ASSERT_TRUE(::edgeaccel::testing::Eventually([&] { return api_.open_slice_watches() == 2; }));
  api_.BookmarkSliceWatches();
  absl::SleepFor(absl::Milliseconds(300));  // the streams' next turn (they wait at most 200 ms)
  api_.EndSliceWatches();
  a.join();
  b.join();
  EXPECT_EQ(api_.open_slice_watches(), 0);
  ASSERT_EQ(with.size(), 1u);
  EXPECT_EQ(with[0]["type"], "BOOKMARK");
  EXPECT_EQ(with[0]["object"]["metadata"].size(), 1u) << with[0].dump();
  EXPECT_TRUE(without.empty());
  EXPECT_EQ(api_.resource_slice_watches(), 2);

  api_.RefuseSliceWatches(403);
  EXPECT_EQ(Call("GET", absl::StrCat(kSlices, "?watch=true")), Answer(403, "Forbidden"));
  EXPECT_THAT(last_["message"].get<std::string>(), HasSubstr("cannot watch resource \"resourceslices\""));
}

TEST_F(ApiResourcesTest, TheKubeletsDeleteCollectionTakesTheNodesSlicesOnly) {
  Created(Slice("node-1", kDriver));
  Created(Slice("node-1", "edgetpu.edgeaccel.io"));
  const json theirs = Created(Slice("node-2", kDriver));
  EXPECT_EQ(Call("DELETE", absl::StrCat(kSlices, "?fieldSelector=spec.nodeName%3Dnode-1")),
            Answer(200, ""));
  EXPECT_EQ(last_["kind"], "ResourceSliceList");
  EXPECT_EQ(last_["items"].size(), 2u);
  EXPECT_EQ(api_.ResourceSlices(), std::vector<json>{theirs});
  EXPECT_EQ(Call("DELETE", absl::StrCat(kSlices, "?fieldSelector=spec.foo%3Dx")),
            Answer(400, "BadRequest"));
  // The test's own, as the kubelet at its start (and after a driver's plugin went).
  Created(Slice("node-1", kDriver));
  Created(Slice("node-1", "edgetpu.edgeaccel.io"));
  EXPECT_EQ(api_.DeleteAllResourceSlices("node-1", kDriver), 1);
  EXPECT_EQ(api_.DeleteAllResourceSlices("node-1"), 1);
  EXPECT_EQ(api_.ResourceSlices(), std::vector<json>{theirs});
}

TEST_F(ApiResourcesTest, ASliceOwnedByANodeThatDoesNotExistIsCollected) {
  json slice = Slice();
  slice["metadata"]["ownerReferences"][0]["uid"] = "0b5cbb3e-5c0f-4a6f-9d4e-0e3b8d1c0d3a";
  EXPECT_EQ(Create(slice), Answer(201, ""));  // accepted, then the garbage collector takes it
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(api_.resource_slices_collected(), 1);
  slice["metadata"]["ownerReferences"][0]["uid"] = api_.node_uid();
  slice["metadata"]["ownerReferences"][0]["name"] = "node-2";
  EXPECT_EQ(Create(slice), Answer(201, ""));
  EXPECT_TRUE(api_.ResourceSlices().empty());
  EXPECT_EQ(Create(Slice()), Answer(201, ""));
  EXPECT_EQ(api_.ResourceSlices().size(), 1u);
  EXPECT_EQ(api_.resource_slices_collected(), 2);
}

TEST_F(ApiResourcesTest, WaitForResourceSlicesWakesOnAWrite) {
  auto two = [](const std::vector<json>& slices) { return slices.size() == 2; };
  EXPECT_FALSE(api_.WaitForResourceSlices(two, absl::Milliseconds(50)));
  std::thread writer([&] {
    ApiClient client(Config());
    for (int i = 0; i < 2; i++) {
      absl::StatusOr<HttpResponse> response =
          client.Request("POST", kSlices, "application/json", Slice().dump());
      EXPECT_TRUE(response.ok() && response->status == 201);
    }
  });
  std::vector<json> seen;
  EXPECT_TRUE(api_.WaitForResourceSlices(two, absl::Seconds(10), &seen));
  writer.join();
  EXPECT_EQ(seen.size(), 2u);
  // A slice another writer left.
  json left = Slice();
  left["metadata"]["name"] = "left-over";
  EXPECT_EQ(api_.AddResourceSlice(left)["metadata"]["name"], "left-over");
  EXPECT_EQ(api_.ResourceSlices().size(), 3u);
  EXPECT_EQ(api_.resource_slice_writes(), 2);
}

TEST_F(ApiResourcesTest, ResourceSlicePathsNeedTheToken) {
  ApiServerConfig config = Config();
  config.token = "not-the-token";
  EXPECT_EQ(Call("GET", kSlices, "", "", config), Answer(401, "Unauthorized"));
  EXPECT_EQ(Call("POST", kSlices, "application/json", Slice().dump(), config),
            Answer(401, "Unauthorized"));
  config.token.clear();
  config.token_file.clear();
  EXPECT_EQ(Call("GET", "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/b", "", "", config),
            Answer(403, "Forbidden"));
  EXPECT_TRUE(api_.ResourceSlices().empty());
}

TEST_F(ApiResourcesTest, AnUnservedPathIs404WithAStatus) {
  EXPECT_EQ(Call("GET", "/apis/resource.k8s.io/v1beta1/resourceslices"), Answer(404, "NotFound"));
  EXPECT_EQ(last_["message"], "the server could not find the requested resource");
  EXPECT_EQ(Call("PATCH", absl::StrCat(kSlices, "/x"), "application/merge-patch+json", "{}"),
            Answer(501, "NotImplemented"));
}

TEST_F(ApiResourcesTest, AClaimIsReadAsStoredAndAMissingOneIs404) {
  const json made = TestApiServer::MakeAllocatedClaim(
      "default", "gpu-claim", kDriver, "node-1",
      {{"gpu", "gpu-tegra234-igpu0"}, {"gpu", "gpu-1"}, {"other/sub", "gpu-2"}});
  EXPECT_EQ(made["spec"]["devices"]["requests"].size(), 2u);
  const json stored = api_.AddResourceClaim(made);
  const std::string path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-claim";
  EXPECT_EQ(Call("GET", path), Answer(200, ""));
  EXPECT_EQ(last_, stored);
  EXPECT_EQ(last_["kind"], "ResourceClaim");
  EXPECT_EQ(last_["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(last_["metadata"]["namespace"], "default");
  EXPECT_EQ(last_["metadata"]["uid"].get<std::string>().size(), 36u);
  EXPECT_FALSE(last_["metadata"].value("resourceVersion", "").empty());
  const json& results = last_["status"]["allocation"]["devices"]["results"];
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0], json({{"request", "gpu"},
                              {"driver", kDriver},
                              {"pool", "node-1"},
                              {"device", "gpu-tegra234-igpu0"}}));
  EXPECT_EQ(results[2]["request"], "other/sub");
  EXPECT_EQ(last_["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
                ["values"][0],
            "node-1");
  EXPECT_EQ(last_["status"]["reservedFor"].size(), 1u);
  // Another name, another namespace.
  EXPECT_EQ(Call("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/other"),
            Answer(404, "NotFound"));
  EXPECT_EQ(last_["message"], "resourceclaims.resource.k8s.io \"other\" not found");
  EXPECT_EQ(last_["details"]["kind"], "resourceclaims");
  EXPECT_EQ(Call("GET", "/apis/resource.k8s.io/v1/namespaces/kube-system/resourceclaims/gpu-claim"),
            Answer(404, "NotFound"));
  EXPECT_EQ(api_.resource_claim_gets(), 3);
  // Failures a test injects, then the claim again.
  api_.FailNextClaimGets(500, 1);
  EXPECT_EQ(Call("GET", path), Answer(500, "InternalError"));
  EXPECT_EQ(Call("GET", path), Answer(200, ""));
  // Deleted: 404.
  EXPECT_TRUE(api_.DeleteResourceClaim("default", "gpu-claim"));
  EXPECT_FALSE(api_.DeleteResourceClaim("default", "gpu-claim"));
  EXPECT_EQ(Call("GET", path), Answer(404, "NotFound"));
  EXPECT_TRUE(api_.ResourceClaim("default", "gpu-claim").is_null());
}

TEST_F(ApiResourcesTest, AReplacedClaimHasANewUid) {
  const json first = api_.AddResourceClaim(
      TestApiServer::MakeAllocatedClaim("ns", "c", kDriver, "node-1", {{"gpu", "gpu-0"}}));
  const json second = api_.ReplaceResourceClaim("ns", "c");
  ASSERT_FALSE(second.is_null());
  EXPECT_NE(second["metadata"]["uid"], first["metadata"]["uid"]);
  EXPECT_NE(second["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"]);
  EXPECT_EQ(second["status"], first["status"]);
  EXPECT_EQ(Call("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"),
            Answer(200, ""));
  EXPECT_EQ(last_["metadata"]["uid"], second["metadata"]["uid"]);
  // With new content (here: not allocated any more), and a uid that is the old one replaced.
  json unallocated = second;
  unallocated.erase("status");
  const json third = api_.ReplaceResourceClaim(unallocated);
  EXPECT_NE(third["metadata"]["uid"], second["metadata"]["uid"]);
  EXPECT_FALSE(api_.ResourceClaim("ns", "c").contains("status"));
  EXPECT_TRUE(api_.ReplaceResourceClaim("ns", "none").is_null());
  EXPECT_TRUE(api_.AddResourceClaim(json({{"metadata", {{"name", "no-namespace"}}}})).is_null());
}

}  // namespace
}  // namespace edgeaccel
