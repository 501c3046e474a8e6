#include "coordinator/aggregator.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <span>
#include <vector>

#include "coordinator/job_runner_internal.h"
#include "protocol/messages.h"
#include "storage/byte_source.h"
#include "storage/local_blob_copy.h"
#include "strategy/buffered_aggregation.h"
#include "strategy/make_strategy.h"
#include "weights/keyed_stream.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

namespace {

// Stores `set` as a safetensors blob streamed from its header and its tensors' own bytes: no serialised copy of the
// model in memory (at 1 GiB and more, that copy doubled the coordinator's peak). As PutBytes: a blob already under
// `key` (left by a run that crashed before its commit) holds the same deterministic bytes and is taken as it is.
StatusOr<storage::BlobInfo> PutWeightSet(storage::BlobStore& blobs, const std::string& key,
                                         const weights::WeightSet& set) {
  struct SetSource final : storage::ByteSource {
    std::vector<std::span<const std::byte>> parts;  // the header, then each tensor
    size_t part = 0;
    StatusOr<size_t> Read(std::span<std::byte> buffer) override {
      size_t n = 0;
      while (n < buffer.size() && part < parts.size()) {
        std::span<const std::byte>& rest = parts[part];
        const size_t take = std::min(buffer.size() - n, rest.size());
        std::copy_n(rest.begin(), take, buffer.begin() + static_cast<std::ptrdiff_t>(n));
        rest = rest.subspan(take);
        n += take;
        if (rest.empty()) ++part;
      }
      return n;
    }
  } source;
  const std::string header = weights::SafetensorsHeaderBytes(set);
  source.parts.push_back(std::as_bytes(std::span(header.data(), header.size())));
  for (const weights::Tensor& t : set.tensors()) source.parts.push_back(t.data);
  // Nothing else of the round is left to run: the store may hash on a second core while it writes.
  StatusOr<storage::BlobInfo> stored = blobs.Put(key, source, {.hash_on_second_thread = true});
  if (!stored.ok() && stored.status().code() == StatusCode::kAlreadyExists) stored = blobs.Head(key);
  return stored;
}

// Stores the file at `path` under `key`, as PutWeightSet does a set.
StatusOr<storage::BlobInfo> PutFile(storage::BlobStore& blobs, const std::string& key,
                                    const std::filesystem::path& path) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, storage::OpenFileSource(path));
  StatusOr<storage::BlobInfo> stored = blobs.Put(key, *source, {.hash_on_second_thread = true});
  if (!stored.ok() && stored.status().code() == StatusCode::kAlreadyExists) stored = blobs.Head(key);
  return stored;
}

// The downlink's blobs beside a round's global (docs/compression.md, "Downlink"), and the global's metadata key that
// names the residual's sha256 (so a resumed job carries on from it).
constexpr char kGlobalDeltaFile[] = "global.delta";
constexpr char kGlobalResidualFile[] = "global_residual.safetensors";
constexpr char kGlobalResidualShaKey[] = "parsyn_global_residual_sha256";

// The folder part of a blob key, with its slash ("jobs/1/rounds/000002/a1/").
std::string KeyFolder(const std::string& key) { return key.substr(0, key.rfind('/') + 1); }

// Spool files of one global's downlink, removed when done.
struct DownlinkSpool {
  std::filesystem::path residual, delta, global;
  DownlinkSpool(const std::filesystem::path& dir, const std::string& key) {
    std::string stem = key;
    std::replace(stem.begin(), stem.end(), '/', '-');
    residual = dir / (stem + ".residual");
    delta = dir / (stem + ".delta");
    global = dir / (stem + ".reconstructed");
  }
  ~DownlinkSpool() {
    std::error_code ignored;
    for (const auto& path : {residual, delta, global}) std::filesystem::remove(path, ignored);
  }
};

// The spec's strategy options; under secure aggregation dp_fedavg's workers add its noise (docs/secure-aggregation.md).
strategy::StrategyOptions StrategyOptionsOf(const JobSpec& spec) {
  strategy::StrategyOptions options = spec.distributed.strategy_options;
  options.noise_from_workers = spec.distributed.secure_aggregation.enabled;
  return options;
}

}  // namespace

