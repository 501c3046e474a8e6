// The transport's own contract where no server is needed; src/http's client tests and src/storage's S3 tests (against
// moto_server) exercise it against real servers.
#include "net/transport.h"

#include <gtest/gtest.h>

#include <fstream>

#include "base/testing/free_port.h"
#include "base/testing/temp_dir.h"

namespace parsyn::net {
namespace {

std::string ClosedPortUrl(std::string_view path) {
  StatusOr<int> port = test_support::FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status().ToString();
  return "http://127.0.0.1:" + std::to_string(port.ok() ? *port : 0) + std::string(path);
}

TEST(TransportTest, WithoutQueryHidesWhatFollowsTheQuestionMark) {
  EXPECT_EQ(WithoutQuery("https://s3.example/b/k?X-Amz-Signature=abc"), "https://s3.example/b/k?…");
  EXPECT_EQ(WithoutQuery("http://127.0.0.1:8080/api/v1/jobs"), "http://127.0.0.1:8080/api/v1/jobs");
}

TEST(TransportTest, RefusedConnectionIsRetriedAndNamedWithoutTheQuery) {
  TransportOptions options;
  options.max_attempts = 2;
  options.backoff_initial = std::chrono::milliseconds(1);
  options.unreachable_hint = "is it running?";
  Transport transport(options);
  Request request;
  request.url = ClosedPortUrl("/blob?X-Amz-Signature=secret");
  request.retry = true;
  StatusOr<Response> r = transport.Perform(request);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(),
            "after 2 attempts: GET " + WithoutQuery(request.url) + ": connection refused (is it running?)");
}

TEST(TransportTest, DescribeFailureIsTheCallersToChoose) {
  TransportOptions options;
  options.describe_failure = [](std::string_view what, const TransferFailure& failure) {
    return InternalError("store failed during " + std::string(what) + ": " + failure.reason);
  };
  Transport transport(options);
  Request request;
  request.method = "DELETE";
  request.url = ClosedPortUrl("/k");
  request.what = "DELETE s3://bucket/k";
  StatusOr<Response> r = transport.Perform(request);
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(r.status().message().starts_with("store failed during DELETE s3://bucket/k: ")) << r.status().message();

  StatusOr<std::unique_ptr<ResponseStream>> stream = transport.Open(request);
  EXPECT_EQ(stream.status().code(), StatusCode::kInternal);
}

TEST(TransportTest, FileBodyChecksItsRangeAtEachRewind) {
  test_support::TempDir dir("parsyn-net-test");
  const std::filesystem::path file = dir.path() / "ten";
  std::ofstream(file) << "0123456789";
  std::unique_ptr<RequestBody> middle = FileBody(file, 2, 5);
  ASSERT_TRUE(middle->Rewind().ok());
  EXPECT_EQ(middle->size(), 5u);
  char buffer[16];
  StatusOr<size_t> n = middle->Read(buffer, sizeof(buffer));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buffer, *n), "23456");
  ASSERT_TRUE(middle->Rewind().ok());  // a retry starts again at the offset
  n = middle->Read(buffer, 3);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buffer, *n), "234");

  EXPECT_EQ(FileBody(file, 5, 6)->Rewind().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FileBody(dir.path() / "missing")->Rewind().code(), StatusCode::kNotFound);
  std::unique_ptr<RequestBody> whole = FileBody(file);
  ASSERT_TRUE(whole->Rewind().ok());
  EXPECT_EQ(whole->size(), 10u);
}

TEST(TransportTest, MemoryBodyRewinds) {
  std::unique_ptr<RequestBody> body = MemoryBody("abc");
  char buffer[4];
  for (int attempt = 0; attempt < 2; ++attempt) {
    ASSERT_TRUE(body->Rewind().ok());
    StatusOr<size_t> n = body->Read(buffer, sizeof(buffer));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(std::string(buffer, *n), "abc");
  }
}

}  // namespace
}  // namespace parsyn::net
