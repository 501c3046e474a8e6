#include "coordinator/service.h"

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "base/log.h"
#include "base/text_file.h"
#include "coordinator/api_json.h"
#include "coordinator/auth.h"
#include "coordinator/job_runner.h"
#include "coordinator/server_metrics.h"
#include "coordinator/service_routes.h"
#include "coordinator/signed_blob_urls.h"
#include "coordinator/static_routes.h"
#include "http/signed_url.h"
#include "loop/loop_tools.h"
#include "secagg/key_signature.h"
#include "storage/byte_source.h"
#include "storage/directory_blob_store.h"
#include "storage/metadata_store.h"
#include "storage/timed_metadata_store.h"

namespace parsyn::coordinator {

using nlohmann::json;

StatusOr<std::vector<storage::Worker>> Service::ResetWorkerSessions(storage::MetadataStore& store) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Worker> workers, store.ListWorkers());
  for (storage::Worker& w : workers) {
    if (w.status != storage::WorkerStatus::kOffline) {
      w.status = storage::WorkerStatus::kOffline;
      PARSYN_RETURN_IF_ERROR(store.UpdateWorker(w));
    }
  }
  return workers;
}

namespace {

// How long /readyz's store probes and /metrics' stored gauges are shared by every caller (both routes are open).
constexpr std::chrono::milliseconds kReadinessMaxAge{1000};
constexpr std::chrono::milliseconds kStoredGaugesMaxAge{5000};

FeedPublisher::Options FeedOptions(const ServiceOptions& options) {
  return {.buffer_events = options.event_buffer_events,
          .buffer_bytes = options.event_buffer_bytes,
          .progress_sample_interval = options.progress_sample_interval,
          .progress_samples_per_second = options.progress_samples_per_second};
}

// The checker of secure aggregation's advertised keys under the workers' CA file.
StatusOr<secagg::KeyVerifier> SecureKeyVerifier(const std::filesystem::path& ca_file) {
  StatusOr<std::string> ca = ReadWholeFile(ca_file);
  if (!ca.ok()) return InvalidArgumentError("--client-ca: " + std::string(ca.status().message()));
  StatusOr<secagg::KeyVerifier> verifier = secagg::MakeKeyVerifier(*ca);
  if (!verifier.ok()) return InvalidArgumentError("--client-ca: " + std::string(verifier.status().message()));
  return verifier;
}

}  // namespace

Service::Service(boost::asio::io_context& io, ServiceOptions options)
    : io_(io),
      options_(std::move(options)),
      clock_(SystemClock::Get()),
      pool_(static_cast<size_t>(std::max(1, options_.pool_threads))),
      upload_pool_(static_cast<size_t>(std::max(1, options_.upload_threads))),
      feed_(io.get_executor(), clock_, FeedOptions(options_)),
      shutdown_(io.get_executor()),
      tick_(io.get_executor()),
      readiness_(io.get_executor(), kReadinessMaxAge),
      stored_gauges_(io.get_executor(), kStoredGaugesMaxAge) {}

Service::~Service() {
  ticker_.reset();
  upload_pool_.join();
  pool_.join();
  // The presence seen since the last flush (a crash loses it: workers say hello again after a restart anyway).
  if (store_ == nullptr || sessions_ == nullptr) return;
  const std::vector<storage::WorkerSeen> seen = sessions_->UnstoredPresence();
  Status stored = store_->RecordWorkersSeen(seen);
  if (!stored.ok()) PARSYN_LOG_WARN("worker presence not stored at shutdown: {}", stored.ToString());
}

