// Strategy: the aggregation policy of a federated job, after Flower's `Strategy` — pure policy, with no I/O, no
// threads and no clock. The round engine asks it whom to train and with which seed; RoundAggregation
// (strategy/round_aggregation.h), which owns the round's sums or kept updates, asks it how the round's updates combine
// (RoundPlan) and what the new global is from that combination (FinishFromMean, FinishFromKept).
//
// Threads: a Strategy is owned by one job and called from one thread at a time (the coordinator's event loop, or a
// pool thread while the job's mutex is held); it needs no locks. ConfigureRound is const and may be called at any
// time, also while a round aggregates.
#pragma once

#include <cstdint>
#include <functional>
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
#include "weights/weighted_mean.h"

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

// One tensor of the round's global without its bytes: the layout every update must have.
struct LayoutEntry {
  std::string name;
  weights::DType dtype = weights::DType::kF32;
  std::vector<int64_t> shape;
};

// An update kept whole for the finish step (Combination::kKeepAll), as the worker sent it.
struct KeptUpdate {
  weights::WeightSet weights;
  int64_t sample_count = 0;
  double weight_scale = 1.0;  // an asynchronous job's staleness weight (buffered_aggregation.h)
};

// How a round's accepted updates combine before the strategy's finish step.
enum class Combination {
  // Summed into a weights::WeightedMean as they arrive (owned ones in batches): O(model) memory whatever their number.
  kWeightedMean,
  // Kept as given (no copy when handed over), for a rule that needs them all at once (robust aggregation).
  kKeepAll,
};

// What a strategy answers when a round begins (BeginRound).
struct RoundPlan {
  Combination combination = Combination::kWeightedMean;
  // kWeightedMean: an update weighs its sample count (FedAvg), else 1 (sample counts checked, not used).
  bool weighted_by_sample_count = false;
  // kWeightedMean: the mean's accumulation and threads. Fixed for a strategy: the sums are reused from round to round.
  weights::WeightedMeanOptions mean_options;
  // kWeightedMean: null, the updates are averaged as given (in the global's layout); else each update goes through
  // TransformUpdate, and the mean is over this layout (read while the round begins only; DpFedAvg: the clipped
  // deltas, float32).
  const weights::WeightSet* transformed_layout = nullptr;
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

  // --- A round's aggregation: the policy that RoundAggregation (round_aggregation.h) follows. ---

  // A round begins on top of `global` (the latest committed global; RoundAggregation checks every update against its
  // layout): the strategy checks that it can aggregate `global`, keeps what its finish step needs (e.g. a copy of the
  // global) and forgets any round in progress, and says how the round's updates combine. InvalidArgument if it
  // cannot aggregate `global` (e.g. a non-float tensor) or its options are out of range.
  virtual StatusOr<RoundPlan> BeginRound(int round, const weights::WeightSet& global) = 0;

  // RoundPlan::transformed_layout only: hands `add` (which adds to the mean, and may refuse) what stands for
  // `update` in the mean, in the transformed layout. `update` has the global's layout and finite values. An error
  // (InvalidArgument) rejects the update: it does not count. By default: add(update).
  virtual Status TransformUpdate(const weights::WeightSet& update,
                                 const std::function<Status(const weights::WeightSet&)>& add) {
    return add(update);
  }

  // Combination::kWeightedMean: the new global from `mean`, the weighted mean of the round's `count` (> 0) accepted
  // updates (transformed ones, with RoundPlan::transformed_layout), in the layout the mean was over. By default the
  // mean itself (FedAvg).
  virtual StatusOr<weights::WeightSet> FinishFromMean(weights::WeightSet mean, int count) { return mean; }

  // Combination::kKeepAll: the new global from every update accepted since BeginRound (at least one, in arrival
  // order; the strategy may reorder them), `layout` the global's. An error leaves the updates kept: more may be
  // accepted and the round finished again. By default Internal (a strategy that keeps updates overrides it).
  virtual StatusOr<weights::WeightSet> FinishFromKept(std::vector<KeptUpdate>& updates,
                                                      const std::vector<LayoutEntry>& layout) {
    return InternalError(std::string(name()) + " keeps no updates");
  }

  // Server state carried from round to round (a server optimizer's moments), which the job runner stores beside each
  // committed global and restores when a job resumes. Stateless strategies (the defaults) have none.
  virtual bool has_state() const { return false; }
  // The state the finish step computed, to be stored with the round's global; nullptr when there is none (stateless,
  // or no finish step since the last BeginRound).
  virtual const weights::WeightSet* PendingState() const { return nullptr; }
  // The round whose finish step computed PendingState was committed: the next round starts from that state. Without
  // it (a failed or retried round), BeginRound starts again from the state committed before.
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
