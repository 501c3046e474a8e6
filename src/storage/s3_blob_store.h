// S3BlobStore: blobs as objects in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, R2; moto_server in tests),
// spoken to over libcurl with SigV4 (s3_sigv4.h). `s3://` URIs (OpenS3BlobStore, also reached via OpenBlobStore).
//
// Layout: the blob for key "a/b" is the object "<prefix>a/b"; its sha256 is the object's user metadata
// `x-amz-meta-sha256`, set when it is put.
// Put: the stream is spooled first (in memory up to `memory_spool_bytes`, beyond that in an unlinked temp file in
//   `spool_dir`), hashing as it goes, because S3 needs the length and the metadata before the body. Nothing is sent
//   until the source has ended and passed `max_size_bytes`/`expected_sha256`, so a failed Put stores nothing. Then one
//   PUT (payload hash signed) or, above `multipart_threshold_bytes`, a multipart upload in `part_size_bytes` parts.
//   Create-only through `If-None-Match: *` on the PUT / CompleteMultipartUpload (412 -> AlreadyExists; S3's 409
//   ConditionalRequestConflict, a concurrent create of the same key, also -> AlreadyExists).
// Get streams the body: memory stays bounded (about 1 MiB per open stream) whatever the blob's size.
// Head reads the metadata; for an object without it (written by another tool) it hashes the object through Get.
// Delete is Head then DELETE (S3's DELETE succeeds for missing keys; the contract wants NotFound).
// Errors: S3's error code and message are kept in the Status message ("HTTP 403 AccessDenied: Access Denied").
//   404 -> NotFound, 412 -> AlreadyExists, 401/403 -> PermissionDenied, other 4xx -> InvalidArgument,
//   5xx and transport failures (refused, reset, timeout) -> Unavailable naming the endpoint.
// No retries here: callers (the coordinator) decide. Safe to call from several threads at once; a ByteSource from
// Get() is used by one thread at a time.
//
// Presigned URLs (for workers, who hold no credentials): PresignGet/PresignPut/PresignUploadPart return the URL, the
// method and the headers the holder must send as they are (they are signed). The coordinator checks size and sha256
// of what arrived (Head, or hashing through Get) before counting it: S3 does not check our metadata.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/blob_store.h"
#include "storage/blob_urls.h"
#include "storage/s3_sigv4.h"

namespace parsyn::storage {

// Reads an environment variable; injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnv();

// Credentials from AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else from the shared credentials
// file (AWS_SHARED_CREDENTIALS_FILE, default $HOME/.aws/credentials), profile `profile` if non-empty, else
// AWS_PROFILE, else "default". Unauthenticated saying where it looked if none are found; InvalidArgument if the file's
// profile lacks a key.
StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env, std::string_view profile = "");

struct S3BlobStoreOptions {
  std::string bucket;
  std::string prefix;  // "" or ending in '/': prepended to every key
  S3Endpoint endpoint;
  AwsCredentials credentials;
  uint64_t multipart_threshold_bytes = uint64_t{64} << 20;  // Puts larger than this use multipart
  uint64_t part_size_bytes = uint64_t{64} << 20;            // S3 wants >= 5 MiB except for the last part
  size_t memory_spool_bytes = size_t{8} << 20;
  std::filesystem::path spool_dir;  // empty: std::filesystem::temp_directory_path()
  int list_page_size = 1000;        // max-keys per ListObjectsV2 page (small in tests to exercise continuation)
  std::chrono::seconds connect_timeout{10};
  // A request that moves no bytes for this long fails with Unavailable (not applied while a Get stream is unread).
  std::chrono::seconds stall_timeout{60};
  // Wall clock for signing; tests fix it.
  std::function<std::chrono::system_clock::time_point()> now = [] { return std::chrono::system_clock::now(); };
};

// Parses "s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path_style=0|1&profile=P&multipart_threshold_mib=N&
// part_size_mib=N]" (see docs/s3.md) and loads
// credentials. Region: the URI's, else AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1. Endpoint: the URI's
// ("http://127.0.0.1:9000", scheme and host[:port] only), else https://s3.REGION.amazonaws.com. path_style defaults
// to 1 with an explicit endpoint, 0 for AWS. InvalidArgument naming the part of the URI that is wrong.
StatusOr<S3BlobStoreOptions> ParseS3BlobStoreUri(std::string_view uri, const EnvLookup& env);

// S3's bucket naming rules: 3 to 63 of a-z, 0-9, '-' and '.', starting and ending with a letter or digit.
// ParseS3BlobStoreUri and S3BlobStore::Create refuse other names.
bool IsValidS3BucketName(std::string_view bucket);

// What a holder of a presigned URL sends: exactly this method, URL and headers, before `expires_at`.
struct PresignedRequest {
  std::string method;
  std::string url;
  HttpHeaders headers;
  std::chrono::system_clock::time_point expires_at;
};

struct UploadedPart {
  int part_number = 0;
  uint64_t size_bytes = 0;
  std::string etag;
};

struct IncompleteUpload {
  std::string key;  // blob key (store prefix removed)
  std::string upload_id;
};