StatusOr<std::unique_ptr<Service>> Service::Open(boost::asio::io_context& io, ServiceOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(options.data_dir, ec);
  if (ec) return UnavailableError("cannot create data directory " + options.data_dir.string() + ": " + ec.message());
  std::filesystem::permissions(options.data_dir, std::filesystem::perms::owner_all, ec);
  std::unique_ptr<Service> service(new Service(io, std::move(options)));
  const std::filesystem::path dir = service->options_.data_dir;
  PARSYN_ASSIGN_OR_RETURN(
      auto store, storage::OpenMetadataStore(service->options_.metadata_uri.empty() ? (dir / "metadata.db").string()
                                                                                    : service->options_.metadata_uri));
  // Every store call is timed for /metrics (parsyn_store_operation_duration_seconds).
  service->store_ =
      std::make_unique<storage::TimedMetadataStore>(std::move(store), Metrics().store_duration, Metrics().store_errors);
  service->writes_ = std::make_unique<WriteQueue>(io.get_executor(), service->pool_, *service->store_);
  Service* self = service.get();
  service->sessions_ = std::make_unique<WorkerSessions>(
      io.get_executor(), service->clock_, *service->store_, service->pool_,
      [self](int64_t worker_id, const json& fields) {
        self->feed_.NoteWorkerChange(worker_id, self->worker_tokens_.FeedProject(worker_id), fields);
      });
  PARSYN_RETURN_IF_ERROR(service->OpenBlobs());
  if (!service->options_.admin_key_file.empty()) {
    PARSYN_RETURN_IF_ERROR(UseAdminKeyFile(*service->store_, service->options_.admin_key_file));
  } else {
    PARSYN_ASSIGN_OR_RETURN(AdminKeySetup admin, EnsureAdminKey(*service->store_, dir));
    service->new_admin_key_ = admin.new_key;
  }
  if (!service->options_.worker_bootstrap_key_file.empty()) {
    PARSYN_ASSIGN_OR_RETURN(const std::string key, ReadOperatorKeyFile(service->options_.worker_bootstrap_key_file,
                                                                       "--worker-bootstrap-key-file"));
    service->worker_bootstrap_key_hash_ = HashSecret(key);
  }
  if (!service->options_.client_ca_file.empty()) {
    PARSYN_ASSIGN_OR_RETURN(service->secure_key_verifier_, SecureKeyVerifier(service->options_.client_ca_file));
  }
  PARSYN_ASSIGN_OR_RETURN(service->admin_key_hash_, service->store_->GetAdminKeyHash());
  PARSYN_ASSIGN_OR_RETURN(service->signing_secret_, LoadOrCreateSigningSecret(dir));
  if (service->blob_urls_ == nullptr) {
    service->signed_blob_urls_ = std::make_unique<SignedBlobUrls>(
        service->signing_secret_, [self] { return self->options_.public_url; }, service->clock_);
    service->blob_urls_ = service->signed_blob_urls_.get();
  }
  PARSYN_ASSIGN_OR_RETURN(std::string coordinator_id, LeaderElection::NewCoordinatorId());
  PARSYN_ASSIGN_OR_RETURN(Ed25519PrivateKey audit_key, LoadAuditSigningKey(service->options_.audit_key_file, dir));
  service->audit_ = std::make_unique<AuditLog>(*service->store_, service->pool_, io.get_executor(), service->clock_,
                                               std::move(audit_key), "coordinator " + coordinator_id,
                                               service->options_.audit_checkpoint_every);
  // A new leader reads it again when it takes over (PrepareTakeOver).
  PARSYN_RETURN_IF_ERROR(service->audit_->LoadHead());
  service->election_ = service->NewLeaderElection(std::move(coordinator_id));
  // A store no other coordinator shares: this one leads from the start (Start resumes the jobs).
  if (!service->store_->SharedByCoordinators()) service->election_->LeadAlone();
  // On a shared store the leader's workers are not this process's to reset: BecomeLeader does it on takeover.
  PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Worker> workers, service->store_->SharedByCoordinators()
                                                                    ? service->store_->ListWorkers()
                                                                    : ResetWorkerSessions(*service->store_));
  service->worker_tokens_.Reset(workers);
  if (service->options_.oidc) {
    PARSYN_ASSIGN_OR_RETURN(service->oidc_, OidcVerifier::Discover(*service->options_.oidc));
  }
  PARSYN_ASSIGN_OR_RETURN(StoredUserKeys user_keys, LoadUserKeys(*service->store_));
  service->user_keys_.Reset(user_keys);
  return service;
}

Status Service::OpenBlobs() {
  if (options_.blobs_uri.empty()) {
    PARSYN_ASSIGN_OR_RETURN(blobs_, storage::DirectoryBlobStore::Open(options_.data_dir / "blobs"));
    return Status::Ok();
  }
  PARSYN_ASSIGN_OR_RETURN(blobs_, storage::OpenBlobStore(options_.blobs_uri));
  blob_urls_ = blobs_->url_issuer();
  if (blob_urls_ != nullptr) {
    if (options_.blob_url_ttl > blob_urls_->max_ttl()) {
      return InvalidArgumentError("--blob-url-ttl: the blob store's presigned URLs last at most " +
                                  std::to_string(blob_urls_->max_ttl().count()) + " s; it is " +
                                  std::to_string(options_.blob_url_ttl.count()) + " s");
    }
    // Fail at start, not in the middle of a job, when the bucket cannot be reached. A missing probe key is the
    // expected answer; some stores answer 403 for missing keys to callers without ListBucket, which is fine too.
    StatusOr<storage::BlobInfo> probe = blobs_->Head("parsyn-startup-probe");
    if (!probe.ok() && probe.status().code() != StatusCode::kNotFound &&
        probe.status().code() != StatusCode::kPermissionDenied) {
      return probe.status().WithContext("the blob store " + options_.blobs_uri +
                                        " cannot be reached (check --blobs, the endpoint and the credentials)");
    }
  }
  return Status::Ok();
}

