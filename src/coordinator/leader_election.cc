#include "coordinator/leader_election.h"

#include <unistd.h>

#include <cstdlib>

#include "base/log.h"
#include "coordinator/auth.h"
#include "loop/loop_tools.h"

namespace parsyn::coordinator {

LeaderElection::LeaderElection(boost::asio::any_io_executor executor, const Clock& clock,
                               boost::asio::thread_pool& pool, std::string coordinator_id,
                               std::chrono::milliseconds lease_ttl, std::function<std::string()> public_url,
                               LeaseStore store, TakeOver take_over)
    : clock_(clock),
      pool_(pool),
      coordinator_id_(std::move(coordinator_id)),
      lease_ttl_(lease_ttl),
      public_url_(std::move(public_url)),
      store_(std::move(store)),
      take_over_(std::move(take_over)),
      stop_(std::move(executor)) {}

StatusOr<std::string> LeaderElection::NewCoordinatorId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  PARSYN_ASSIGN_OR_RETURN(std::string suffix, NewSecret(""));
  return std::string(host) + "-" + std::to_string(getpid()) + "-" + suffix.substr(0, 8);
}

Status LeaderElection::LeaderStatus() const {
  if (leader_) return Status::Ok();
  if (leader_url_.empty()) {
    return UnavailableError("this coordinator is a standby and no leader is known yet: retry in a few seconds");
  }
  return UnavailableError("this coordinator is a standby; the leader is " + leader_url_ + ": send the call there");
}

void LeaderElection::Stop() {
  stopping_ = true;
  stop_.Notify();
}

http::Awaitable<void> LeaderElection::Run() {
  const std::chrono::milliseconds ttl = lease_ttl_;
  Clock::TimePoint held_until{};  // the latest the lease we hold can last: from the start of the call that renewed it
  while (!stopping_) {
    const Clock::TimePoint asked_at = clock_.Now();
    // Named, not a temporary of the co_await: the lambda holds strings (kCoAwaitTemporaries, loop_tools.h).
    auto acquire = loop::Offload(
        pool_, [this, ttl, id = coordinator_id_, url = public_url_()] { return store_.acquire(id, url, ttl); });
    StatusOr<storage::LeaderLease> lease = co_await std::move(acquire);
    if (stopping_) break;
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
    co_await stop_.Wait(leader_ ? ttl / 3 : ttl / 10);
  }
  if (leader_) {
    // A standby takes over at once instead of waiting for the lease to expire.
    Status released = co_await loop::Offload(pool_, [this] { return store_.release(coordinator_id_); });
    if (!released.ok()) PARSYN_LOG_WARN("the leader lease was not released: {}", released.ToString());
  }
}

void LeaderElection::LeadershipLost(const std::string& why) {
  PARSYN_LOG_ERROR("coordinator {}: no longer the leader ({}); exiting (status {}) so that it restarts as a standby",
                   coordinator_id_, why, kExitLeadershipLost);
  spdlog::shutdown();  // flushes the log
  std::_Exit(kExitLeadershipLost);
}

http::Awaitable<void> LeaderElection::BecomeLeader() {
  auto prepare = take_over_.prepare();  // kCoAwaitTemporaries
  const Status failed = co_await std::move(prepare);
  if (!failed.ok()) {
    PARSYN_LOG_ERROR(
        "coordinator {}: cannot take over without the store's workers and admin key ({}); giving the "
        "lease back and staying a standby",
        coordinator_id_, failed.ToString());
    Status released = co_await loop::Offload(pool_, [this] { return store_.release(coordinator_id_); });
    if (!released.ok()) PARSYN_LOG_WARN("the leader lease was not released: {}", released.ToString());
    co_return;
  }
  leader_ = true;
  leader_url_ = public_url_();
  // Spawned: the lease renewals go on while the jobs resume.
  take_over_.resume();
}

}  // namespace parsyn::coordinator
