// Internal to the coordinator: what the service's route handlers share. RouteTable registers a route with its
// credential check (open, platform_admin, any user, a role in the request's or the object's project, worker token)
// and records it for the OpenAPI check and the route access table; RouteContext is the narrow
// piece of the service most handlers use; one Add*Routes function per resource file registers its handlers.
// Loop thread only.
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/thread_pool.hpp>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "coordinator/api_json.h"
#include "coordinator/audit_log.h"
#include "coordinator/user_keys.h"
#include "http/server.h"
#include "loop/loop_tools.h"
#include "storage/blob_store.h"
#include "storage/local_blob_copy.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

class Service;
struct RouteInfo;

// The names every route file uses.
using http::Awaitable;
using http::Method;
using http::Request;
using http::Response;
using nlohmann::json;

// What most route handlers use of the service (handlers that need sessions or job runners also hold the Service).
struct RouteContext {
  storage::MetadataStore& store;
  storage::BlobStore& blobs;
  boost::asio::thread_pool& pool;         // store calls, blob reads, validation (loop::Offload)
  boost::asio::thread_pool& upload_pool;  // streamed uploads only: their threads block on the network
  const Clock& clock;
  std::filesystem::path spool_dir;  // temporary local copies of blobs (LocalBlobCopy)
  uint64_t max_upload_bytes;        // datasets, model files and round updates
};

using WorkerHandler = std::function<http::Awaitable<http::Response>(http::Request&, int64_t worker_id)>;
using UserHandler = std::function<http::Awaitable<http::Response>(http::Request&, const Caller& caller)>;

// What an object route's object belongs to: its project (kManagedPool for a managed worker) and what errors call it
// ("dataset 7").
struct ObjectOwner {
  int64_t project_id = 0;
  std::string object;
};
// Reads the owner of the object a request names (NotFound for an unknown one).
using ObjectProject = std::function<http::Awaitable<StatusOr<ObjectOwner>>(const http::Request&)>;

// Adds routes to a router behind their credential check and records each in `table` (Service::routes(), which
// docs/openapi.yaml must describe exactly).
class RouteTable {
 public:
  // Who the request's API key (or the admin key) names; Unauthenticated otherwise (user_keys.h).
  using UserCheck = std::function<StatusOr<Caller>(const http::Request&)>;
  // A credential of a route's own (the worker bootstrap key).
  using KeyCheck = std::function<Status(const http::Request&)>;
  // The worker id of the request's token; Unauthenticated or PermissionDenied (revoked) otherwise.
  using WorkerCheck = std::function<StatusOr<int64_t>(const http::Request&)>;

  // `max_json_bytes` caps the bodies of routes that buffer theirs (JSON; ServiceOptions::max_json_bytes) unless a
  // route sets its own max_body_bytes. Every route's state-changing requests (POST, PUT, PATCH, DELETE; but the
  // workers' heartbeats and progress reports), every sign-in (SignIn routes, GETs too) and every request
  // refused for its credential (401, 403) are recorded in `audit` before they are answered (a credential refused
  // before the body is read: right after).
  // `directory` holds the projects and who holds which role there.
  RouteTable(http::Router& router, std::vector<RouteInfo>& table, UserCheck check_user, WorkerCheck check_worker,
             uint64_t max_json_bytes, AuditLog& audit, const UserKeys& directory)
      : router_(router),
        table_(table),
        check_user_(std::move(check_user)),
        check_worker_(std::move(check_worker)),
        max_json_bytes_(max_json_bytes),
        audit_(audit),
        directory_(directory) {}

  // Admin, worker and own-key routes answer this check's error (a standby's 503) before anything else, when set.
  using LeaderCheck = std::function<Status()>;
  void RequireLeader(LeaderCheck check) { check_leader_ = std::move(check); }