std::chrono::seconds Service::TaskUrlTtl(std::chrono::milliseconds attempt_timeout) const {
  std::chrono::seconds ttl = options_.blob_url_ttl;
  if (ttl.count() <= 0) ttl = std::chrono::ceil<std::chrono::seconds>(attempt_timeout) + kTaskUrlMargin;
  return std::min(ttl, blob_urls_->max_ttl());
}

std::string Service::BlobGetUrl(std::string_view key, std::chrono::seconds ttl, int64_t worker_id) const {
  if (signed_blob_urls_ != nullptr) return SignedBlobUrl("GET", key, ttl, worker_id);
  // A store's presigned URLs (S3) cannot name the worker: only their lifetime limits them.
  StatusOr<std::string> url = blob_urls_->GetUrl(key, ttl);
  // Presigning is local and the key and lifetime were checked at start: an error here is a bug.
  if (url.ok()) return *url;
  PARSYN_LOG_ERROR("presigning GET {}: {}", key, url.status().ToString());
  return SignedBlobUrl("GET", key, ttl, worker_id);
}

StatusOr<storage::UrlGrant> Service::BlobPutGrant(std::string_view key, std::chrono::seconds ttl,
                                                  int64_t worker_id) const {
  if (signed_blob_urls_ != nullptr) {
    return storage::UrlGrant{.url = SignedBlobUrl("PUT", key, ttl, worker_id), .headers = {}};
  }
  return blob_urls_->PutGrant(key, ttl);
}

bool Service::WorkerRevoked(int64_t worker_id) const { return worker_tokens_.Revoked(worker_id); }

StatusOr<http::Router> Service::BuildRouter() {
  http::Router router;
  routes_.clear();
  RouteTable routes(
      router, routes_, [this](const http::Request& req) { return AuthenticateUser(req); },
      [this](const http::Request& req) { return AuthenticateWorker(req); }, options_.max_json_bytes, *audit_,
      user_keys_);
  // A standby answers every admin and worker route 503 naming the leader (clients retry there).
  routes.RequireLeader([this] { return LeaderStatus(); });
  const RouteContext context{.store = *store_,
                             .blobs = *blobs_,
                             .pool = pool_,
                             .upload_pool = upload_pool_,
                             .clock = clock_,
                             .spool_dir = spool_dir(),
                             .max_upload_bytes = options_.max_upload_bytes};
  PARSYN_RETURN_IF_ERROR(
      routes.Open(http::Method::kGet, "/healthz", [this](http::Request&) -> http::Awaitable<http::Response> {
        json health = {{"status", "ok"}, {"tls", options_.tls}, {"insecure", options_.insecure}};
        // Connections refused for want of file descriptors (the server logs what to do once a minute).
        const http::AcceptFailures failures = http_server_ ? http_server_->accept_failures() : http::AcceptFailures{};
        health["accept_failures_fd_exhausted"] = failures.fd_exhausted;
        health["last_accept_failure_fd_exhausted_at_ms"] =
            failures.last_fd_exhausted_unix_ms ? json(failures.last_fd_exhausted_unix_ms) : json();
        co_return http::Response::Json(200, health);
      }));
  PARSYN_RETURN_IF_ERROR(
      routes.Open(http::Method::kGet, "/readyz",
                  [this](http::Request&) -> http::Awaitable<http::Response> { co_return co_await Readiness(); }));
  http::Handler metrics = [this](http::Request&) -> http::Awaitable<http::Response> {
    co_return co_await MetricsResponse();
  };
  if (options_.metrics_require_admin) {
    PARSYN_RETURN_IF_ERROR(routes.Admin(http::Method::kGet, "/metrics", std::move(metrics)));
  } else {
    PARSYN_RETURN_IF_ERROR(routes.Open(http::Method::kGet, "/metrics", std::move(metrics)));
  }
  PARSYN_RETURN_IF_ERROR(AddDatasetRoutes(routes, context));
  PARSYN_RETURN_IF_ERROR(AddModelRoutes(routes, context));
  PARSYN_RETURN_IF_ERROR(AddWorkerAdminRoutes(routes, context, *this));
  PARSYN_RETURN_IF_ERROR(AddJobRoutes(routes, context, *this));
  PARSYN_RETURN_IF_ERROR(AddEventRoutes(routes, *this));
  PARSYN_RETURN_IF_ERROR(AddWorkerProtocolRoutes(routes, context, *this));
  PARSYN_RETURN_IF_ERROR(AddSecureAggregationRoutes(routes, *this));
  PARSYN_RETURN_IF_ERROR(AddAuditRoutes(routes, context, *audit_));
  PARSYN_RETURN_IF_ERROR(AddUserRoutes(routes, context, *this));
  PARSYN_RETURN_IF_ERROR(AddProjectRoutes(routes, context, *this));
  PARSYN_RETURN_IF_ERROR(AddBlobRoutes(routes, context, *this, signing_secret_));
  PARSYN_RETURN_IF_ERROR(AddStaticRoutes(router));  // the dashboard; not API routes, so not in routes_
  return router;
}

