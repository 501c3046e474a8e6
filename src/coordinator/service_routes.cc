#include "coordinator/service_routes.h"

#include <charconv>

#include "base/log.h"
#include "base/strings.h"
#include "coordinator/auth.h"
#include "coordinator/body_stream.h"
#include "coordinator/project_access.h"
#include "coordinator/service.h"
#include "http/status_codes.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;

namespace {

// A server-side failure (5xx) answered to a worker or a bootstrapping pod, neither of which is trusted: its message
// without the server's file paths ("disk full: /var/lib/parsyn/metadata.db (...)" reads "disk full: metadata.db
// (...)"); the server's log keeps it whole.
Response WithoutServerPaths(Response response, std::string_view pattern) {
  if (response.status < 500 || response.body.empty()) return response;
  std::string scrubbed = WithoutLocalPaths(response.body);
  if (scrubbed != response.body) {
    PARSYN_LOG_WARN("{} answered {}: {}", pattern, response.status, response.body);
    response.body = std::move(scrubbed);
  }
  return response;
}

}  // namespace

namespace {

bool ChangesState(Method method) {
  return method == Method::kPost || method == Method::kPut || method == Method::kPatch || method == Method::kDelete;
}

// Worker liveness and telemetry: they change no stored object and come every few seconds from every worker.
bool IsTelemetry(std::string_view route) {
  return route == "/api/v1/worker/heartbeat" || route == "/api/v1/worker/progress";
}

// Whether a request's answer goes into the audit log; a sign-in route's always does (a GET may start a session).
bool Audited(const Request& req, int status, bool sign_in) {
  return sign_in || status == 401 || status == 403 || (ChangesState(req.method) && !IsTelemetry(req.route));
}

constexpr std::string_view kSignInAccess = "ID token";

AuditEntry EntryOf(const Request& req, int status, std::string detail) {
  return AuditEntry{.actor = req.principal.empty() ? "anonymous" : req.principal,
                    .action = std::string(http::MethodName(req.method)) + " " + req.route,
                    .object = req.path,
                    .outcome = AuditOutcome(status),
                    .status = status,
                    .detail = std::move(detail),
                    .source = req.remote_address,
                    .request_id = req.request_id,
                    .project = req.scope,
                    .project_id = req.scope_id};
}

}  // namespace

AuditEntry AuditEntryFor(const Request& req, const Response& answer) {
  std::string detail;
  if (answer.status >= 400) {
    const json body = json::parse(answer.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_object() && body.contains("error") && body["error"].is_object()) {
      detail = body["error"].value("message", "");
    }
  }
  AuditEntry entry = EntryOf(req, answer.status, std::move(detail));
  for (const auto& [name, value] : answer.headers) {
    if (name == "Location") entry.object = value;  // the resource created
  }
  return entry;
}

AuditEntry AuditEntryFor(const Request& req, const Status& refusal) {
  return EntryOf(req, http::HttpStatusFor(refusal.code()), refusal.message());
}

template <typename Check>
http::Authorizer RouteTable::Authorizer(Check check) const {
  return [leader = check_leader_, check = std::move(check), audit = &audit_](const Request& req) -> Status {
    if (leader) PARSYN_RETURN_IF_ERROR(leader());
    Status allowed = check(req);
    if (!allowed.ok()) audit->Post(AuditEntryFor(req, allowed));
    return allowed;
  };
}

Status RouteTable::Open(Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options) {
  return Add(method, pattern, std::move(handler), std::move(options), "open");
}

Status RouteTable::SignedUrl(Method method, std::string_view pattern, http::Handler handler,
                             http::RouteOptions options) {
  return Add(method, pattern, std::move(handler), std::move(options), "signed URL");
}

Status RouteTable::SignIn(Method method, std::string_view pattern, http::Handler handler) {
  return Add(method, pattern, std::move(handler), {}, std::string(kSignInAccess));
}

Status RouteTable::Add(Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options,
                       std::string access) {
  if (!options.stream_body && options.max_body_bytes == 0) options.max_body_bytes = max_json_bytes_;
  const bool sign_in = access == kSignInAccess;
  http::Handler audited = [audit = &audit_, sign_in,
                           handler = std::move(handler)](Request& req) -> Awaitable<Response> {
    Response answer = co_await handler(req);
    if (Audited(req, answer.status, sign_in)) {
      auto append = audit->Append(AuditEntryFor(req, answer));  // kCoAwaitTemporaries
      co_await std::move(append);
    }
    co_return answer;
  };
  PARSYN_RETURN_IF_ERROR(router_.Add(method, pattern, std::move(audited), options));
  table_.push_back({method, std::string(pattern), std::move(access)});
  return Status::Ok();
}

