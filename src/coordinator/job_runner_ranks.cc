// JobRunner's part for LoRA jobs whose workers train different ranks (lora_rank_spec.h, rank_globals.h): each
// training task's rank, the global its rank starts from, and the base its update is checked against.
#include <fmt/format.h>

#include "coordinator/job_runner.h"
#include "coordinator/job_runner_internal.h"
#include "weights/lora_rank.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

namespace {

// The global at `rank` below its own, `max_rank`: its best rank-r approximation (svd: the first r ranks of the
// global's SVD form, the very form whose ranks beyond r complete the worker's update in strategy::RoundAggregation) or
// its first r ranks (zero_pad), B scaled by r / r_max for PEFT's scaling alpha / r (weights::ScaleLoraProducts), stored
// under `key` for the attempt (not durable: a restarted job's next attempt makes its own). Blocking (a pool thread).
StatusOr<RankGlobals::Global> StoreRankGlobal(storage::BlobStore& blobs, const std::string& key,
                                              std::shared_ptr<weights::WeightSet> global, int rank, int max_rank,
                                              bool svd) {
  StatusOr<weights::WeightSet> svd_form =
      svd ? weights::TruncateLoraRank(*global, max_rank) : StatusOr<weights::WeightSet>(weights::WeightSet());
  PARSYN_RETURN_IF_ERROR(svd_form.status());
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet top, weights::SliceLoraRank(svd ? *svd_form : *global, rank));
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet lower,
                          weights::ScaleLoraProducts(top, static_cast<double>(rank) / max_rank));
  const std::vector<std::byte> bytes = weights::SerializeSafetensors(lower);
  PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo info,
                          PutBytes(blobs, key, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  return RankGlobals::Global{.key = key,
                             .sha256 = info.sha256,
                             .size_bytes = info.size_bytes,
                             .weights = std::make_shared<weights::WeightSet>(std::move(lower))};
}

}  // namespace

int64_t JobRunner::ModelBytes() const {
  int64_t bytes = 0;
  for (const storage::ModelFile& f : model_.files) bytes += f.size_bytes;
  return bytes;
}

Status JobRunner::ChooseLoraRank(int64_t worker_id) {
  const WorkerCapacity capacity = host_.AnnouncedCapacity(worker_id);
  StatusOr<int> rank = WorkerLoraRank(spec_.lora_ranks, spec_.config.lora_r, worker_id, capacity.device_memory_bytes,
                                      capacity.lora_rank, ModelBytes());
  if (!rank.ok()) return rank.status();
  rank_globals_.SetRank(worker_id, *rank);
  return Status::Ok();
}

http::Awaitable<Status> JobRunner::MakeRankGlobal(const AssignTask& a) {
  const std::optional<int> rank = rank_globals_.RankOf(a.worker);
  if (!rank || *rank == spec_.config.lora_r || rank_globals_.GlobalAt(*rank) != nullptr) co_return Status::Ok();
  const std::string key = fmt::format("{}/global-r{}.safetensors", AttemptPrefix(a.round, a.attempt), *rank);
  const bool svd = spec_.lora_ranks.EffectiveAggregation() == LoraAggregation::kSvd;
  std::shared_ptr<weights::WeightSet> global = global_.weights();
  const int r = *rank, max_rank = spec_.config.lora_r;
  StatusOr<RankGlobals::Global> made = co_await loop::Offload(
      host_.pool(), [&] { return StoreRankGlobal(host_.blobs(), key, global, r, max_rank, svd); });
  if (!made.ok()) co_return made.status().WithContext("the global at LoRA rank " + std::to_string(r));
  rank_globals_.AddGlobal(r, std::move(*made));
  co_return Status::Ok();
}

const RankGlobals::Global* JobRunner::LowerRankGlobal(const AssignTask& a) const {
  if (a.kind != TaskKind::kTrain) return nullptr;  // an evaluation reads the global at its own rank
  std::optional<int> rank = rank_globals_.RankOf(a.worker);
  if (!rank || *rank == spec_.config.lora_r) return nullptr;
  return rank_globals_.GlobalAt(*rank);
}

std::shared_ptr<weights::WeightSet> JobRunner::UpdateBase(int64_t worker_id, int task_round) const {
  if (engine_config_.async && task_round - 1 != job_.committed_round) return global_.Earlier(task_round - 1);
  if (std::optional<int> rank = rank_globals_.RankOf(worker_id); rank && *rank != spec_.config.lora_r) {
    if (const RankGlobals::Global* lower = rank_globals_.GlobalAt(*rank)) return lower->weights;
  }
  return global_.weights();
}

}  // namespace parsyn::coordinator
