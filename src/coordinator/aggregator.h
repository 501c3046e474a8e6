// Aggregator: a job's aggregation as its JobRunner (job_runner.h) owns it: the strategy (strategy::MakeStrategy from
// the spec's distributed.strategy, its secret draws under the job's private seed), the round's
// strategy::RoundAggregation beside it (the kernel that validates and holds the round's updates, as the strategy plans
// each round), and the work of aggregating off the event loop: adding the updates the kernel kept, and finishing a
// round into durable blobs (the new global, and a stateful strategy's server state beside it). Neither it nor the
// runner names a concrete strategy: what a strategy needs from the job or reports about a round goes through Strategy's
// own hooks (set_eligible_workers, CommittedRoundPrivacy).
//
// Threads: loop thread only, except Begin, AcceptOwned and FinishRound (blocking: a pool thread, while the job's
// mutex is held).
#pragma once

#include <utility>  // Boost 1.74's Asio needs this before its headers under g++ 12.

#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "coordinator/global_weights.h"
#include "coordinator/job_spec.h"
#include "loop/loop_tools.h"
#include "storage/blob_store.h"
#include "storage/metadata_store.h"
#include "strategy/round_aggregation.h"
#include "strategy/strategy.h"
#include "weights/update_wire.h"
#include "weights/weight_set.h"

namespace parsyn::coordinator {

class Aggregator {
 public:
  // Makes the job's strategy; `num_shards`: the workers its rounds draw from (one shard per worker that may take part).
  Aggregator(const storage::TrainingJob& job, const JobSpec& spec, int num_shards);

  // The job's strategy; nullptr when the spec's strategy cannot be made (error() says why, and Launch fails with it).
  strategy::Strategy* strategy() const { return strategy_.get(); }
  const Status& error() const { return error_; }

  // The round's aggregation (strategy::RoundAggregation); only once strategy() is made. Begin is blocking (a pool
  // thread: a strategy may copy the global); AcceptOwned is, unless AcceptOwnedIsQuick says it returns at once.
  Status Begin(int round, const weights::WeightSet& global) { return round_->Begin(round, global); }
  // `weight_scale`: an asynchronous job's staleness weight (strategy/buffered_aggregation.h).
  Status AcceptOwned(weights::WeightSet update, int64_t sample_count, std::optional<double> max_magnitude,
                     double weight_scale = 1.0) {
    return round_->AcceptOwned(std::move(update), sample_count, max_magnitude, weight_scale);
  }
  bool AcceptOwnedIsQuick(const weights::WeightSet& update) const { return round_->AcceptOwnedIsQuick(update); }
  // Whether the round's strategy finishes from the mean of transformed updates (dp_fedavg's deltas), not of weights:
  // the form a secure round's mean must take for FinishSecureRound.
  bool FinishesFromTransformed() const { return round_->finishes_from_transformed(); }

  // Adds the updates the round's aggregation kept (RoundAggregation::AddKeptUpdates): on the loop after a small
  // update, else on `pool`.
  loop::Awaitable<void> AddKeptUpdates(boost::asio::thread_pool& pool, bool small_update);

  // A round's new global, durable in the blob store, with its delta from the global before it when the job sends
  // deltas (distributed.compression.global): then the global is what the delta decodes to (docs/compression.md,
  // "Downlink"), the one every worker reconstructs.
  struct Aggregated {
    std::shared_ptr<weights::WeightSet> weights;
    storage::BlobInfo info;
    std::optional<GlobalWeights::DeltaCopy> delta;
  };
  // The global the round started from (the latest committed one), the base of the new global's delta.
  struct Base {
    const std::string& key;
    const std::string& sha256;
    const weights::WeightSet& weights;
  };
  // How long FinishRound's phases took, in milliseconds (the debug log and parsyn_round_phase_duration_seconds).
  struct FinishTimings {
    double finish_ms = 0;
    double serialize_ms = 0;
    double put_ms = 0;
  };
  // Finishes the round (RoundAggregation::Finish; an asynchronous job's server learning rate then applied to the
  // change from `base`, strategy::ApplyServerLearningRate) and stores the new global under `key`, a stateful strategy's
  // pending state first under `state_key`; with deltas, the delta and the downlink's error-feedback residual beside it
  // (`spool_dir` holds the files on their way). Blocking (a pool thread); *timings is filled as the phases end.
  StatusOr<Aggregated> FinishRound(storage::BlobStore& blobs, const std::string& key, const std::string& state_key,
                                   const Base& base, const std::filesystem::path& spool_dir, FinishTimings* timings);
  // FinishRound for a securely aggregated round: the strategy's new global from the survivors' mean `mean` (weights,
  // or deltas as FinishesFromTransformed says; the coordinator never held their updates:
  // strategy::Strategy::FinishFromMean over `count` of them), stored as
  // FinishRound stores it. Blocking (a pool thread).
  StatusOr<Aggregated> FinishSecureRound(weights::WeightSet mean, int count, storage::BlobStore& blobs,
                                         const std::string& key, const std::string& state_key, const Base& base,
                                         const std::filesystem::path& spool_dir, FinishTimings* timings);

 private:
  // The new global `mean` (the strategy's), stored under `key` as FinishRound says.
  StatusOr<Aggregated> StoreNewGlobal(weights::WeightSet mean, storage::BlobStore& blobs, const std::string& key,
                                      const std::string& state_key, const Base& base,
                                      const std::filesystem::path& spool_dir, FinishTimings* timings);
  // The new global as a delta from `base`: the delta and the residual stored beside `key`, and the reconstructed
  // global stored under `key` (*global: its blob) and in place of `mean` (its metadata naming the residual).
  StatusOr<GlobalWeights::DeltaCopy> EncodeDelta(storage::BlobStore& blobs, const std::string& key, const Base& base,
                                                 const std::filesystem::path& spool_dir, weights::WeightSet& mean,
                                                 storage::BlobInfo* global) const;

  weights::WireEncoding downlink_;                   // codec kNone: the job sends no deltas
  double server_learning_rate_ = 1.0;                // distributed.async.server_learning_rate (1: none)
  std::unique_ptr<strategy::Strategy> strategy_;     // null when the spec's strategy cannot be made (Launch fails)
  std::optional<strategy::RoundAggregation> round_;  // over *strategy_, when made
  Status error_;
};

}  // namespace parsyn::coordinator
