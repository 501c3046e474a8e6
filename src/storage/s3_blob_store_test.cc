// S3BlobStore: URI and credential parsing (no server), then the blob-store contract, presigned URLs, multipart
// uploads and an outage against a real moto_server on loopback (started per test process, on a free port).
#include "storage/s3_blob_store.h"
#include "base/testing/missing_dependency.h"

#include <curl/curl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>

#include "base/sha256.h"
#include "storage/blob_store_contract.h"
#include "storage/s3_moto_for_test.h"
#include "storage/temp_dir_for_test.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace std::chrono_literals;

constexpr char kMotoMissing[] =
    "moto_server is not installed (looked on PATH and in /root/.pyenv/shims): the S3 store's server tests need it";

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// ---- Parsing: no server needed. ----

TEST(S3UriTest, ParsesBucketPrefixAndOptions) {
  EnvLookup env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "SECRET"}});
  StatusOr<S3BlobStoreOptions> local = ParseS3BlobStoreUri(
      "s3://parsyn-blobs/deploy/a?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1&path_style=1", env);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->bucket, "parsyn-blobs");
  EXPECT_EQ(local->prefix, "deploy/a/");
  EXPECT_EQ(local->endpoint.scheme, "http");
  EXPECT_EQ(local->endpoint.host, "127.0.0.1:9000");
  EXPECT_EQ(local->endpoint.region, "eu-west-1");
  EXPECT_TRUE(local->endpoint.path_style);
  EXPECT_EQ(local->credentials.access_key_id, "AKID");

  StatusOr<S3BlobStoreOptions> aws =
      ParseS3BlobStoreUri("s3://parsyn-blobs", FakeEnv({{"AWS_ACCESS_KEY_ID", "AKID"},
                                                        {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                                        {"AWS_SESSION_TOKEN", "TOKEN"},
                                                        {"AWS_REGION", "ap-south-1"}}));
  ASSERT_TRUE(aws.ok()) << aws.status().ToString();
  EXPECT_EQ(aws->prefix, "");
  EXPECT_EQ(aws->endpoint.scheme, "https");
  EXPECT_EQ(aws->endpoint.host, "s3.ap-south-1.amazonaws.com");
  EXPECT_FALSE(aws->endpoint.path_style);
  EXPECT_EQ(aws->credentials.session_token, "TOKEN");

  // An endpoint without path_style defaults to path style (MinIO, moto); the option can turn it off.
  StatusOr<S3BlobStoreOptions> minio =
      ParseS3BlobStoreUri("s3://b12/p/?endpoint=https://minio.internal:9000&path_style=0", env);
  ASSERT_TRUE(minio.ok()) << minio.status().ToString();
  EXPECT_EQ(minio->prefix, "p/");
  EXPECT_FALSE(minio->endpoint.path_style);
  EXPECT_EQ(minio->endpoint.region, "us-east-1");
  EXPECT_EQ(minio->multipart_threshold_bytes, uint64_t{64} << 20);

  StatusOr<S3BlobStoreOptions> sized =
      ParseS3BlobStoreUri("s3://b12?endpoint=http://127.0.0.1:9&multipart_threshold_mib=0&part_size_mib=8", env);
  ASSERT_TRUE(sized.ok()) << sized.status().ToString();
  EXPECT_EQ(sized->multipart_threshold_bytes, 0u);
  EXPECT_EQ(sized->part_size_bytes, uint64_t{8} << 20);
}

TEST(S3UriTest, RejectsBadUrisNamingThePart) {
  EnvLookup env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "SECRET"}});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"s3://", "bucket '' is not a valid S3 bucket name"},
      {"s3://Upper_Case/x", "bucket 'Upper_Case'"},
      {"s3://bucket/a//b", "prefix: invalid blob key"},
      {"s3://bucket/../x", "prefix: invalid blob key"},
      {"s3://bucket?endpoint=ftp://host", "endpoint 'ftp://host' must be http(s)://HOST[:PORT]"},
      {"s3://bucket?endpoint=http://host/path", "with no path"},
      {"s3://bucket?path_style=yes", "path_style must be 0 or 1"},
      {"s3://bucket?colour=blue", "unknown option 'colour'"},
      {"s3://bucket?part_size_mib=4", "part_size_mib must be a whole number of MiB from 5 to 5120"},
      {"s3://bucket?multipart_threshold_mib=x", "multipart_threshold_mib must be a whole number"},
      {"s3://my.bucket", "bucket names with dots break TLS"},
  };
  for (const auto& [uri, fragment] : cases) {
    StatusOr<S3BlobStoreOptions> parsed = ParseS3BlobStoreUri(uri, env);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << uri;
    EXPECT_THAT(parsed.status().message(), HasSubstr(fragment)) << uri;
  }
}

