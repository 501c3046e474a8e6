// Service: the coordinator behind `parsyn server` (docs/architecture.md §3). It owns the metadata and blob stores under
// the data directory, one JobRunner per active job, and the HTTP routes (REST API v1, the worker protocol, signed blob
// URLs), and composes the parts of its own concern: the worker sessions (WorkerSessions: presence, task delivery),
// the dashboard's stream (FeedPublisher) and the leader lease (LeaderElection).
//
// Threads: all of the service's state lives on the ONE thread that runs the io_context given to Open (the event
// loop); route handlers and job runners are coroutines there and take no locks. Blocking work (store calls, blob
// I/O, validating and accumulating updates, sharding) runs on the service's small thread pool through loop::Offload()
// and resumes on the loop; uploads stream on a separate pool. Open() itself blocks (it opens the stores) and may
// run before the loop starts.
//
// Durability: every state change is written to the metadata store before the request that caused it is answered;
// on Start() every running job resumes at its last committed round (see JobRunner).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "coordinator/audit_log.h"
#include "coordinator/auth.h"
#include "coordinator/feed_publisher.h"
#include "coordinator/job_host.h"
#include "coordinator/leader_election.h"
#include "coordinator/oidc.h"
#include "coordinator/signed_blob_urls.h"
#include "coordinator/user_keys.h"
#include "coordinator/worker_sessions.h"
#include "http/server.h"
#include "loop/loop_tools.h"
#include "loop/signal.h"
#include "storage/blob_store.h"
#include "storage/blob_urls.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

class JobRunner;

