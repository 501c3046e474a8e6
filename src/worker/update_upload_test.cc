// UploadUpdate against a real S3 protocol server (moto_server on loopback, started once per test process) through
// presigned URLs made by the storage layer's S3BlobStore, and against fake coordinator routes for the /blobs form.
// A recording proxy in front of moto shows what goes on the wire and fails chosen requests once.
#include "worker/update_upload.h"
#include "base/testing/missing_dependency.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "base/sha256.h"
#include "base/testing/temp_dir.h"
#include "http/test_server.h"
#include "storage/byte_source.h"
#include "storage/s3_blob_store.h"
#include "storage/s3_moto_for_test.h"

namespace parsyn::worker {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
using std::chrono::milliseconds;
using namespace std::chrono_literals;
using storage::MotoServer;
using storage::PresignedRequest;
using storage::S3BlobStore;
using ::testing::HasSubstr;

constexpr char kMotoMissing[] =
    "moto_server is not installed (looked on PATH and in /root/.pyenv/shims): the S3 upload tests need it";
// moto refuses multipart parts below S3_UPLOAD_PART_MIN_SIZE (5 MiB by default) except the last; lowered for this
// process's server so the tests move kilobytes, not megabytes.
constexpr uint64_t kPartBytes = 16 << 10;

// The process's moto_server, started with kPartBytes as its smallest multipart part.
StatusOr<MotoServer*> SharedMoto() {
  static const bool part_size_set =
      ::setenv("S3_UPLOAD_PART_MIN_SIZE", std::to_string(kPartBytes).c_str(), 1) == 0;  // inherited by moto_server
  (void)part_size_set;
  return storage::SharedMotoServer();
}

std::string Bytes(size_t size, int seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 31 + static_cast<size_t>(seed) * 7) % 251);
  return bytes;
}

// The files live in one directory per test process, removed at exit.
fs::path WriteFile(const std::string& name, const std::string& bytes) {
  static const test_support::TempDir dir("parsyn-upload-test");
  fs::path path = dir.path() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  return path;
}

protocol::HttpHeaders Headers(const PresignedRequest& request) {
  protocol::HttpHeaders headers;
  for (const auto& [name, value] : request.headers) headers[name] = value;
  return headers;
}

// The single-PUT form of a task's update_upload.
protocol::UpdateUpload SinglePut(std::string key, std::string url, protocol::HttpHeaders headers = {},
                                 uint64_t max_size_bytes = 0) {
  return {.blob_key = std::move(key),
          .max_size_bytes = max_size_bytes,
          .url = std::move(url),
          .headers = headers,
          .multipart = std::nullopt};
}

// The multipart form: `part_size_bytes` and the listed parts.
protocol::UpdateUpload Multipart(std::string key, uint64_t part_size_bytes, std::vector<protocol::UploadPart> parts) {
  return {
      .blob_key = std::move(key),
      .max_size_bytes = 1 << 20,
      .url = "",
      .headers = std::nullopt,
      .multipart = protocol::UpdateUpload::Multipart{.part_size_bytes = part_size_bytes, .parts = std::move(parts)}};
}

// The client the agent uses for blobs: no token, fast retries.
http::ClientOptions BlobClientOptions() {
  http::ClientOptions options;
  options.max_attempts = 3;
  options.backoff_initial = milliseconds(10);
  options.backoff_max = milliseconds(40);
  return options;
}

const UploadUpdateOptions kFastPartRetries{.part_attempts = 3, .part_backoff = milliseconds(10)};

http::ClientOptions SingleAttempt() {
  http::ClientOptions options;
  options.max_attempts = 1;
  return options;
}

// Forwards every request to moto and records it; answers 500 (which the client does not retry, so the part loop
// must) to the first `failures` requests whose target contains `fail_marker`. Forwarding blocks the proxy's loop
// thread: fine here, where one client sends one request at a time.
class RecordingProxy {
 public:
  struct Seen {
    std::string target;
    std::string authorization;
    std::string if_none_match;
    std::string sha256_meta;
    size_t body_bytes = 0;
  };

