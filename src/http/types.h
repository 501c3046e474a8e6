// Small vocabulary types shared by the server and the client.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

namespace parsyn::http {

enum class Method { kGet, kHead, kPost, kPut, kDelete, kPatch, kOptions };
std::string_view MethodName(Method method);  // "GET", ...
// Escapes everything but RFC 3986 unreserved characters ('/' too unless `keep_slash`): a query value, a path segment.
std::string PercentEncode(std::string_view text, bool keep_slash = false);
// "a=1&b=x%20y": `fields` as a query string or an application/x-www-form-urlencoded body, each value PercentEncoded.
std::string FormEncode(std::initializer_list<std::pair<std::string_view, std::string_view>> fields);

// Ordered string map that can be looked up with a string_view.
using StringMap = std::map<std::string, std::string, std::less<>>;

}  // namespace parsyn::http