TEST(S3CredentialsTest, SharedCredentialsFileAndProfiles) {
  TempDirForTest dir;
  fs::path file = dir.path() / "credentials";
  std::ofstream(file) << "# comment\n[default]\naws_access_key_id = DEFAULTID\naws_secret_access_key=DEFAULTSECRET\n"
                         "\n[ci]\naws_access_key_id=CIID\naws_secret_access_key = CISECRET\n"
                         "aws_session_token = CITOKEN\n[broken]\naws_access_key_id=X\n";
  std::map<std::string, std::string> vars = {{"AWS_SHARED_CREDENTIALS_FILE", file.string()}};

  StatusOr<AwsCredentials> by_default = LoadAwsCredentials(FakeEnv(vars));
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_EQ(by_default->access_key_id, "DEFAULTID");
  EXPECT_EQ(by_default->secret_access_key, "DEFAULTSECRET");
  EXPECT_EQ(by_default->session_token, "");

  vars["AWS_PROFILE"] = "ci";
  StatusOr<AwsCredentials> ci = LoadAwsCredentials(FakeEnv(vars));
  ASSERT_TRUE(ci.ok()) << ci.status().ToString();
  EXPECT_EQ(ci->access_key_id, "CIID");
  EXPECT_EQ(ci->session_token, "CITOKEN");

  // The URI's profile wins over AWS_PROFILE; environment keys win over the file.
  EXPECT_EQ(LoadAwsCredentials(FakeEnv(vars), "default")->access_key_id, "DEFAULTID");
  vars["AWS_ACCESS_KEY_ID"] = "ENVID";
  vars["AWS_SECRET_ACCESS_KEY"] = "ENVSECRET";
  EXPECT_EQ(LoadAwsCredentials(FakeEnv(vars))->access_key_id, "ENVID");
  vars.erase("AWS_SECRET_ACCESS_KEY");
  EXPECT_THAT(LoadAwsCredentials(FakeEnv(vars)).status().message(), HasSubstr("must be set together"));
  vars.erase("AWS_ACCESS_KEY_ID");

  StatusOr<AwsCredentials> broken = LoadAwsCredentials(FakeEnv(vars), "broken");
  EXPECT_EQ(broken.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr("lacks aws_access_key_id or aws_secret_access_key"));

  StatusOr<AwsCredentials> missing = LoadAwsCredentials(FakeEnv(vars), "nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.status().message(), HasSubstr("profile 'nope' is not in"));

  StatusOr<AwsCredentials> none = LoadAwsCredentials(FakeEnv({{"HOME", (dir.path() / "nohome").string()}}));
  EXPECT_EQ(none.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(none.status().message(), HasSubstr("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"));
}

TEST(S3BlobStoreTest, PresigningIsLocalAndChecksItsArguments) {
  S3BlobStoreOptions options;
  options.bucket = "parsyn";
  options.prefix = "deploy/";
  options.endpoint = {
      .scheme = "https", .host = "s3.eu-west-1.amazonaws.com", .region = "eu-west-1", .path_style = false};
  options.credentials = {"AKID", "SECRET", ""};
  options.now = [] { return std::chrono::system_clock::from_time_t(1700000000); };
  auto store = S3BlobStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  StatusOr<PresignedRequest> get = (*store)->PresignGet("jobs/1/global.safetensors", 600s);
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->method, "GET");
  EXPECT_THAT(get->url, HasSubstr("https://parsyn.s3.eu-west-1.amazonaws.com/deploy/jobs/1/global.safetensors?"));
  EXPECT_THAT(get->url, HasSubstr("X-Amz-Expires=600&X-Amz-SignedHeaders=host&"));
  EXPECT_THAT(get->headers, IsEmpty());
  EXPECT_EQ(get->expires_at, std::chrono::system_clock::from_time_t(1700000600));

  std::string sha(64, 'a');
  StatusOr<PresignedRequest> put = (*store)->PresignPut("u/1", 60s, sha);
  ASSERT_TRUE(put.ok());
  EXPECT_THAT(put->url, HasSubstr("X-Amz-SignedHeaders=host%3Bif-none-match%3Bx-amz-meta-sha256&"));
  EXPECT_THAT(put->headers, ElementsAre(std::pair<std::string, std::string>("If-None-Match", "*"),
                                        std::pair<std::string, std::string>("x-amz-meta-sha256", sha)));

  StatusOr<PresignedRequest> part = (*store)->PresignUploadPart("u/1", "upload-7", 3, 60s);
  ASSERT_TRUE(part.ok());
  EXPECT_THAT(part->url, HasSubstr("/deploy/u/1?uploadId=upload-7&partNumber=3&X-Amz-Algorithm="));

  EXPECT_EQ((*store)->PresignGet("k", 0s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT((*store)->PresignGet("k", 604801s).status().message(), HasSubstr("1 s to 7 days"));
  EXPECT_EQ((*store)->PresignGet("../k", 60s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->PresignPut("k", 60s, "ABC").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->PresignUploadPart("k", "id", 0, 60s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->PresignUploadPart("k", "id", 10001, 60s).status().code(), StatusCode::kInvalidArgument);
}

TEST(S3BlobStoreTest, CreateChecksOptions) {
  S3BlobStoreOptions options;
  options.bucket = "ok-bucket";
  options.endpoint.host = "127.0.0.1:1";
  options.prefix = "no-slash";
  EXPECT_THAT(S3BlobStore::Create(options).status().message(), HasSubstr("must end with '/'"));
  options.prefix = "";
  options.part_size_bytes = 1024;
  EXPECT_THAT(S3BlobStore::Create(options).status().message(), HasSubstr("at least 5 MiB"));
  options.bucket = "x";
  EXPECT_EQ(S3BlobStore::Create(options).status().code(), StatusCode::kInvalidArgument);
}

// ---- Against moto_server. ----

// A fresh bucket on `server` for each store, so tests never see each other's blobs.
std::string FreshBucket(const MotoServer& server) {
  static std::atomic<int> next{0};
  std::string bucket = "parsyn-test-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
  Status created = server.CreateBucket(bucket);
  EXPECT_TRUE(created.ok()) << created.ToString();
  return bucket;
}

S3BlobStoreOptions MotoOptions(const MotoServer& server, std::string bucket, std::string prefix = "store/") {
  S3BlobStoreOptions options;
  options.bucket = std::move(bucket);
  options.prefix = std::move(prefix);
  options.endpoint = {.scheme = "http",
                      .host = "127.0.0.1:" + std::to_string(server.port()),
                      .region = "us-east-1",
                      .path_style = true};
  options.credentials = {"testing", "testing", ""};
  return options;
}

std::vector<BlobStoreBackend> S3BackendsIfInstalled() {
  if (!FindMotoServer()) return {};  // S3BlobStoreTest.MotoServerIsInstalled reports the skip
  return {BlobStoreBackend{"s3_moto", [](const fs::path&) -> StatusOr<std::unique_ptr<BlobStore>> {
                             PARSYN_ASSIGN_OR_RETURN(MotoServer * server, SharedMotoServer());
                             PARSYN_ASSIGN_OR_RETURN(auto store,
                                                     S3BlobStore::Create(MotoOptions(*server, FreshBucket(*server))));
                             return std::unique_ptr<BlobStore>(std::move(store));
                           }}};
}

INSTANTIATE_TEST_SUITE_P(S3, BlobStoreContractTest, ::testing::ValuesIn(S3BackendsIfInstalled()), BlobStoreBackendName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BlobStoreContractTest);

TEST(S3BlobStoreTest, MotoServerIsInstalled) {
  if (!FindMotoServer()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(kMotoMissing);
  StatusOr<MotoServer*> server = SharedMotoServer();
  ASSERT_TRUE(server.ok()) << "moto_server is installed but did not start: " << server.status().ToString();
}

class S3MotoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!FindMotoServer()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(kMotoMissing);
    StatusOr<MotoServer*> server = SharedMotoServer();
    ASSERT_TRUE(server.ok()) << "moto_server is installed but did not start: " << server.status().ToString();
    server_ = *server;
    bucket_ = FreshBucket(*server_);
    store_ = Open(MotoOptions(*server_, bucket_));
  }

  std::unique_ptr<S3BlobStore> Open(const S3BlobStoreOptions& options) {
    StatusOr<std::unique_ptr<S3BlobStore>> store = S3BlobStore::Create(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  MotoServer* server_ = nullptr;
  std::string bucket_;
  std::unique_ptr<S3BlobStore> store_;
};

std::string Bytes(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    bytes[i] = static_cast<char>(x);
  }
  return bytes;
}

struct HttpResult {
  long status = 0;
  std::string body;
  std::string error;  // libcurl's, when the transfer failed
};

size_t AppendTo(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

struct BodyReader {
  std::string_view bytes;
  size_t offset = 0;
  size_t abort_after = std::string::npos;  // simulate a client dying mid-upload
};

size_t ReadBody(char* out, size_t size, size_t count, void* user) {
  auto* body = static_cast<BodyReader*>(user);
  if (body->offset >= body->abort_after) return CURL_READFUNC_ABORT;
  size_t n = std::min({size * count, body->bytes.size() - body->offset, body->abort_after - body->offset});
  std::memcpy(out, body->bytes.data() + body->offset, n);
  body->offset += n;
  return n;
}

// What a worker does with a presigned request: plain HTTP, no credentials.
HttpResult Send(const PresignedRequest& request, std::string_view body = "", size_t abort_after = std::string::npos) {
  CURL* curl = curl_easy_init();
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : request.headers) headers = curl_slist_append(headers, (name + ": " + value).c_str());
  headers = curl_slist_append(headers, "Expect:");
  HttpResult result;
  BodyReader reader{body, 0, abort_after};
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendTo);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body);
  if (request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &reader);
  }
  CURLcode code = curl_easy_perform(curl);
  if (code != CURLE_OK) result.error = curl_easy_strerror(code);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return result;
}

TEST_F(S3MotoTest, CreateOnlyPutIsEnforcedByTheServer) {
  ASSERT_TRUE(PutString(*store_, "jobs/1/global", "first").ok());
  StatusOr<BlobInfo> again = PutString(*store_, "jobs/1/global", "second");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  // The server refused it (412 PreconditionFailed from If-None-Match: *), not a check on our side.
  EXPECT_THAT(again.status().message(), HasSubstr("HTTP 412 PreconditionFailed"));
  EXPECT_EQ(GetString(*store_, "jobs/1/global"), "first");
}

TEST_F(S3MotoTest, MissingBucketIsNotFoundNamingIt) {
  std::unique_ptr<S3BlobStore> store = Open(MotoOptions(*server_, "no-such-bucket"));
  StatusOr<BlobInfo> put = PutString(*store, "k", "x");
  EXPECT_EQ(put.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(put.status().message(), HasSubstr("bucket 'no-such-bucket' does not exist"));
  EXPECT_THAT(put.status().message(), HasSubstr("NoSuchBucket"));
}

TEST_F(S3MotoTest, ListFollowsContinuationTokensAndStaysUnderThePrefix) {
  S3BlobStoreOptions options = MotoOptions(*server_, bucket_);
  options.list_page_size = 2;
  std::unique_ptr<S3BlobStore> paged = Open(options);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(PutString(*paged, "k/" + std::to_string(i), "v").ok());
  // Another store on the same bucket under another prefix is invisible.
  std::unique_ptr<S3BlobStore> other = Open(MotoOptions(*server_, bucket_, "other/"));
  ASSERT_TRUE(PutString(*other, "k/9", "v").ok());
  EXPECT_THAT(*paged->List("k/"), ElementsAre("k/0", "k/1", "k/2", "k/3", "k/4", "k/5", "k/6"));
  EXPECT_THAT(*other->List(""), ElementsAre("k/9"));
}

TEST_F(S3MotoTest, PresignedGetAndCreateOnlyPutWorkWithoutCredentials) {
  ASSERT_TRUE(PutString(*store_, "jobs/1/global", "global weights").ok());
  StatusOr<PresignedRequest> get = store_->PresignGet("jobs/1/global", 300s);
  ASSERT_TRUE(get.ok());
  HttpResult got = Send(*get);
  EXPECT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.body, "global weights");

  const std::string update = "update from worker 3";
  const std::string sha = Sha256Hex(std::string_view(update));
  StatusOr<PresignedRequest> put = store_->PresignPut("jobs/1/updates/w3", 300s, sha);
  ASSERT_TRUE(put.ok());
  HttpResult sent = Send(*put, update);
  EXPECT_EQ(sent.status, 200) << sent.body;
  StatusOr<BlobInfo> head = store_->Head("jobs/1/updates/w3");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size_bytes, update.size());
  EXPECT_EQ(head->sha256, sha);  // the declared hash, carried as signed metadata

  // The URL cannot overwrite: If-None-Match: * is part of the signed request.
  HttpResult twice = Send(*put, "something else");
  EXPECT_EQ(twice.status, 412) << twice.body;
  EXPECT_EQ(GetString(*store_, "jobs/1/updates/w3"), update);
}

TEST_F(S3MotoTest, HeadHashesObjectsWithoutShaMetadata) {
  StatusOr<PresignedRequest> put = store_->PresignPut("u/no-sha", 300s);  // no declared sha256
  ASSERT_TRUE(put.ok());
  ASSERT_EQ(Send(*put, "abc").status, 200);
  StatusOr<BlobInfo> head = store_->Head("u/no-sha");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size_bytes, 3u);
  EXPECT_EQ(head->sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(S3MotoTest, LargePutUsesMultipartAndLeavesNoUploadBehind) {
  S3BlobStoreOptions options = MotoOptions(*server_, bucket_);
  options.multipart_threshold_bytes = 5 << 20;
  options.part_size_bytes = 5 << 20;
  options.memory_spool_bytes = 1 << 20;  // exercise the temp-file spool too
  std::unique_ptr<S3BlobStore> store = Open(options);
  const std::string bytes = Bytes((11 << 20) + 123, 1);  // three parts, the last one short
  StatusOr<BlobInfo> put = PutString(*store, "big/update.bin", bytes);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->size_bytes, bytes.size());
  EXPECT_EQ(put->sha256, Sha256Hex(std::string_view(bytes)));
  StatusOr<BlobInfo> head = store->Head("big/update.bin");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size_bytes, bytes.size());
  EXPECT_EQ(head->sha256, put->sha256);
  EXPECT_TRUE(GetString(*store, "big/update.bin") == bytes);
  EXPECT_THAT(*store->ListIncompleteUploads(""), IsEmpty());

  // Create-only holds for multipart too (checked at CompleteMultipartUpload), and the refused upload is aborted.
  StatusOr<BlobInfo> again = PutString(*store, "big/update.bin", Bytes((6 << 20), 2));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  EXPECT_THAT(*store->ListIncompleteUploads(""), IsEmpty());
  EXPECT_EQ(store->Head("big/update.bin")->sha256, put->sha256);
}

