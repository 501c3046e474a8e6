#include "storage/s3_sigv4.h"

#include <algorithm>
#include <ctime>
#include <map>

#include "base/sha256.h"
#include "base/strings.h"

namespace parsyn::storage {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";

// SigV4's Trimall: no leading/trailing whitespace, runs of whitespace become one space.
std::string TrimAll(std::string_view value) {
  std::string out;
  bool pending_space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += c;
  }
  return out;
}

using QueryPairs = std::vector<std::pair<std::string, std::string>>;

std::string EncodeQuery(const QueryPairs& pairs) {
  std::string out;
  for (const auto& [name, value] : pairs) {
    if (!out.empty()) out += '&';
    out += S3UriEncode(name, false) + "=" + S3UriEncode(value, false);
  }
  return out;
}

std::string CanonicalQuery(const QueryPairs& pairs) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (const auto& [name, value] : pairs) encoded.emplace_back(S3UriEncode(name, false), S3UriEncode(value, false));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out += '&';
    out += name + "=" + value;
  }
  return out;
}

struct CanonicalHeaders {
  std::string block;         // "name:value\n" for each, sorted
  std::string signed_names;  // "host;x-amz-date"
};

CanonicalHeaders Canonicalize(const HttpHeaders& headers) {
  std::map<std::string, std::string> by_name;  // sorted by lowercase name; repeated names joined with ','
  for (const auto& [name, value] : headers) {
    std::string& joined = by_name[ToLower(TrimAll(name))];
    if (!joined.empty()) joined += ',';
    joined += TrimAll(value);
  }
  CanonicalHeaders out;
  for (const auto& [name, value] : by_name) {
    out.block += name + ":" + value + "\n";
    if (!out.signed_names.empty()) out.signed_names += ';';
    out.signed_names += name;
  }
  return out;
}

std::string Scope(std::string_view date, const S3Endpoint& endpoint) {
  return std::string(date) + "/" + endpoint.region + "/s3/aws4_request";
}

std::string Signature(const AwsCredentials& credentials, const S3Endpoint& endpoint, std::string_view timestamp,
                      std::string_view canonical_request) {
  std::string date(timestamp.substr(0, 8));
  std::string string_to_sign = std::string(kAlgorithm) + "\n" + std::string(timestamp) + "\n" + Scope(date, endpoint) +
                               "\n" + Sha256HexOf(canonical_request);
  std::string key = HmacSha256("AWS4" + credentials.secret_access_key, date);
  key = HmacSha256(key, endpoint.region);
  key = HmacSha256(key, "s3");
  key = HmacSha256(key, "aws4_request");
  return HmacSha256Hex(key, string_to_sign);
}

}  // namespace

std::string S3UriEncode(std::string_view bytes, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(bytes.size());
  for (char ch : bytes) {
    unsigned char c = static_cast<unsigned char>(ch);
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += kDigits[c >> 4];
      out += kDigits[c & 0xf];
    }
  }
  return out;
}

std::string AmzTimestamp(std::chrono::system_clock::time_point time) {
  std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &utc);
  return buf;
}

S3Target ResolveS3Target(const S3Endpoint& endpoint, std::string_view bucket, std::string_view key) {
  S3Target target;
  std::string encoded_key = S3UriEncode(key, true);
  if (endpoint.path_style) {
    target.host = endpoint.host;
    target.path = "/" + std::string(bucket);
    if (!key.empty()) target.path += "/" + encoded_key;
  } else {
    target.host = std::string(bucket) + "." + endpoint.host;
    target.path = "/" + encoded_key;
  }
  return target;
}

SignedS3Request SignS3Request(const S3Endpoint& endpoint, const AwsCredentials& credentials, const S3Request& request,
                              std::string_view payload_sha256, std::chrono::system_clock::time_point now) {
  S3Target target = ResolveS3Target(endpoint, request.bucket, request.key);
  std::string timestamp = AmzTimestamp(now);

  SignedS3Request signed_request;
  signed_request.url = endpoint.scheme + "://" + target.host + target.path;
  if (!request.query.empty()) signed_request.url += "?" + EncodeQuery(request.query);

  HttpHeaders& headers = signed_request.headers;
  headers.emplace_back("Host", target.host);
  for (const auto& header : request.headers) headers.push_back(header);
  headers.emplace_back("X-Amz-Date", timestamp);
  headers.emplace_back("X-Amz-Content-SHA256", std::string(payload_sha256));
  if (!credentials.session_token.empty()) headers.emplace_back("X-Amz-Security-Token", credentials.session_token);

  CanonicalHeaders canonical = Canonicalize(headers);
  std::string canonical_request = request.method + "\n" + target.path + "\n" + CanonicalQuery(request.query) + "\n" +
                                  canonical.block + "\n" + canonical.signed_names + "\n" + std::string(payload_sha256);
  std::string signature = Signature(credentials, endpoint, timestamp, canonical_request);
  headers.emplace_back("Authorization", std::string(kAlgorithm) + " Credential=" + credentials.access_key_id + "/" +
                                            Scope(timestamp.substr(0, 8), endpoint) +
                                            ", SignedHeaders=" + canonical.signed_names + ", Signature=" + signature);
  return signed_request;
}

std::string PresignS3Url(const S3Endpoint& endpoint, const AwsCredentials& credentials, const S3Request& request,
                         std::chrono::seconds expires, std::chrono::system_clock::time_point now) {
  S3Target target = ResolveS3Target(endpoint, request.bucket, request.key);
  std::string timestamp = AmzTimestamp(now);

  HttpHeaders headers;
  headers.emplace_back("Host", target.host);
  for (const auto& header : request.headers) headers.push_back(header);
  CanonicalHeaders canonical = Canonicalize(headers);

  QueryPairs auth = {
      {"X-Amz-Algorithm", std::string(kAlgorithm)},
      {"X-Amz-Credential", credentials.access_key_id + "/" + Scope(timestamp.substr(0, 8), endpoint)},
      {"X-Amz-Date", timestamp},
      {"X-Amz-Expires", std::to_string(expires.count())},
      {"X-Amz-SignedHeaders", canonical.signed_names},
  };
  if (!credentials.session_token.empty()) auth.emplace_back("X-Amz-Security-Token", credentials.session_token);
  QueryPairs all = request.query;
  all.insert(all.end(), auth.begin(), auth.end());

  std::string canonical_request = request.method + "\n" + target.path + "\n" + CanonicalQuery(all) + "\n" +
                                  canonical.block + "\n" + canonical.signed_names + "\n" +
                                  std::string(kUnsignedPayload);
  std::string signature = Signature(credentials, endpoint, timestamp, canonical_request);
  return endpoint.scheme + "://" + target.host + target.path + "?" + EncodeQuery(all) + "&X-Amz-Signature=" + signature;
}

std::string HmacSha256Hex(std::string_view key, std::string_view message) {
  return HexEncode(HmacSha256(key, message));
}

std::string Sha256HexOf(std::string_view bytes) { return Sha256Hex(bytes); }

}  // namespace parsyn::storage
