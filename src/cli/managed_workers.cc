#include "cli/managed_workers.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include "base/atomic_file.h"
#include "base/clock.h"
#include "base/log.h"
#include "coordinator/auth.h"
#include "storage/metadata_store.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> ReadToken(const fs::path& file) {
  std::ifstream in(file);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty()) return std::nullopt;
  return token;
}

}  // namespace

StatusOr<std::vector<ManagedWorkerIdentity>> EnsureManagedWorkers(const fs::path& data_dir, int count,
                                                                  const std::string& metadata_uri) {
  const fs::path dir = data_dir / "managed-workers";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir.string() + ": " + ec.message());
  fs::permissions(data_dir, fs::perms::owner_all, ec);
  fs::permissions(dir, fs::perms::owner_all, ec);
  // The coordinator opens the same database afterwards; this connection is closed before it does.
  PARSYN_ASSIGN_OR_RETURN(auto store, storage::OpenMetadataStore(
                                          metadata_uri.empty() ? (data_dir / "metadata.db").string() : metadata_uri));
  SystemClock clock;
  std::vector<ManagedWorkerIdentity> result;
  for (int i = 1; i <= count; ++i) {
    ManagedWorkerIdentity identity;
    identity.name = "managed-" + std::to_string(i);
    identity.cache_dir = dir / identity.name;
    const fs::path token_file = dir / (identity.name + ".token");
    if (std::optional<std::string> token = ReadToken(token_file)) {
      StatusOr<storage::Worker> known = store->FindWorkerByTokenHash(coordinator::HashSecret(*token));
      if (known.ok() && known->kind == storage::WorkerKind::kManaged && !known->revoked) {
        identity.id = known->id;
        identity.token = *token;
      } else if (!known.ok() && known.status().code() != StatusCode::kNotFound) {
        return known.status();
      }
    }
    if (identity.token.empty()) {
      PARSYN_ASSIGN_OR_RETURN(identity.token, coordinator::NewSecret("pwt_"));
      storage::Worker worker;
      worker.name = identity.name;
      worker.kind = storage::WorkerKind::kManaged;
      worker.token_sha256 = coordinator::HashSecret(identity.token);
      worker.created_at_ms = clock.UnixMillis();
      PARSYN_ASSIGN_OR_RETURN(storage::Worker created, store->CreateWorker(worker));
      identity.id = created.id;
      PARSYN_RETURN_IF_ERROR(WriteFileAtomically(token_file, identity.token + "\n", 0600));
      PARSYN_LOG_INFO("managed worker {} registered as worker {}", identity.name, identity.id);
    }
    fs::create_directories(identity.cache_dir, ec);
    if (ec) return UnavailableError("cannot create " + identity.cache_dir.string() + ": " + ec.message());
    result.push_back(std::move(identity));
  }
  return result;
}

StatusOr<fs::path> EnsureManagedWorkerCertificates(const fs::path& data_dir,
                                                   std::vector<ManagedWorkerIdentity>& workers) {
  const fs::path dir = data_dir / "managed-workers";
  const fs::path ca_cert = dir / "ca.pem";
  const fs::path ca_key = dir / "ca.key";
  std::error_code ec;
  if (!fs::exists(dir, ec)) {  // bootstrap alone: no managed workers of the server's own made it
    fs::create_directories(dir, ec);
    if (ec) return UnavailableError("cannot create " + dir.string() + ": " + ec.message());
    fs::permissions(dir, fs::perms::owner_all, ec);
  }
  if (!fs::exists(ca_cert, ec) || !fs::exists(ca_key, ec)) {
    PARSYN_ASSIGN_OR_RETURN(coordinator::IssuedCertificate ca,
                            coordinator::CreateCertificateAuthority("parsyn managed workers CA"));
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(ca_key, ca.private_key_pem, 0600));
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(ca_cert, ca.certificate_pem, 0644));
    PARSYN_LOG_INFO("created the managed workers' client CA {}", ca_cert.string());
  }
  for (ManagedWorkerIdentity& worker : workers) {
    PARSYN_ASSIGN_OR_RETURN(coordinator::IssuedCertificate issued,
                            coordinator::IssueWorkerCertificate(ca_cert, ca_key, worker.id));
    worker.cert_file = dir / (worker.name + ".pem");
    worker.key_file = dir / (worker.name + ".key");
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(worker.key_file, issued.private_key_pem, 0600));
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(worker.cert_file, issued.certificate_pem, 0644));
  }
  return ca_cert;
}