TEST_F(S3MotoTest, InterruptedMultipartUploadIsRetriedPartByPartAndCompleted) {
  const uint64_t part = 5 << 20;
  const std::string bytes = Bytes(2 * part + 1000, 3);
  const std::string sha = Sha256Hex(std::string_view(bytes));
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w7", sha);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  auto part_bytes = [&](int number) { return std::string_view(bytes).substr((number - 1) * part, part); };
  auto presign = [&](int number) { return *store_->PresignUploadPart("jobs/1/updates/w7", *upload, number, 600s); };

  // The worker sends part 1, then dies half-way through part 2.
  ASSERT_EQ(Send(presign(1), part_bytes(1)).status, 200);
  HttpResult cut = Send(presign(2), part_bytes(2), part / 2);
  EXPECT_FALSE(cut.error.empty());
  // Not visible, and only part 1 arrived.
  EXPECT_EQ(store_->Head("jobs/1/updates/w7").status().code(), StatusCode::kNotFound);
  StatusOr<std::vector<UploadedPart>> parts = store_->ListUploadedParts("jobs/1/updates/w7", *upload);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].part_number, 1);
  EXPECT_EQ((*parts)[0].size_bytes, part);

  // It resumes with fresh URLs for the missing parts only.
  ASSERT_EQ(Send(presign(2), part_bytes(2)).status, 200);
  ASSERT_EQ(Send(presign(3), part_bytes(3)).status, 200);
  StatusOr<BlobInfo> done = store_->CompleteMultipartUpload("jobs/1/updates/w7", *upload);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->size_bytes, bytes.size());
  EXPECT_EQ(done->sha256, sha);
  // The coordinator's own check: hash what is actually stored.
  StatusOr<std::unique_ptr<ByteSource>> stored = store_->Get("jobs/1/updates/w7");
  ASSERT_TRUE(stored.ok());
  StatusOr<std::string> stored_bytes = ReadAll(**stored);
  ASSERT_TRUE(stored_bytes.ok());
  EXPECT_EQ(Sha256Hex(std::string_view(*stored_bytes)), sha);
  EXPECT_THAT(*store_->ListIncompleteUploads("jobs/"), IsEmpty());
}

