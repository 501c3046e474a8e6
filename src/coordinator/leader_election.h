// LeaderElection: which of the coordinators sharing one store leads (failover, docs/operations.md "Failover"). On a
// shared store Run takes and renews the leader lease until Stop (then gives it up); becoming the leader readies the
// service and resumes its jobs (TakeOver); losing the lease ends the process (LeadershipLost). On a store nobody
// shares the coordinator leads alone from the start (LeadAlone). A standby answers API and worker calls 503 naming the
// leader (LeaderStatus).
//
// Threads: the service's event loop only (no locks); the lease calls run on the pool given (loop::Offload).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <functional>
#include <string>

#include "base/clock.h"
#include "base/status.h"
#include "http/server.h"
#include "loop/signal.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// The exit status of a `parsyn server` that lost the leader lease (EX_TEMPFAIL: restart it).
inline constexpr int kExitLeadershipLost = 75;

class LeaderElection {
 public:
  // The store's lease calls (storage::MetadataStore::AcquireLeaderLease and ReleaseLeaderLease), run on the pool.
  struct LeaseStore {
    std::function<StatusOr<storage::LeaderLease>(const std::string& holder, const std::string& holder_url,
                                                 std::chrono::milliseconds ttl)>
        acquire;
    std::function<Status(const std::string& holder)> release;
  };
  // What taking the lease over asks of the service.
  struct TakeOver {
    // Readies the service before any call is let in (Service::PrepareTakeOver). Not OK: the lease goes back and this
    // coordinator stays a standby (the election tries again later).
    std::function<http::Awaitable<Status>()> prepare;
    // Once leader() is true: resumes the jobs (spawned, so that the lease renewals go on meanwhile).
    std::function<void()> resume;
  };

  // `public_url`: this coordinator's URL as the lease names it (read at each call: it may be set after start).
  LeaderElection(boost::asio::any_io_executor executor, const Clock& clock, boost::asio::thread_pool& pool,
                 std::string coordinator_id, std::chrono::milliseconds lease_ttl,
                 std::function<std::string()> public_url, LeaseStore store, TakeOver take_over);

  // This process's id in the leader lease: host, pid and a random suffix.
  static StatusOr<std::string> NewCoordinatorId();

  // Whether this coordinator is the leader (always, on a store that is not shared).
  bool leader() const { return leader_; }
  // The leader's URL as the lease names it ("" while unknown).
  const std::string& leader_url() const { return leader_url_; }
  const std::string& coordinator_id() const { return coordinator_id_; }
  // OK on the leader; Unavailable saying this is a standby and which URL the leader has, when known.
  Status LeaderStatus() const;

  // A store no other coordinator shares: this one leads from the start, with no lease.
  void LeadAlone() { leader_ = true; }
  // The lease loop (on a shared store): takes and renews the lease until Stop (then gives it up); becoming the
  // leader calls take_over (BecomeLeader); losing the lease ends the process (LeadershipLost). On the loop.
  http::Awaitable<void> Run();
  // Ends Run at its next step (shutdown).
  void Stop();

  // Exits the process at once (status kExitLeadershipLost): a deposed leader must stop acting, and whatever it still
  // tries to write is refused by the store (fencing). Its supervisor restarts it, as a standby.
  [[noreturn]] void LeadershipLost(const std::string& why);

 private:
  // Readies the service (take_over.prepare), then leads and resumes the jobs; when the service cannot be readied,
  // gives the lease back and stays a standby.
  http::Awaitable<void> BecomeLeader();

  const Clock& clock_;
  boost::asio::thread_pool& pool_;
  const std::string coordinator_id_;
  const std::chrono::milliseconds lease_ttl_;
  std::function<std::string()> public_url_;
  LeaseStore store_;
  TakeOver take_over_;
  bool leader_ = false;
  std::string leader_url_;  // the leader's URL as the lease names it ("" while unknown)
  bool stopping_ = false;
  loop::Signal stop_;  // notified by Stop: Run's wait between lease calls ends
};

}  // namespace parsyn::coordinator
