// The failover part of Service: the leader lease (ElectionLoop), taking over (BecomeLeader), and the admin key
// that a takeover and the leader's timer re-read (RefreshAdminKey). docs/operations.md, "Failover".
#include "coordinator/service.h"

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "base/log.h"
#include "coordinator/auth.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

Status Service::LeaderStatus() const {
  if (leader_) return Status::Ok();
  if (leader_url_.empty()) {
    return UnavailableError("this coordinator is a standby and no leader is known yet: retry in a few seconds");
  }
  return UnavailableError("this coordinator is a standby; the leader is " + leader_url_ + ": send the call there");
}

http::Awaitable<void> Service::ElectionLoop() {
  const std::chrono::milliseconds ttl = options_.leader_lease_ttl;
  Clock::TimePoint held_until{};  // the latest the lease we hold can last: from the start of the call that renewed it
  while (!shutting_down_) {
    const Clock::TimePoint asked_at = clock_.Now();
    // Named, not a temporary of the co_await: the lambda holds strings (kCoAwaitTemporaries, loop_tools.h).
    auto acquire = loop::Offload(pool_, [this, ttl, id = coordinator_id_, url = options_.public_url] {
      return store_->AcquireLeaderLease(id, url, ttl);
    });
    StatusOr<storage::LeaderLease> lease = co_await std::move(acquire);
    if (shutting_down_) break;
    if (lease.ok() && lease->held) {
      held_until = asked_at + ttl;
      if (!leader_) {
        PARSYN_LOG_INFO("coordinator {}: now the leader (lease epoch {}); resuming the running jobs", coordinator_id_,
                        lease->epoch);
        co_await BecomeLeader();
      }
    } else if (lease.ok()) {
      if (leader_)
        LeadershipLost("the lease was taken by " + lease->holder + " at epoch " + std::to_string(lease->epoch));
      if (lease->holder_url != leader_url_) {
        PARSYN_LOG_INFO("coordinator {}: standby; the leader is {} ({})", coordinator_id_, lease->holder,
                        lease->holder_url);
      }
      leader_url_ = lease->holder_url;
    } else {
      PARSYN_LOG_WARN("coordinator {}: the leader lease could not be {}: {}", coordinator_id_,
                      leader_ ? "renewed" : "asked for", lease.status().ToString());
      if (leader_ && clock_.Now() >= held_until) {
        LeadershipLost("the lease expired before it could be renewed: " + lease.status().ToString());
      }
    }
    co_await shutdown_.Wait(leader_ ? ttl / 3 : ttl / 10);
  }
  if (leader_) {
    // A standby takes over at once instead of waiting for the lease to expire.
    Status released = co_await loop::Offload(pool_, [this] { return store_->ReleaseLeaderLease(coordinator_id_); });
    if (!released.ok()) PARSYN_LOG_WARN("the leader lease was not released: {}", released.ToString());
  }
}

void Service::LeadershipLost(const std::string& why) {
  PARSYN_LOG_ERROR("coordinator {}: no longer the leader ({}); exiting (status {}) so that it restarts as a standby",
                   coordinator_id_, why, kExitLeadershipLost);
  spdlog::shutdown();  // flushes the log
  std::_Exit(kExitLeadershipLost);
}

http::Awaitable<void> Service::BecomeLeader() {
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
      worker_tokens_.Reset(*workers);
      break;
    }
    PARSYN_LOG_WARN("coordinator {}: reloading the workers and the admin key as the new leader (try {} of {}): {}",
                    coordinator_id_, attempt, kTries, failed.ToString());
    if (attempt < kTries) co_await shutdown_.Wait(std::chrono::seconds(1));
    if (shutting_down_) break;
  }
  if (!failed.ok()) {
    PARSYN_LOG_ERROR(
        "coordinator {}: cannot take over without the store's workers and admin key ({}); giving the "
        "lease back and staying a standby",
        coordinator_id_, failed.ToString());
    Status released = co_await loop::Offload(pool_, [this] { return store_->ReleaseLeaderLease(coordinator_id_); });
    if (!released.ok()) PARSYN_LOG_WARN("the leader lease was not released: {}", released.ToString());
    co_return;
  }
  leader_ = true;
  leader_url_ = options_.public_url;
  // Spawned: the lease renewals go on while the jobs resume.
  boost::asio::co_spawn(io_, ResumeJobs(), boost::asio::detached);
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
    PARSYN_LOG_INFO("coordinator {}: the admin key changed{}; the previous key is refused from now on", coordinator_id_,
                    options_.admin_key_file.empty() ? " in the store" : " in --admin-key-file");
    admin_key_hash_ = *hash;
  }
  co_return Status::Ok();
}

}  // namespace parsyn::coordinator