ManagedWorkerSupervisor::ManagedWorkerSupervisor(SupervisorOptions options, std::vector<ManagedWorkerIdentity> workers)
    : options_(std::move(options)), slots_(workers.size()) {
  for (size_t i = 0; i < workers.size(); ++i) slots_[i].identity = std::move(workers[i]);
}

ManagedWorkerSupervisor::~ManagedWorkerSupervisor() { Stop(); }

void ManagedWorkerSupervisor::Start() {
  for (Slot& slot : slots_) slot.thread = std::thread([this, &slot] { Supervise(slot); });
}

void ManagedWorkerSupervisor::RequestStop() {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  stopping_ = true;
  for (Slot& slot : slots_) {
    if (slot.child) slot.child->Terminate();
  }
  changed_.notify_all();
}

bool ManagedWorkerSupervisor::AllExited() {
  std::lock_guard lock(mutex_);
  return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.child != nullptr; });
}

void ManagedWorkerSupervisor::Stop(std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  RequestStop();
  {
    std::unique_lock lock(mutex_);
    const bool exited = changed_.wait_for(lock, grace, [this] {
      return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.child != nullptr; });
    });
    if (!exited) {
      for (Slot& slot : slots_) {
        if (!slot.child) continue;
        PARSYN_LOG_WARN("managed worker {} did not stop within {} ms; killing it", slot.identity.name, grace.count());
        slot.child->Kill();
      }
    }
  }
  for (Slot& slot : slots_) {
    if (slot.thread.joinable()) slot.thread.join();
  }
}

void ManagedWorkerSupervisor::Supervise(Slot& slot) {
  const ManagedWorkerIdentity& id = slot.identity;
  // The token goes through the environment, never argv: any local user can read a process's command line
  // (/proc/<pid>/cmdline, ps), while its environment is readable only by its owner.
  std::vector<std::string> args = {"worker",
                                   "--server",
                                   options_.server_url,
                                   "--name",
                                   id.name,
                                   "--device",
                                   options_.device,
                                   "--cache-dir",
                                   id.cache_dir.string(),
                                   "--exit-with-parent"};
  if (!options_.ca_file.empty()) args.insert(args.end(), {"--ca-file", options_.ca_file.string()});
  if (!id.cert_file.empty()) {
    args.insert(args.end(), {"--cert", id.cert_file.string(), "--key", id.key_file.string()});
  }
  std::chrono::milliseconds backoff = options_.initial_backoff;
  while (true) {
    std::optional<Subprocess> child;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      SubprocessOptions spawn;
      spawn.environment = {{"PARSYN_WORKER_TOKEN", id.token}};
      // Names this process to the worker's --exit-with-parent, which asks for SIGTERM (a clean leave) when it dies.
      spawn.die_with_parent = true;
      StatusOr<Subprocess> started = Subprocess::Start(options_.program, args, spawn);
      if (started.ok()) {
        child.emplace(std::move(*started));
        slot.child = &*child;
        PARSYN_LOG_INFO("managed worker {} started (pid {})", id.name, child->pid());
      } else {
        PARSYN_LOG_ERROR("managed worker {}: {}", id.name, started.status().ToString());
      }
    }
    const auto started_at = std::chrono::steady_clock::now();
    if (child) {
      // The worker logs to stderr (shared with the server's); its stdout is drained here so it never blocks.
      while (std::optional<std::string> line = child->ReadLine()) {
        PARSYN_LOG_INFO("[{}] {}", id.name, *line);
      }
      // RequestStop may signal the child until the moment it is reaped (Subprocess keeps that safe).
      const int code = child->Wait();
      std::lock_guard lock(mutex_);
      slot.child = nullptr;
      changed_.notify_all();
      if (stopping_) {
        PARSYN_LOG_INFO("managed worker {} stopped (exit {})", id.name, code);
        return;
      }
      if (std::chrono::steady_clock::now() - started_at >= options_.healthy_run) backoff = options_.initial_backoff;
      PARSYN_LOG_WARN("managed worker {} exited with {}; restarting in {} ms", id.name, code, backoff.count());
    }
    std::unique_lock lock(mutex_);
    if (changed_.wait_for(lock, backoff, [this] { return stopping_; })) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace parsyn::cli