Aggregator::Aggregator(const storage::TrainingJob& job, const JobSpec& spec, int num_shards) {
  if (spec.distributed.async.enabled) server_learning_rate_ = spec.distributed.async.server_learning_rate;
  // The job's private seed keys what must stay secret (dp_fedavg's noise and sample): storage::TrainingJob.
  StatusOr<weights::SecretKey> private_key = weights::ParseSecretKey(job.private_seed);
  if (!private_key.ok() && spec.distributed.strategy == strategy::StrategyKind::kDpFedAvg) {
    private_key = FailedPreconditionError("job " + std::to_string(job.id) +
                                          " has no private seed, which dp_fedavg draws its noise under");
  }
  StatusOr<std::unique_ptr<strategy::Strategy>> made =
      private_key.ok() || spec.distributed.strategy != strategy::StrategyKind::kDpFedAvg
          ? strategy::MakeStrategy(spec.distributed.strategy, StrategyOptionsOf(spec),
                                   private_key.ok() ? *private_key : weights::SecretKey{})
          : StatusOr<std::unique_ptr<strategy::Strategy>>(private_key.status());
  if (made.ok()) {
    strategy_ = std::move(*made);
    // dp_fedavg's sampling rate q = K / eligible: the eligible workers are the job's shards (one per worker that
    // may take part; docs/training.md, "Differential privacy").
    strategy_->set_eligible_workers(num_shards);
    // LoRA updates of mixed ranks: averaged exactly in factored form (config.lora_aggregation "svd"), or padded.
    strategy::LoraRanks lora_ranks = strategy::LoraRanks::kSame;
    if (spec.config.use_peft && spec.lora_ranks.EffectiveAggregation() == LoraAggregation::kSvd) {
      lora_ranks = strategy::LoraRanks::kFactored;
    } else if (spec.config.use_peft && spec.lora_ranks.mixed()) {
      lora_ranks = strategy::LoraRanks::kZeroPadded;
    }
    round_.emplace(*strategy_, lora_ranks);
  } else {
    error_ = made.status();
  }
  const protocol::UpdateCompression& compression = spec.distributed.compression;
  if (StatusOr<weights::UpdateCodec> codec = weights::ParseUpdateCodec(protocol::GlobalDeltaCodec(compression.global));
      codec.ok() && *codec != weights::UpdateCodec::kNone) {
    // Error feedback always: each global carries the rounding the one before it left out.
    downlink_ = {.codec = *codec, .delta = true, .zstd_level = compression.zstd_level, .error_feedback = true};
  }
}

loop::Awaitable<void> Aggregator::AddKeptUpdates(boost::asio::thread_pool& pool, bool small_update) {
  if (small_update) {
    round_->AddKeptUpdates();
    co_return;
  }
  auto added = loop::Offload(pool, [&] {  // kCoAwaitTemporaries
    round_->AddKeptUpdates();
    return true;
  });
  co_await std::move(added);
}

StatusOr<GlobalWeights::DeltaCopy> Aggregator::EncodeDelta(storage::BlobStore& blobs, const std::string& key,
                                                           const Base& base, const std::filesystem::path& spool_dir,
                                                           weights::WeightSet& mean, storage::BlobInfo* global) const {
  std::error_code ec;
  std::filesystem::create_directories(spool_dir, ec);
  DownlinkSpool spool(spool_dir, key);
  // The residual the global before left, named by its metadata and stored beside it (none: from zero).
  if (auto named = base.weights.metadata().find(kGlobalResidualShaKey); named != base.weights.metadata().end()) {
    PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy carried,
                            storage::LocalBlobCopy::Open(blobs, KeyFolder(base.key) + kGlobalResidualFile, spool_dir));
    if (carried.sha256() != named->second) {
      return DataLossError("the downlink residual beside " + base.key + " has sha256 " + carried.sha256() +
                           ", the global names " + named->second);
    }
    std::filesystem::copy_file(carried.path(), spool.residual, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return UnavailableError("copying the downlink residual into " + spool_dir.string() + ": " + ec.message());
  }
  PARSYN_RETURN_IF_ERROR(weights::EncodeSetForWire(mean, base.weights, downlink_, spool.residual, spool.delta)
                             .WithContext("encoding the global as a delta"));
  PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo residual,
                          PutFile(blobs, KeyFolder(key) + kGlobalResidualFile, spool.residual));
  GlobalWeights::DeltaCopy delta{.of_global = key,
                                 .key = KeyFolder(key) + kGlobalDeltaFile,
                                 .base_sha256 = base.sha256,
                                 .metadata = mean.metadata()};
  delta.metadata[kGlobalResidualShaKey] = residual.sha256;
  // The global is what the workers reconstruct from the delta: written by the same function, read back.
  PARSYN_RETURN_IF_ERROR(
      weights::WriteGlobalFromDelta(spool.delta, base.weights, downlink_, delta.metadata, spool.global));
  PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo stored_delta, PutFile(blobs, delta.key, spool.delta));
  delta.sha256 = stored_delta.sha256;
  delta.size_bytes = stored_delta.size_bytes;
  PARSYN_ASSIGN_OR_RETURN(*global, PutFile(blobs, key, spool.global));  // the file as written: no second serialisation
  PARSYN_ASSIGN_OR_RETURN(mean, weights::ReadSafetensorsFile(spool.global));
  return delta;
}

