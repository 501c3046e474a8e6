// GlobalWeights: a job's global model as its JobRunner (job_runner.h) holds it: the latest committed global (its blob
// key, sha256, size and weights), the attempt's zstd copy of it, its delta from the global before it, the global the
// attempt aggregated and has not committed yet, and the validation loss of the global the attempt started from, stored
// with the round's commit; and, for an asynchronous job, the earlier globals that tasks still in training started from.
//
// Threads: loop thread only (the job's runner); the weights are shared read-only with the pool's checks.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "weights/weight_set.h"

namespace parsyn::coordinator {

class GlobalWeights {
 public:
  // The attempt's zstd copy of the global (distributed.compression.zstd_level > 0), as tasks offer it.
  struct ZstdCopy {
    std::string of_global;  // the global's key it is a copy of: offered only while that is the global
    std::string key;
    std::string sha256;
    uint64_t size_bytes = 0;
  };
  // A global as a delta from the global before it (distributed.compression.global), durable in the blob store, as
  // tasks offer it (protocol::TaskGlobalDelta).
  struct DeltaCopy {
    std::string of_global;  // the global's key it stands for: offered only while that is the global
    std::string key;
    std::string sha256;
    uint64_t size_bytes = 0;
    std::string base_sha256;
    std::map<std::string, std::string> metadata;  // the global's __metadata__, which the worker gives its file
  };
  // A global aggregated and durable in the blob store, not yet committed.
  struct Pending {
    std::string key;
    std::string sha256;
    std::shared_ptr<weights::WeightSet> weights;
    std::optional<DeltaCopy> delta;  // its delta from the committed global, when the job sends deltas
  };

  // The latest committed global (round committed_round; 0: the initial weights): its blob key, the sha256 and size of
  // its bytes, and its weights (nullptr before the first Set, and once the job ended: ReleaseWeights).
  const std::string& key() const { return key_; }
  const std::string& sha256() const { return sha256_; }
  uint64_t size_bytes() const { return size_bytes_; }
  const std::shared_ptr<weights::WeightSet>& weights() const { return weights_; }
  // A global loaded from the store becomes the latest committed one.
  void Set(std::string key, std::string sha256, uint64_t size_bytes, std::shared_ptr<weights::WeightSet> weights);
  // The weights are in the blob store; an ended job holds no memory.
  void ReleaseWeights() { weights_.reset(); }

  // The global aggregated by the attempt, until it commits or the attempt ends.
  const std::optional<Pending>& pending() const { return pending_; }
  void SetPending(Pending pending) { pending_ = std::move(pending); }
  void DropPending() { pending_.reset(); }
  // The pending global (there must be one) becomes the latest committed one, its size `size_bytes` as the store has it,
  // with its delta copy.
  void CommitPending(uint64_t size_bytes);

  // Asynchronous jobs: the weights of committed global `round` while tasks that trained on it may still report (their
  // updates are checked against it and rebased from it): KeepEarlier before a commit replaces the latest one, Earlier
  // finds one (the latest committed global under its own round too), ForgetEarlierExcept drops those no task needs.
  void KeepEarlier(int round, std::shared_ptr<weights::WeightSet> weights) { earlier_[round] = std::move(weights); }
  std::shared_ptr<weights::WeightSet> Earlier(int round) const;
  void ForgetEarlierExcept(const std::set<int>& rounds);

  // The validation loss of the global the attempt started from, stored by the round's commit.
  const std::optional<double>& pending_validation_loss() const { return pending_validation_loss_; }
  void set_pending_validation_loss(double loss) { pending_validation_loss_ = loss; }
  void DropPendingValidationLoss() { pending_validation_loss_.reset(); }

  // The attempt's zstd copy, if it is of the latest committed global (not a previous global's: the final
  // evaluation); nullptr otherwise.
  const ZstdCopy* zstd_copy() const { return zstd_ && zstd_->of_global == key_ ? &*zstd_ : nullptr; }
  void SetZstdCopy(ZstdCopy copy) { zstd_ = std::move(copy); }
  void ForgetZstdCopy() { zstd_.reset(); }

  // The latest committed global's delta from the global before it; nullptr when there is none (the initial global, a
  // job without deltas, a job resumed after a restart) or it is not of the latest committed global.
  const DeltaCopy* delta_copy() const { return delta_ && delta_->of_global == key_ ? &*delta_ : nullptr; }

 private:
  std::string key_;
  std::string sha256_;
  uint64_t size_bytes_ = 0;
  std::shared_ptr<weights::WeightSet> weights_;
  std::optional<ZstdCopy> zstd_;
  std::optional<DeltaCopy> delta_;
  std::optional<Pending> pending_;                 // aggregated, not yet committed
  std::optional<double> pending_validation_loss_;  // of the global the attempt started from, stored on commit
  std::map<int, std::shared_ptr<weights::WeightSet>> earlier_;  // asynchronous jobs: by committed round
};

}  // namespace parsyn::coordinator