// Also its own BlobUrlIssuer (presigned GET and create-only PUT URLs) and MultipartUrlIssuer (presigned part URLs).
class S3BlobStore final : public BlobStore, public BlobUrlIssuer, public MultipartUrlIssuer {
 public:
  // Checks the options (bucket name, prefix, part sizes); does not contact the store.
  static StatusOr<std::unique_ptr<S3BlobStore>> Create(S3BlobStoreOptions options);
  ~S3BlobStore() override;

  StatusOr<BlobInfo> Put(std::string_view key, ByteSource& data, const PutOptions& options = {}) override;
  StatusOr<std::unique_ptr<ByteSource>> Get(std::string_view key) override;
  StatusOr<BlobInfo> Head(std::string_view key) override;
  // NotFound for a missing key, else FailedPrecondition: S3 blobs have no local file.
  StatusOr<std::filesystem::path> LocalPath(std::string_view key) override;
  Status Delete(std::string_view key) override;
  StatusOr<std::vector<std::string>> List(std::string_view prefix) override;

  // Presigned single-key URLs; `expires` from 1 s to 7 days (InvalidArgument otherwise). Presigning is local: it
  // neither contacts the store nor checks that the key exists.
  StatusOr<PresignedRequest> PresignGet(std::string_view key, std::chrono::seconds expires) const;
  // A create-only PUT: `If-None-Match: *` is signed and must be sent. With `sha256`, `x-amz-meta-sha256` is signed
  // too, so Head() reports the declared hash (the coordinator still verifies the bytes).
  StatusOr<PresignedRequest> PresignPut(std::string_view key, std::chrono::seconds expires,
                                        std::optional<std::string> sha256 = std::nullopt) const;

  // Multipart uploads driven by the coordinator, parts sent by a worker through presigned URLs.
  // Starts one for `key` (nothing is visible until Complete) and returns its upload id.
  StatusOr<std::string> StartMultipartUpload(std::string_view key, std::optional<std::string> sha256 = std::nullopt);
  // Part numbers 1..10000; re-uploading a part number replaces that part (so a failed part is simply retried).
  StatusOr<PresignedRequest> PresignUploadPart(std::string_view key, std::string_view upload_id, int part_number,
                                               std::chrono::seconds expires) const;
  // The parts received so far, by part number (what a resumed upload still has to send).
  StatusOr<std::vector<UploadedPart>> ListUploadedParts(std::string_view key, std::string_view upload_id);
  // Completes with every uploaded part, in order, create-only. AlreadyExists if `key` was taken meanwhile (the upload
  // is then aborted); NotFound for an unknown upload id; InvalidArgument (S3's InvalidPart/EntityTooSmall) if parts
  // are missing or too small. Returns the object's size, and its sha256 only when the upload declared one (else
  // empty: nothing is read back here; Head() or a read hashes the bytes).
  StatusOr<BlobInfo> CompleteMultipartUpload(std::string_view key, std::string_view upload_id);
  // Discards the upload's parts. NotFound for an unknown upload id.
  Status AbortMultipartUpload(std::string_view key, std::string_view upload_id);
  // Uploads started under `prefix` and neither completed nor aborted.
  StatusOr<std::vector<IncompleteUpload>> ListIncompleteUploads(std::string_view prefix);
  // Aborts all of them (e.g. when a round ends); returns how many.
  StatusOr<int> AbortIncompleteUploads(std::string_view prefix);

  const S3BlobStoreOptions& options() const { return options_; }

  // BlobUrlIssuer and MultipartUrlIssuer (blob_urls.h), on the calls above. PutGrant declares no sha256.
  BlobUrlIssuer* url_issuer() override { return this; }
  StatusOr<std::string> GetUrl(std::string_view key, std::chrono::seconds ttl) const override;
  StatusOr<UrlGrant> PutGrant(std::string_view key, std::chrono::seconds ttl) const override;
  std::chrono::seconds max_ttl() const override;
  bool transfers_bypass_coordinator() const override { return true; }
  MultipartUrlIssuer* multipart() override { return this; }
  uint64_t multipart_threshold_bytes() const override { return options_.multipart_threshold_bytes; }
  uint64_t part_size_bytes() const override { return options_.part_size_bytes; }
  StatusOr<std::string> StartUpload(std::string_view key) override { return StartMultipartUpload(key); }
  StatusOr<UrlGrant> PartGrant(std::string_view key, std::string_view upload_id, int part_number,
                               std::chrono::seconds ttl) const override;
  StatusOr<BlobInfo> CompleteUpload(std::string_view key, std::string_view upload_id) override {
    return CompleteMultipartUpload(key, upload_id);
  }
  StatusOr<int> AbortUploadsUnder(std::string_view prefix) override { return AbortIncompleteUploads(prefix); }

 private:
  class Http;
  explicit S3BlobStore(S3BlobStoreOptions options);
  StatusOr<PresignedRequest> Presign(S3Request request, std::chrono::seconds expires) const;
  // HEAD of the object: size and the sha256 metadata as stored (empty when it has none; never hashes).
  StatusOr<BlobInfo> HeadObject(std::string_view key);
  std::string ObjectKey(std::string_view key) const { return options_.prefix + std::string(key); }

  S3BlobStoreOptions options_;
  std::unique_ptr<Http> http_;
};

// OpenBlobStore's s3:// branch: ParseS3BlobStoreUri with the process environment, then Create.
StatusOr<std::unique_ptr<BlobStore>> OpenS3BlobStore(std::string_view uri);

}  // namespace parsyn::storage
