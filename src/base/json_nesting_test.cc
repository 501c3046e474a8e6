#include "base/json_nesting.h"

#include <gtest/gtest.h>

#include <string>

namespace parsyn {
namespace {

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonNestingTest, AcceptsUpToTheLimit) {
  EXPECT_TRUE(CheckJsonNesting(Nested(64), "body").ok());
  const std::string six_levels = R"({"a": [{"b": {"c": [1, 2, {"d": null}]}}]})";
  EXPECT_TRUE(CheckJsonNesting(six_levels, "body", 6).ok());
  EXPECT_FALSE(CheckJsonNesting(six_levels, "body", 5).ok());
  EXPECT_TRUE(CheckJsonNesting("", "body").ok());
}

TEST(JsonNestingTest, RefusesDeeperTextNamingWhatAndWhere) {
  Status s = CheckJsonNesting(Nested(65), "request body");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "request body nests deeper than 64 levels (at byte 64)");
  // The body that crashed the coordinator: 200,000 nested arrays inside an object, 400 KB.
  const std::string attack = R"({"metrics": {"x": )" + Nested(200'000) + "}}";
  EXPECT_EQ(CheckJsonNesting(attack, "request body").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckJsonNesting(Nested(3, '{', '}'), "task", 2).message(), "task nests deeper than 2 levels (at byte 2)");
}

TEST(JsonNestingTest, BracketsInsideStringsDoNotCount) {
  const std::string deep_in_string = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_TRUE(CheckJsonNesting(deep_in_string, "body", 2).ok());
  // An escaped backslash ends the escape: the quote after it closes the string, and the brackets count again.
  EXPECT_FALSE(CheckJsonNesting(R"(["\\", [[[]]]])", "body", 3).ok());
}

}  // namespace
}  // namespace parsyn