TEST_F(S3MotoTest, CompletingAnUndeclaredUploadReadsNothingBackAndHeadHashesIt) {
  StatusOr<std::string> upload = store_->StartMultipartUpload("jobs/1/updates/w8");
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  const std::string bytes = Bytes(3000, 9);
  ASSERT_EQ(Send(*store_->PresignUploadPart("jobs/1/updates/w8", *upload, 1, 60s), bytes).status, 200);
  StatusOr<BlobInfo> done = store_->CompleteMultipartUpload("jobs/1/updates/w8", *upload);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->size_bytes, bytes.size());
  EXPECT_EQ(done->sha256, "");  // not declared, and not downloaded just to say it
  StatusOr<BlobInfo> head = store_->Head("jobs/1/updates/w8");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->sha256, Sha256Hex(std::string_view(bytes)));
  // No local file, without reading the object to find that out.
  EXPECT_EQ(store_->LocalPath("jobs/1/updates/w8").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->LocalPath("jobs/1/updates/none").status().code(), StatusCode::kNotFound);
}

TEST_F(S3MotoTest, IncompleteUploadsAreAbortedWhenTheRoundEnds) {
  StatusOr<std::string> a = store_->StartMultipartUpload("jobs/1/rounds/2/w1");
  StatusOr<std::string> b = store_->StartMultipartUpload("jobs/1/rounds/2/w2");
  StatusOr<std::string> other_round = store_->StartMultipartUpload("jobs/1/rounds/3/w1");
  ASSERT_TRUE(a.ok() && b.ok() && other_round.ok()) << a.status().ToString();
  ASSERT_EQ(Send(*store_->PresignUploadPart("jobs/1/rounds/2/w1", *a, 1, 60s), Bytes(1000, 4)).status, 200);

  StatusOr<std::vector<IncompleteUpload>> open = store_->ListIncompleteUploads("jobs/1/rounds/2/");
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_EQ(open->size(), 2u);
  StatusOr<int> aborted = store_->AbortIncompleteUploads("jobs/1/rounds/2/");
  ASSERT_TRUE(aborted.ok()) << aborted.status().ToString();
  EXPECT_EQ(*aborted, 2);
  EXPECT_THAT(*store_->ListIncompleteUploads("jobs/1/rounds/2/"), IsEmpty());
  EXPECT_EQ(store_->ListIncompleteUploads("jobs/1/rounds/3/")->size(), 1u);  // another round's is untouched

  // A late worker can no longer complete or add to an aborted upload.
  StatusOr<BlobInfo> late = store_->CompleteMultipartUpload("jobs/1/rounds/2/w1", *a);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound) << late.status().ToString();
  EXPECT_EQ(store_->AbortMultipartUpload("jobs/1/rounds/2/w2", *b).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Head("jobs/1/rounds/2/w1").status().code(), StatusCode::kNotFound);
}