StatusOr<Caller> Service::AuthenticateUser(const http::Request& req) const {
  std::optional<std::string> session = req.Cookie(kSessionCookie);
  if (session && req.Header("authorization").empty()) {
    const bool changes = req.method != http::Method::kGet && req.method != http::Method::kHead;
    const std::optional<std::string> csrf = req.Cookie(kCsrfCookie);
    if (changes && (!csrf || csrf->empty() || !DigestsEqual(*csrf, req.Header(kCsrfHeader)))) {
      return PermissionDeniedError("a request signed in by the session cookie that changes something needs the " +
                                   std::string(kCsrfHeader) + " header (the " + std::string(kCsrfCookie) +
                                   " cookie's value): the dashboard sends it");
    }
  }
  PARSYN_ASSIGN_OR_RETURN(std::string key, session && req.Header("authorization").empty()
                                               ? StatusOr<std::string>(*session)
                                               : BearerToken(req.Header("authorization")));
  const std::string hash = HashSecret(key);
  if (DigestsEqual(hash, admin_key_hash_)) {
    return Caller{.user_id = 1, .name = "admin", .platform_admin = true, .roles = user_keys_.RolesOf(1)};
  }
  return user_keys_.Authenticate(hash, clock_.UnixMillis());
}

StatusOr<int64_t> Service::AuthenticateWorker(const http::Request& req) const {
  PARSYN_ASSIGN_OR_RETURN(std::string token, BearerToken(req.Header("authorization")));
  const WorkerTokens::Entry* worker = worker_tokens_.Find(HashSecret(token));
  if (worker == nullptr) return UnauthenticatedError("invalid worker token");
  if (worker->revoked) {
    return PermissionDeniedError("worker " + std::to_string(worker->worker_id) + " has been revoked");
  }
  if (options_.require_worker_certificates) {
    PARSYN_RETURN_IF_ERROR(CheckWorkerCertificate(req.client_identity, worker->worker_id));
  }
  return worker->worker_id;
}

Status Service::CheckWorkerBootstrapKey(const http::Request& req) const {
  if (worker_bootstrap_key_hash_.empty()) {
    return NotFoundError("worker bootstrap registration is off: start the server with --worker-bootstrap-key-file");
  }
  PARSYN_ASSIGN_OR_RETURN(const std::string key, BearerToken(req.Header("authorization")));
  if (!DigestsEqual(HashSecret(key), worker_bootstrap_key_hash_)) {
    return UnauthenticatedError("invalid worker bootstrap key");
  }
  return Status::Ok();
}

std::string Service::SignedBlobUrl(std::string_view method, std::string_view key, std::chrono::seconds ttl,
                                   int64_t worker_id) const {
  const int64_t expires = clock_.UnixMillis() / 1000 + ttl.count();
  return coordinator::SignedBlobUrl(signing_secret_, options_.public_url, method, key, expires, worker_id);
}

bool Service::DeliverTask(int64_t worker_id, int64_t job_id, TaskMessage task) {
  return sessions_->DeliverTask(worker_id, job_id, std::move(task));
}

