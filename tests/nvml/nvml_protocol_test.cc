#include "edgeaccel/nvml/nvml_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace edgeaccel {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(NvmlProtocolTest, ARecordIsOneLineWhateverItsValuesHold) {
  NvmlRecord record{"gpu", {}};
  record.Add("uuid", "GPU-e3004cd3-73c7-d4d7-4325-ef6f655d34ec")
      .Add("name", "NVIDIA H100 80GB HBM3")
      .Add("odd", std::string("tab\there\nnewline 100% a=b \x01\x7f", 29));
  const std::string line = EncodeNvmlRecord(record);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  EXPECT_EQ(line.substr(0, 4), "gpu\t");
  std::optional<NvmlRecord> decoded = DecodeNvmlRecord(line.substr(0, line.size() - 1));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->kind, "gpu");
  EXPECT_THAT(decoded->fields,
              ElementsAre(Pair("uuid", "GPU-e3004cd3-73c7-d4d7-4325-ef6f655d34ec"),
                          Pair("name", "NVIDIA H100 80GB HBM3"), Pair("odd", record.Get("odd"))));
  EXPECT_EQ(decoded->Get("name"), "NVIDIA H100 80GB HBM3");
  EXPECT_TRUE(decoded->Has("uuid"));
  EXPECT_FALSE(decoded->Has("minor"));
  EXPECT_EQ(decoded->Get("minor"), "");
}

TEST(NvmlProtocolTest, ARecordWithoutFieldsIsJustItsKind) {
  EXPECT_EQ(EncodeNvmlRecord({"ready", {}}), "ready\n");
  std::optional<NvmlRecord> decoded = DecodeNvmlRecord("ready");
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->kind, "ready");
  EXPECT_TRUE(decoded->fields.empty());
  // An empty value is a value.
  decoded = DecodeNvmlRecord("hello\tcuda=");
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(decoded->Has("cuda"));
}

TEST(NvmlProtocolTest, WhatIsNoRecordIsRefused) {
  for (const std::string bad :
       {std::string(""), std::string("\tuuid=x"), std::string("gpu\tuuid"),
        std::string("gpu\t=x"), std::string("gpu\tuuid=%4"), std::string("gpu\tuuid=%zz"),
        std::string("gpu\tuuid=a\rb"), std::string("gpu\t"), std::string("gp%u")}) {
    EXPECT_FALSE(DecodeNvmlRecord(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace edgeaccel
