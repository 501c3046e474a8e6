#include "http/signed_url.h"

#include <gtest/gtest.h>

#include "http/internal.h"

namespace parsyn::http {
namespace {

constexpr std::string_view kSecret = "0123456789abcdef0123456789abcdef";
constexpr std::string_view kKey = "jobs/17/rounds/000003/global.safetensors";
constexpr int64_t kNow = 1'700'000'000;

struct Parts {
  std::string expires, signature;
};

Parts Parse(const std::string& query) {
  StatusOr<StringMap> q = ParseQuery(query);
  EXPECT_TRUE(q.ok());
  return {(*q)["expires"], (*q)["signature"]};
}

TEST(SignedUrlTest, ValidUntilExpiry) {
  std::string query = SignUrl(kSecret, "GET", kKey, kNow + 600);
  EXPECT_TRUE(query.starts_with("expires=1700000600&signature=")) << query;
  Parts p = Parse(query);
  EXPECT_EQ(p.signature.size(), 43u);  // 32 bytes, base64url without padding
  EXPECT_EQ(p.signature.find_first_of("+/="), std::string::npos);
  EXPECT_TRUE(VerifySignedUrl(kSecret, "GET", kKey, p.expires, p.signature, kNow).ok());
  EXPECT_TRUE(VerifySignedUrl(kSecret, "GET", kKey, p.expires, p.signature, kNow + 600).ok());
}

TEST(SignedUrlTest, ExpiredIsPermissionDeniedAndSaysSo) {
  Parts p = Parse(SignUrl(kSecret, "PUT", kKey, kNow));
  Status s = VerifySignedUrl(kSecret, "PUT", kKey, p.expires, p.signature, kNow + 1);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "signed URL expired at 1700000000 (now 1700000001); ask for a new one");
}

TEST(SignedUrlTest, RejectsTamperingWrongMethodKeyAndSecret) {
  Parts p = Parse(SignUrl(kSecret, "GET", kKey, kNow + 600));
  std::string tampered = p.signature;
  tampered[5] = tampered[5] == 'A' ? 'B' : 'A';
  struct Case {
    std::string name, secret, method, key, expires, signature;
  } cases[] = {
      {"tampered signature", std::string(kSecret), "GET", std::string(kKey), p.expires, tampered},
      {"truncated signature", std::string(kSecret), "GET", std::string(kKey), p.expires, p.signature.substr(1)},
      {"extended expiry", std::string(kSecret), "GET", std::string(kKey), "1700000601", p.signature},
      {"wrong method", std::string(kSecret), "PUT", std::string(kKey), p.expires, p.signature},
      {"other blob", std::string(kSecret), "GET", "jobs/17/rounds/000004/global.safetensors", p.expires, p.signature},
      {"other secret", "another secret", "GET", std::string(kKey), p.expires, p.signature},
  };
  for (const Case& c : cases) {
    Status s = VerifySignedUrl(c.secret, c.method, c.key, c.expires, c.signature, kNow);
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << c.name;
    EXPECT_EQ(s.message(), "signed URL signature does not match this method and blob") << c.name;
  }
}

TEST(SignedUrlTest, MissingOrMalformedPartsAreUnauthenticated) {
  Parts p = Parse(SignUrl(kSecret, "GET", kKey, kNow + 600));
  EXPECT_EQ(VerifySignedUrl(kSecret, "GET", kKey, "", p.signature, kNow).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(VerifySignedUrl(kSecret, "GET", kKey, p.expires, "", kNow).code(), StatusCode::kUnauthenticated);
  Status bad = VerifySignedUrl(kSecret, "GET", kKey, "12x", p.signature, kNow);
  EXPECT_EQ(bad.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(bad.message(), "signed URL has a malformed 'expires' value");
}

TEST(UrlTest, PercentCodingRoundTrips) {
  EXPECT_EQ(PercentEncode("a b/c?d=é"), "a%20b%2Fc%3Fd%3D%C3%A9");
  EXPECT_EQ(PercentEncode("jobs/1/x.bin", true), "jobs/1/x.bin");
  EXPECT_EQ(*PercentDecode("a%20b%2Fc", false), "a b/c");
  EXPECT_EQ(*PercentDecode("a+b", true), "a b");
  EXPECT_EQ(*PercentDecode("a+b", false), "a+b");
  EXPECT_EQ(PercentDecode("bad%2", false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PercentDecode("bad%zz", false).status().code(), StatusCode::kInvalidArgument);
  auto q = ParseQuery("a=1&b=x%20y&flag&a=2");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)["a"], "2");
  EXPECT_EQ((*q)["b"], "x y");
  EXPECT_EQ((*q)["flag"], "");
}

}  // namespace
}  // namespace parsyn::http

namespace parsyn::http {
namespace {

TEST(FormEncodeTest, JoinsFieldsWithEachValueEscaped) {
  EXPECT_EQ(FormEncode({}), "");
  EXPECT_EQ(FormEncode({{"a", "1"}}), "a=1");
  EXPECT_EQ(FormEncode({{"scope", "openid email"}, {"uri", "http://h/cb?x=1&y"}}),
            "scope=openid%20email&uri=http%3A%2F%2Fh%2Fcb%3Fx%3D1%26y");
}

}  // namespace
}  // namespace parsyn::http
