// The coordinator's signed /blobs URLs: their lifetime is the one asked for, and a URL bound to a worker is signed
// over that binding, so it verifies only with the worker id it names.
#include "coordinator/signed_blob_urls.h"

#include <gtest/gtest.h>

#include <map>

#include "http/signed_url.h"

namespace parsyn::coordinator {
namespace {

constexpr char kSecret[] = "test-secret";
constexpr char kKey[] = "jobs/7/rounds/2/global.safetensors";

// The query of `url` as a map.
std::map<std::string, std::string> Query(const std::string& url) {
  std::map<std::string, std::string> out;
  std::string rest = url.substr(url.find('?') + 1);
  while (!rest.empty()) {
    const std::string pair = rest.substr(0, rest.find('&'));
    out[pair.substr(0, pair.find('='))] = pair.substr(pair.find('=') + 1);
    rest = rest.find('&') == std::string::npos ? "" : rest.substr(rest.find('&') + 1);
  }
  return out;
}

TEST(SignedBlobUrlsTest, UrlLastsItsTtl) {
  FakeClock clock;
  SignedBlobUrls urls(
      kSecret, [] { return std::string("http://c:8080"); }, clock);
  const std::string url = urls.Sign("GET", kKey, std::chrono::seconds(900));
  EXPECT_EQ(url.rfind(std::string("http://c:8080/blobs/") + kKey + "?", 0), 0u) << url;
  const auto q = Query(url);
  const int64_t now = clock.UnixMillis() / 1000;
  EXPECT_EQ(q.at("expires"), std::to_string(now + 900));
  EXPECT_EQ(q.count("worker"), 0u);
  EXPECT_TRUE(http::VerifySignedUrl(kSecret, "GET", kKey, q.at("expires"), q.at("signature"), now + 900).ok());
  EXPECT_EQ(http::VerifySignedUrl(kSecret, "GET", kKey, q.at("expires"), q.at("signature"), now + 901).code(),
            StatusCode::kPermissionDenied);
}

TEST(SignedBlobUrlsTest, WorkerBoundUrlVerifiesOnlyForItsWorker) {
  FakeClock clock;
  SignedBlobUrls urls(
      kSecret, [] { return std::string("http://c:8080"); }, clock);
  const std::string url = urls.Sign("PUT", kKey, std::chrono::seconds(60), 12);
  const auto q = Query(url);
  const int64_t now = clock.UnixMillis() / 1000;
  ASSERT_EQ(q.at("worker"), "12");
  EXPECT_TRUE(
      http::VerifySignedUrl(kSecret, "PUT", WorkerBoundKey(kKey, 12), q.at("expires"), q.at("signature"), now).ok());
  // Dropping or changing the worker id breaks the signature.
  EXPECT_EQ(http::VerifySignedUrl(kSecret, "PUT", kKey, q.at("expires"), q.at("signature"), now).code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(
      http::VerifySignedUrl(kSecret, "PUT", WorkerBoundKey(kKey, 13), q.at("expires"), q.at("signature"), now).code(),
      StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace parsyn::coordinator