StatusOr<Aggregator::Aggregated> Aggregator::FinishRound(storage::BlobStore& blobs, const std::string& key,
                                                         const std::string& state_key, const Base& base,
                                                         const std::filesystem::path& spool_dir,
                                                         FinishTimings* timings) {
  const auto finish_start = std::chrono::steady_clock::now();
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet mean, round_->Finish());
  PARSYN_RETURN_IF_ERROR(strategy::ApplyServerLearningRate(mean, base.weights, server_learning_rate_));
  timings->finish_ms = MillisSince(finish_start);
  return StoreNewGlobal(std::move(mean), blobs, key, state_key, base, spool_dir, timings);
}

StatusOr<Aggregator::Aggregated> Aggregator::FinishSecureRound(weights::WeightSet mean, int count,
                                                               storage::BlobStore& blobs, const std::string& key,
                                                               const std::string& state_key, const Base& base,
                                                               const std::filesystem::path& spool_dir,
                                                               FinishTimings* timings) {
  const auto finish_start = std::chrono::steady_clock::now();
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet global, strategy_->FinishFromMean(std::move(mean), count));
  timings->finish_ms = MillisSince(finish_start);
  return StoreNewGlobal(std::move(global), blobs, key, state_key, base, spool_dir, timings);
}

StatusOr<Aggregator::Aggregated> Aggregator::StoreNewGlobal(weights::WeightSet mean, storage::BlobStore& blobs,
                                                            const std::string& key, const std::string& state_key,
                                                            const Base& base, const std::filesystem::path& spool_dir,
                                                            FinishTimings* timings) {
  auto phase_start = std::chrono::steady_clock::now();
  mean.metadata()["format"] = "pt";
  // A server optimizer's state is durable before the global that names it: a restart resumes from the pair.
  if (const weights::WeightSet* state = strategy_->PendingState()) {
    PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo state_info, PutWeightSet(blobs, state_key, *state));
    mean.metadata()[kServerStateShaKey] = state_info.sha256;
  }
  timings->serialize_ms = MillisSince(phase_start);
  phase_start = std::chrono::steady_clock::now();
  Aggregated out;
  if (downlink_.codec != weights::UpdateCodec::kNone) {
    PARSYN_ASSIGN_OR_RETURN(out.delta, EncodeDelta(blobs, key, base, spool_dir, mean, &out.info));
  } else {
    PARSYN_ASSIGN_OR_RETURN(out.info, PutWeightSet(blobs, key, mean));
  }
  timings->put_ms = MillisSince(phase_start);
  // The job keeps the stored global read-only mapped where the store has local files: until a strategy reads it
  // again (FedAvg reads only its layout), it is page cache, so the next round's aggregation is the only copy of the
  // model in this process's memory. Else (memory, S3) it keeps the result in memory.
  if (StatusOr<std::filesystem::path> path = blobs.LocalPath(key); path.ok()) {
    if (StatusOr<weights::WeightSet> mapped = weights::MapSafetensorsFileReadOnly(*path); mapped.ok()) {
      out.weights = std::make_shared<weights::WeightSet>(std::move(*mapped));
      return out;
    }
  }
  out.weights = std::make_shared<weights::WeightSet>(std::move(mean));
  return out;
}

}  // namespace parsyn::coordinator
