#include "base/strings.h"

#include <gtest/gtest.h>

namespace parsyn {
namespace {

TEST(StringsTest, ToLowerChangesAsciiLettersOnly) {
  EXPECT_EQ(ToLower("Content-Type: X-Amz-Meta-SHA256"), "content-type: x-amz-meta-sha256");
  EXPECT_EQ(ToLower("\xc3\x84"), "\xc3\x84");  // UTF-8 bytes stay as they are
}

TEST(StringsTest, TrimRemovesSpacesTabsAndLineEnds) {
  EXPECT_EQ(Trim("  value\t\r\n"), "value");
  EXPECT_EQ(Trim("\ta b\n"), "a b");
  EXPECT_EQ(Trim(" \r\n"), "");
  EXPECT_EQ(Trim(""), "");
}

TEST(StringsTest, HexEncodeIsLowercaseTwoDigitsPerByte) {
  EXPECT_EQ(HexEncode(std::string_view("\x00\x0f\xab\xff", 4)), "000fabff");
  EXPECT_EQ(HexEncode(""), "");
}

}  // namespace
}  // namespace parsyn
