// REST API v1 for workers: register (the token is shown once), list, get, revoke. A worker's view adds the job it
// is working on from its live session. Bootstrap: a worker that registers itself as a managed worker with the
// operator's bootstrap key (`parsyn server --worker-bootstrap-key-file`; `parsyn worker --bootstrap-key-file`).
#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/loop_tools.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"

namespace parsyn::coordinator {

// A friend of Service: registering and revoking change its token table, and a worker's view reads its session.
class WorkerAdminRoutes {
 public:
  WorkerAdminRoutes(const RouteContext& context, Service& service) : context_(context), service_(service) {}

  // POST /api/v1/workers {"name", "kind": own|managed}.
  Awaitable<Response> Register(Request& req) {
    StatusOr<WorkerRegistration> registration = ParseWorkerRegistration(req.body);
    if (!registration.ok()) co_return Response::Error(registration.status());
    co_return co_await Create(*registration);
  }

  // POST /api/v1/workers/bootstrap {"name"} with "Authorization: Bearer <bootstrap key>": a managed worker, answered
  // like POST /api/v1/workers. The key can do nothing else (it is no admin key).
  Awaitable<Response> Bootstrap(Request& req) {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    WorkerRegistration registration{.name = fields->String("name", true).value_or(""),
                                    .kind = storage::WorkerKind::kManaged};
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    co_return co_await Create(registration);
  }

  // Checked from the headers, before the body is read, and again before the handler runs (RouteTable::OwnKey).
  Status CheckBootstrapKey(const Request& req) const {
    if (service_.worker_bootstrap_key_hash_.empty()) {
      return NotFoundError("worker bootstrap registration is off: start the server with --worker-bootstrap-key-file");
    }
    PARSYN_ASSIGN_OR_RETURN(const std::string key, BearerToken(req.Header("authorization")));
    if (!DigestsEqual(HashSecret(key), service_.worker_bootstrap_key_hash_)) {
      return UnauthenticatedError("invalid worker bootstrap key");
    }
    return Status::Ok();
  }

  Awaitable<Response> Create(const WorkerRegistration& registration) {
    StatusOr<std::string> token = NewSecret("pwt_");
    if (!token.ok()) co_return Response::Error(token.status());
    storage::Worker worker{.name = registration.name,
                           .kind = registration.kind,
                           .token_sha256 = HashSecret(*token),
                           .created_at_ms = context_.clock.UnixMillis()};
    auto created = co_await Offload(context_.pool, [&] { return context_.store.CreateWorker(worker); });
    if (!created.ok()) co_return Response::Error(created.status());
    service_.worker_tokens_.Add(*created);
    service_.NoteWorkerChange(created->id, WorkerView(*created));  // the dashboard's stream
    json body = WorkerJson(*created);
    body["token"] = *token;  // shown once; only its hash is kept
    co_return Created("/api/v1/workers", created->id, body);
  }

  Awaitable<Response> List(Request& req) {
    return ListRecords(
        context_, req, "workers", [](storage::MetadataStore& s, const storage::IdPage& p) { return s.ListWorkers(p); },
        [this](const storage::Worker& w) { return WorkerView(w); });
  }

  Awaitable<Response> Get(Request& req) {
    return GetRecordById(
        context_, req, "worker", [](storage::MetadataStore& s, int64_t id) { return s.GetWorker(id); },
        [this](const storage::Worker& w) { return WorkerView(w); });
  }

  // DELETE /api/v1/workers/{id}: revocation keeps the record (jobs and rounds refer to it) and ends the worker's
  // session at once.
  Awaitable<Response> Revoke(Request& req) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "worker");
    if (!id.ok()) co_return Response::Error(id.status());
    auto revoked = co_await Offload(context_.pool, [&]() -> StatusOr<storage::Worker> {
      PARSYN_ASSIGN_OR_RETURN(storage::Worker w, context_.store.GetWorker(*id));
      w.revoked = true;
      w.status = storage::WorkerStatus::kOffline;
      PARSYN_RETURN_IF_ERROR(context_.store.UpdateWorker(w));
      return w;
    });
    if (!revoked.ok()) co_return Response::Error(revoked.status());
    service_.worker_tokens_.Revoke(*id);
    co_await service_.EndSession(*id, "revoked");
    json view = WorkerView(*revoked);
    service_.NoteWorkerChange(*id, view);  // the dashboard's stream
    co_return Response::Json(200, view);
  }

 private:
  // The stored worker with "current_job_id": the job of its delivered (else first queued) task, or null.
  json WorkerView(const storage::Worker& w) {
    json j = WorkerJson(w);
    if (const Service::Session* s = service_.FindSession(w.id)) {
      // Presence is kept in memory and reaches the store in batches: a connected worker's last heartbeat is this.
      j["last_heartbeat_at_ms"] = context_.clock.UnixMillis() - (context_.clock.Now() - s->last_seen).count();
      j["status"] = storage::ToString(s->status);  // busy/online live in the session (Session::status)
      if (s->current_job)
        j["current_job_id"] = *s->current_job;
      else if (!s->queued.empty())
        j["current_job_id"] = s->queued.front().job_id;
    }
    if (!j.contains("current_job_id")) j["current_job_id"] = nullptr;
    return j;
  }

  const RouteContext context_;
  Service& service_;
};

Status AddWorkerAdminRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<WorkerAdminRoutes>(context, service);
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/workers", Bind(h, &WorkerAdminRoutes::Register)));
  PARSYN_RETURN_IF_ERROR(routes.OwnKey(Method::kPost, "/api/v1/workers/bootstrap",
                                       Bind(h, &WorkerAdminRoutes::Bootstrap),
                                       [h](const Request& req) { return h->CheckBootstrapKey(req); }));
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/workers", Bind(h, &WorkerAdminRoutes::List)));
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/workers/{id}", Bind(h, &WorkerAdminRoutes::Get)));
  return routes.Admin(Method::kDelete, "/api/v1/workers/{id}", Bind(h, &WorkerAdminRoutes::Revoke));
}

}  // namespace parsyn::coordinator
