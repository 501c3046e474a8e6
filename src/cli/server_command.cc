// parsyn server: runs the coordinator (src/coordinator/service.h) on one event-loop thread until SIGINT/SIGTERM,
// then shuts down gracefully. On the first start it prints the admin API key once to a terminal (it is always in
// <data-dir>/admin-key, mode 0600); it writes <data-dir>/server.json with its URL so the local CLI finds it.
// With --managed-workers N it also runs N local managed workers (cli/managed_workers.h): stopped first on shutdown,
// so they say goodbye while the server still answers.
// Transport: plain HTTP only on a loopback --listen unless --insecure (then a warning and /healthz "insecure": true);
// --tls-cert/--tls-key for HTTPS; --client-ca for mutual TLS on the worker and blob routes (docs/operations.md).
#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <unistd.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <boost/asio/steady_timer.hpp>

#include "base/atomic_file.h"
#include "base/fd_limit.h"
#include "base/log.h"
#include "base/log_format.h"
#include "base/subprocess.h"
#include "cli/coordinator_commands.h"
#include "cli/managed_workers.h"
#include "cli/remote.h"
#include "coordinator/server_metrics.h"
#include "coordinator/service.h"
#include "http/server.h"

namespace parsyn::cli {
namespace {

struct ServerFlags {
  std::string data_dir;
  std::string metadata;  // "" (SQLite in the data dir), a path or sqlite:///path.db, or postgres://...
  std::string listen = "127.0.0.1:8080";
  std::string tls_cert;
  std::string tls_key;
  std::string client_ca;
  bool insecure = false;
  std::string public_url;
  int64_t heartbeat_interval_ms = 5'000;
  int64_t heartbeat_timeout_ms = 20'000;
  int64_t blob_url_ttl_s = 0;  // 0: each job's aggregation_timeout plus 5 minutes
  int64_t max_poll_wait_ms = 30'000;
  int64_t progress_interval_ms = 500;
  int64_t max_progress_points = 10'000;
  bool keep_updates = false;
  int threads = 4;
  // Limits (docs/operations.md "Limits"); defaults are ServerOptions' and ServiceOptions'.
  uint32_t max_connections = http::ServerOptions{}.max_connections;
  uint32_t max_connections_per_address = http::ServerOptions{}.max_connections_per_address;
  uint64_t max_json_bytes = coordinator::ServiceOptions{}.max_json_bytes;
  int max_uploads_per_worker = coordinator::ServiceOptions{}.max_uploads_per_worker;
  int bootstrap_rate = coordinator::ServiceOptions{}.bootstrap_rate_per_minute;
  int max_managed_workers = coordinator::ServiceOptions{}.max_managed_workers;
  int64_t managed_worker_absence_s = 0;
  uint64_t upload_min_rate = coordinator::ServiceOptions{}.upload_min_rate;
  int64_t upload_rate_window_ms = coordinator::ServiceOptions{}.upload_rate_window.count();
  int64_t upload_rate_grace_ms = coordinator::ServiceOptions{}.upload_rate_grace.count();
  std::string log_level;
  std::string log_format = "text";
  std::string metrics_auth = "none";
  int managed_workers = 0;
  std::string managed_worker_device = "cpu";
  std::string blobs;  // "" (the data dir's blobs/), a directory, or s3://BUCKET/PREFIX
  std::string s3_endpoint;
  std::string s3_region;
  std::string s3_path_style;  // "", "0" or "1"
  std::string admin_key_file;
  std::string worker_bootstrap_key_file;
  std::string audit_key_file;
  std::string oidc_issuer;
  std::string oidc_client_id;
  std::string oidc_roles_claim = "groups";
  std::vector<std::string> oidc_admin_groups;
  std::string oidc_ca_file;
  int64_t session_hours = 12;
  int64_t audit_checkpoint_every = coordinator::ServiceOptions{}.audit_checkpoint_every;
  int64_t leader_lease_ms = coordinator::ServiceOptions{}.leader_lease_ttl.count();
  int64_t admin_key_refresh_ms = coordinator::ServiceOptions{}.admin_key_refresh_interval.count();
};

// The blob store URI from --blobs and the --s3-* flags (folded into the s3:// URI's query, docs/s3.md).
StatusOr<std::string> BlobsUri(const ServerFlags& f) {
  const bool s3_flags = !f.s3_endpoint.empty() || !f.s3_region.empty() || !f.s3_path_style.empty();
  if (!f.blobs.starts_with("s3://")) {
    if (s3_flags) {
      return InvalidArgumentError("--s3-endpoint, --s3-region and --s3-path-style need --blobs s3://BUCKET/PREFIX");
    }
    return f.blobs;
  }
  std::string uri = f.blobs;
  auto add = [&uri](std::string_view name, const std::string& value) {
    if (value.empty()) return;
    uri += uri.find('?') == std::string::npos ? '?' : '&';
    uri += std::string(name) + "=" + value;  // URL-safe: http(s)://host:port, a region, 0/1
  };
  add("endpoint", f.s3_endpoint);
  add("region", f.s3_region);
  add("path_style", f.s3_path_style);
  return uri;
}

// The files' contents one after the other (a PEM bundle), each ending in a newline.
StatusOr<std::string> ConcatenateFiles(const std::vector<std::filesystem::path>& files) {
  std::string all;
  for (const std::filesystem::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) return InvalidArgumentError("cannot read " + file.string());
    if (text.empty()) return InvalidArgumentError(file.string() + " is empty or cannot be read");
    all += text;
    if (all.back() != '\n') all += '\n';
  }
  return all;
}

std::string HostOf(const std::string& listen) {
  size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::" || host == "[::]") return "[::1]";
  return host;
}

// The transport rules of the flags: TLS flags go together, and plain HTTP beyond this machine needs --insecure,
// because the admin key and worker tokens travel in headers. Returns the message to print, or "" when they hold.
std::string CheckTransportFlags(const ServerFlags& f) {
  if (f.tls_cert.empty() != f.tls_key.empty()) return "--tls-cert and --tls-key go together";
  const bool tls = !f.tls_cert.empty();
  if (!f.client_ca.empty() && !tls) {
    return "--client-ca needs --tls-cert and --tls-key: client certificates exist only over TLS";
  }
  if (f.insecure && tls) return "--insecure allows plain HTTP; it makes no sense with --tls-cert";
  StatusOr<bool> loopback = http::IsLoopbackListenAddress(f.listen);
  if (!loopback.ok()) return "--listen: " + loopback.status().message();
  if (!*loopback && !tls && !f.insecure) {
    return "refusing to serve plain HTTP on " + f.listen +
           ", which is reachable from other machines: the admin key and worker tokens would cross the network "
           "unencrypted. Give --tls-cert and --tls-key (docs/operations.md, \"TLS\"), listen on 127.0.0.1 behind a "
           "TLS-terminating proxy, or pass --insecure to accept the risk (a trusted network only)";
  }
  return "";
}

// The service's options from the flags (`tls`, `insecure`: as RunServer decided them).
StatusOr<coordinator::ServiceOptions> ServiceOptionsFrom(const ServerFlags& f, bool tls, bool insecure) {
  coordinator::ServiceOptions options;
  options.data_dir = f.data_dir.empty() ? DefaultDataDir() : f.data_dir;
  options.metadata_uri = f.metadata;
  options.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_interval_ms);
  options.heartbeat_timeout = std::chrono::milliseconds(f.heartbeat_timeout_ms);
  options.max_poll_wait = std::chrono::milliseconds(f.max_poll_wait_ms);
  options.min_progress_interval = std::chrono::milliseconds(f.progress_interval_ms);
  options.max_progress_points = f.max_progress_points;
  options.keep_updates = f.keep_updates;
  options.blob_url_ttl = std::chrono::seconds(f.blob_url_ttl_s);
  options.pool_threads = f.threads;
  options.max_json_bytes = f.max_json_bytes;
  options.max_uploads_per_worker = f.max_uploads_per_worker;
  options.bootstrap_rate_per_minute = f.bootstrap_rate;
  options.max_managed_workers = f.max_managed_workers;
  options.managed_worker_absence = std::chrono::seconds(f.managed_worker_absence_s);
  options.upload_min_rate = f.upload_min_rate;
  options.upload_rate_window = std::chrono::milliseconds(f.upload_rate_window_ms);
  options.upload_rate_grace = std::chrono::milliseconds(f.upload_rate_grace_ms);
  PARSYN_ASSIGN_OR_RETURN(options.blobs_uri, BlobsUri(f));
  options.tls = tls;
  options.insecure = insecure;
  options.require_worker_certificates = !f.client_ca.empty();
  options.metrics_require_admin = f.metrics_auth == "admin";
  options.admin_key_file = f.admin_key_file;
  options.worker_bootstrap_key_file = f.worker_bootstrap_key_file;
  options.audit_key_file = f.audit_key_file;
  if (f.oidc_issuer.empty() != f.oidc_client_id.empty()) {
    return InvalidArgumentError(
        "--oidc-issuer and --oidc-client-id go together (the provider, and this "
        "coordinator's client id there)");
  }
  if (!f.oidc_issuer.empty()) {
    options.oidc = coordinator::OidcSettings{.issuer = f.oidc_issuer,
                                             .client_id = f.oidc_client_id,
                                             .roles_claim = f.oidc_roles_claim,
                                             .admin_groups = f.oidc_admin_groups,
                                             .ca_file = f.oidc_ca_file};
  }
  options.session_lifetime = std::chrono::hours(f.session_hours);
  options.audit_checkpoint_every = f.audit_checkpoint_every;
  options.leader_lease_ttl = std::chrono::milliseconds(f.leader_lease_ms);
  options.admin_key_refresh_interval = std::chrono::milliseconds(f.admin_key_refresh_ms);
  return options;
}