  RecordingProxy(std::string upstream, std::string fail_marker, int failures)
      : upstream_(std::move(upstream)), fail_marker_(std::move(fail_marker)), failures_left_(failures) {
    http::Router router;
    http::Handler forward = [this](http::Request& req) -> http::Awaitable<http::Response> { co_return Forward(req); };
    EXPECT_TRUE(router.Add(http::Method::kPut, "/{path...}", forward).ok());
    http::ServerOptions options;
    options.max_body_bytes = 1 << 20;
    server_ = std::make_unique<http::testing::TestServer>(io_, std::move(router), options);
  }

  // `url` (a presigned moto URL) with the proxy in moto's place; moto does not check signatures, so the Host change
  // is harmless.
  std::string Via(const std::string& url) const { return server_->url() + url.substr(upstream_.size()); }

  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  http::Response Forward(http::Request& req) {
    {
      std::lock_guard lock(mu_);
      seen_.push_back({req.target, std::string(req.Header("authorization")), std::string(req.Header("if-none-match")),
                       std::string(req.Header("x-amz-meta-sha256")), req.body.size()});
      if (req.target.find(fail_marker_) != std::string::npos && failures_left_ > 0) {
        failures_left_--;
        return http::Response::Text(500, "<Error><Code>InternalError</Code></Error>", "application/xml");
      }
    }
    http::CallOptions call{.retry = false};
    for (const char* name : {"if-none-match", "x-amz-meta-sha256"}) {
      if (!req.Header(name).empty()) call.headers.emplace_back(name, std::string(req.Header(name)));
    }
    StatusOr<http::ClientResponse> answer = upstream_client_.Send(req.method, upstream_ + req.target, req.body,
                                                                  std::string(req.Header("content-type")), call);
    if (!answer.ok()) return http::Response::Text(502, answer.status().ToString());
    return http::Response::Text(answer->status, answer->body, "application/xml");
  }

  std::string upstream_;
  std::string fail_marker_;
  http::Client upstream_client_{SingleAttempt()};
  std::mutex mu_;
  int failures_left_;
  std::vector<Seen> seen_;
  net::io_context io_;
  std::unique_ptr<http::testing::TestServer> server_;  // last: stopped before the state its handler uses goes away
};

class UploadUpdateS3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!storage::FindMotoServer()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(kMotoMissing);
    StatusOr<MotoServer*> moto = SharedMoto();
    ASSERT_TRUE(moto.ok()) << "moto_server is installed but did not start: " << moto.status().ToString();
    moto_ = *moto;
    static std::atomic<int> next{0};
    const std::string bucket = "worker-upload-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
    ASSERT_TRUE(moto_->CreateBucket(bucket).ok());
    storage::S3BlobStoreOptions options;
    options.bucket = bucket;
    options.prefix = "store/";
    options.endpoint = {.scheme = "http",
                        .host = "127.0.0.1:" + std::to_string(moto_->port()),
                        .region = "us-east-1",
                        .path_style = true};
    options.credentials = {"testing", "testing", ""};
    StatusOr<std::unique_ptr<S3BlobStore>> store = S3BlobStore::Create(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }

  // The multipart form of update_upload for `key`, `parts` URLs (passed through `via`).
  protocol::UpdateUpload MultipartTask(const std::string& key, const std::string& upload_id, int parts,
                                       const std::function<std::string(const std::string&)>& via = nullptr) {
    std::vector<protocol::UploadPart> list;
    for (int number = 1; number <= parts; ++number) {
      StatusOr<PresignedRequest> part = store_->PresignUploadPart(key, upload_id, number, 600s);
      EXPECT_TRUE(part.ok()) << part.status().ToString();
      list.push_back({.part_number = number, .url = via ? via(part->url) : part->url, .headers = Headers(*part)});
    }
    return Multipart(key, kPartBytes, std::move(list));
  }

  std::string Stored(const std::string& key) {
    StatusOr<std::unique_ptr<storage::ByteSource>> source = store_->Get(key);
    if (!source.ok()) return "<" + source.status().ToString() + ">";
    StatusOr<std::string> bytes = storage::ReadAll(**source);
    return bytes.ok() ? *bytes : "<" + bytes.status().ToString() + ">";
  }

  MotoServer* moto_ = nullptr;
  std::unique_ptr<S3BlobStore> store_;
  http::Client blobs_{BlobClientOptions()};
};

