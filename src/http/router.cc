// Router, Request and Response helpers: the parts of the server that do not touch sockets.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>

#include "base/json_nesting.h"
#include "base/strings.h"
#include "http/internal.h"
#include "http/server.h"
#include "http/status_codes.h"

namespace parsyn::http {

std::string_view MethodName(Method method) {
  switch (method) {
    case Method::kGet: return "GET";
    case Method::kHead: return "HEAD";
    case Method::kPost: return "POST";
    case Method::kPut: return "PUT";
    case Method::kDelete: return "DELETE";
    case Method::kPatch: return "PATCH";
    case Method::kOptions: return "OPTIONS";
  }
  return "?";
}

std::string_view Request::Header(std::string_view name) const {
  auto it = headers.find(ToLower(name));
  return it == headers.end() ? std::string_view() : std::string_view(it->second);
}

StatusOr<nlohmann::json> Request::JsonBody() const {
  PARSYN_RETURN_IF_ERROR(CheckJsonNesting(body, "request body"));
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1, column 2: ..."; keep the useful tail.
    std::string what = e.what();
    auto pos = what.find("] ");
    return InvalidArgumentError("request body is not valid JSON: " +
                                (pos == std::string::npos ? what : what.substr(pos + 2)));
  }
}

std::optional<std::string> Request::Cookie(std::string_view name) const {
  std::string_view rest = Header("cookie");
  while (!rest.empty()) {
    const size_t end = rest.find(';');
    std::string_view pair = Trim(rest.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    const size_t eq = pair.find('=');
    if (eq != std::string_view::npos && Trim(pair.substr(0, eq)) == name) return std::string(Trim(pair.substr(eq + 1)));
  }
  return std::nullopt;
}

std::string RequestIdFor(std::string_view sent) {
  const bool usable = !sent.empty() && sent.size() <= 64 && std::all_of(sent.begin(), sent.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-';
  });
  if (usable) return std::string(sent);
  // Unique enough to find a request in the logs; not a secret.
  thread_local std::mt19937_64 random{std::random_device{}()};
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(random()));
  return id;
}

// The one place the API's error body is built.
Response ErrorBody(int http_status, std::string_view code, std::string_view message) {
  nlohmann::json body = {{"error", {{"code", code}, {"message", message}}}};
  return Response::Json(http_status, body);
}

Response Response::Json(int status, const nlohmann::json& body) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  // `replace` keeps a handler's stray invalid UTF-8 from throwing here.
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

Response Response::Text(int status, std::string text, std::string content_type) {
  Response r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(text);
  return r;
}

Response Response::NoContent() {
  Response r;
  r.status = 204;
  return r;
}

Response Response::Error(const Status& status) {
  if (status.ok()) return ErrorBody(500, "internal", "Response::Error called with an OK status");
  return ErrorBody(HttpStatusFor(status.code()), StatusCodeSlug(status.code()), status.message());
}

Response MethodNotAllowed(std::string_view method, std::string_view path, const std::vector<Method>& allowed) {
  std::string allow;
  for (Method m : allowed) {
    if (!allow.empty()) allow += ", ";
    allow += MethodName(m);
  }
  return ErrorBody(405, "method_not_allowed",
                   std::string(method) + " is not allowed on " + std::string(path) + " (allowed: " + allow + ")")
      .WithHeader("Allow", allow);
}

Response Response::File(std::filesystem::path path, std::string content_type) {
  Response r;
  r.file = std::move(path);
  r.content_type = std::move(content_type);
  return r;
}

Response Response::Events(EventProducer producer) {
  Response r;
  r.content_type = "text/event-stream";
  r.event_producer = std::move(producer);
  return r;
}

Response& Response::WithHeader(std::string name, std::string value) {
  headers.emplace_back(std::move(name), std::move(value));
  return *this;
}