// The CA file the server checks client certificates against. Managed workers under mutual TLS get certificates from
// their own CA, which the server trusts besides --client-ca (one bundle file, since the server takes one). Worker pods
// bootstrapping under mutual TLS get theirs from the same CA, for the key of the request they send. Gives each of
// `managed` its certificate.
StatusOr<std::filesystem::path> ClientCaFile(const ServerFlags& f, std::vector<ManagedWorkerIdentity>& managed,
                                             coordinator::ServiceOptions& options) {
  if ((managed.empty() && f.worker_bootstrap_key_file.empty()) || f.client_ca.empty()) {
    return std::filesystem::path(f.client_ca);
  }
  PARSYN_ASSIGN_OR_RETURN(std::filesystem::path managed_ca, EnsureManagedWorkerCertificates(options.data_dir, managed));
  if (!f.worker_bootstrap_key_file.empty()) {
    options.managed_ca_cert_file = managed_ca;
    options.managed_ca_key_file = managed_ca.parent_path() / "ca.key";
  }
  PARSYN_ASSIGN_OR_RETURN(std::string bundle, ConcatenateFiles({f.client_ca, managed_ca}));
  std::filesystem::path bundle_file = options.data_dir / "client-ca-bundle.pem";
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(bundle_file, bundle, 0644));
  return bundle_file;
}