void Service::AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt) {
  sessions_->AbandonTask(worker_id, job_id, round, attempt);
}

void Service::TaskFinished(int64_t worker_id, int64_t job_id) { sessions_->TaskFinished(worker_id, job_id); }

std::vector<int64_t> Service::IdleWorkers() const { return sessions_->IdleWorkers(); }

bool Service::WorkerHasLocalData(int64_t worker_id) const { return sessions_->WorkerHasLocalData(worker_id); }

WorkerCapacity Service::AnnouncedCapacity(int64_t worker_id) const { return sessions_->AnnouncedCapacity(worker_id); }

bool Service::WorkerServesProject(int64_t worker_id, int64_t project_id) const {
  return worker_tokens_.ServesProject(worker_id, project_id);
}

bool Service::WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view model_kind) const {
  return sessions_->WorkerOffersTrainer(worker_id, name, model_kind);
}

JobRunner* Service::FindRunner(int64_t job_id) {
  auto it = runners_.find(job_id);
  return it == runners_.end() ? nullptr : it->second.get();
}

http::Awaitable<void> Service::EndSession(int64_t worker_id, std::string_view why) {
  if (!sessions_->Close(worker_id, why)) co_return;
  std::vector<JobRunner*> runners;
  for (auto& [id, r] : runners_) {
    if (!r->finished()) runners.push_back(r.get());
  }
  for (JobRunner* r : runners) co_await r->WorkerDisconnected(worker_id);
  if (sessions_->Find(worker_id) == nullptr) {
    co_await sessions_->SetWorkerStatus(worker_id, storage::WorkerStatus::kOffline);
  }
}

http::Awaitable<void> Service::OfferWorker(int64_t worker_id) {
  std::vector<JobRunner*> runners;
  for (auto& [id, r] : runners_) {
    if (r->IsEligible(worker_id)) runners.push_back(r.get());
  }
  for (JobRunner* r : runners) {
    const WorkerSessions::Session* s = sessions_->Find(worker_id);
    // One task at a time: stop offering once a job gave the worker something to do.
    if (s == nullptr || !s->queued.empty() || s->current_job) break;
    // The runner may wait for its job's mutex, and an event holding it may give this worker a task meanwhile: the
    // offer is then stale, and passing it on would make the engine drop the worker for "asking for a new task
    // before reporting". The check runs under the job's mutex, right before the engine hears of the offer.
    auto still_idle = [this, worker_id, session_id = s->session_id, assigned = s->tasks_assigned] {
      const WorkerSessions::Session* now = sessions_->Find(worker_id);
      return now != nullptr && now->session_id == session_id && now->tasks_assigned == assigned;
    };
    auto available = r->WorkerAvailable(worker_id, std::move(still_idle));  // kCoAwaitTemporaries
    co_await std::move(available);
  }
}

http::Awaitable<void> Service::LaunchJob(storage::TrainingJob job) {
  const int64_t id = job.id;
  StatusOr<JobSpec> spec = ParseJobSpec(job.spec_json);
  if (!spec.ok()) {
    PARSYN_LOG_ERROR("training job {}: stored spec does not parse: {}", id, spec.status().ToString());
    co_return;
  }
  auto runner = std::make_unique<JobRunner>(*this, std::move(job), std::move(*spec));
  JobRunner* r = runner.get();
  runners_[id] = std::move(runner);
  Status launched = co_await r->Launch();
  if (!launched.ok()) co_return;
  // Workers already waiting for work may join now.
  std::vector<int64_t> idle = IdleWorkers();
  for (int64_t w : idle) co_await OfferWorker(w);
}

http::Awaitable<void> Service::Start() {
  if (store_->SharedByCoordinators()) {
    boost::asio::co_spawn(io_, election_->Run(), boost::asio::detached);
    co_return;
  }
  election_->LeadAlone();
  co_await ResumeJobs();
}

http::Awaitable<void> Service::ResumeJobs() {
  StatusOr<std::vector<storage::TrainingJob>> jobs = co_await loop::Offload(pool_, [&] { return store_->ListJobs(); });
  if (!jobs.ok()) {
    PARSYN_LOG_ERROR("cannot list training jobs to resume: {}", jobs.status().ToString());
  } else {
    for (storage::TrainingJob& job : *jobs) {
      if (job.status == storage::JobStatus::kQueued || job.status == storage::JobStatus::kRunning) {
        auto launch = LaunchJob(std::move(job));  // kCoAwaitTemporaries
        co_await std::move(launch);
      }
    }
  }
  ticker_ = std::make_unique<loop::LoopTicker>(io_.get_executor(), options_.tick_interval,
                                               [this](loop::LoopTicker::TimePoint due) {
                                                 tick_due_ = due;
                                                 tick_.Notify();
                                               });
  boost::asio::co_spawn(io_, TimerLoop(), boost::asio::detached);
}

