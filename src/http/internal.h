// Helpers shared by the server, client and signed-URL code; not part of the layer's public surface.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "http/server.h"

namespace parsyn::http {

// Decodes %XX escapes (and '+' as space when `plus_is_space`, as in query strings). InvalidArgument on a bad escape.
StatusOr<std::string> PercentDecode(std::string_view text, bool plus_is_space);
// "a=1&b=x%20y" -> {a: 1, b: "x y"}. InvalidArgument on a bad escape.
StatusOr<StringMap> ParseQuery(std::string_view query);

// {"error": {"code": code, "message": message}} with `http_status`: the one place the error body is built.
Response ErrorBody(int http_status, std::string_view code, std::string_view message);
Response MethodNotAllowed(std::string_view method, std::string_view path, const std::vector<Method>& allowed);

// Request::request_id for a request whose X-Request-Id header is `sent` ("" when absent): `sent` when it is 1 to 64
// of [A-Za-z0-9._:-], else 16 fresh hex digits.
std::string RequestIdFor(std::string_view sent);

}  // namespace parsyn::http