namespace {

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> out;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (true) {
    size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

bool IsParam(std::string_view segment) {
  return segment.size() >= 3 && segment.front() == '{' && segment.back() == '}';
}
bool IsRestParam(std::string_view segment) { return IsParam(segment) && segment.ends_with("...}"); }
std::string ParamName(std::string_view segment) {
  segment = segment.substr(1, segment.size() - 2);
  if (segment.ends_with("...")) segment.remove_suffix(3);
  return std::string(segment);
}

}  // namespace

Status Router::Add(Method method, std::string_view pattern, Handler handler, RouteOptions options) {
  if (pattern.empty() || pattern.front() != '/') {
    return InvalidArgumentError("route pattern '" + std::string(pattern) + "' must start with '/'");
  }
  Route route{method, {}, std::move(handler), options, 0, std::string(pattern)};
  std::vector<std::string_view> segments = SplitPath(pattern);
  for (size_t i = 0; i < segments.size(); ++i) {
    std::string_view s = segments[i];
    if (IsRestParam(s) && i + 1 != segments.size()) {
      return InvalidArgumentError("route pattern '" + std::string(pattern) + "': '{name...}' must be last");
    }
    if (IsParam(s) && ParamName(s).empty()) {
      return InvalidArgumentError("route pattern '" + std::string(pattern) + "' has an unnamed parameter");
    }
    if (!IsParam(s) && (s.find('{') != std::string_view::npos || s.find('}') != std::string_view::npos)) {
      return InvalidArgumentError("route pattern '" + std::string(pattern) + "': a parameter must fill its segment");
    }
    if (!IsParam(s)) ++route.literal_count;
    route.segments.emplace_back(s);
  }
  for (const Route& r : routes_) {
    if (r.method == method && r.segments == route.segments) {
      return AlreadyExistsError("route " + std::string(MethodName(method)) + " " + std::string(pattern) +
                                " is already registered");
    }
  }
  routes_.push_back(std::move(route));
  return Status::Ok();
}

StatusOr<Router::Match> Router::Find(Method method, std::string_view path) const {
  std::vector<std::string_view> raw = SplitPath(path);
  std::vector<std::string> decoded;
  decoded.reserve(raw.size());
  for (std::string_view s : raw) {
    PARSYN_ASSIGN_OR_RETURN(std::string d, PercentDecode(s, /*plus_is_space=*/false));
    decoded.push_back(std::move(d));
  }

  Match best;
  int best_literals = -1;
  for (const Route& route : routes_) {
    StringMap params;
    bool matched = true;
    size_t i = 0;
    for (; i < route.segments.size(); ++i) {
      const std::string& seg = route.segments[i];
      if (IsRestParam(seg)) {
        if (i >= decoded.size() || decoded[i].empty()) {
          matched = false;
          break;
        }
        // The rest of the path: decoded segments re-joined with '/'. Its owner validates it (blob keys).
        std::string rest;
        for (size_t j = i; j < decoded.size(); ++j) {
          if (j > i) rest += '/';
          rest += decoded[j];
        }
        params[ParamName(seg)] = std::move(rest);
        i = decoded.size();
        break;
      }
      if (i >= decoded.size()) {
        matched = false;
        break;
      }
      if (IsParam(seg)) {
        if (decoded[i].empty()) {
          matched = false;
          break;
        }
        params[ParamName(seg)] = decoded[i];
      } else if (seg != decoded[i]) {
        matched = false;
        break;
      }
    }
    if (!matched || i != decoded.size()) continue;
    if (route.method != method) {
      if (std::find(best.allowed.begin(), best.allowed.end(), route.method) == best.allowed.end()) {
        best.allowed.push_back(route.method);
      }
      continue;
    }
    if (route.literal_count > best_literals) {
      best_literals = route.literal_count;
      best.route = &route;
      best.params = std::move(params);
    }
  }
  if (best.route) best.allowed.clear();
  return best;
}

}  // namespace parsyn::http
