#include "coordinator/job_preparation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <span>

#include "coordinator/job_runner_internal.h"
#include "coordinator/partition.h"
#include "coordinator/sharding.h"
#include "data/dataset.h"
#include "storage/byte_source.h"
#include "storage/local_blob_copy.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {
namespace {

// A sharded checkpoint's tensors as one safetensors image, the global of a full-weight job on a sharded model (a custom
// model's): the shards in their names' order as the index names them, each shard's tensors in its data order, so a
// setup interrupted and redone writes the same bytes. The whole model is held in memory while it is joined. Blocking.
StatusOr<std::string> JoinedShardsImage(storage::BlobStore& blobs, const storage::Model& model,
                                        const std::filesystem::path& spool_dir) {
  const storage::ModelFile* index = nullptr;
  for (const storage::ModelFile& f : model.files) {
    if (f.path == weights::kShardIndexFile) index = &f;
  }
  if (index == nullptr) return FailedPreconditionError("model " + std::to_string(model.id) + " has no shard index");
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, blobs.Get(index->blob_key));
  PARSYN_ASSIGN_OR_RETURN(std::string text, storage::ReadAll(*source, size_t{16} << 20));
  PARSYN_ASSIGN_OR_RETURN(auto shards, weights::ParseSafetensorsIndex(text));
  weights::WeightSet joined;
  for (const auto& [shard, names] : shards) {
    const auto file = std::find_if(model.files.begin(), model.files.end(),
                                   [&shard](const storage::ModelFile& f) { return f.path == shard; });
    if (file == model.files.end())
      return DataLossError(std::string(weights::kShardIndexFile) + " names a missing " + shard);
    PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy,
                            storage::LocalBlobCopy::Open(blobs, file->blob_key, spool_dir));
    PARSYN_ASSIGN_OR_RETURN(weights::WeightSet part, weights::ReadSafetensorsFile(copy.path()));
    for (const weights::Tensor& t : part.tensors()) {
      PARSYN_RETURN_IF_ERROR(joined.Add(t.name, t.dtype, t.shape, t.data).WithContext(shard));
    }
  }
  std::vector<std::byte> image = weights::SerializeSafetensors(joined);
  return std::string(reinterpret_cast<const char*>(image.data()), image.size());
}

// The workers' own data: nothing to split or upload. The shards are slots without rows, stored so that a worker keeps
// its slot (and so its seeds) across a restart.
Status CreateWorkerSlots(const JobPreparationInputs& in, PreparedJob& p) {
  const RoundEngineConfig& config = in.config;
  const bool fixed_owners = config.num_shards == static_cast<int>(config.eligible_workers.size());
  for (int i = 0; i < config.num_shards; ++i) {
    storage::Shard slot;
    slot.shard_index = i;
    if (fixed_owners) slot.worker_id = config.eligible_workers[static_cast<size_t>(i)];
    p.shards.push_back(std::move(slot));
  }
  PARSYN_RETURN_IF_ERROR(in.store.CreateShards(in.job_id, p.shards));
  PARSYN_ASSIGN_OR_RETURN(p.shards, in.store.ListShards(in.job_id));
  return Status::Ok();
}

// The rows of each shard, by distributed.partition (an ordinary job's one shard is the whole dataset: iid). The labels
// are read when there is one to read: a CSV's label column, or a JSONL field the partition names.
StatusOr<std::vector<Shard>> SplitDataset(const JobPreparationInputs& in, const storage::Dataset& dataset,
                                          const std::filesystem::path& source, data::DatasetFormat format,
                                          const data::TabularOptions& tabular, std::optional<data::RowLabels>& labels) {
  const JobSpec& spec = in.spec;
  DataPartition partition = spec.distributed.enabled ? spec.distributed.partition : DataPartition{};
  if (!spec.distributed.enabled) partition.label = spec.distributed.partition.label;
  if (partition.label.empty() && format == data::DatasetFormat::kCsv) partition.label = tabular.label_column;
  if (partition.label.empty()) {
    return SplitRows(dataset.row_count, in.config.num_shards, spec.config.validation_fraction, spec.config.seed);
  }
  StatusOr<data::RowLabels> read = data::ReadRowLabels(source, format, partition.label);
  if (!read.ok()) {
    return read.status().WithContext("distributed.partition.label \"" + partition.label + "\" of dataset " +
                                     std::to_string(dataset.id));
  }
  labels = std::move(*read);
  return SplitRowsByLabel(*labels, in.config.num_shards, spec.config.validation_fraction, partition, spec.config.seed);
}