// About two descriptors per connected worker: the default soft limit (often 1024) would cap the server far below
// what the system allows.
void RaiseAndLogOpenFilesLimit() {
  if (StatusOr<OpenFilesLimit> fds = RaiseOpenFilesLimit(); !fds.ok()) {
    PARSYN_LOG_WARN("{}", fds.status().ToString());
  } else if (fds->after != fds->before) {
    PARSYN_LOG_INFO("open-files limit raised from {} to {} (the hard limit)", fds->before, fds->after);
  } else {
    PARSYN_LOG_INFO("open-files limit {} (hard {})", fds->after, fds->hard);
  }
}

// Writes server.json (where the local CLI finds the server) and says where a new admin key is.
void AnnounceServer(const ServerFlags& f, const std::filesystem::path& data_dir, const std::string& base,
                    const std::optional<std::string>& new_admin_key) {
  const bool tls = !f.tls_cert.empty();
  {
    // Over TLS the local CLI reaches the server at the name its certificate is for (--public-url, when set), and
    // trusts the certificate file (ca_file), like the managed workers.
    nlohmann::json info_json{{"url", tls && !f.public_url.empty() ? f.public_url : base}};
    if (tls) info_json["ca_file"] = std::filesystem::absolute(f.tls_cert).string();
    std::ofstream info(data_dir / "server.json", std::ios::trunc);
    info << info_json.dump() << "\n";
  }
  if (new_admin_key) {
    // Shown only to a person at a terminal: a pipe or file (a container's log, a service manager's journal) would keep
    // the key wherever those logs go.
    const std::string file = (data_dir / "admin-key").string();
    if (::isatty(STDOUT_FILENO) != 0) {
      std::cout << "admin API key (shown once; also in " << file << "): " << *new_admin_key << "\n";
    } else {
      std::cout << "admin API key written to " << file << " (mode 0600; not printed: stdout is not a terminal)\n";
    }
  }
  std::cout << "parsyn server listening on " << base << std::endl;
}

