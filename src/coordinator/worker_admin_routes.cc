// REST API v1 for workers: register (the token is shown once), list, get, revoke. A worker's view adds the job it
// is working on from its live session. Bootstrap: a worker that registers itself as a managed worker with the
// operator's bootstrap key (`parsyn server --worker-bootstrap-key-file`; `parsyn worker --bootstrap-key-file`).
#include <algorithm>
#include <cmath>
#include <optional>

#include "base/log.h"
#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/project_access.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

// Registering and revoking change the service's token table (Service::AddWorkerToken, RevokeWorker), a worker's
// view reads its session (WorkerSessions), and both go to the dashboard's stream (FeedPublisher).
class WorkerAdminRoutes {
 public:
  WorkerAdminRoutes(const RouteContext& context, Service& service, const WorkerSessions& sessions, FeedPublisher& feed)
      : context_(context), service_(service), sessions_(sessions), feed_(feed) {}

  // POST /api/v1/workers {"name", "kind": own|managed}: an own worker of the request's project, or (platform admins
  // only) one of the managed pool.
  Awaitable<Response> Register(Request& req, const Caller& caller) {
    StatusOr<WorkerRegistration> registration = ParseWorkerRegistration(req.body);
    if (!registration.ok()) co_return Response::Error(registration.status());
    if (registration->kind == storage::WorkerKind::kManaged && !caller.platform_admin) {
      co_return Response::Error(PermissionDeniedError(
          "a managed worker serves every project: registering one needs the platform_admin role, which user " +
          caller.name + " does not have; register an own worker (\"kind\": \"own\") of your project instead"));
    }
    registration->project_id = req.scope_id;
    co_return co_await Create(*registration);
  }

