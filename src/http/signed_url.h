// Signed URLs: a worker may GET or PUT one blob until an expiry, without any other credential.
//
// signature = HMAC-SHA256(secret, method "\n" blob_key "\n" expires_unix_s), base64url without padding. The query
// string carries `expires` and `signature`; the path carries the key. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn::http {

// Returns "expires=<expires_unix_s>&signature=<base64url>" for appending after '?'.
std::string SignUrl(std::string_view secret, std::string_view method, std::string_view blob_key,
                    int64_t expires_unix_s);

// Checks a request's `expires` and `signature` query values (compared in constant time). Errors:
// Unauthenticated when either is missing or malformed, or the signature does not match (also a different method or
// key); PermissionDenied "signed URL expired at <t> (now <now>)" once now_unix_s > expires.
Status VerifySignedUrl(std::string_view secret, std::string_view method, std::string_view blob_key,
                       std::string_view expires, std::string_view signature, int64_t now_unix_s);

}  // namespace parsyn::http