http::Awaitable<void> Service::CheckpointAuditLog() {
  if (!leader()) co_return;                // a standby writes nothing
  auto checkpoint = audit_->Checkpoint();  // kCoAwaitTemporaries
  co_await std::move(checkpoint);
}

void Service::BeginShutdown() {
  shutting_down_ = true;
  shutdown_.Notify();
  election_->Stop();
  sessions_->WakeAll();
}

http::Awaitable<void> Service::TimerLoop() {
  Clock::TimePoint next_presence_flush = clock_.Now() + options_.presence_flush_interval;
  Clock::TimePoint next_admin_key_read = clock_.Now() + options_.admin_key_refresh_interval;
  Clock::TimePoint next_absence_scan = clock_.Now();
  Clock::TimePoint next_worker_changes = clock_.Now() + options_.event_batch_interval;
  // A silent worker is found within a tenth of the heartbeat timeout, and at most a second late: a scan of 10,000
  // sessions on every tick was ~3% of the loop during a round.
  const auto silent_scan_interval = std::clamp<std::chrono::milliseconds>(
      options_.heartbeat_timeout / 10, options_.tick_interval, std::chrono::seconds(1));
  Clock::TimePoint next_silent_scan = clock_.Now();
  while (!shutting_down_) {
    // Woken by the ticker (tick_interval) or the shutdown; the timeout only guards against a ticker gone quiet.
    std::array<loop::Signal*, 2> wakers{&tick_, &shutdown_};
    auto woken = loop::WaitAny(wakers, 10 * options_.tick_interval);  // kCoAwaitTemporaries
    const int by = co_await std::move(woken);
    if (shutting_down_) break;
    const auto ticked = std::chrono::steady_clock::now();
    if (by == 0) {
      const std::chrono::duration<double> late = ticked - tick_due_;
      Metrics().tick_lateness.WithLabels({}).Observe(std::max(0.0, late.count()));
    }
    // The loop's queue now: what a request read now waits before its handler runs.
    co_await loop::YieldToLoop();
    Metrics().loop_lag.WithLabels({}).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - ticked).count());
    const Clock::TimePoint now = clock_.Now();
    if (now >= next_presence_flush) {
      co_await sessions_->FlushPresence();
      next_presence_flush = now + options_.presence_flush_interval;
    }
    if (now >= next_admin_key_read) {
      auto key_read = RefreshAdminKey(/*as_leader=*/true);  // kCoAwaitTemporaries
      if (Status read = co_await std::move(key_read); !read.ok()) {
        PARSYN_LOG_WARN("re-reading the admin key: {} (the current key stays in use)", read.ToString());
      }
      next_admin_key_read = clock_.Now() + options_.admin_key_refresh_interval;
    }
    if (now >= next_absence_scan) {
      auto scan = RevokeAbsentManagedWorkers();  // kCoAwaitTemporaries
      co_await std::move(scan);
      // A quarter of the absence allowed, between a second and a minute.
      next_absence_scan =
          clock_.Now() + std::clamp<std::chrono::milliseconds>(options_.managed_worker_absence / 4,
                                                               std::chrono::seconds(1), std::chrono::minutes(1));
    }
    if (now >= next_worker_changes) {
      PublishBatches();
      // Counted from the publication (the presence flush above may have taken a while): batches are at least an
      // interval apart.
      next_worker_changes = clock_.Now() + options_.event_batch_interval;
    }
    if (now >= next_silent_scan) {
      next_silent_scan = now + silent_scan_interval;
      const std::vector<int64_t> silent = sessions_->Silent(now, options_.heartbeat_timeout);
      for (int64_t id : silent) co_await EndSession(id, "no heartbeat within the heartbeat timeout");
    }
    std::vector<JobRunner*> due;
    for (auto& [id, r] : runners_) {
      if (r->TickDue()) due.push_back(r.get());
    }
    for (JobRunner* r : due) co_await r->Tick();
  }
}

}  // namespace parsyn::coordinator