namespace {

// The leader check's error, else the caller `check` finds (named in req.principal, for logs and the audit log).
StatusOr<Caller> LeaderAndCaller(const RouteTable::LeaderCheck& leader, const RouteTable::UserCheck& check,
                                 Request& req) {
  if (leader) PARSYN_RETURN_IF_ERROR(leader());
  PARSYN_ASSIGN_OR_RETURN(Caller caller, check(req));
  req.principal = caller.name;
  return caller;
}

// A platform_admin's, or PermissionDenied naming the route and the role.
StatusOr<Caller> RequirePlatformAdmin(StatusOr<Caller> caller, const Request& req) {
  if (caller.ok() && !caller->platform_admin) {
    return PermissionDeniedError(std::string(http::MethodName(req.method)) + " " + req.route +
                                 " needs the platform_admin role, which user " + caller->name +
                                 " does not have: ask a platform admin");
  }
  return caller;
}

}  // namespace

Status RouteTable::Admin(Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options) {
  return Admin(method, pattern,
               UserHandler([handler = std::move(handler)](Request& req, const Caller&) { return handler(req); }),
               std::move(options));
}

Status RouteTable::Admin(Method method, std::string_view pattern, UserHandler handler, http::RouteOptions options) {
  options.authorize =
      Authorizer([check = check_user_](const Request& req) { return RequirePlatformAdmin(check(req), req).status(); });
  return Add(
      method, pattern,
      [leader = check_leader_, check = check_user_, handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        if (leader) {
          if (Status s = leader(); !s.ok()) co_return Response::Error(s);
        }
        StatusOr<Caller> caller = RequirePlatformAdmin(check(req), req);
        if (!caller.ok()) co_return Response::Error(caller.status());
        req.principal = caller->name;
        co_return co_await handler(req, *caller);
      },
      options, "platform_admin");
}

Status RouteTable::User(Method method, std::string_view pattern, UserHandler handler, http::RouteOptions options) {
  options.authorize = Authorizer([check = check_user_](const Request& req) { return check(req).status(); });
  return Add(
      method, pattern,
      [leader = check_leader_, check = check_user_, handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        StatusOr<Caller> caller = LeaderAndCaller(leader, check, req);
        if (!caller.ok()) co_return Response::Error(caller.status());
        co_return co_await handler(req, *caller);
      },
      options, "any user");
}

Status RouteTable::InProject(Method method, std::string_view pattern, UserHandler handler, storage::ProjectRole needed,
                             http::RouteOptions options) {
  return InScope(
      method, pattern, std::move(handler),
      [needed](const Request& req, const Caller& caller, const UserKeys& directory) {
        return RequestProject(req, caller, directory, needed);
      },
      std::string(storage::ToString(needed)), std::move(options));
}

namespace {

// The platform_admin's whole view, or the project ?project= names where the caller is an owner (nullptr: none named).
StatusOr<const storage::Project*> AdminOrOwnerOfNamed(const Request& req, const Caller& caller,
                                                      const UserKeys& directory) {
  const auto named = req.query.find(std::string(kProjectParam));
  if (named == req.query.end()) {
    PARSYN_RETURN_IF_ERROR(RequirePlatformAdmin(caller, req).status());
    return nullptr;
  }
  return NamedProject(req, named->second, caller, directory, storage::ProjectRole::kOwner);
}

}  // namespace

Status RouteTable::AdminOrProjectOwner(Method method, std::string_view pattern, UserHandler handler,
                                       http::RouteOptions options) {
  return InScope(method, pattern, std::move(handler), AdminOrOwnerOfNamed,
                 "platform_admin, or owner of ?project=", std::move(options));
}

Status RouteTable::InScope(Method method, std::string_view pattern, UserHandler handler, ScopeCheck scope,
                           std::string access, http::RouteOptions options) {
  options.authorize = Authorizer([check = check_user_, directory = &directory_, scope](const Request& req) {
    StatusOr<Caller> caller = check(req);
    if (!caller.ok()) return caller.status();
    return scope(req, *caller, *directory).status();
  });
  return Add(
      method, pattern,
      [leader = check_leader_, check = check_user_, directory = &directory_, scope,
       handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        StatusOr<Caller> caller = LeaderAndCaller(leader, check, req);
        if (!caller.ok()) co_return Response::Error(caller.status());
        StatusOr<const storage::Project*> project = scope(req, *caller, *directory);
        if (!project.ok()) co_return Response::Error(project.status());
        if (*project != nullptr) {
          req.scope_id = (*project)->id;
          req.scope = (*project)->name;
        }
        co_return co_await handler(req, *caller);
      },
      options, std::move(access));
}

