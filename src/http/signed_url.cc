#include "http/signed_url.h"

#include <openssl/crypto.h>

#include <charconv>

#include "base/sha256.h"
#include "base/strings.h"

namespace parsyn::http {

namespace {

std::string Sign(std::string_view secret, std::string_view method, std::string_view blob_key, int64_t expires) {
  std::string message;
  message.append(method).append("\n").append(blob_key).append("\n").append(std::to_string(expires));
  const std::string mac = HmacSha256(secret, message);
  return Base64UrlEncode(mac);
}

}  // namespace

std::string SignUrl(std::string_view secret, std::string_view method, std::string_view blob_key,
                    int64_t expires_unix_s) {
  return "expires=" + std::to_string(expires_unix_s) + "&signature=" + Sign(secret, method, blob_key, expires_unix_s);
}

Status VerifySignedUrl(std::string_view secret, std::string_view method, std::string_view blob_key,
                       std::string_view expires, std::string_view signature, int64_t now_unix_s) {
  if (expires.empty() || signature.empty()) {
    return UnauthenticatedError("signed URL needs both 'expires' and 'signature' query parameters");
  }
  int64_t expires_unix_s = 0;
  auto [end, ec] = std::from_chars(expires.data(), expires.data() + expires.size(), expires_unix_s);
  if (ec != std::errc() || end != expires.data() + expires.size()) {
    return UnauthenticatedError("signed URL has a malformed 'expires' value");
  }
  std::string expected = Sign(secret, method, blob_key, expires_unix_s);
  // Constant time, so response timing does not reveal how much of a forged signature was right.
  if (signature.size() != expected.size() || CRYPTO_memcmp(signature.data(), expected.data(), expected.size()) != 0) {
    return UnauthenticatedError("signed URL signature does not match this method and blob");
  }
  // Checked after the signature, so an unsigned request learns nothing about expiry.
  if (now_unix_s > expires_unix_s) {
    return PermissionDeniedError("signed URL expired at " + std::to_string(expires_unix_s) + " (now " +
                                 std::to_string(now_unix_s) + "); ask for a new one");
  }
  return Status::Ok();
}

}  // namespace parsyn::http
