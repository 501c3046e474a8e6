// SigV4 signing and presigning, checked against references no one here wrote: the AWS documentation's published
// examples, and boto3/botocore (run as tests/s3/sigv4_reference.py) over a table of cases.
#include "storage/s3_sigv4.h"
#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>

#include "storage/s3_moto_for_test.h"
#include "storage/temp_dir_for_test.h"

namespace parsyn::storage {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::chrono::system_clock::time_point ParseAmzTime(const std::string& text) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y%m%dT%H%M%SZ");
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

// From "Signature Calculations for the Authorization Header" (AWS S3 API reference, sig-v4-header-based-auth).
TEST(S3SigV4Test, AwsDocumentationGetObjectExample) {
  S3Endpoint endpoint{.scheme = "https", .host = "s3.amazonaws.com", .region = "us-east-1", .path_style = false};
  AwsCredentials credentials{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  S3Request request{
      .method = "GET", .bucket = "examplebucket", .key = "test.txt", .query = {}, .headers = {{"Range", "bytes=0-9"}}};
  SignedS3Request signed_request =
      SignS3Request(endpoint, credentials, request, Sha256HexOf(""), ParseAmzTime("20130524T000000Z"));
  EXPECT_EQ(signed_request.url, "https://examplebucket.s3.amazonaws.com/test.txt");
  std::map<std::string, std::string> headers(signed_request.headers.begin(), signed_request.headers.end());
  EXPECT_EQ(headers["Authorization"],
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(headers["X-Amz-Date"], "20130524T000000Z");
  EXPECT_EQ(headers["Host"], "examplebucket.s3.amazonaws.com");
}

// From "Authenticating Requests: Using Query Parameters" (sigv4-query-string-auth).
TEST(S3SigV4Test, AwsDocumentationPresignedUrlExample) {
  S3Endpoint endpoint{.scheme = "https", .host = "s3.amazonaws.com", .region = "us-east-1", .path_style = false};
  AwsCredentials credentials{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
  S3Request request{.method = "GET", .bucket = "examplebucket", .key = "test.txt", .query = {}, .headers = {}};
  EXPECT_EQ(PresignS3Url(endpoint, credentials, request, 86400s, ParseAmzTime("20130524T000000Z")),
            "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
            "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}

TEST(S3SigV4Test, UriEncodingKeepsUnreservedAndOptionallySlash) {
  EXPECT_EQ(S3UriEncode("a-b_c.d~e/f g+h=i", true), "a-b_c.d~e/f%20g%2Bh%3Di");
  EXPECT_EQ(S3UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(S3UriEncode("caf\xc3\xa9 \xe2\x82\xac", true), "caf%C3%A9%20%E2%82%AC");
  EXPECT_EQ(S3UriEncode("a/./b", true), "a/./b");  // S3 paths are never normalised
}

// One row of the cross-check table: what both boto3 and our code are asked to sign.
struct SigCase {
  std::string id;
  std::string kind;  // "request" or "presign"
  std::string method;
  std::string bucket;
  std::string key;
  std::string endpoint_url;  // "https://s3.eu-west-1.amazonaws.com"
  std::string region;
  bool path_style = false;
  std::string token;
  std::string time = "20240229T235959Z";
  int expires = 900;
  HttpHeaders headers;
  std::string body;
  bool unsigned_payload = false;
  std::string upload_id;
  int part_number = 0;
};

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string ToJson(const std::vector<SigCase>& cases) {
  std::string out = "[";
  for (const SigCase& c : cases) {
    if (out.size() > 1) out += ",\n";
    out += "{\"id\":" + JsonString(c.id) + ",\"kind\":" + JsonString(c.kind) + ",\"method\":" + JsonString(c.method) +
           ",\"bucket\":" + JsonString(c.bucket) + ",\"key\":" + JsonString(c.key) +
           ",\"endpoint\":" + JsonString(c.endpoint_url) + ",\"region\":" + JsonString(c.region) +
           ",\"addressing\":" + JsonString(c.path_style ? "path" : "virtual") +
           ",\"access_key\":\"AKIDEXAMPLE\",\"secret_key\":\"wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\"" +
           ",\"token\":" + JsonString(c.token) + ",\"time\":" + JsonString(c.time) +
           ",\"expires\":" + std::to_string(c.expires) + ",\"body\":" + JsonString(c.body) +
           ",\"unsigned_payload\":" + (c.unsigned_payload ? "true" : "false") +
           ",\"upload_id\":" + JsonString(c.upload_id) + ",\"part_number\":" + std::to_string(c.part_number) +
           ",\"headers\":[";
    for (size_t i = 0; i < c.headers.size(); ++i) {
      out += (i ? "," : "") + std::string("[") + JsonString(c.headers[i].first) + "," +
             JsonString(c.headers[i].second) + "]";
    }
    out += "]}";
  }
  return out + "]";
}

// What the reference printed for one case.
struct Reference {
  std::string url;
  std::map<std::string, std::string> headers;  // lowercase names
};

std::map<std::string, Reference> ParseReference(const std::string& text) {
  std::map<std::string, Reference> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    size_t start = 0;
    for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1) {
      fields.push_back(line.substr(start, tab - start));
    }
    fields.push_back(line.substr(start));
    if (fields.size() == 3 && fields[1] == "URL") out[fields[0]].url = fields[2];
    if (fields.size() == 4 && fields[1] == "HEADER") out[fields[0]].headers[fields[2]] = fields[3];
  }
  return out;
}

S3Endpoint EndpointOf(const SigCase& c) {
  S3Endpoint endpoint;
  size_t sep = c.endpoint_url.find("://");
  endpoint.scheme = c.endpoint_url.substr(0, sep);
  endpoint.host = c.endpoint_url.substr(sep + 3);
  endpoint.region = c.region;
  endpoint.path_style = c.path_style;
  return endpoint;
}

S3Request RequestOf(const SigCase& c) {
  S3Request request{.method = c.method, .bucket = c.bucket, .key = c.key, .query = {}, .headers = c.headers};
  if (!c.upload_id.empty()) {
    // The order botocore serialises UploadPart's query in (it matters for the presigned URL's bytes only).
    request.query = {{"uploadId", c.upload_id}, {"partNumber", std::to_string(c.part_number)}};
  }
  return request;
}

std::vector<SigCase> CrossCheckCases() {
  const std::string aws_eu = "https://s3.eu-west-1.amazonaws.com";
  const std::string local = "http://127.0.0.1:9000";
  const std::string unicode_key = "datasets/my folder/na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xe2\x82\xac+=&?%.txt";
  const HttpHeaders create_only = {{"If-None-Match", "*"}, {"x-amz-meta-sha256", "ba7816bf8f01cfea"}};
  std::vector<SigCase> cases;
  auto add = [&](SigCase c) { cases.push_back(std::move(c)); };
  // Header-signed requests.
  add({.id = "get-virtual",
       .kind = "request",
       .method = "GET",
       .bucket = "parsyn-blobs",
       .key = "jobs/1/global",
       .endpoint_url = aws_eu,
       .region = "eu-west-1"});
  add({.id = "get-path-local",
       .kind = "request",
       .method = "GET",
       .bucket = "parsyn",
       .key = "jobs/1/global",
       .endpoint_url = local,
       .region = "us-east-1",
       .path_style = true});
  add({.id = "head-unicode-key",
       .kind = "request",
       .method = "HEAD",
       .bucket = "parsyn",
       .key = unicode_key,
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .path_style = true});
  add({.id = "delete-virtual-token",
       .kind = "request",
       .method = "DELETE",
       .bucket = "parsyn",
       .key = "a b/c",
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .token = "FwoGZXIvYXdzEXAMPLE//token+with/chars="});
  add({.id = "put-signed-payload",
       .kind = "request",
       .method = "PUT",
       .bucket = "parsyn",
       .key = "u/1.bin",
       .endpoint_url = local,
       .region = "us-east-1",
       .path_style = true,
       .headers = create_only,
       .body = "hello, world"});
  add({.id = "put-unsigned-payload",
       .kind = "request",
       .method = "PUT",
       .bucket = "parsyn-blobs",
       .key = unicode_key,
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .token = "session-token",
       .headers = create_only,
       .body = "abc",
       .unsigned_payload = true});
  add({.id = "get-range-spaces-in-header",
       .kind = "request",
       .method = "GET",
       .bucket = "parsyn",
       .key = "k",
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .headers = {{"Range", "  bytes=0-9  "}}});
  add({.id = "upload-part",
       .kind = "request",
       .method = "PUT",
       .bucket = "parsyn",
       .key = "big/update.bin",
       .endpoint_url = local,
       .region = "us-east-1",
       .path_style = true,
       .body = "part bytes",
       .upload_id = "2~iCw_lDSFy2F4nW4Ew+QR/ps=",
       .part_number = 7});
  // Presigned URLs.
  add({.id = "presign-get-virtual",
       .kind = "presign",
       .method = "GET",
       .bucket = "parsyn-blobs",
       .key = "jobs/1/rounds/000003/global.safetensors",
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .expires = 3600});
  add({.id = "presign-get-path-unicode",
       .kind = "presign",
       .method = "GET",
       .bucket = "parsyn",
       .key = unicode_key,
       .endpoint_url = local,
       .region = "us-east-1",
       .path_style = true,
       .expires = 604800});
  add({.id = "presign-put-token",
       .kind = "presign",
       .method = "PUT",
       .bucket = "parsyn",
       .key = "u/w 1.bin",
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .token = "FwoGZXIvYXdzEXAMPLE//token+with/chars=",
       .time = "20251231T235959Z",
       .expires = 60});
  add({.id = "presign-put-create-only",
       .kind = "presign",
       .method = "PUT",
       .bucket = "parsyn",
       .key = "u/2.bin",
       .endpoint_url = local,
       .region = "us-east-1",
       .path_style = true,
       .headers = create_only});
  add({.id = "presign-upload-part",
       .kind = "presign",
       .method = "PUT",
       .bucket = "parsyn-blobs",
       .key = "big/update 1.bin",
       .endpoint_url = aws_eu,
       .region = "eu-west-1",
       .token = "tok",
       .expires = 7200,
       .upload_id = "2~iCw_lDSFy2F4nW4Ew+QR/ps=",
       .part_number = 10000});
  return cases;
}

TEST(S3SigV4Test, MatchesBoto3ByteForByte) {
  std::optional<std::filesystem::path> python = FindS3ReferencePython();
  if (!python) PARSYN_SKIP_FOR_MISSING_DEPENDENCY("moto_server (and the Python with boto3 beside it) is not installed");
  std::vector<SigCase> cases = CrossCheckCases();
  TempDirForTest dir;
  std::filesystem::path cases_file = dir.path() / "cases.json";
  std::ofstream(cases_file) << ToJson(cases);
  StatusOr<std::string> output =
      RunAndCapture({python->string(), test_support::SourcePath("tests/s3/sigv4_reference.py"), cases_file.string()});
  ASSERT_TRUE(output.ok()) << output.status().ToString();
  std::map<std::string, Reference> references = ParseReference(*output);
  ASSERT_EQ(references.size(), cases.size()) << *output;

  AwsCredentials credentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  for (const SigCase& c : cases) {
    SCOPED_TRACE(c.id);
    const Reference& ref = references[c.id];
    credentials.session_token = c.token;
    auto now = ParseAmzTime(c.time);
    if (c.kind == "presign") {
      EXPECT_EQ(PresignS3Url(EndpointOf(c), credentials, RequestOf(c), std::chrono::seconds(c.expires), now), ref.url);
      continue;
    }
    std::string payload = c.unsigned_payload ? std::string(kUnsignedPayload) : Sha256HexOf(c.body);
    SignedS3Request ours = SignS3Request(EndpointOf(c), credentials, RequestOf(c), payload, now);
    EXPECT_EQ(ours.url, ref.url);
    std::map<std::string, std::string> our_headers;
    for (const auto& [name, value] : ours.headers) {
      std::string lower = name;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      our_headers[lower] = value;
    }
    for (std::string_view name : {"authorization", "x-amz-date", "x-amz-content-sha256", "x-amz-security-token"}) {
      auto theirs = ref.headers.find(std::string(name));
      if (theirs == ref.headers.end()) {
        EXPECT_EQ(our_headers.count(std::string(name)), 0u) << name;
      } else {
        EXPECT_EQ(our_headers[std::string(name)], theirs->second) << name;
      }
    }
    ASSERT_THAT(ref.headers.at("authorization"), HasSubstr("Signature="));
  }
}

}  // namespace
}  // namespace parsyn::storage