  // No credentials (/healthz).
  Status Open(http::Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options = {});
  // A sign-in: no credential but the provider's ID token (or the sign-in's state) the handler checks; every answer
  // is recorded in the audit log, a GET's too.
  Status SignIn(http::Method method, std::string_view pattern, http::Handler handler);
  // No credentials but the signed URL the handler checks (/blobs).
  Status SignedUrl(http::Method method, std::string_view pattern, http::Handler handler,
                   http::RouteOptions options = {});
  // Needs "Authorization: Bearer <key>" of a platform_admin (the admin key, or a platform admin's API key): others
  // get 403 naming the role. Checked from the header (RouteOptions::authorize) before any of the body is read, and
  // again when the handler runs.
  Status Admin(http::Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options = {});
  // The same, for a handler that needs the caller.
  Status Admin(http::Method method, std::string_view pattern, UserHandler handler, http::RouteOptions options = {});
  // Needs any user's valid key, checked like Admin's; the handler gets the caller (and decides what it may see: its
  // own keys, say).
  Status User(http::Method method, std::string_view pattern, UserHandler handler, http::RouteOptions options = {});
  // A route of a project's collection (a list or a create; no path parameters): the request's project
  // (project_access.h: the X-Parsyn-Project header, else ?project=, else "default") must exist and the caller hold
  // `needed` there: else 404 naming the project (it does not exist or they are no member), or 403 naming the role.
  // Checked from the header before the body is read, and again when the handler runs, which finds the project's id
  // in req.scope_id (and its name in req.scope).
  Status InProject(http::Method method, std::string_view pattern, UserHandler handler, storage::ProjectRole needed,
                   http::RouteOptions options = {});
  // A route of one object ({id}): `owner` reads the object's project, where the caller must hold `needed`. One who
  // is not its member gets 404 "<object> not found", as for an id that does not exist (ids do not leak); one with a
  // lower role 403 naming it (CheckObjectRole). req.scope_id is the object's project when the handler runs.
  Status OnProjectObject(http::Method method, std::string_view pattern, UserHandler handler,
                         storage::ProjectRole needed, ObjectProject owner, http::RouteOptions options = {});
  // A platform_admin's route that a project's owners may call for their project, naming it in ?project= (the query
  // only: a filter, which a client's default project header does not set). Without it the caller must be a
  // platform_admin (403 naming the role); with it, an owner there (NamedProject: 404 for a project the caller is no
  // member of, 403 for a lower role), and req.scope_id is the project's (0 without one).
  Status AdminOrProjectOwner(http::Method method, std::string_view pattern, UserHandler handler,
                             http::RouteOptions options = {});
  // Needs "Authorization: Bearer <worker token>", checked like Admin's; the handler gets the worker's id from the
  // token. Its server-side failures (5xx) are answered without the server's file paths (the log keeps them).
  Status Worker(http::Method method, std::string_view pattern, WorkerHandler handler, http::RouteOptions options = {});
  // A route with a credential of its own (`check`, e.g. the worker bootstrap key) that writes, so only the leader
  // serves it: the leader check, then `check`, from the header before the body is read, and again when the handler
  // runs. Its 5xx answers carry no server file paths, as Worker's.
  Status OwnKey(http::Method method, std::string_view pattern, http::Handler handler, KeyCheck check,
                http::RouteOptions options = {});

 private:
  http::Router& router_;
  std::vector<RouteInfo>& table_;
  UserCheck check_user_;
  WorkerCheck check_worker_;
  uint64_t max_json_bytes_;
  AuditLog& audit_;
  const UserKeys& directory_;
  LeaderCheck check_leader_;

  // The project a request acts in (nullptr: none), or why the caller may not call the route.
  using ScopeCheck =
      std::function<StatusOr<const storage::Project*>(const http::Request&, const Caller&, const UserKeys& directory)>;
  // A user route whose project `scope` finds, from the header before the body is read and again when the handler
  // runs (req.scope_id, req.scope), registered as callable by `access`.
  Status InScope(http::Method method, std::string_view pattern, UserHandler handler, ScopeCheck scope,
                 std::string access, http::RouteOptions options);
  // Registers the route, audited (see the constructor), as callable by `access` (RouteInfo::access).
  Status Add(http::Method method, std::string_view pattern, http::Handler handler, http::RouteOptions options,
             std::string access);
  // `check` after the leader check, for RouteOptions::authorize: a refused credential is recorded in the audit log.
  template <typename Check>
  http::Authorizer Authorizer(Check check) const;
};

// What the audit log records of a request answered `answer` (AuditLog fills in the time).
AuditEntry AuditEntryFor(const http::Request& req, const http::Response& answer);
// The entry of a request refused by its credential check (`refusal`) before its handler ran.
AuditEntry AuditEntryFor(const http::Request& req, const Status& refusal);

// A route handler that calls `method` on `handlers`, which the router keeps alive.
template <typename Handlers>
http::Handler Bind(std::shared_ptr<Handlers> handlers,
                   http::Awaitable<http::Response> (Handlers::*method)(http::Request&)) {
  return [handlers = std::move(handlers), method](http::Request& req) { return ((*handlers).*method)(req); };
}
template <typename Handlers>
WorkerHandler Bind(std::shared_ptr<Handlers> handlers,
                   http::Awaitable<http::Response> (Handlers::*method)(http::Request&, int64_t worker_id)) {
  return [handlers = std::move(handlers), method](http::Request& req, int64_t worker_id) {
    return ((*handlers).*method)(req, worker_id);
  };
}
template <typename Handlers>
UserHandler Bind(std::shared_ptr<Handlers> handlers,
                 http::Awaitable<http::Response> (Handlers::*method)(http::Request&, const Caller& caller)) {
  return [handlers = std::move(handlers), method](http::Request& req, const Caller& caller) {
    return ((*handlers).*method)(req, caller);
  };
}

