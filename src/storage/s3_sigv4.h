// AWS Signature Version 4 for S3: signed request headers and presigned URLs (query-string auth), computed with
// OpenSSL HMAC-SHA256. Byte-for-byte what botocore produces for the same inputs (checked by s3_sigv4_test.cc against
// boto3 and the AWS documentation's examples).
//
// S3 specifics followed here: the canonical URI is the key URI-encoded once (unreserved A-Z a-z 0-9 - _ . ~ kept,
// '/' kept, every other byte of the UTF-8 key as %XX), never normalised ("a/./b" stays); query names and values are
// encoded with the same set ('/' encoded too) and sorted; the payload hash is the body's sha256 hex or
// "UNSIGNED-PAYLOAD" (always UNSIGNED-PAYLOAD in presigned URLs).
// Pure functions of their arguments (the time is passed in): safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace parsyn::storage {

inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary (STS) credentials
};

// Where S3 requests go. `scheme` is "https" or "http"; `host` may carry a port ("127.0.0.1:9000").
// Path-style puts the bucket in the path (https://host/bucket/key, MinIO, moto); virtual-host style puts it in the
// host name (https://bucket.host/key, AWS's default).
struct S3Endpoint {
  std::string scheme = "https";
  std::string host;
  std::string region = "us-east-1";
  bool path_style = false;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One S3 operation before signing.
struct S3Request {
  std::string method;  // "GET", "PUT", "HEAD", "DELETE", "POST"
  std::string bucket;
  std::string key;  // raw bytes (UTF-8), not encoded; empty for bucket-level operations
  // Raw (unencoded) query parameters, in the order they appear in the URL (the signature sorts its own copy).
  // An empty value is written "name=" (S3 accepts "?uploads=" for "?uploads").
  std::vector<std::pair<std::string, std::string>> query;
  // Extra headers to send and sign (names in any case; values are trimmed and inner spaces squeezed for signing).
  HttpHeaders headers;
};

// The request as it goes on the wire.
struct SignedS3Request {
  std::string url;
  // Every header to send: `Host`, the request's own headers, X-Amz-Date, X-Amz-Content-SHA256, X-Amz-Security-Token
  // (with a session token) and Authorization.
  HttpHeaders headers;
};

// URI-encodes `bytes` the way S3 SigV4 wants: unreserved characters stay, '/' stays when `keep_slash`, everything
// else becomes %XX with uppercase hex.
std::string S3UriEncode(std::string_view bytes, bool keep_slash);

// "20130524T000000Z" for `time` in UTC.
std::string AmzTimestamp(std::chrono::system_clock::time_point time);

// The host and the encoded path of `bucket`/`key` at `endpoint` ("/bucket/k%20ey" or "/k%20ey").
struct S3Target {
  std::string host;
  std::string path;
};
S3Target ResolveS3Target(const S3Endpoint& endpoint, std::string_view bucket, std::string_view key);

// Signs `request` with header auth. `payload_sha256` is the body's sha256 in lowercase hex, or kUnsignedPayload.
SignedS3Request SignS3Request(const S3Endpoint& endpoint, const AwsCredentials& credentials, const S3Request& request,
                              std::string_view payload_sha256, std::chrono::system_clock::time_point now);

// A presigned URL for `request`, valid `expires` (1 s to 7 days) from `now`. Any request headers are signed
// (X-Amz-SignedHeaders lists them) and must be sent unchanged by whoever uses the URL.
std::string PresignS3Url(const S3Endpoint& endpoint, const AwsCredentials& credentials, const S3Request& request,
                         std::chrono::seconds expires, std::chrono::system_clock::time_point now);

// Lowercase hex of HMAC-SHA256 / SHA-256 (exposed for tests of the derivation steps).
std::string HmacSha256Hex(std::string_view key, std::string_view message);
std::string Sha256HexOf(std::string_view bytes);

}  // namespace parsyn::storage
