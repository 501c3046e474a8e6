// What a job's setup writes once, before its first round: the shards (a dataset split into per-shard training and
// validation files in the blob store, with their records; or, for a job over the workers' own data, slots without
// rows) and the starting global (a PEFT job's initial adapters, a sharded checkpoint joined, or the model's own
// weights). A setup interrupted by a crash redoes what is missing. Blocking: JobRunner::Setup runs it on the pool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "base/status.h"
#include "coordinator/job_spec.h"
#include "coordinator/round_engine.h"
#include "storage/blob_store.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

struct JobPreparationInputs {
  storage::MetadataStore& store;
  storage::BlobStore& blobs;
  const JobSpec& spec;
  const RoundEngineConfig& config;  // num_shards, eligible_workers, workers_hold_data
  int64_t job_id = 0;
  std::filesystem::path spool_dir;  // where blobs are copied to be read as files
};

struct PreparedJob {
  storage::Model model;
  storage::Dataset dataset;  // none for a job over the workers' own data
  std::vector<storage::Shard> shards;
  std::vector<std::string> validation_sha256;  // by shard index (empty for slots without rows)
  std::string global_key;                      // the starting global's blob
  // Where setup's time went (logged: a job over thousands of shards must not sit long in `queued`).
  double split_ms = 0, blobs_ms = 0, records_ms = 0, checksums_ms = 0;
};

StatusOr<PreparedJob> PrepareJob(const JobPreparationInputs& in);

// A PEFT job's starting adapters as a safetensors image: deterministic (model config, LoRA options, seed), so a
// restart can check the stored blob against them.
StatusOr<std::string> InitialAdapterImage(const storage::Model& model, const JobSpec& spec);

// The sha256 of each shard's validation file, by shard index. The metadata store records the training file's only;
// the validation file's is the blob store's record of it, made when setup wrote it. Workers check their downloads
// against both.
StatusOr<std::vector<std::string>> ValidationChecksums(storage::BlobStore& blobs,
                                                       const std::vector<storage::Shard>& shards,
                                                       storage::DatasetFormat format);

}  // namespace parsyn::coordinator
