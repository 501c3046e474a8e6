#include "coordinator/global_weights.h"

#include <cassert>

namespace parsyn::coordinator {

void GlobalWeights::Set(std::string key, std::string sha256, uint64_t size_bytes,
                        std::shared_ptr<weights::WeightSet> weights) {
  weights_ = std::move(weights);
  key_ = std::move(key);
  sha256_ = std::move(sha256);
  size_bytes_ = size_bytes;
}

void GlobalWeights::CommitPending(uint64_t size_bytes) {
  assert(pending_.has_value());
  delta_ = std::move(pending_->delta);
  Set(std::move(pending_->key), std::move(pending_->sha256), size_bytes, std::move(pending_->weights));
  pending_.reset();
}

std::shared_ptr<weights::WeightSet> GlobalWeights::Earlier(int round) const {
  auto it = earlier_.find(round);
  return it == earlier_.end() ? nullptr : it->second;
}

void GlobalWeights::ForgetEarlierExcept(const std::set<int>& rounds) {
  std::erase_if(earlier_, [&](const auto& entry) { return !rounds.contains(entry.first); });
}

}  // namespace parsyn::coordinator
