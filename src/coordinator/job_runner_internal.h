// Helpers shared by the files of JobRunner (job_runner.cc, job_runner_setup.cc, job_runner_tasks.cc,
// job_runner_updates.cc, job_runner_commit.cc) and its Aggregator (aggregator.cc). Not for other users.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "storage/blob_store.h"
#include "storage/byte_source.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// Updates carry the global's tensors: the same bytes plus a header that may differ in key order and metadata.
inline constexpr uint64_t kUpdateHeaderSlackBytes = 1 << 20;

inline std::string_view DatasetExtension(storage::DatasetFormat format) {
  return format == storage::DatasetFormat::kCsv ? "csv" : "jsonl";
}

// The key of a shard's validation file, beside its training file (job_runner_setup.cc writes both): the training file's
// key with "validation" for its last "train" ("jobs/7/shards/00042.train.csv"; jobs set up before the flat layout have
// "jobs/7/shards/042/train.csv").
inline std::string ValidationKey(const storage::Shard& shard, storage::DatasetFormat format) {
  return shard.blob_key.substr(0, shard.blob_key.rfind("train.")) + "validation." +
         std::string(DatasetExtension(format));
}

inline StatusOr<storage::BlobInfo> PutBytes(storage::BlobStore& blobs, const std::string& key, std::string bytes) {
  storage::StringByteSource source(std::move(bytes));
  StatusOr<storage::BlobInfo> info = blobs.Put(key, source);
  // A blob left by a run that crashed before recording it holds the same deterministic bytes: reuse it.
  if (!info.ok() && info.status().code() == StatusCode::kAlreadyExists) return blobs.Head(key);
  return info;
}

// The start of the job's "warning" event about local datasets of very different sizes (job_runner_updates.cc), by which
// a resumed job knows it was already given.
// The global's safetensors metadata key that holds the sha256 of the server state stored beside it
// (server_state.safetensors in the same attempt folder); absent for stateless strategies.
inline constexpr char kServerStateShaKey[] = "parsyn_server_state_sha256";
inline constexpr char kServerStateFile[] = "server_state.safetensors";

inline constexpr std::string_view kUnevenLocalDataWarning = "the workers' local datasets differ in size";

// For the debug log's per-phase timings.
inline double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace parsyn::coordinator