// Sends a blob's local copy as the body; a temporary copy (S3) is removed once the response has been written.
inline http::Response FileResponse(storage::LocalBlobCopy copy, std::string content_type = "application/octet-stream") {
  http::Response res = http::Response::File(copy.path(), std::move(content_type));
  res.file_owner = std::make_shared<const storage::LocalBlobCopy>(std::move(copy));
  return res;
}

// FileResponse as a download: `Content-Disposition: attachment; filename="<last segment of name>"` (characters other
// than letters, digits, '.', '-' and '_' become '_') and `X-Content-Type-Options: nosniff`, so a browser saves the
// bytes instead of rendering them as a page of the coordinator's origin.
inline http::Response DownloadResponse(storage::LocalBlobCopy copy, std::string_view name,
                                       std::string content_type = "application/octet-stream") {
  std::string filename(name.substr(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1));
  for (char& c : filename) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  }
  if (filename.empty() || filename.find_first_not_of('.') == std::string::npos) filename = "blob";
  http::Response res = FileResponse(std::move(copy), std::move(content_type));
  res.headers.emplace_back("X-Content-Type-Options", "nosniff");
  res.headers.emplace_back("Content-Disposition", "attachment; filename=\"" + filename + "\"");
  return res;
}

// Streams a request body (a route with stream_body) into a new blob `key` on the upload pool.
http::Awaitable<StatusOr<storage::BlobInfo>> StreamBodyToBlob(const RouteContext& context, http::BodyReader& body,
                                                              std::string key, storage::PutOptions options = {});
// A fresh random blob name: 32 hex digits (datasets/<name>/..., uploads/<name>).
StatusOr<std::string> NewBlobName();

// The routes of each resource, in its own file. Errors: those of Router::Add (a duplicate route).
Status AddDatasetRoutes(RouteTable& routes, const RouteContext& context);     // dataset_routes.cc
Status AddModelRoutes(RouteTable& routes, const RouteContext& context);       // model_routes.cc
Status AddWorkerAdminRoutes(RouteTable& routes, const RouteContext& context,  // worker_admin_routes.cc
                            Service& service);
Status AddJobRoutes(RouteTable& routes, const RouteContext& context, Service& service);  // job_routes.cc
Status AddEventRoutes(RouteTable& routes, Service& service);                             // event_routes.cc
Status AddWorkerProtocolRoutes(RouteTable& routes, const RouteContext& context,          // worker_protocol_routes.cc
                               Service& service);
Status AddSecureAggregationRoutes(RouteTable& routes, Service& service);  // secure_aggregation_routes.cc
Status AddUserRoutes(RouteTable& routes, const RouteContext& context, Service& service);  // user_routes.cc
Status AddProjectRoutes(RouteTable& routes, const RouteContext& context,                  // project_routes.cc
                        Service& service);
Status AddAuditRoutes(RouteTable& routes, const RouteContext& context,  // audit_routes.cc
                      const AuditLog& audit);
// `signing_secret` verifies the signed /blobs URLs.
Status AddBlobRoutes(RouteTable& routes, const RouteContext& context, Service& service,  // blob_routes.cc
                     std::string signing_secret);

// A query parameter that must be an integer in [min, max]; `fallback` when absent. InvalidArgument naming it.
StatusOr<int64_t> IntQuery(const http::Request& req, const std::string& name, int64_t fallback, int64_t min,
                           int64_t max);

// Pagination, one convention for every list (docs/openapi.yaml, "Pagination"): ?limit= items per page and ?cursor=,
// the next_cursor of the page before (absent: the first page). Items come in ascending id order; a cursor is the id
// of the last item of the page before, as decimal text (opaque to clients), so items added while a client pages
// come on a later page and none comes twice.
inline constexpr int64_t kDefaultPageLimit = 100;
inline constexpr int64_t kMaxPageLimit = 1000;
struct PageRequest {
  int64_t after_id = 0;  // the page starts after this id
  int64_t limit = kDefaultPageLimit;
};
// ?limit= (1..max_limit, default_limit when absent) and ?cursor=; InvalidArgument naming the one that is bad.
StatusOr<PageRequest> ParsePageRequest(const http::Request& req, int64_t default_limit = kDefaultPageLimit,
                                       int64_t max_limit = kMaxPageLimit);
// The next_cursor of a page whose last item has id `last_id`.
inline std::string CursorAfter(int64_t last_id) { return std::to_string(last_id); }

