// DP-FedAvg with fixed clipping (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models";
// Flower's DifferentialPrivacyServerSideFixedClipping): user-level differential privacy over the workers.
//
// Each accepted update's delta Δ_i = w_i - global (over the whole update, all tensors as one vector) is clipped to L2
// norm C = clip_norm: Δ_i · min(1, C / ‖Δ_i‖). The clipped deltas are averaged *unweighted* (sample counts are
// checked but not used: a worker's reported count is unbounded, so weighting by it would break the sensitivity
// bound), Gaussian noise is added to their sum, and
//   new global = global + (Σ_i clip(Δ_i) + N(0, (σ·C)² I)) / K,   σ = noise_multiplier, K = updates accepted,
// i.e. noise of standard deviation σ·C/K per coordinate on the average. Adding or removing one worker changes the
// sum by at most C in L2, so each round is the Gaussian mechanism with noise multiplier σ, sampled with rate
// q = K / eligible workers; RdpAccountant composes the rounds and gives ε at `delta` (ε reported by epsilon_spent()).
//
// Distributed DP (DpFedAvgOptions::noise_from_workers, for a securely aggregated job): the coordinator never sees a
// delta, so each worker clips its own to C and adds normal noise of standard deviation σ·C/√t per coordinate, t the
// attempt's least number of survivors (secagg::WorkerNoiseStddev); the s ≥ t deltas summed then carry noise of
// standard deviation σ·C·√(s/t) ≥ σ·C, and the accountant counts σ as above. FinishFromMean adds nothing.
//
// Secrecy: the noise and the client sample are drawn under the job's private key (256 bits from getrandom, kept only
// in the coordinator's metadata store: storage::TrainingJob::private_seed), never from anything in the job spec. A
// released global minus noise regenerated from the spec's seed is no closer to the noise-free average (the test
// dp_fed_avg_test.cc "NoiseCannotBeRegeneratedFromTheJobSpec"), and the sample cannot be predicted, so the sampling
// amplification the accountant claims holds. The guarantee holds against everyone without access to the
// coordinator's store (docs/training.md, "Differential privacy").
//
// Noise: standard normals from Box–Muller over ChaCha20's keystream under that key with the nonce (kDpNoiseDomain,
// round) (weights/keyed_stream.h). Coordinate n of the model (tensors in order, flattened row-major) takes pair
// p = n / 2 from stream words 2p and 2p+1: u1 = ((w_2p >> 11) + 1) · 2^-53 in (0, 1], u2 = (w_2p+1 >> 11) · 2^-53,
// z = sqrt(-2 ln u1) · (cos 2πu2 if n is even, else sin 2πu2). No std::normal_distribution: its algorithm differs
// between standard libraries. The sample: the shards ranked by KeyedRank(key, kDpSampleDomain, round, shard). The sums
// use exact (order-independent) accumulation, so the same job, resumed or rerun, gives the same global bits on the
// same platform (ln, cos and sin come from the C library; another libm may differ in their last bit).
//
// Memory: O(model) whatever the number of workers: a copy of the global, one float32 delta buffer, and the exact sums
// of the round's weights::WeightedMean (16 bytes per parameter; RoundAggregation holds them). Each update is read
// twice (its norm, then the scaled add).
// Threads: see Strategy.
#pragma once

#include <cstdint>
#include <optional>

#include "base/status.h"
#include "strategy/privacy_accounting.h"
#include "strategy/rdp_accountant.h"
#include "strategy/strategy.h"
#include "weights/keyed_stream.h"

namespace parsyn::strategy {

// OK, or InvalidArgument naming the option and the rule, e.g. "clip_norm must be a finite number > 0, got 0".
Status ValidateDpFedAvgOptions(const DpFedAvgOptions& options);

// The privacy accounting a dp_fedavg server state holds (the state's format: DpFedAvg's state hooks below).
struct DpAccountingState {
  RdpAccountant accountant;                 // the committed rounds'
  double epsilon = 0;                       // ε at delta after the last committed round
  std::optional<DpRoundReport> last_round;  // nullopt when no round was accounted
};
// Reads a stored dp_fedavg state (as PendingState gave it) without a strategy: what RestoreState restores, and what
// the job API reports of a stored round. InvalidArgument if `state` is not a dp_fedavg state with RdpAccountant's
// orders.
StatusOr<DpAccountingState> ReadDpFedAvgState(const weights::WeightSet& state);

class DpFedAvg : public Strategy {
 public:
  // `options` must pass ValidateDpFedAvgOptions (asserted). `private_key`: the job's private seed (above).
  DpFedAvg(DpFedAvgOptions options, const weights::SecretKey& private_key);

  // The domains of the key's draws (weights::KeyedStream, KeyedRank).
  static constexpr uint32_t kDpNoiseDomain = 1;
  static constexpr uint32_t kDpSampleDomain = 2;