// Starts the managed workers' supervisor (none when `managed` is empty).
StatusOr<std::unique_ptr<ManagedWorkerSupervisor>> SuperviseManagedWorkers(const ServerFlags& f,
                                                                           const std::string& base,
                                                                           std::vector<ManagedWorkerIdentity> managed) {
  if (managed.empty()) return std::unique_ptr<ManagedWorkerSupervisor>();
  PARSYN_ASSIGN_OR_RETURN(std::filesystem::path self, SelfExecutablePath());
  // Workers on this machine reach the server at the address it listens on, whatever --public-url says; over TLS
  // at the public URL when there is one, the name the certificate is for (managed_workers.h).
  SupervisorOptions supervision{.program = self, .server_url = base, .device = f.managed_worker_device};
  if (!f.tls_cert.empty()) {
    if (!f.public_url.empty()) supervision.server_url = f.public_url;
    supervision.ca_file = std::filesystem::absolute(f.tls_cert);
  }
  auto supervisor = std::make_unique<ManagedWorkerSupervisor>(supervision, std::move(managed));
  supervisor->Start();
  return supervisor;
}

// On SIGINT or SIGTERM: managed workers stop first (bounded), while the server still answers their goodbye; then the
// service and the server shut down. No io.stop(): once the server has closed its connections and the service its
// timer and long-polls, the loop runs out of work and run() returns with every coroutine finished, so nothing
// outlives what it uses.
void ShutDownOnSignal(boost::asio::signal_set& signals, coordinator::Service* svc, http::Server* srv,
                      ManagedWorkerSupervisor* workers) {
  signals.async_wait([loop = signals.get_executor(), svc, srv, workers](const boost::system::error_code& ec, int) {
    if (ec) return;
    PARSYN_LOG_INFO("shutting down");
    boost::asio::co_spawn(
        loop,
        [svc, srv, workers]() -> http::Awaitable<void> {
          if (workers != nullptr) {
            workers->RequestStop();
            boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (!workers->AllExited() && std::chrono::steady_clock::now() < deadline) {
              timer.expires_after(std::chrono::milliseconds(100));
              co_await timer.async_wait(boost::asio::use_awaitable);
            }
          }
          // While still the leader: the audit log's last records get their signature.
          auto checkpoint = svc->CheckpointAuditLog();  // kCoAwaitTemporaries
          co_await std::move(checkpoint);
          svc->BeginShutdown();
          co_await srv->Shutdown(std::chrono::seconds(5));
        },
        boost::asio::detached);
  });
}