struct ServiceOptions {
  std::filesystem::path data_dir;  // holds metadata.db, blobs/, admin-key, url-signing-secret, spool/
  // The metadata store (storage::OpenMetadataStore): empty for SQLite at data_dir/metadata.db; a path or
  // sqlite:///path.db for SQLite elsewhere; postgres://USER:PASSWORD@HOST:PORT/DATABASE for PostgreSQL.
  std::string metadata_uri;
  // Where blobs live: empty for the directory store under data_dir/blobs; "s3://BUCKET/PREFIX?endpoint=...&region=...
  // &path_style=0|1" for an S3-compatible store (docs/s3.md), whose presigned URLs then go to workers.
  std::string blobs_uri;
  // Base of the signed URLs handed to workers ("http://10.0.0.5:8080"); empty: set later with SetPublicUrl.
  std::string public_url;
  std::chrono::milliseconds heartbeat_interval{5'000};  // asked of workers in hello
  // A worker silent this long is disconnected: found by a scan every tenth of it (tick_interval to 1 s), so up to that
  // much later.
  std::chrono::milliseconds heartbeat_timeout{20'000};
  std::chrono::milliseconds max_poll_wait{30'000};  // the longest a task long-poll is held open
  // A worker's progress in a job is stored at most once per min_progress_interval (sooner reports are answered 429),
  // and at most max_progress_points per job and worker (later reports are shown live but not stored).
  std::chrono::milliseconds min_progress_interval{500};
  int64_t max_progress_points = 10'000;
  // Lifetime of the blob URLs in a task (`parsyn server --blob-url-ttl`); 0: the job's aggregation_timeout plus
  // kTaskUrlMargin. S3 presigned URLs follow it too (capped at the store's 7 days).
  std::chrono::seconds blob_url_ttl{0};
  uint64_t max_upload_bytes = uint64_t{64} << 30;  // datasets and model files
  uint64_t max_json_bytes = 1 << 20;               // JSON request bodies (every route that buffers its body)
  int pool_threads = 4;                            // store calls, blob reads, validation and aggregation
  int upload_threads = 16;  // blob uploads, each holding a thread while it streams (kept off the pool above, so
                            // store writes never queue behind slow uploads); more uploads at once wait for one
  // Round-update uploads (PUT /blobs/...), so one worker cannot hold the upload threads: at most
  // max_uploads_per_worker at once per worker (429 beyond; 0: no cap; one per key in any case, 409 for a second), and
  // a body slower than upload_min_rate bytes/s averaged over upload_rate_window, after upload_rate_grace, is cut off
  // and its partial blob discarded (http::BodyRate; 0: no minimum).
  int max_uploads_per_worker = 2;
  // Worker pods registering themselves (POST /api/v1/workers/bootstrap): at most bootstrap_rate_per_minute
  // registrations a minute (a burst of as many; 429 beyond), and at most max_managed_workers managed workers not
  // revoked (429 beyond). A pod registering again under its name revokes its earlier record. Managed workers not heard
  // from for managed_worker_absence are revoked (0: never), so departed pods do not pile up.
  int bootstrap_rate_per_minute = 60;
  int max_managed_workers = 1000;
  std::chrono::seconds managed_worker_absence{0};
  uint64_t upload_min_rate = 64 << 10;
  std::chrono::milliseconds upload_rate_window{30'000};
  std::chrono::milliseconds upload_rate_grace{10'000};
  std::chrono::milliseconds tick_interval{100};  // timer resolution of timeouts (aggregation; heartbeats: above)
  // Presence (when each worker was last seen) lives in memory; every presence_flush_interval the workers seen since
  // the last flush get their last_heartbeat_at_ms in ONE store commit (and once more at shutdown), so heartbeats
  // cost O(1) commits, not one each. Status changes (online, busy, offline) are stored when they happen.
  std::chrono::milliseconds presence_flush_interval{30'000};
  // How the server is reached, as /healthz reports it: over TLS, or plain HTTP on a non-loopback address that the
  // operator allowed (`parsyn server --insecure`).
  bool tls = false;
  bool insecure = false;
  // Mutual TLS (`parsyn server --client-ca`): worker routes and worker-bound blob URLs need the worker's own client
  // certificate (auth.h, CheckWorkerCertificate).
  bool require_worker_certificates = false;
  // The CA file of the workers' client certificates (with require_worker_certificates): securely aggregated rounds
  // accept only keys signed by their worker's certificate from it (docs/secure-aggregation.md).
  std::filesystem::path client_ca_file;
  // GET /metrics needs the admin key (`parsyn server --metrics-auth admin`); by default it is open, like /healthz.
  bool metrics_require_admin = false;
  // `parsyn server --keep-updates`: a round's updates stay in the blob store after it ends (for audit or debugging);
  // by default they are deleted once the round is committed or fails (JobHost::keep_updates).
  bool keep_updates = false;
  // `parsyn server --admin-key-file`: the admin key is this file's (auth.h UseAdminKeyFile) instead of one created
  // on the first start. Empty: created on the first start.
  std::filesystem::path admin_key_file;
  // The audit log's signing key (`parsyn server --audit-key-file`): this PEM file's Ed25519 private key. Empty: one
  // made on the first start at <data_dir>/audit-signing-key.pem. Its checkpoints sign the chain's head every
  // audit_checkpoint_every records (`--audit-checkpoint-every`) and at shutdown.
  std::filesystem::path audit_key_file;
  int64_t audit_checkpoint_every = 100;
  // Single sign-on (`parsyn server --oidc-issuer ...`; docs/operations.md "Single sign-on"): unset, it is off.
  std::optional<OidcSettings> oidc;
  // How long the API key a sign-in makes lasts (`--session-hours`).
  std::chrono::hours session_lifetime{12};
  // `parsyn server --worker-bootstrap-key-file`: who presents this file's key may register managed workers
  // (POST /api/v1/workers/bootstrap: worker pods that register themselves). Empty: that route answers 404.
  std::filesystem::path worker_bootstrap_key_file;
  // Under mutual TLS with bootstrap on: the managed workers' CA (PEM certificate and key), which signs the certificate
  // signing request ("csr") a worker pod sends with its bootstrap. Empty: bootstraps get no certificate.
  std::filesystem::path managed_ca_cert_file;
  std::filesystem::path managed_ca_key_file;
  // Failover, on a store that several coordinators share (PostgreSQL; docs/operations.md "Failover"): the leader
  // lease lasts this long; the leader renews it every third of it, a standby tries to take it every tenth, so a
  // standby takes over within about 1.1 x this after the leader stopped (`parsyn server --leader-lease-ms`).
  std::chrono::milliseconds leader_lease_ttl{10'000};
  // The leader re-reads the admin key (--admin-key-file, else the store) this often, and at every takeover, so a
  // rotated key reaches every coordinator without a restart (`parsyn server --admin-key-refresh-ms`).
  std::chrono::milliseconds admin_key_refresh_interval{30'000};
  // GET /api/v1/events (EventFeed): the ring keeps at most this many events and bytes of event data; worker changes
  // are sent as one "workers" event per event_batch_interval (never one per heartbeat); worker progress is a sample,
  // at most one per worker per progress_sample_interval and progress_samples_per_second in all.
  size_t event_buffer_events = 4096;
  size_t event_buffer_bytes = size_t{8} << 20;
  std::chrono::milliseconds event_batch_interval{1'000};
  std::chrono::milliseconds progress_sample_interval{5'000};
  int progress_samples_per_second = 20;
};

// A (method, pattern) the service registers; docs/openapi.yaml must describe exactly these.
struct RouteInfo {
  http::Method method;
  std::string pattern;
  // Who may call it (docs/operations.md, "Who may call each route"): "open", "ID token" (a sign-in), "signed URL",
  // "platform_admin", "any user" (the caller's own records), "worker token" or "worker bootstrap key".
  std::string access;
};

class Service final : public JobHost {
 public:
  // Opens (creating on first start) the stores under options.data_dir and the admin key. Blocking.
  // Unavailable / DataLoss / FailedPrecondition from the stores and files, named.
  static StatusOr<std::unique_ptr<Service>> Open(boost::asio::io_context& io, ServiceOptions options);
  ~Service() override;

  // The admin key when it was created by this Open (the first start): print it once.
  const std::optional<std::string>& new_admin_key() const { return new_admin_key_; }
  // Every route of the service. Records them in routes().
  StatusOr<http::Router> BuildRouter();
  const std::vector<RouteInfo>& routes() const { return routes_; }
  void SetPublicUrl(std::string url) { options_.public_url = std::move(url); }
  // The server in front of this service, whose accept failures /healthz reports (none set: reported as 0).
  void SetHttpServer(const http::Server* server) { http_server_ = server; }
  // Call on the loop once the server listens: resumes running jobs, starts the timer. Errors are logged per job.
  http::Awaitable<void> Start();
  // Stops the timer and wakes long-polls so a graceful shutdown completes. On the loop.
  void BeginShutdown();
  // Whether this coordinator is the leader (always, on a store that is not shared); a standby answers API and worker
  // calls 503 naming the leader (LeaderStatus). Loop thread.
  bool leader() const { return election_->leader(); }
  // OK on the leader; Unavailable saying this is a standby and which URL the leader has, when known.
  Status LeaderStatus() const { return election_->LeaderStatus(); }
  // This process's id in the leader lease: host, pid and a random suffix.
  const std::string& coordinator_id() const { return election_->coordinator_id(); }
  // Set by BeginShutdown: long-polls and loops end.
  bool shutting_down() const { return shutting_down_; }
  // Signs the audit log's head (AuditLog::Checkpoint): at shutdown, before BeginShutdown gives the lease up.
  http::Awaitable<void> CheckpointAuditLog();

  // ---- For the coordinator's own routes and job runners (loop thread only). ----
  const ServiceOptions& options() const { return options_; }
  storage::MetadataStore& store() override { return *store_; }
  storage::BlobStore& blobs() override { return *blobs_; }
  // The blob store's own URL issuer (S3 presigning), else the coordinator's signed /blobs URLs. Chosen at Open.
  storage::BlobUrlIssuer& blob_urls() override { return *blob_urls_; }
  std::chrono::seconds TaskUrlTtl(std::chrono::milliseconds attempt_timeout) const override;
  boost::asio::thread_pool& pool() override { return pool_; }
  const Clock& clock() const override { return clock_; }
  boost::asio::any_io_executor executor() override { return io_.get_executor(); }
  // A URL for `method` on blob `key` at /blobs/..., valid for `ttl`, bound to worker_id.
  std::string SignedBlobUrl(std::string_view method, std::string_view key, std::chrono::seconds ttl,
                            int64_t worker_id) const;
  // Where a worker GETs blob `key`: blob_urls()'s URL (e.g. S3 presigned), else SignedBlobUrl("GET", key, ...).
  std::string BlobGetUrl(std::string_view key, std::chrono::seconds ttl, int64_t worker_id) const override;
  StatusOr<storage::UrlGrant> BlobPutGrant(std::string_view key, std::chrono::seconds ttl,
                                           int64_t worker_id) const override;
  // True once worker `worker_id` is revoked (unknown ids too): its bound blob URLs are refused.
  bool WorkerRevoked(int64_t worker_id) const;
  // Temporary local copies of blobs from stores without local files (LocalBlobCopy).
  std::filesystem::path spool_dir() const override { return options_.data_dir / "spool"; }
  bool keep_updates() const override { return options_.keep_updates; }
  // Appends a job event to the store (one write of the next batch) and wakes the job's event streams. Errors are
  // logged, not returned: events describe changes already stored.
  http::Awaitable<void> AppendEvent(int64_t job_id, std::string type, nlohmann::json payload) override;
  WriteQueue::TicketPtr QueueJobWrites(int64_t job_id, std::vector<storage::BatchWrite> records,
                                       std::vector<QueuedEvent> events) override;
  loop::Signal& EventSignal(int64_t job_id);
  // The dashboard's stream across jobs (GET /api/v1/events): events, worker changes, job summaries.
  FeedPublisher& feed_publisher() { return feed_; }
  // The worker sessions (the worker protocol's routes open, refresh and read them).
  WorkerSessions& sessions() { return *sessions_; }
  // The task delivery of the job runners (JobHost), by the worker sessions (WorkerSessions says what each does).
  bool DeliverTask(int64_t worker_id, int64_t job_id, TaskMessage task) override;
  void AbandonTask(int64_t worker_id, int64_t job_id, int round, int attempt) override;
  void TaskFinished(int64_t worker_id, int64_t job_id) override;
  std::vector<int64_t> IdleWorkers() const override;
  bool WorkerHasLocalData(int64_t worker_id) const override;
  bool WorkerOffersTrainer(int64_t worker_id, std::string_view name, std::string_view model_kind) const override;
  bool WorkerServesProject(int64_t worker_id, int64_t project_id) const override;
  WorkerCapacity AnnouncedCapacity(int64_t worker_id) const override;
  const secagg::KeyVerifier& secure_key_verifier() const override { return secure_key_verifier_; }
  JobRunner* FindRunner(int64_t job_id);
  // Starts a runner for a stored job (queued: set up and start round 1; running: resume). On the loop.
  http::Awaitable<void> LaunchJob(storage::TrainingJob job);
  // Ends a worker's session (goodbye, missed heartbeats, a new hello) and tells every job.
  http::Awaitable<void> EndSession(int64_t worker_id, std::string_view why);
  // Offers an idle worker to the jobs it is eligible for, until one gives it a task.
  http::Awaitable<void> OfferWorker(int64_t worker_id);
  // Revokes worker `id`: its record is kept (jobs and rounds refer to it), its token refused from now on, its session
  // ended with `why`. Returns the revoked record.
  http::Awaitable<StatusOr<storage::Worker>> RevokeWorker(int64_t id, std::string why);
  // A newly registered worker's token is accepted from now on.
  void AddWorkerToken(const storage::Worker& worker) { worker_tokens_.Add(worker); }
  // The users and keys every request is checked against (user_routes.cc changes them with the store).
  UserKeys& user_keys() { return user_keys_; }
  const WorkerTokens& worker_tokens() const { return worker_tokens_; }
  // The provider's ID-token checks when single sign-on is on; null otherwise.
  OidcVerifier* oidc() { return oidc_.get(); }
  // The operator's worker bootstrap key (POST /api/v1/workers/bootstrap): NotFound when bootstrap registration is
  // off, Unauthenticated for another key.
  Status CheckWorkerBootstrapKey(const http::Request& req) const;

 private:
  Service(boost::asio::io_context& io, ServiceOptions options);

  // Opens the blob store named by options_.blobs_uri (checking that a store issuing its own URLs, S3, answers).
  Status OpenBlobs();

  // GET /readyz: whether the metadata and blob stores answer (200), or which does not (503, with a short reason;
  // the details go to the log). The stores are probed at most once a second (kReadinessMaxAge): the route is open,
  // and each probe is a store read and a blob write and delete (billed requests on S3).
  http::Awaitable<http::Response> Readiness();
  // GET /metrics: the Prometheus exposition. The gauges of stored state (jobs by status, workers' kinds) are read
  // from the store at most once every 5 s (kStoredGaugesMaxAge); the sessions' gauges are computed now.
  http::Awaitable<http::Response> MetricsResponse();

  // Authentication of user and worker requests.
  // Who the request's key names: the admin key is user 1 ("admin"); else a user's API key (UserKeys).
  StatusOr<Caller> AuthenticateUser(const http::Request& req) const;
  StatusOr<int64_t> AuthenticateWorker(const http::Request& req) const;
  http::Awaitable<void> TimerLoop();
  // The leader election on this service's store, pool and options; takeover as below. Made by Open.
  std::unique_ptr<LeaderElection> NewLeaderElection(std::string coordinator_id);
  // Taking over as the leader (LeaderElection::TakeOver's prepare): reloads the worker tokens (the old leader may have
  // registered or revoked some) and the admin key (it may have been rotated) and marks every worker offline, before
  // calls are let in and the jobs resume. Retried; the store's error after three tries (the election then gives the
  // lease back and stays a standby, and tries again later).
  http::Awaitable<Status> PrepareTakeOver();
  // Re-reads the admin key: from --admin-key-file when set (as_leader: storing its hash when it changed), else from
  // the store; a changed key replaces admin_key_hash_ at once. At takeover and every admin_key_refresh_interval.
  http::Awaitable<Status> RefreshAdminKey(bool as_leader);
  // Revokes the managed workers not heard from for ServiceOptions::managed_worker_absence (the leader's timer).
  http::Awaitable<void> RevokeAbsentManagedWorkers();
  // Sessions do not survive a restart or a change of leader: marks every worker offline. Returns every worker.
  static StatusOr<std::vector<storage::Worker>> ResetWorkerSessions(storage::MetadataStore& store);
  // Every queued or running job gets a runner (running ones resume at their last committed round); starts the timer.
  http::Awaitable<void> ResumeJobs();
  // Sends the dashboard's batches (FeedPublisher::PublishBatches) with the live summaries of the running jobs.
  void PublishBatches();

  boost::asio::io_context& io_;
  ServiceOptions options_;
  secagg::KeyVerifier secure_key_verifier_;  // from options_.client_ca_file; null without mutual TLS
  const Clock& clock_;
  boost::asio::thread_pool pool_;
  // Streamed uploads only (the routes' RouteContext): its threads block on the network as much as on the disk.
  boost::asio::thread_pool upload_pool_;
  std::unique_ptr<storage::MetadataStore> store_;
  std::unique_ptr<WriteQueue> writes_;  // group commit of job writes and events (made once store_ is open)
  std::unique_ptr<AuditLog> audit_;     // made once store_ is open
  std::unique_ptr<storage::BlobStore> blobs_;
  std::string admin_key_hash_;
  std::string worker_bootstrap_key_hash_;  // empty: bootstrap registration is off
  std::string signing_secret_;
  std::unique_ptr<SignedBlobUrls> signed_blob_urls_;  // when the store issues no URLs of its own
  storage::BlobUrlIssuer* blob_urls_ = nullptr;
  std::optional<std::string> new_admin_key_;
  const http::Server* http_server_ = nullptr;
  std::vector<RouteInfo> routes_;
  WorkerTokens worker_tokens_;
  std::unique_ptr<OidcVerifier> oidc_;  // ServiceOptions::oidc, discovered by Open
  UserKeys user_keys_;                  // loaded by Open and at every takeover; changed by the user routes
  FeedPublisher feed_;
  std::unique_ptr<WorkerSessions> sessions_;  // made by Open, once store_ is open
  std::map<int64_t, std::unique_ptr<JobRunner>> runners_;
  std::map<int64_t, std::unique_ptr<loop::Signal>> event_signals_;
  loop::Signal shutdown_;
  bool shutting_down_ = false;
  // The timer's tick (TimerLoop), posted by a thread of its own rather than an Asio timer (loop::LoopTicker: a timer's
  // expiry came seconds late on a busy loop). Made when the jobs resume; stopped first on destruction.
  loop::Signal tick_;
  loop::LoopTicker::TimePoint tick_due_{};
  std::unique_ptr<loop::LoopTicker> ticker_;
  std::unique_ptr<LeaderElection> election_;  // made by Open, once store_ is open
  // What the stores answered /readyz's probes: each problem's short reason ({} when ready).
  loop::SharedForAWhile<nlohmann::json> readiness_;
  // The stored state behind /metrics' gauges: jobs per status, and each worker's kind.
  struct StoredGauges {
    std::map<storage::JobStatus, int64_t> jobs;
    std::map<int64_t, storage::WorkerKind> worker_kinds;
  };
  loop::SharedForAWhile<StatusOr<StoredGauges>> stored_gauges_;
};

}  // namespace parsyn::coordinator