TEST_F(S3MotoTest, GetStreamsLargeBlobsInBoundedChunks) {
  const std::string bytes = Bytes(6 << 20, 5);
  ASSERT_TRUE(PutString(*store_, "big", bytes).ok());
  StatusOr<std::unique_ptr<ByteSource>> source = store_->Get("big");
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  std::vector<std::byte> buffer(64 << 10);
  Sha256 hasher;
  uint64_t total = 0;
  while (true) {
    StatusOr<size_t> n = (*source)->Read(buffer);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (*n == 0) break;
    hasher.Update(std::span<const std::byte>(buffer.data(), *n));
    total += *n;
  }
  EXPECT_EQ(total, bytes.size());
  EXPECT_EQ(hasher.HexDigest(), Sha256Hex(std::string_view(bytes)));
}

TEST_F(S3MotoTest, OpenBlobStoreOpensS3UrisWithEnvironmentCredentials) {
  ::setenv("AWS_ACCESS_KEY_ID", "testing", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "testing", 1);
  StatusOr<std::unique_ptr<BlobStore>> store =
      OpenBlobStore("s3://" + bucket_ + "/via-uri?endpoint=" + server_->endpoint() + "&region=us-east-1");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE(PutString(**store, "a/b", "through the opener").ok());
  std::unique_ptr<S3BlobStore> direct = Open(MotoOptions(*server_, bucket_, "via-uri/"));
  EXPECT_EQ(GetString(*direct, "a/b"), "through the opener");
}