Status RouteTable::OnProjectObject(Method method, std::string_view pattern, UserHandler handler,
                                   storage::ProjectRole needed, ObjectProject owner, http::RouteOptions options) {
  options.authorize = Authorizer([check = check_user_](const Request& req) { return check(req).status(); });
  return Add(
      method, pattern,
      [leader = check_leader_, check = check_user_, directory = &directory_, needed, owner = std::move(owner),
       handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        StatusOr<Caller> caller = LeaderAndCaller(leader, check, req);
        if (!caller.ok()) co_return Response::Error(caller.status());
        auto read_owner = owner(req);  // kCoAwaitTemporaries
        StatusOr<ObjectOwner> found = co_await std::move(read_owner);
        if (!found.ok()) co_return Response::Error(found.status());
        // The project's audit records show what was asked of its objects, refusals included.
        req.scope_id = found->project_id;
        if (const storage::Project* p = directory->FindProject(found->project_id)) req.scope = p->name;
        Status allowed = CheckObjectRole(req, *caller, found->project_id, found->object, needed, *directory);
        if (!allowed.ok()) co_return Response::Error(allowed);
        co_return co_await handler(req, *caller);
      },
      options, std::string(storage::ToString(needed)));
}

Status RouteTable::OwnKey(Method method, std::string_view pattern, http::Handler handler, KeyCheck check,
                          http::RouteOptions options) {
  options.authorize = Authorizer(check);
  return Add(
      method, pattern,
      [leader = check_leader_, check, handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        if (leader) {
          if (Status s = leader(); !s.ok()) co_return Response::Error(s);
        }
        if (Status auth = check(req); !auth.ok()) co_return Response::Error(auth);
        Response answer = co_await handler(req);
        co_return WithoutServerPaths(std::move(answer), req.route);
      },
      options, "worker bootstrap key");
}

Status RouteTable::Worker(Method method, std::string_view pattern, WorkerHandler handler, http::RouteOptions options) {
  options.authorize = Authorizer([check = check_worker_](const Request& req) { return check(req).status(); });
  return Add(
      method, pattern,
      [leader = check_leader_, check = check_worker_,
       handler = std::move(handler)](Request& req) -> Awaitable<Response> {
        if (leader) {
          if (Status s = leader(); !s.ok()) co_return Response::Error(s);
        }
        StatusOr<int64_t> worker = check(req);
        if (!worker.ok()) co_return Response::Error(worker.status());
        req.principal = "worker " + std::to_string(*worker);
        Response answer = co_await handler(req, *worker);
        co_return WithoutServerPaths(std::move(answer), req.route);
      },
      options, "worker token");
}

Awaitable<StatusOr<storage::BlobInfo>> StreamBodyToBlob(const RouteContext& context, http::BodyReader& body,
                                                        std::string key, storage::PutOptions options) {
  storage::BlobStore& blobs = context.blobs;
  auto upload = StreamBodyInto<StatusOr<storage::BlobInfo>>(
      context.upload_pool, body,
      [&blobs, key, options](storage::ByteSource& source) { return blobs.Put(key, source, options); });
  co_return co_await std::move(upload);
}

StatusOr<int64_t> IntQuery(const Request& req, const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  auto it = req.query.find(name);
  if (it == req.query.end()) return fallback;
  const std::string& text = it->second;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return InvalidArgumentError(name + " must be an integer from " + std::to_string(min) + " to " +
                                std::to_string(max) + ", got '" + text.substr(0, 64) + "'");
  }
  return value;
}

StatusOr<PageRequest> ParsePageRequest(const Request& req, int64_t default_limit, int64_t max_limit) {
  PageRequest page;
  PARSYN_ASSIGN_OR_RETURN(page.limit, IntQuery(req, "limit", default_limit, 1, max_limit));
  if (auto it = req.query.find("cursor"); it != req.query.end()) {
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), page.after_id);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || page.after_id < 0) {
      return InvalidArgumentError("cursor '" + text.substr(0, 64) +
                                  "' is not one this server handed out: pass a page's next_cursor as it came, or no "
                                  "cursor for the first page");
    }
  }
  return page;
}

StatusOr<std::string> NewBlobName() {
  PARSYN_ASSIGN_OR_RETURN(std::string secret, NewSecret(""));
  return secret.substr(0, 32);
}

}  // namespace parsyn::coordinator
