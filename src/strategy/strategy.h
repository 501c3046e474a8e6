// Strategy: the aggregation policy of a federated job, after Flower's `Strategy` — pure policy, with no I/O, no
// threads and no clock. The round engine asks it whom to train and with which seed; the coordinator feeds it each
// validated update as it arrives and takes the new global when the round closes.
//
// Threads: a Strategy is owned by one job on the coordinator's event loop and is called only from there; it needs
// no locks. ConfigureRound is const and may be called at any time, also between Begin and Finish.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "strategy/privacy_accounting.h"
#include "strategy/strategy_options.h"
#include "weights/weight_set.h"

namespace parsyn::strategy {

// A worker that is online, idle and has a data shard of the job.
struct Candidate {
  int64_t worker_id = 0;
  int shard = 0;  // 0-based, fixed for the worker for the whole job
};

// What a strategy knows about the round it configures.
struct RoundContext {
  uint64_t job_seed = 0;
  int round = 1;  // 1-based
  int min_workers = 1;
  int max_workers = 1;
  Sampling sampling;  // the job's client sampling (none: every available worker, up to max_workers)
};

// One participant of a round and its per-round configuration.
struct ParticipantConfig {
  int64_t worker_id = 0;
  int shard = 0;
  uint64_t seed = 0;  // TaskSeed(job_seed, round, shard), see strategy/seed.h

  friend bool operator==(const ParticipantConfig&, const ParticipantConfig&) = default;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // "federated_averaging", as the job spec spells it.
  virtual std::string_view name() const = 0;

  // Chooses this round's participants from `available` (any order; each worker at most once). Returns an empty
  // vector when the round should keep waiting (fewer than ctx.min_workers available); otherwise between
  // min_workers and max_workers participants, each one of `available`, sorted by shard. Deterministic. Every
  // strategy of the project answers ChooseParticipants(ctx, available) (strategy/sampling.h: client sampling).
  virtual std::vector<ParticipantConfig> ConfigureRound(const RoundContext& ctx,
                                                        std::span<const Candidate> available) const = 0;

  // Starts aggregating `round` on top of `global` (the latest committed global: its names, dtypes and shapes are
  // what every update must have). Discards any aggregation in progress (a failed round that is retried).
  // InvalidArgument if `global` cannot be aggregated (e.g. a non-float tensor).
  virtual Status Begin(int round, const weights::WeightSet& global) = 0;

  // Adds one worker's update, weighted by `sample_count` (the training examples behind it). InvalidArgument, and
  // the update does not count, if its layout differs from the global's, a value is not finite, or sample_count is
  // not positive. FailedPrecondition if Begin was not called.
  virtual Status Accept(const weights::WeightSet& update, int64_t sample_count) = 0;

  // As Accept, same verdict, but takes the update over, so a strategy may keep it and add several together later
  // (before Finish returns). `max_magnitude`: the update's largest |value| when a check that read every value (and
  // found them finite) already knows it, so a strategy that needs the bound need not read the values for it (else
  // nullopt). By default: Accept(update, sample_count).
  virtual Status AcceptOwned(weights::WeightSet update, int64_t sample_count, std::optional<double> max_magnitude) {
    return Accept(update, sample_count);
  }
  // True when AcceptOwned(update, ..., max_magnitude) with a known max_magnitude would return in microseconds (it
  // judges and keeps the update, with no pass over its values and no wait for kept updates being added): cheap
  // enough for a caller that must not block long (the coordinator's event loop). By default false.
  virtual bool AcceptOwnedIsQuick(const weights::WeightSet& update) const { return false; }
  // Adds the updates AcceptOwned kept, now (the caller is idle and expects no other update soon). By default none are
  // kept: a no-op.
  virtual void AddKeptUpdates() {}

  // Updates that counted since Begin.
  virtual int num_accepted() const = 0;

  // The new global from the updates accepted since Begin; afterwards Begin must be called again.
  // FailedPrecondition if Begin was not called or nothing was accepted.
  virtual StatusOr<weights::WeightSet> Finish() = 0;

  // Server state carried from round to round (a server optimizer's moments), which the job runner stores beside each
  // committed global and restores when a job resumes. Stateless strategies (the defaults) have none.
  virtual bool has_state() const { return false; }
  // The state Finish computed, to be stored with the round's global; nullptr when there is none (stateless, or no
  // Finish since the last Begin).
  virtual const weights::WeightSet* PendingState() const { return nullptr; }
  // The round whose Finish computed PendingState was committed: the next round starts from that state. Without it
  // (a failed or retried round), Begin starts again from the state committed before.
  virtual void CommitState() {}
  // Replaces the committed state (a resumed job): `state` as PendingState gave it for the last committed round, or
  // nullptr for the initial state (no round committed yet). InvalidArgument if it is not this strategy's.
  virtual Status RestoreState(const weights::WeightSet* state) {
    return state == nullptr ? Status::Ok() : InvalidArgumentError(std::string(name()) + " keeps no server state");
  }

  // The number of workers a round's participants are drawn from (the job runner sets the job's shard count: one shard
  // per worker that may take part), for a strategy whose accounting depends on the sampling rate q = K / n
  // (dp_fedavg). Sticky. By default ignored.
  virtual void set_eligible_workers(int64_t eligible_workers) {}
  // A differentially private strategy's accounting of its last committed round (after CommitState or RestoreState),
  // which the job runner records with the round's commit; nullopt before the first committed round, and for every
  // strategy that accounts no privacy (the default).
  virtual std::optional<RoundPrivacy> CommittedRoundPrivacy() const { return std::nullopt; }
};

}  // namespace parsyn::strategy
