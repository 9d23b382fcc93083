#include "edgeaccel/host/json_fields.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace edgeaccel {
namespace {

using nlohmann::json;

TEST(JsonFieldsTest, AMemberOfSomethingThatIsNotAnObjectIsAbsent) {
  for (const json& not_an_object : {json(nullptr), json(7), json("text"), json::array({1, 2})}) {
    EXPECT_EQ(JsonMember(not_an_object, "name"), nullptr) << not_an_object.dump();
    EXPECT_EQ(JsonString(not_an_object, "name"), std::nullopt);
    EXPECT_EQ(JsonInt(not_an_object, "name"), std::nullopt);
    EXPECT_EQ(JsonBool(not_an_object, "name"), std::nullopt);
    EXPECT_EQ(JsonStringList(not_an_object, "name"), std::nullopt);
  }
  const json object{{"name", "a"}};
  ASSERT_NE(JsonMember(object, "name"), nullptr);
  EXPECT_EQ(*JsonMember(object, "name"), "a");
  EXPECT_EQ(JsonMember(object, "other"), nullptr);
}

TEST(JsonFieldsTest, AFieldOfAnotherTypeIsAbsentWhereValueWouldThrow) {
  const json object = json::parse(R"({"s": "x", "n": 7, "neg": -3, "f": 1.5, "o": {"s": 1},
                                      "big": 18446744073709551615, "null": null, "list": ["x"]})");
  EXPECT_EQ(JsonString(object, "s"), "x");
  EXPECT_EQ(JsonString(object, "n"), std::nullopt);
  EXPECT_EQ(JsonString(object, "o"), std::nullopt);
  EXPECT_EQ(JsonString(object, "null"), std::nullopt);
  EXPECT_EQ(JsonString(object, "list"), std::nullopt);
  EXPECT_EQ(JsonString(object, "missing"), std::nullopt);
  EXPECT_EQ(JsonInt(object, "n"), 7);
  EXPECT_EQ(JsonInt(object, "neg"), -3);
  EXPECT_EQ(JsonInt(object, "f"), std::nullopt) << "1.5 is not an integer";
  EXPECT_EQ(JsonInt(object, "s"), std::nullopt);
  EXPECT_EQ(JsonInt(object, "big"), std::nullopt) << "above INT64_MAX: not an int64";
  EXPECT_EQ(JsonBool(object, "s"), std::nullopt);
  EXPECT_EQ(JsonBool(object, "n"), std::nullopt) << "7 is not a boolean";
  EXPECT_EQ(JsonBool(object, "null"), std::nullopt);
  EXPECT_EQ(JsonStringList(object, "list"), std::vector<std::string>{"x"});
  EXPECT_EQ(JsonStringList(object, "s"), std::nullopt);
  EXPECT_EQ(JsonStringList(object, "missing"), std::nullopt);
  // What nlohmann does where these answer "absent": the reason they exist.
  EXPECT_THROW((void)object.value("n", ""), json::type_error);
  EXPECT_THROW((void)object["s"].value("x", ""), json::type_error);
}

TEST(JsonFieldsTest, BooleansAndListsOfStrings) {
  const json object = json::parse(R"({"yes": true, "no": false, "strings": ["a", "b"], "empty": [],
                                      "mixed": ["a", 1], "nested": [["a"]]})");
  EXPECT_EQ(JsonBool(object, "yes"), true);
  EXPECT_EQ(JsonBool(object, "no"), false);
  EXPECT_EQ(JsonStringList(object, "strings"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(JsonStringList(object, "empty"), std::vector<std::string>{});
  EXPECT_EQ(JsonStringList(object, "mixed"), std::nullopt) << "one item is not a string";
  EXPECT_EQ(JsonStringList(object, "nested"), std::nullopt);
  EXPECT_THROW((void)object["mixed"].get<std::vector<std::string>>(), json::type_error);
}

}  // namespace
}  // namespace edgeaccel