// The shard records of `split` (without their files yet), each with its label histogram when there are labels.
std::vector<storage::Shard> ShardRecords(const JobPreparationInputs& in, const std::vector<Shard>& split,
                                         const std::optional<data::RowLabels>& labels) {
  const std::vector<std::vector<int64_t>> histograms =
      labels ? LabelHistograms(split, *labels) : std::vector<std::vector<int64_t>>{};
  const bool fixed_owners = in.config.num_shards == static_cast<int>(in.config.eligible_workers.size());
  std::vector<storage::Shard> shards;
  for (size_t i = 0; i < split.size(); ++i) {
    storage::Shard shard;
    shard.shard_index = static_cast<int32_t>(i);
    if (fixed_owners) shard.worker_id = in.config.eligible_workers[i];
    shard.train_rows = static_cast<int64_t>(split[i].train_rows.size());
    shard.validation_rows = static_cast<int64_t>(split[i].validation_rows.size());
    if (labels) shard.label_histogram_json = LabelHistogramJson(histograms[i], labels->class_names);
    shards.push_back(std::move(shard));
  }
  return shards;
}

// Splits the dataset into shards: every shard's train and validation bytes from one pass over the dataset (per budget
// of memory), straight into the blob store without a flush each and one flush for all: setup is linear in the
// dataset and costs one sync, not shards x (dataset + fsyncs). The shard records come after that flush, so a crash
// before it leaves no record; the redone setup replaces any blob a crash left behind.
Status WriteShards(const JobPreparationInputs& in, PreparedJob& p) {
  const auto split_start = std::chrono::steady_clock::now();
  PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy dataset_copy,
                          storage::LocalBlobCopy::Open(in.blobs, p.dataset.blob_key, in.spool_dir));
  const std::filesystem::path& source = dataset_copy.path();
  const data::DatasetFormat format =
      p.dataset.format == storage::DatasetFormat::kCsv ? data::DatasetFormat::kCsv : data::DatasetFormat::kJsonl;
  data::TabularOptions tabular;
  if (!in.spec.config.label_column.empty()) tabular.label_column = in.spec.config.label_column;
  std::optional<data::RowLabels> labels;
  PARSYN_ASSIGN_OR_RETURN(std::vector<Shard> split, SplitDataset(in, p.dataset, source, format, tabular, labels));
  constexpr std::array<const char*, 2> kParts = {"train", "validation"};
  std::vector<std::span<const int64_t>> subsets;  // shard i's train rows at 2i, its validation rows at 2i + 1
  for (const Shard& shard : split) {
    subsets.push_back(shard.train_rows);
    subsets.push_back(shard.validation_rows);
  }
  p.shards = ShardRecords(in, split, labels);
  p.split_ms = MillisSince(split_start);

  auto phase_start = std::chrono::steady_clock::now();
  const storage::PutOptions scratch{.max_size_bytes = std::nullopt, .expected_sha256 = std::nullopt, .durable = false};
  auto put_subset = [&](size_t subset, std::string&& bytes) -> Status {
    const size_t i = subset / 2, k = subset % 2;
    const std::string key =
        fmt::format("jobs/{}/shards/{:05}.{}.{}", in.job_id, i, kParts[k], DatasetExtension(p.dataset.format));
    storage::StringByteSource bytes_in(bytes);
    StatusOr<storage::BlobInfo> info = in.blobs.Put(key, bytes_in, scratch);
    if (!info.ok() && info.status().code() == StatusCode::kAlreadyExists) {
      // Left by a setup a crash interrupted (no shard record names it): its bytes may be torn, so replace it.
      PARSYN_RETURN_IF_ERROR(in.blobs.Delete(key));
      storage::StringByteSource again(bytes);
      info = in.blobs.Put(key, again, scratch);
    }
    if (!info.ok()) return info.status();
    if (k == 0) {
      p.shards[i].blob_key = key;
      p.shards[i].sha256 = info->sha256;
    }
    return Status::Ok();
  };
  PARSYN_RETURN_IF_ERROR(data::SplitIntoSubsets(source, format, subsets, put_subset, tabular));
  PARSYN_RETURN_IF_ERROR(in.blobs.SyncAll());
  p.blobs_ms = MillisSince(phase_start);
  phase_start = std::chrono::steady_clock::now();
  PARSYN_RETURN_IF_ERROR(in.store.CreateShards(in.job_id, p.shards));
  PARSYN_ASSIGN_OR_RETURN(p.shards, in.store.ListShards(in.job_id));
  p.records_ms = MillisSince(phase_start);
  return Status::Ok();
}

