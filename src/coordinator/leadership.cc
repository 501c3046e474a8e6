// The failover part of Service: its LeaderElection (the lease; leader_election.h), what taking over takes of the
// service (PrepareTakeOver, then ResumeJobs), and the admin key that a takeover and the leader's timer re-read
// (RefreshAdminKey). docs/operations.md, "Failover". A new leader also reads the audit log's head (AuditLog).
#include "coordinator/service.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <optional>

#include "base/log.h"
#include "coordinator/auth.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

std::unique_ptr<LeaderElection> Service::NewLeaderElection(std::string coordinator_id) {
  storage::MetadataStore& store = *store_;
  LeaderElection::LeaseStore lease{
      .acquire = [&store](const std::string& holder, const std::string& holder_url,
                          std::chrono::milliseconds ttl) { return store.AcquireLeaderLease(holder, holder_url, ttl); },
      .release = [&store](const std::string& holder) { return store.ReleaseLeaderLease(holder); }};
  LeaderElection::TakeOver take_over{
      .prepare = [this] { return PrepareTakeOver(); },
      // Spawned: the lease renewals go on while the jobs resume.
      .resume = [this] { boost::asio::co_spawn(io_, ResumeJobs(), boost::asio::detached); }};
  return std::make_unique<LeaderElection>(
      io_.get_executor(), clock_, pool_, std::move(coordinator_id), options_.leader_lease_ttl,
      [this] { return options_.public_url; }, std::move(lease), std::move(take_over));
}

http::Awaitable<Status> Service::PrepareTakeOver() {
  // Before any call is let in: a hello must not be followed by this reset, and neither a worker revoked since this
  // process started nor an admin key rotated meanwhile may be accepted. Retried a few times; if the store still
  // fails, the lease goes back, so that this coordinator (or another) takes over later with what the store holds.
  constexpr int kTries = 3;
  Status failed;
  for (int attempt = 1; attempt <= kTries; ++attempt) {
    StatusOr<std::vector<storage::Worker>> workers =
        co_await loop::Offload(pool_, [this] { return ResetWorkerSessions(*store_); });
    failed = workers.status();
    if (workers.ok()) {
      auto key_read = RefreshAdminKey(/*as_leader=*/true);  // kCoAwaitTemporaries
      failed = co_await std::move(key_read);
    }
    if (failed.ok()) {
      // The chain goes on from the record the previous leader stored last.
      auto head_read = audit_->ReloadHead();  // kCoAwaitTemporaries
      failed = co_await std::move(head_read);
    }
    std::optional<StoredUserKeys> user_keys;
    if (failed.ok()) {
      // Users and keys made or revoked by the previous leader.
      auto read = loop::Offload(pool_, [this] { return LoadUserKeys(*store_); });  // kCoAwaitTemporaries
      StatusOr<StoredUserKeys> loaded = co_await std::move(read);
      failed = loaded.status();
      if (loaded.ok()) user_keys = *std::move(loaded);
    }
    if (failed.ok()) {
      worker_tokens_.Reset(*workers);
      user_keys_.Reset(*user_keys);
      break;
    }
    PARSYN_LOG_WARN("coordinator {}: reloading the workers and the admin key as the new leader (try {} of {}): {}",
                    coordinator_id(), attempt, kTries, failed.ToString());
    if (attempt < kTries) co_await shutdown_.Wait(std::chrono::seconds(1));
    if (shutting_down_) break;
  }
  co_return failed;
}

http::Awaitable<Status> Service::RefreshAdminKey(bool as_leader) {
  // With --admin-key-file the file is the key (a rotated Secret is picked up here); the leader also stores its hash,
  // for coordinators started without the file. Without it, the store holds the key.
  auto read = loop::Offload(pool_, [this, as_leader, file = options_.admin_key_file]() -> StatusOr<std::string> {
    if (file.empty()) return store_->GetAdminKeyHash();
    if (as_leader) PARSYN_RETURN_IF_ERROR(UseAdminKeyFile(*store_, file));
    PARSYN_ASSIGN_OR_RETURN(const std::string key, ReadOperatorKeyFile(file, "--admin-key-file"));
    return HashSecret(key);
  });
  StatusOr<std::string> hash = co_await std::move(read);
  if (!hash.ok()) co_return hash.status();
  if (*hash != admin_key_hash_) {
    PARSYN_LOG_INFO("coordinator {}: the admin key changed{}; the previous key is refused from now on",
                    coordinator_id(), options_.admin_key_file.empty() ? " in the store" : " in --admin-key-file");
    admin_key_hash_ = *hash;
  }
  co_return Status::Ok();
}

}  // namespace parsyn::coordinator