TEST_F(UploadUpdateS3Test, SinglePresignedPutSendsItsSignedHeadersAndNoAuthorization) {
  const std::string update = Bytes(10'000, 1);
  const std::string sha = Sha256Hex(std::string_view(update));
  StatusOr<PresignedRequest> put = store_->PresignPut("jobs/1/updates/w3", 600s, sha);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  RecordingProxy proxy(moto_->endpoint(), "never", 0);
  const protocol::UpdateUpload task = SinglePut("jobs/1/updates/w3", proxy.Via(put->url), Headers(*put), 20'000);

  Status uploaded = UploadUpdate(blobs_, task, WriteFile("single.bin", update), sha, {});
  ASSERT_TRUE(uploaded.ok()) << uploaded.ToString();
  StatusOr<storage::BlobInfo> head = store_->Head("jobs/1/updates/w3");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size_bytes, update.size());
  EXPECT_EQ(head->sha256, sha);  // the signed x-amz-meta-sha256 arrived
  EXPECT_TRUE(Stored("jobs/1/updates/w3") == update);
  std::vector<RecordingProxy::Seen> seen = proxy.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].authorization, "");
  EXPECT_EQ(seen[0].if_none_match, "*");
  EXPECT_EQ(seen[0].sha256_meta, sha);
  EXPECT_EQ(seen[0].body_bytes, update.size());
}