  std::string_view name() const override { return "dp_fedavg"; }

  // As FedAvg: all available workers when they fit in max_workers, else a window that rotates by round; with
  // sampling, the shards ranked under the private key.
  std::vector<ParticipantConfig> ConfigureRound(const RoundContext& ctx,
                                                std::span<const Candidate> available) const override;

  // Its plan: an unweighted mean (sample counts are checked, not used: see above) of the updates transformed into
  // their clipped deltas, float32, with exact sums. InvalidArgument if a tensor of `global` is not a float (F32, F16,
  // BF16, F64). Keeps a copy of `global`.
  StatusOr<RoundPlan> BeginRound(int round, const weights::WeightSet& global) override;
  // The update's delta from the global, clipped, handed to `add`. InvalidArgument (the update does not count) on a
  // delta whose norm overflows.
  Status TransformUpdate(const weights::WeightSet& update,
                         const std::function<Status(const weights::WeightSet&)>& add) override;
  // global + (the clipped deltas' mean + noise): the noisy new global in the global's dtypes (noise_from_workers: the
  // workers' clipped, noisy deltas' mean, and no noise added here). The round is accounted
  // in the pending state (PendingState, pending_round()); it counts in epsilon_spent() once CommitState says the
  // round committed.
  StatusOr<weights::WeightSet> FinishFromMean(weights::WeightSet mean_delta, int participants) override;

  // The number of workers this round's participants were drawn from, for q = K / n (the job runner sets the job's
  // shard count: one shard per worker that may take part). Sticky: applies to every later Finish until set again.
  // 0 (the default): unknown, q = 1 (no amplification by sampling is claimed). Values below K count as K.
  void set_eligible_workers(int64_t eligible_workers) override { eligible_workers_ = eligible_workers; }

  // Privacy accounting as server state: the accountant advances only when a round commits, and a resumed job
  // restores it bit for bit. The state WeightSet (metadata "strategy": "dp_fedavg") holds F64 tensors "orders" and
  // "rdp" (the composed RDP per order), I64 "rounds" [1], F64 "epsilon" [1] (ε at delta after the last committed
  // round) and F64 "last_round" [6] (round, participants, clipped, noise_stddev, sampling_rate, epsilon; all 0
  // before the first round).
  bool has_state() const override { return true; }
  const weights::WeightSet* PendingState() const override { return pending_ ? &pending_->state : nullptr; }
  void CommitState() override;
  // InvalidArgument if `state` is not a dp_fedavg state with this accountant's orders.
  Status RestoreState(const weights::WeightSet* state) override;

  // ε at options().delta spent by the committed rounds (0 before the first; +∞ when noise_multiplier is 0).
  double epsilon_spent() const { return epsilon_spent_; }
  // The last committed round; nullopt before the first.
  const std::optional<DpRoundReport>& last_round() const { return last_round_; }
  // last_round() with the options it was accounted under.
  std::optional<RoundPrivacy> CommittedRoundPrivacy() const override {
    return last_round_ ? std::optional<RoundPrivacy>(RoundPrivacy{.round = *last_round_, .options = options_})
                       : std::nullopt;
  }
  // The round Finish computed that has not committed yet; nullopt when none (after Begin or CommitState).
  std::optional<DpRoundReport> pending_round() const {
    return pending_ ? std::optional<DpRoundReport>(pending_->report) : std::nullopt;
  }
  // The committed rounds' accountant.
  const RdpAccountant& accountant() const { return accountant_; }

  // Accounts a committed round without aggregating anything (in round order, before the next Begin), with its K
  // (participants) and eligible count: the accountant, hence the ε, the uninterrupted job would have.
  void RecordPastRound(int64_t participants, int64_t eligible_workers);

  const DpFedAvgOptions& options() const { return options_; }

 private:
  double SamplingRate(int64_t participants, int64_t eligible_workers) const;

  DpFedAvgOptions options_;
  weights::SecretKey private_key_;
  int round_ = 0;
  weights::WeightSet global_;  // the round's global (a copy)
  weights::WeightSet delta_;   // float32 scratch: the clipped delta of the update being added; the mean's layout
  int clipped_ = 0;            // updates of the round whose delta was clipped
  int64_t eligible_workers_ = 0;
  RdpAccountant accountant_;  // committed rounds only
  double epsilon_spent_ = 0;
  std::optional<DpRoundReport> last_round_;
  struct Pending {
    RdpAccountant accountant;
    double epsilon = 0;
    DpRoundReport report;
    weights::WeightSet state;
  };
  std::optional<Pending> pending_;  // Finish's round, until CommitState (dropped by Begin)
};

}  // namespace parsyn::strategy