int RunServer(const ServerFlags& f) {
  if (!f.log_level.empty()) log::Init(f.log_level);
  log::SetFormat(f.log_format);  // checked by the flag's parser
  if (std::string problem = CheckTransportFlags(f); !problem.empty()) {
    std::cerr << "parsyn server: " << problem << "\n";
    return 2;
  }
  const bool tls = !f.tls_cert.empty();
  // Plain HTTP that other machines reach: only with --insecure (checked above), and then said loudly.
  const StatusOr<bool> loopback = http::IsLoopbackListenAddress(f.listen);
  const bool insecure = !tls && !(loopback.ok() && *loopback);
  if (insecure) {
    std::cerr << "parsyn server: WARNING: --insecure: serving plain HTTP on " << f.listen
              << "; API keys, worker tokens, weights and data cross the network unencrypted\n";
    PARSYN_LOG_WARN("serving plain HTTP on {} (--insecure): credentials and data are not encrypted", f.listen);
  }
  boost::asio::io_context io;
  StatusOr<coordinator::ServiceOptions> options = ServiceOptionsFrom(f, tls, insecure);
  if (!options.ok()) return Fail("server", options.status());
  // Before the coordinator opens the store, so it loads the managed workers' tokens.
  std::vector<ManagedWorkerIdentity> managed;
  if (f.managed_workers > 0) {
    StatusOr<std::vector<ManagedWorkerIdentity>> ensured =
        EnsureManagedWorkers(options->data_dir, f.managed_workers, options->metadata_uri);
    if (!ensured.ok()) return Fail("server", ensured.status());
    managed = std::move(*ensured);
  }
  StatusOr<std::filesystem::path> tls_client_ca = ClientCaFile(f, managed, *options);
  if (!tls_client_ca.ok()) return Fail("server", tls_client_ca.status());
  options->client_ca_file = *tls_client_ca;
  RaiseAndLogOpenFilesLimit();
  StatusOr<std::unique_ptr<coordinator::Service>> service = coordinator::Service::Open(io, *options);
  if (!service.ok()) return Fail("server", service.status());
  StatusOr<http::Router> router = (*service)->BuildRouter();
  if (!router.ok()) return Fail("server", router.status());

  http::ServerOptions server_options;
  server_options.listen = f.listen;
  server_options.tls_cert_file = f.tls_cert;
  server_options.tls_key_file = f.tls_key;
  server_options.max_connections = f.max_connections;
  server_options.max_connections_per_address = f.max_connections_per_address;
  server_options.tls_client_ca = *tls_client_ca;
  server_options.on_request = coordinator::RecordRequest;  // access log and HTTP metrics
  StatusOr<std::unique_ptr<http::Server>> server = http::Server::Start(io, server_options, std::move(*router));
  if (!server.ok()) return Fail("server", server.status());
  const std::string url = (*server)->tls() ? "https://" : "http://";
  const std::string base = url + HostOf(f.listen) + ":" + std::to_string((*server)->port());
  (*service)->SetPublicUrl(f.public_url.empty() ? base : f.public_url);
  (*service)->SetHttpServer(server->get());
  AnnounceServer(f, options->data_dir, base, (*service)->new_admin_key());

  StatusOr<std::unique_ptr<ManagedWorkerSupervisor>> supervisor = SuperviseManagedWorkers(f, base, std::move(managed));
  if (!supervisor.ok()) return Fail("server", supervisor.status());
  boost::asio::co_spawn(io, (*service)->Start(), boost::asio::detached);
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  ShutDownOnSignal(signals, service->get(), server->get(), supervisor->get());
  io.run();
  if (*supervisor) (*supervisor)->Stop(std::chrono::seconds(1));  // joins; kills a worker that outlived the wait above
  return 0;
}

// The flags of where the metadata lives and where and how the server listens.
void AddMetadataAndListenFlags(CLI::App* cmd, ServerFlags& f) {
  cmd->add_option("--data-dir", f.data_dir,
                  "where the metadata database and blobs live "
                  "(default: $PARSYN_DATA_DIR or ./parsyn-data)");
  cmd->add_option("--metadata", f.metadata,
                  "the metadata store: a SQLite file (a path or sqlite:///path.db) or PostgreSQL "
                  "(postgres://USER:PASSWORD@HOST:PORT/DATABASE; docs/operations.md). Default: <data-dir>/metadata.db")
      ->envname("PARSYN_METADATA");
  cmd->add_option("--listen", f.listen, "host:port to listen on (port 0 picks a free one)")->capture_default_str();
  cmd->add_option("--tls-cert", f.tls_cert, "PEM certificate chain: serve HTTPS only");
  cmd->add_option("--tls-key", f.tls_key, "PEM private key for --tls-cert");
  cmd->add_option("--client-ca", f.client_ca,
                  "PEM CA certificate(s): workers must present a client certificate signed by it, naming their own "
                  "worker (CN worker-<id>), on the worker and blob routes (mutual TLS; needs --tls-cert)");
  cmd->add_flag("--insecure", f.insecure,
                "allow plain HTTP on a non-loopback --listen address (credentials travel unencrypted)");
  cmd->add_option("--public-url", f.public_url, "base URL workers reach this server at (signed blob URLs)");
}