TEST_F(UploadUpdateS3Test, RepeatedCreateOnlyPutCountsAsAlreadyStored) {
  const std::string update = Bytes(5'000, 2);
  const std::string sha = Sha256Hex(std::string_view(update));
  StatusOr<PresignedRequest> put = store_->PresignPut("jobs/1/updates/w4", 600s, sha);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  const protocol::UpdateUpload task = SinglePut("jobs/1/updates/w4", put->url, Headers(*put));
  ASSERT_TRUE(UploadUpdate(blobs_, task, WriteFile("first.bin", update), sha, {}).ok());

  // A retried task's PUT finds the key taken (moto: 412 PreconditionFailed): done, and nothing is overwritten.
  Status again = UploadUpdate(blobs_, task, WriteFile("second.bin", Bytes(5'000, 3)), sha, {});
  EXPECT_TRUE(again.ok()) << again.ToString();
  EXPECT_TRUE(Stored("jobs/1/updates/w4") == update);
}

TEST_F(UploadUpdateS3Test, MultipartUploadSendsConsecutivePartsThatComplete) {
  const std::string update = Bytes(2 * kPartBytes + 1'000, 4);  // three parts, the last one short
  const std::string sha = Sha256Hex(std::string_view(update));
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w5", sha);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  const protocol::UpdateUpload task =
      MultipartTask("jobs/1/updates/w5", *upload, 4);  // one part more than needed: left unused

  Status uploaded = UploadUpdate(blobs_, task, WriteFile("multi.bin", update), sha, {}, kFastPartRetries);
  ASSERT_TRUE(uploaded.ok()) << uploaded.ToString();
  StatusOr<std::vector<storage::UploadedPart>> parts = store_->ListUploadedParts("jobs/1/updates/w5", *upload);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0].size_bytes, kPartBytes);
  EXPECT_EQ((*parts)[2].size_bytes, 1'000u);
  StatusOr<storage::BlobInfo> done = store_->CompleteMultipartUpload("jobs/1/updates/w5", *upload);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->size_bytes, update.size());
  EXPECT_EQ(done->sha256, sha);
  EXPECT_TRUE(Stored("jobs/1/updates/w5") == update);
}

TEST_F(UploadUpdateS3Test, InterruptedPartIsRetriedAloneAndTheUploadCompletes) {
  const std::string update = Bytes(2 * kPartBytes + 500, 5);
  const std::string sha = Sha256Hex(std::string_view(update));
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w6", sha);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  RecordingProxy proxy(moto_->endpoint(), "partNumber=2", 1);
  const protocol::UpdateUpload task =
      MultipartTask("jobs/1/updates/w6", *upload, 3, [&](const std::string& url) { return proxy.Via(url); });

  Status uploaded = UploadUpdate(blobs_, task, WriteFile("interrupted.bin", update), sha, {}, kFastPartRetries);
  ASSERT_TRUE(uploaded.ok()) << uploaded.ToString();
  // Part 1 went once, part 2 twice (the 500, then the retry), part 3 once: nothing was sent again from the start.
  std::vector<RecordingProxy::Seen> seen = proxy.seen();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_THAT(seen[0].target, HasSubstr("partNumber=1"));
  EXPECT_THAT(seen[1].target, HasSubstr("partNumber=2"));
  EXPECT_THAT(seen[2].target, HasSubstr("partNumber=2"));
  EXPECT_THAT(seen[3].target, HasSubstr("partNumber=3"));
  EXPECT_EQ(seen[2].body_bytes, kPartBytes);
  EXPECT_EQ(seen[3].body_bytes, 500u);
  for (const RecordingProxy::Seen& s : seen) EXPECT_EQ(s.authorization, "") << s.target;
  StatusOr<storage::BlobInfo> done = store_->CompleteMultipartUpload("jobs/1/updates/w6", *upload);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->sha256, sha);
  EXPECT_TRUE(Stored("jobs/1/updates/w6") == update);
}

TEST_F(UploadUpdateS3Test, PartThatKeepsFailingNamesThePartAfterItsAttempts) {
  const std::string update = Bytes(kPartBytes + 10, 6);
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w7");
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  RecordingProxy proxy(moto_->endpoint(), "partNumber=2", 100);
  const protocol::UpdateUpload task =
      MultipartTask("jobs/1/updates/w7", *upload, 2, [&](const std::string& url) { return proxy.Via(url); });

  Status uploaded = UploadUpdate(blobs_, task, WriteFile("failing.bin", update), "", {}, kFastPartRetries);
  EXPECT_EQ(uploaded.code(), StatusCode::kInternal) << uploaded.ToString();
  EXPECT_THAT(uploaded.message(), HasSubstr("part 2: PUT "));
  EXPECT_THAT(uploaded.message(), HasSubstr("HTTP 500"));
  EXPECT_EQ(proxy.seen().size(), 1u + 3u);  // part 1 once, part 2 part_attempts times
}

TEST_F(UploadUpdateS3Test, FileNeedingMorePartsThanListedFailsBeforeSendingAnything) {
  const std::string update = Bytes(2 * kPartBytes + 1, 7);
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w8");
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  const protocol::UpdateUpload task = MultipartTask("jobs/1/updates/w8", *upload, 2);

  Status uploaded = UploadUpdate(blobs_, task, WriteFile("toobig.bin", update), "", {}, kFastPartRetries);
  EXPECT_EQ(uploaded.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(uploaded.message(), "the update has " + std::to_string(update.size()) + " bytes, which need 3 parts of " +
                                    std::to_string(kPartBytes) + " bytes; the task lists 2");
  EXPECT_TRUE(store_->ListUploadedParts("jobs/1/updates/w8", *upload)->empty());
}

// ---- Checks that need no store. ----

TEST(UploadUpdateTest, RefusesMalformedTasksAndOversizedFiles) {
  http::Client blobs(BlobClientOptions());
  const fs::path file = WriteFile("small.bin", Bytes(100, 8));
  Status big = UploadUpdate(blobs, SinglePut("k", "http://127.0.0.1:1/x", {}, 99), file, "", {});
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(), "the update has 100 bytes, more than the task's limit of 99");

  Status no_url = UploadUpdate(blobs, SinglePut("k", ""), file, "", {});
  EXPECT_EQ(no_url.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(no_url.message(), "update_upload has neither a url nor multipart parts");

  Status zero_parts = UploadUpdate(blobs, Multipart("k", 0, {}), file, "", {});
  EXPECT_EQ(zero_parts.message(), "update_upload.multipart.part_size_bytes must be positive");

  Status wrong_number = UploadUpdate(
      blobs, Multipart("k", 1000, {{.part_number = 2, .url = "http://127.0.0.1:1/x", .headers = {}}}), file, "", {});
  EXPECT_EQ(wrong_number.message(), "update_upload.multipart.parts[0] has part_number 2, expected 1");

  Status missing = UploadUpdate(blobs, SinglePut("k", "http://127.0.0.1:1/x"), file.string() + ".absent", "", {});
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
}

// The coordinator's own /blobs form: a JSON answer naming the stored sha256, 409 already_exists on a repeat.
TEST(UploadUpdateTest, CoordinatorBlobAnswersAreCheckedAndARepeatCountsAsStored) {
  net::io_context io;
  http::Router router;
  std::atomic<int> puts = 0;
  std::string stored_sha;
  ASSERT_TRUE(router
                  .Add(http::Method::kPut, "/blobs/{key...}",
                       [&](http::Request& req) -> http::Awaitable<http::Response> {
                         if (req.params["key"] == "taken") co_return http::Response::Error(AlreadyExistsError("taken"));
                         puts++;
                         co_return http::Response::Json(201, {{"sha256", stored_sha}, {"size_bytes", req.body.size()}});
                       })
                  .ok());
  http::testing::TestServer ts(io, std::move(router));
  http::Client blobs(BlobClientOptions());
  const std::string update = Bytes(300, 9);
  const std::string sha = Sha256Hex(std::string_view(update));
  const fs::path file = WriteFile("coordinator.bin", update);

  stored_sha = sha;
  EXPECT_TRUE(UploadUpdate(blobs, SinglePut("u", ts.url() + "/blobs/u?sig=1"), file, sha, {}).ok());
  EXPECT_TRUE(UploadUpdate(blobs, SinglePut("taken", ts.url() + "/blobs/taken?sig=1"), file, sha, {}).ok());
  stored_sha = std::string(64, '0');
  Status corrupt = UploadUpdate(blobs, SinglePut("u", ts.url() + "/blobs/u?sig=1"), file, sha, {});
  EXPECT_EQ(corrupt.code(), StatusCode::kDataLoss);
  EXPECT_EQ(corrupt.message(),
            "the coordinator stored the update with sha256 " + stored_sha + ", the trainer wrote " + sha);
  EXPECT_EQ(puts.load(), 2);
}

// 412 means "already stored" only for a PUT that carried If-None-Match: *; for any other PUT it is an error.
TEST(UploadUpdateTest, PreconditionFailedCountsAsStoredOnlyForCreateOnlyPuts) {
  net::io_context io;
  http::Router router;
  ASSERT_TRUE(router
                  .Add(http::Method::kPut, "/bucket/{key...}",
                       [](http::Request&) -> http::Awaitable<http::Response> {
                         co_return http::Response::Text(412, "<Error><Code>PreconditionFailed</Code></Error>",
                                                        "application/xml");
                       })
                  .ok());
  http::testing::TestServer ts(io, std::move(router));
  http::Client blobs(BlobClientOptions());
  const fs::path file = WriteFile("precondition.bin", Bytes(10, 10));
  const protocol::UpdateUpload create_only = SinglePut("k", ts.url() + "/bucket/k", {{"If-None-Match", "*"}});
  EXPECT_TRUE(UploadUpdate(blobs, create_only, file, "", {}).ok());

  const protocol::UpdateUpload conditional = SinglePut("k", ts.url() + "/bucket/k", {{"If-Match", "\"e1\""}});
  Status refused = UploadUpdate(blobs, conditional, file, "", {});
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "PUT " + ts.url() + "/bucket/k: HTTP 412: <Error><Code>PreconditionFailed</Code></Error>");
}

}  // namespace
}  // namespace parsyn::worker
