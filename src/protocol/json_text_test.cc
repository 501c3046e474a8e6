#include "protocol/json_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace parsyn::protocol {
namespace {

using nlohmann::json;

TEST(JsonTextWriterTest, NestsObjectsAndArraysWithCommasWhereTheyBelong) {
  JsonTextWriter w;
  w.BeginObject().Field("a", 1).Key("empty").BeginObject().EndObject().Key("list").BeginArray();
  w.Int(-2).UInt(std::numeric_limits<uint64_t>::max()).BeginObject().Field("x", true).EndObject();
  w.BeginArray().EndArray().Raw(R"({"raw":[1,2]})").EndArray().Field("s", "t").Field("f", false).EndObject();
  const std::string text = w.Take();
  EXPECT_EQ(text,
            R"({"a":1,"empty":{},"list":[-2,18446744073709551615,{"x":true},[],{"raw":[1,2]}],"s":"t","f":false})");
  EXPECT_EQ(json::parse(text)["list"][1].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
}

TEST(JsonTextWriterTest, EscapesWhatJsonRequiresAndKeepsUtf8) {
  std::string every_control;
  for (char c = 1; c < 0x20; ++c) every_control.push_back(c);
  const std::string values[] = {"",
                                "plain",
                                "quote \" backslash \\ slash /",
                                every_control,
                                "\xc3\xa9t\xc3\xa9 \xe2\x82\xac",
                                std::string("nul \0 inside", 12)};
  for (const std::string& value : values) {
    JsonTextWriter w;
    w.BeginObject().Field(value, value).EndObject();
    const std::string text = w.Take();
    // Read back by nlohmann (which rejects raw control characters and invalid escapes), and written as it writes it.
    const json parsed = json::parse(text);
    EXPECT_EQ(parsed.at(value).get<std::string>(), value);
    EXPECT_EQ(text, (json{{value, value}}.dump()));
  }
}

TEST(JsonTextWriterTest, DoublesReadBackExactlyAndStayDoubles) {
  for (double d : {0.01, 1e-05, 3.0, -0.5, 1e300, 0.1 + 0.2, 5e-324}) {
    JsonTextWriter w;
    w.Double(d);
    const json parsed = json::parse(w.Take());
    EXPECT_TRUE(parsed.is_number_float()) << d;
    EXPECT_EQ(parsed.get<double>(), d);
  }
  JsonTextWriter w;
  w.BeginArray().Double(std::nan("")).Double(std::numeric_limits<double>::infinity()).EndArray();
  EXPECT_EQ(w.Take(), "[null,null]");
}

}  // namespace
}  // namespace parsyn::protocol