// The store goes away mid-way through a round: every call is Unavailable, naming the endpoint and what failed.
TEST(S3OutageTest, KilledServerGivesUnavailableWithAClearMessage) {
  if (!FindMotoServer()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(kMotoMissing);
  StatusOr<std::unique_ptr<MotoServer>> server = MotoServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::string bucket = FreshBucket(**server);
  S3BlobStoreOptions options = MotoOptions(**server, bucket);
  options.connect_timeout = 5s;
  auto store = S3BlobStore::Create(options);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(PutString(**store, "jobs/1/rounds/000001/global", "committed").ok());
  // A download in progress when the store dies: far larger than what socket buffers and the stream's 1 MiB window
  // can hold, so most of it is still on the server's side when it is killed.
  const std::string big = Bytes(32 << 20, 6);
  ASSERT_TRUE(PutString(**store, "jobs/1/rounds/000001/update", big).ok());
  StatusOr<std::unique_ptr<ByteSource>> in_flight = (*store)->Get("jobs/1/rounds/000001/update");
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().ToString();
  std::vector<std::byte> first(64 << 10);
  ASSERT_EQ(*(*in_flight)->Read(first), first.size());

  (*server)->Kill();

  const std::string endpoint = "S3 endpoint http://127.0.0.1:" + std::to_string((*server)->port());
  std::vector<Status> failures = {
      PutString(**store, "jobs/1/rounds/000002/global", "next").status(),
      (*store)->Get("jobs/1/rounds/000001/global").status(),
      (*store)->Head("jobs/1/rounds/000001/global").status(),
      (*store)->Delete("jobs/1/rounds/000001/global"),
      (*store)->List("jobs/").status(),
      (*store)->StartMultipartUpload("jobs/1/x").status(),
      (*store)->AbortIncompleteUploads("jobs/").status(),
  };
  for (const Status& s : failures) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(endpoint));
    EXPECT_THAT(s.message(), HasSubstr("Couldn't connect"));
  }
  EXPECT_THAT(failures[0].message(), HasSubstr("during PUT s3://" + bucket + "/store/jobs/1/rounds/000002/global"));
  // The interrupted download ends in an error, never in a silently short blob.
  StatusOr<std::string> rest = ReadAll(**in_flight);
  EXPECT_EQ(rest.status().code(), StatusCode::kUnavailable) << rest.status().ToString();
  EXPECT_THAT(rest.status().message(),
              HasSubstr(endpoint + " failed during GET s3://" + bucket + "/store/jobs/1/rounds/000001/update"));
  // Presigning is local and keeps working; the coordinator decides what to do with the round.
  EXPECT_TRUE((*store)->PresignGet("jobs/1/rounds/000001/global", 60s).ok());
}

}  // namespace
}  // namespace parsyn::storage