// The flags of what the server asks of workers (heartbeats, polls, progress reports) and keeps of rounds.
void AddWorkerProtocolFlags(CLI::App* cmd, ServerFlags& f) {
  cmd->add_option("--heartbeat-interval-ms", f.heartbeat_interval_ms, "heartbeat period asked of workers")
      ->capture_default_str();
  cmd->add_option("--heartbeat-timeout-ms", f.heartbeat_timeout_ms, "a worker silent this long is disconnected")
      ->capture_default_str();
  cmd->add_option("--max-poll-wait-ms", f.max_poll_wait_ms, "longest task long-poll")->capture_default_str();
  cmd->add_option("--progress-interval-ms", f.progress_interval_ms,
                  "a worker's progress in a job is stored at most once per this (sooner reports get 429)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-progress-points", f.max_progress_points,
                  "progress points stored per job and worker; later reports are shown live, not stored")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--keep-updates", f.keep_updates,
                "keep every round's updates in the blob store (for audit or debugging); by default a round's updates "
                "are deleted once it is committed or fails");
  cmd->add_option("--blob-url-ttl", f.blob_url_ttl_s,
                  "seconds the blob URLs in a task stay valid (default 0: the job's aggregation_timeout + 5 min)")
      ->check(CLI::NonNegativeNumber);
}

// The flags that bound the server's load: threads, connections, request sizes, bootstraps and uploads.
void AddLimitFlags(CLI::App* cmd, ServerFlags& f) {
  cmd->add_option("--threads", f.threads, "worker-pool threads for storage and aggregation")->capture_default_str();
  cmd->add_option("--max-connections", f.max_connections,
                  "connections open at once; more are answered 503 with Retry-After (0: no cap)")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-address", f.max_connections_per_address,
                  "connections open at once from one peer IP address; more are answered 429 (0: no cap)")
      ->capture_default_str();
  cmd->add_option("--max-json-bytes", f.max_json_bytes, "largest JSON request body; larger ones get 413")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--bootstrap-rate", f.bootstrap_rate,
                  "worker bootstraps (POST /api/v1/workers/bootstrap) allowed a minute, in a burst of as many; more "
                  "get 429 (0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-managed-workers", f.max_managed_workers,
                  "managed workers (not revoked) a bootstrap may bring the total to; more get 429 (0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--managed-worker-absence-s", f.managed_worker_absence_s,
                  "revoke managed workers not heard from for this long, e.g. 86400 for departed worker pods (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-uploads-per-worker", f.max_uploads_per_worker,
                  "round-update uploads one worker may stream at once; more get 429 (0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--upload-min-rate", f.upload_min_rate,
                  "bytes/s a round-update upload must keep up, averaged over --upload-rate-window-ms after "
                  "--upload-rate-grace-ms; slower ones are cut off (0: no minimum)")
      ->capture_default_str();
  cmd->add_option("--upload-rate-window-ms", f.upload_rate_window_ms, "window of --upload-min-rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--upload-rate-grace-ms", f.upload_rate_grace_ms,
                  "time an upload has before --upload-min-rate applies")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace

void AddServerCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ServerFlags>();
  CLI::App* cmd = app.add_subcommand("server", "run the coordinator (REST API, worker protocol, rounds)");
  AddMetadataAndListenFlags(cmd, *flags);
  AddWorkerProtocolFlags(cmd, *flags);
  AddLimitFlags(cmd, *flags);
  cmd->add_option("--log-level", flags->log_level, "debug, info, warn or error");
  cmd->add_option("--log-format", flags->log_format, "text, or json: one JSON object a line (UTC times)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--metrics-auth", flags->metrics_auth,
                  "GET /metrics: none (open, like /healthz) or admin (needs the admin key as a bearer token)")
      ->check(CLI::IsMember({"none", "admin"}))
      ->capture_default_str();
  cmd->add_option("--managed-workers", flags->managed_workers,
                  "run and supervise this many local managed workers (managed-1..N; restarted when they exit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd->add_option("--managed-worker-device", flags->managed_worker_device, "--device of the managed workers")
      ->capture_default_str();
  cmd->add_option("--blobs", flags->blobs,
                  "where blobs live: a directory, or s3://BUCKET/PREFIX for S3 and S3-compatible stores (credentials "
                  "from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials; docs/s3.md). "
                  "Default: <data-dir>/blobs")
      ->envname("PARSYN_BLOBS");
  cmd->add_option("--s3-endpoint", flags->s3_endpoint,
                  "S3 endpoint, http(s)://HOST[:PORT] (MinIO, Ceph, R2, ...); default: AWS for the region");
  cmd->add_option("--s3-region", flags->s3_region, "S3 region (default: AWS_REGION, else us-east-1)");
  cmd->add_option("--s3-path-style", flags->s3_path_style,
                  "1: path-style URLs (default with --s3-endpoint), 0: virtual-host style (default for AWS)")
      ->check(CLI::IsMember({"0", "1"}));
  cmd->add_option("--admin-key-file", flags->admin_key_file,
                  "the admin API key is this file's (e.g. a mounted Kubernetes Secret; at least 32 characters) "
                  "instead of one made on the first start; a changed file replaces the key at the next start")
      ->envname("PARSYN_ADMIN_KEY_FILE");
  cmd->add_option("--worker-bootstrap-key-file", flags->worker_bootstrap_key_file,
                  "a key (at least 32 characters) with which workers register themselves as managed workers "
                  "(`parsyn worker --bootstrap-key-file`; POST /api/v1/workers/bootstrap)")
      ->envname("PARSYN_WORKER_BOOTSTRAP_KEY_FILE");
  cmd->add_option("--audit-key-file", flags->audit_key_file,
                  "the audit log's checkpoints are signed with this PEM Ed25519 private key (`openssl genpkey "
                  "-algorithm ed25519`; give every coordinator of a failover group the same one) instead of one made "
                  "on the first start in the data dir (docs/operations.md, \"Audit log\")")
      ->envname("PARSYN_AUDIT_KEY_FILE");
  cmd->add_option("--oidc-issuer", flags->oidc_issuer,
                  "single sign-on: the OpenID Connect provider's issuer URL (its discovery document is read at start; "
                  "docs/operations.md, \"Single sign-on\")");
  cmd->add_option("--oidc-client-id", flags->oidc_client_id, "single sign-on: this coordinator's client id there");
  cmd->add_option("--oidc-roles-claim", flags->oidc_roles_claim, "the ID-token claim listing the user's groups")
      ->capture_default_str();
  cmd->add_option("--oidc-admin-group", flags->oidc_admin_groups,
                  "a group (in --oidc-roles-claim) whose members are platform_admins; repeat for several");
  cmd->add_option("--oidc-ca-file", flags->oidc_ca_file, "extra trusted CAs for an https provider with a private CA");
  cmd->add_option("--session-hours", flags->session_hours, "how long the API key a sign-in makes lasts")
      ->check(CLI::Range(int64_t{1}, int64_t{24 * 30}))
      ->capture_default_str();
  cmd->add_option("--audit-checkpoint-every", flags->audit_checkpoint_every,
                  "sign the audit log's head every this many records (and at shutdown)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}))
      ->capture_default_str();
  cmd->add_option("--admin-key-refresh-ms", flags->admin_key_refresh_ms,
                  "how often the leader re-reads the admin key (--admin-key-file, else the store), as it does at every "
                  "takeover: a rotated key is in force within this, without a restart")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--leader-lease-ms", flags->leader_lease_ms,
                  "failover, with a PostgreSQL --metadata shared by several servers: the leader lease's lifetime; a "
                  "standby takes over within about 1.1 x this after the leader dies (docs/operations.md, \"Failover\")")
      ->check(CLI::Range(int64_t{300}, int64_t{600'000}))
      ->capture_default_str();
  cmd->callback([flags, &exit_code] { exit_code = RunServer(*flags); });
}

}  // namespace parsyn::cli