// One page of `records` (in ascending id order): the first page.limit with an id above page.after_id, as
// {"<field>": [view(record), ...], "next_cursor": the cursor after the last one, or null when no record follows}.
template <typename Record, typename View>
nlohmann::json PageJson(std::string_view field, const std::vector<Record>& records, const PageRequest& page,
                        View view) {
  nlohmann::json items = nlohmann::json::array();
  nlohmann::json next = nullptr;
  int64_t last_id = page.after_id;
  for (const Record& r : records) {
    if (r.id <= page.after_id) continue;
    if (static_cast<int64_t>(items.size()) == page.limit) {
      next = CursorAfter(last_id);  // another record follows this page
      break;
    }
    items.push_back(view(r));
    last_id = r.id;
  }
  return {{std::string(field), std::move(items)}, {"next_cursor", std::move(next)}};
}

// What the store reads for `page`: its records, and one more, which tells PageJson whether another page follows (a
// keyset query: the store reads no record of the other pages). `project_id`: only that project's records.
inline storage::IdPage PageQuery(const PageRequest& page, std::optional<int64_t> project_id = std::nullopt) {
  return storage::IdPage{.after_id = page.after_id, .limit = page.limit + 1, .project_id = project_id};
}

// GET of a resource's list: list(store, PageQuery(page)) read on the pool, answered one page at a time (PageJson).
// One body for datasets, models and workers (of the request's project: an InProject route's page query names it).
template <typename List, typename View>
http::Awaitable<http::Response> ListRecords(const RouteContext& context, http::Request& req, std::string field,
                                            List list, View view) {
  StatusOr<PageRequest> page = ParsePageRequest(req);
  if (!page.ok()) co_return http::Response::Error(page.status());
  const std::optional<int64_t> project = req.scope_id == 0 ? std::nullopt : std::optional(req.scope_id);
  auto records = co_await loop::Offload(context.pool, [&] { return list(context.store, PageQuery(*page, project)); });
  if (!records.ok()) co_return http::Response::Error(records.status());
  co_return http::Response::Json(200, PageJson(field, *records, *page, view));
}

// The 201 answer of a created resource: its view, with `Location: <collection>/<id>` (e.g. /api/v1/datasets/3).
inline http::Response Created(std::string_view collection, int64_t id, const nlohmann::json& view) {
  http::Response res = http::Response::Json(201, view);
  res.headers.emplace_back("Location", std::string(collection) + "/" + std::to_string(id));
  return res;
}

// DELETE …/{id} of a stored record and its blobs: on the pool, the record read with get(store, id), removed with
// remove(store, id) (which refuses while a job refers to it), then the blobs blob_keys(record) names deleted, best
// effort (the record is gone; a leftover blob is only space). Answers 204. One body for datasets and models.
template <typename Get, typename Remove, typename BlobKeys>
http::Awaitable<http::Response> DeleteRecordById(const RouteContext& context, http::Request& req, std::string_view what,
                                                 Get get, Remove remove, BlobKeys blob_keys) {
  StatusOr<int64_t> id = ParseId(req.params["id"], what);
  if (!id.ok()) co_return http::Response::Error(id.status());
  Status deleted = co_await loop::Offload(context.pool, [&]() -> Status {
    auto record = get(context.store, *id);
    if (!record.ok()) return record.status();
    PARSYN_RETURN_IF_ERROR(remove(context.store, *id));
    for (const std::string& key : blob_keys(*record)) context.blobs.Delete(key).IgnoreError();
    return Status::Ok();
  });
  if (!deleted.ok()) co_return http::Response::Error(deleted);
  co_return http::Response::NoContent();
}

// GET …/{id} of a stored record: the id from the path (named `what` in errors), the record read on the pool with
// get(store, id), answered as view(record). One body for datasets, models and workers.
template <typename Get, typename View>
http::Awaitable<http::Response> GetRecordById(const RouteContext& context, http::Request& req, std::string_view what,
                                              Get get, View view) {
  StatusOr<int64_t> id = ParseId(req.params["id"], what);
  if (!id.ok()) co_return http::Response::Error(id.status());
  auto record = co_await loop::Offload(context.pool, [&] { return get(context.store, *id); });
  if (!record.ok()) co_return http::Response::Error(record.status());
  co_return http::Response::Json(200, view(*record));
}

// The ObjectOwner of the record `what` {id} names, read with get(store, id) on the pool (a record with project_id).
template <typename Get>
ObjectProject OwnerById(const RouteContext& context, std::string what, Get get) {
  return [&pool = context.pool, &store = context.store, what = std::move(what),
          get](const http::Request& req) -> http::Awaitable<StatusOr<ObjectOwner>> {
    const auto param = req.params.find("id");
    StatusOr<int64_t> id = ParseId(param == req.params.end() ? "" : param->second, what);
    if (!id.ok()) co_return id.status();
    auto record = co_await loop::Offload(pool, [&] { return get(store, *id); });
    if (!record.ok()) co_return record.status();
    co_return ObjectOwner{record->project_id, what + " " + std::to_string(*id)};
  };
}

}  // namespace parsyn::coordinator
