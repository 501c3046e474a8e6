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

TEST(StringsTest, Base64UrlRoundTripsEveryLengthAndRefusesOtherCharacters) {
  EXPECT_EQ(Base64UrlEncode(""), "");
  EXPECT_EQ(Base64UrlEncode("f"), "Zg");
  EXPECT_EQ(Base64UrlEncode("fo"), "Zm8");
  EXPECT_EQ(Base64UrlEncode("foo"), "Zm9v");
  EXPECT_EQ(Base64UrlEncode("\xfb\xff"), "-_8");  // the url alphabet, not '+' and '/'
  std::string bytes;
  for (int n = 0; n < 40; ++n) {
    EXPECT_EQ(Base64UrlDecode(Base64UrlEncode(bytes)), bytes) << n;
    bytes += static_cast<char>(n * 37);
  }
  EXPECT_EQ(Base64UrlDecode("Zm8="), "fo");  // padding is accepted
  EXPECT_FALSE(Base64UrlDecode("Zm+v").has_value());
  EXPECT_FALSE(Base64UrlDecode("Z").has_value());
}

TEST(StringsTest, XmlEscapeEscapesMarkupAndQuotes) {
  EXPECT_EQ(XmlEscape(R"(a<b & "c">d)"), "a&lt;b &amp; &quot;c&quot;&gt;d");
  EXPECT_EQ(XmlEscape("plain 'text'"), "plain 'text'");
}

TEST(StringsTest, HexEncodeIsLowercaseTwoDigitsPerByte) {
  EXPECT_EQ(HexEncode(std::string_view("\x00\x0f\xab\xff", 4)), "000fabff");
  EXPECT_EQ(HexEncode(""), "");
}

TEST(StringsTest, HexDecodeTakesEitherCaseAndRefusesWhatIsNotHex) {
  EXPECT_EQ(HexDecode("000fABff"), std::string("\x00\x0f\xab\xff", 4));
  EXPECT_EQ(HexDecode(""), "");
  EXPECT_EQ(HexDecode("abc"), std::nullopt);
  EXPECT_EQ(HexDecode("0g"), std::nullopt);
  EXPECT_EQ(HexDecode(HexEncode(std::string_view("\x80\x7f", 2))), std::string("\x80\x7f", 2));
}

TEST(StringsTest, WithoutLocalPathsKeepsOnlyEachPathsLastPart) {
  EXPECT_EQ(WithoutLocalPaths("parsyn-trainer exited with status 1: /srv/parsyn/managed-workers/managed-1/tasks/"
                              "1-1-3-w1/task.json: config.max_seq_len must be >= 8"),
            "parsyn-trainer exited with status 1: task.json: config.max_seq_len must be >= 8");
  EXPECT_EQ(WithoutLocalPaths("cannot read '/home/u/data/train.jsonl' (row 3)"), "cannot read 'train.jsonl' (row 3)");
  EXPECT_EQ(WithoutLocalPaths("cannot create /var/cache/parsyn/tasks/: No space left"),
            "cannot create tasks: No space left");
  EXPECT_EQ(WithoutLocalPaths("path=/a/b/c.bin, size 3"), "path=c.bin, size 3");
  // Not paths: ratios, units, single parts, URLs and API routes.
  for (const char* kept : {"loss 1/2 of tokens/s", "see /x here", "GET http://10.0.0.5:8080/blobs/k: 404",
                           "POST /api/v1/worker/result: 409", ""}) {
    EXPECT_EQ(WithoutLocalPaths(kept), kept);
  }
}

}  // namespace
}  // namespace parsyn