// The starting global's blob key, written first where it is made here: a PEFT job's initial adapters, or a sharded
// checkpoint joined. Full fine-tuning otherwise starts from the model's own model.safetensors.
StatusOr<std::string> StartingGlobal(const JobPreparationInputs& in, const storage::Model& model) {
  const std::string made_key = fmt::format("jobs/{}/rounds/{:06}/global.safetensors", in.job_id, 0);
  if (in.spec.config.use_peft) {
    PARSYN_ASSIGN_OR_RETURN(std::string image, InitialAdapterImage(model, in.spec));
    PARSYN_RETURN_IF_ERROR(PutBytes(in.blobs, made_key, std::move(image)).status());
    return made_key;
  }
  bool sharded = false;
  for (const storage::ModelFile& f : model.files) {
    if (f.path == "model.safetensors") return f.blob_key;
    sharded = sharded || f.path == weights::kShardIndexFile;
  }
  if (!sharded) {
    return FailedPreconditionError("model " + std::to_string(model.id) +
                                   " has no model.safetensors to fine-tune (use_peft is false)");
  }
  PARSYN_ASSIGN_OR_RETURN(std::string image, JoinedShardsImage(in.blobs, model, in.spool_dir));
  PARSYN_RETURN_IF_ERROR(PutBytes(in.blobs, made_key, std::move(image)).status());
  return made_key;
}

}  // namespace

StatusOr<PreparedJob> PrepareJob(const JobPreparationInputs& in) {
  PreparedJob p;
  PARSYN_ASSIGN_OR_RETURN(p.model, in.store.GetModel(in.spec.model_id));
  PARSYN_ASSIGN_OR_RETURN(p.shards, in.store.ListShards(in.job_id));
  if (p.shards.empty() && in.config.workers_hold_data) PARSYN_RETURN_IF_ERROR(CreateWorkerSlots(in, p));
  if (!in.config.workers_hold_data) {
    PARSYN_ASSIGN_OR_RETURN(p.dataset, in.store.GetDataset(in.spec.dataset_id));
  }
  if (p.shards.empty()) PARSYN_RETURN_IF_ERROR(WriteShards(in, p));
  if (!in.config.workers_hold_data) {
    const auto phase_start = std::chrono::steady_clock::now();
    PARSYN_ASSIGN_OR_RETURN(p.validation_sha256, ValidationChecksums(in.blobs, p.shards, p.dataset.format));
    p.checksums_ms = MillisSince(phase_start);
  }
  PARSYN_ASSIGN_OR_RETURN(p.global_key, StartingGlobal(in, p.model));
  return p;
}

StatusOr<std::string> InitialAdapterImage(const storage::Model& model, const JobSpec& spec) {
  weights::LoraLayoutOptions lora;
  lora.r = spec.config.lora_r;
  lora.target_modules = spec.config.lora_target_modules;
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet adapters,
                          weights::InitialLoraAdapters(model.config_json, lora, spec.config.seed));
  std::vector<std::byte> image = weights::SerializeSafetensors(adapters);
  return std::string(reinterpret_cast<const char*>(image.data()), image.size());
}

StatusOr<std::vector<std::string>> ValidationChecksums(storage::BlobStore& blobs,
                                                       const std::vector<storage::Shard>& shards,
                                                       storage::DatasetFormat format) {
  std::vector<std::string> checksums;
  for (const storage::Shard& shard : shards) {
    if (shard.blob_key.empty()) {  // a slot of a job over the workers' own data
      checksums.emplace_back();
      continue;
    }
    PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo info, blobs.Head(ValidationKey(shard, format)));
    checksums.push_back(info.sha256);
  }
  return checksums;
}

}  // namespace parsyn::coordinator