  // POST /api/v1/workers/bootstrap {"name"} with "Authorization: Bearer <bootstrap key>": a managed worker, answered
  // like POST /api/v1/workers. The key can do nothing else (it is no admin key).
  // At most --bootstrap-rate a minute and --max-managed-workers live managed workers (429 beyond, saying which); a pod
  // registering again under its name revokes its earlier record (that pod restarted, or another took its name).
  Awaitable<Response> Bootstrap(Request& req) {
    req.principal = "worker bootstrap key";
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "csr"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    WorkerRegistration registration{.name = fields->String("name", true).value_or(""),
                                    .kind = storage::WorkerKind::kManaged};
    constexpr size_t kMaxCsrBytes = 16 << 10;  // a P-256 request is about 500 bytes; RSA-4096 about 1,700
    const std::string csr = fields->Lines("csr", false, kMaxCsrBytes).value_or("");
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    const bool signs = !service_.options().managed_ca_cert_file.empty();
    if (signs && csr.empty()) {
      co_return Response::Error(InvalidArgumentError(
          "csr: this coordinator requires mutual TLS (--client-ca): send a PEM certificate signing request for the "
          "worker's key (`parsyn worker --bootstrap-key-file` does)"));
    }
    if (std::optional<Response> busy = TakeBootstrapToken()) co_return std::move(*busy);
    const int max_managed = service_.options().max_managed_workers;
    auto listed = loop::Offload(context_.pool, [&]() -> StatusOr<std::pair<int, std::vector<int64_t>>> {
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Worker> workers, context_.store.ListWorkers());
      int live = 0;
      std::vector<int64_t> same_name;
      for (const storage::Worker& w : workers) {
        if (w.kind != storage::WorkerKind::kManaged || w.revoked) continue;
        if (w.name == registration.name) {
          same_name.push_back(w.id);
        } else {
          ++live;
        }
      }
      return std::make_pair(live, std::move(same_name));
    });
    StatusOr<std::pair<int, std::vector<int64_t>>> managed = co_await std::move(listed);  // kCoAwaitTemporaries
    if (!managed.ok()) co_return Response::Error(managed.status());
    if (max_managed > 0 && managed->first >= max_managed) {
      co_return TooMany("there are " + std::to_string(managed->first) + " managed workers, the most allowed (" +
                            std::to_string(max_managed) +
                            ", --max-managed-workers); revoke departed ones (DELETE /api/v1/workers/{id}) or raise it",
                        60);
    }
    for (int64_t earlier : managed->second) {
      auto revoke = service_.RevokeWorker(
          earlier, "worker pod '" + registration.name + "' registered again");  // kCoAwaitTemporaries
      StatusOr<storage::Worker> revoked = co_await std::move(revoke);
      if (!revoked.ok()) co_return Response::Error(revoked.status());
    }
    auto created = Create(registration, signs ? csr : std::string());  // kCoAwaitTemporaries (loop_tools.h)
    co_return co_await std::move(created);
  }

  // A 429 saying `why`, with Retry-After.
  static Response TooMany(const std::string& why, int retry_after_s) {
    Response busy = Response::Error(ResourceExhaustedError(why));
    busy.status = 429;
    busy.WithHeader("Retry-After", std::to_string(retry_after_s));
    return busy;
  }

  // The bootstrap rate (a token bucket of --bootstrap-rate tokens, refilled at that many a minute): nullopt when a
  // registration may go ahead (its token taken), else the 429 to answer.
  std::optional<Response> TakeBootstrapToken() {
    const int per_minute = service_.options().bootstrap_rate_per_minute;
    if (per_minute <= 0) return std::nullopt;
    const Clock::TimePoint now = context_.clock.Now();
    if (bootstrap_refilled_at_ == Clock::TimePoint{}) bootstrap_tokens_ = per_minute;
    const double minutes = std::chrono::duration<double>(now - bootstrap_refilled_at_).count() / 60.0;
    if (bootstrap_refilled_at_ != Clock::TimePoint{}) {
      bootstrap_tokens_ = std::min<double>(per_minute, bootstrap_tokens_ + minutes * per_minute);
    }
    bootstrap_refilled_at_ = now;
    if (bootstrap_tokens_ >= 1) {
      bootstrap_tokens_ -= 1;
      return std::nullopt;
    }
    const int wait_s = static_cast<int>(std::ceil((1 - bootstrap_tokens_) * 60.0 / per_minute));
    return TooMany("worker bootstraps are limited to " + std::to_string(per_minute) +
                       " a minute (--bootstrap-rate); retry in " + std::to_string(wait_s) + " s",
                   std::max(1, wait_s));
  }

  // `csr` (bootstrap under mutual TLS): the answer also carries "certificate", the managed CA's for the request's key
  // and CN worker-<id>; a request that cannot be signed leaves no worker behind (it is revoked) and gets a 400.
  Awaitable<Response> Create(const WorkerRegistration& registration, std::string csr = {}) {
    StatusOr<std::string> token = NewSecret("pwt_");
    if (!token.ok()) co_return Response::Error(token.status());
    storage::Worker worker{.name = registration.name,
                           .kind = registration.kind,
                           .token_sha256 = HashSecret(*token),
                           .created_at_ms = context_.clock.UnixMillis(),
                           .project_id = registration.project_id};
    auto created = co_await loop::Offload(context_.pool, [&] { return context_.store.CreateWorker(worker); });
    if (!created.ok()) co_return Response::Error(created.status());
    service_.AddWorkerToken(*created);
    // The dashboard's stream.
    feed_.NoteWorkerChange(created->id, service_.worker_tokens().FeedProject(created->id), WorkerView(*created));
    json body = WorkerJson(*created);
    body["token"] = *token;  // shown once; only its hash is kept
    if (!csr.empty()) {
      const ServiceOptions& o = service_.options();
      auto sign = loop::Offload(context_.pool, [&] {  // kCoAwaitTemporaries
        return SignWorkerCertificateRequest(o.managed_ca_cert_file, o.managed_ca_key_file, csr, created->id);
      });
      StatusOr<IssuedCertificate> issued = co_await std::move(sign);
      if (!issued.ok()) {
        auto revoke = service_.RevokeWorker(created->id, "its certificate request could not be signed");
        StatusOr<storage::Worker> revoked = co_await std::move(revoke);  // kCoAwaitTemporaries
        if (!revoked.ok()) PARSYN_LOG_WARN("revoking worker {}: {}", created->id, revoked.status().ToString());
        co_return Response::Error(issued.status());
      }
      body["certificate"] = issued->certificate_pem;
    }
    co_return Created("/api/v1/workers", created->id, body);
  }

  Awaitable<Response> List(Request& req, const Caller&) {
    return ListRecords(
        context_, req, "workers", [](storage::MetadataStore& s, const storage::IdPage& p) { return s.ListWorkers(p); },
        [this](const storage::Worker& w) { return WorkerView(w); });
  }

  Awaitable<Response> Get(Request& req, const Caller&) {
    return GetRecordById(
        context_, req, "worker", [](storage::MetadataStore& s, int64_t id) { return s.GetWorker(id); },
        [this](const storage::Worker& w) { return WorkerView(w); });
  }

  // DELETE /api/v1/workers/{id}: revocation keeps the record (jobs and rounds refer to it) and ends the worker's
  // session at once.
  Awaitable<Response> Revoke(Request& req, const Caller&) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "worker");
    if (!id.ok()) co_return Response::Error(id.status());
    auto revoke = service_.RevokeWorker(*id, "revoked");  // kCoAwaitTemporaries
    StatusOr<storage::Worker> revoked = co_await std::move(revoke);
    if (!revoked.ok()) co_return Response::Error(revoked.status());
    co_return Response::Json(200, WorkerView(*revoked));
  }

 private:
  // The stored worker with "current_job_id": the job of its delivered (else first queued) task, or null.
  json WorkerView(const storage::Worker& w) {
    json j = WorkerJson(w);
    if (const WorkerSessions::Session* s = sessions_.Find(w.id)) {
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
  const WorkerSessions& sessions_;
  FeedPublisher& feed_;
  double bootstrap_tokens_ = 0;               // TakeBootstrapToken's bucket
  Clock::TimePoint bootstrap_refilled_at_{};  // when it was last refilled (never: full)
};

Status AddWorkerAdminRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<WorkerAdminRoutes>(context, service, service.sessions(), service.feed_publisher());
  using storage::ProjectRole;
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kPost, "/api/v1/workers", Bind(h, &WorkerAdminRoutes::Register), ProjectRole::kEditor));
  // The bootstrap key is checked from the headers, before the body is read, and again before the handler runs
  // (RouteTable::OwnKey).
  PARSYN_RETURN_IF_ERROR(
      routes.OwnKey(Method::kPost, "/api/v1/workers/bootstrap", Bind(h, &WorkerAdminRoutes::Bootstrap),
                    [&service](const Request& req) { return service.CheckWorkerBootstrapKey(req); }));
  PARSYN_RETURN_IF_ERROR(
      routes.InProject(Method::kGet, "/api/v1/workers", Bind(h, &WorkerAdminRoutes::List), ProjectRole::kViewer));
  // A managed worker belongs to the pool every project uses (kManagedPool).
  const ObjectProject owner = OwnerById(context, "worker", [](storage::MetadataStore& s, int64_t id) {
    StatusOr<storage::Worker> w = s.GetWorker(id);
    if (w.ok() && w->kind == storage::WorkerKind::kManaged) w->project_id = kManagedPool;
    return w;
  });
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kGet, "/api/v1/workers/{id}", Bind(h, &WorkerAdminRoutes::Get),
                                                ProjectRole::kViewer, owner));
  return routes.OnProjectObject(Method::kDelete, "/api/v1/workers/{id}", Bind(h, &WorkerAdminRoutes::Revoke),
                                ProjectRole::kEditor, owner);
}

}  // namespace parsyn::coordinator
