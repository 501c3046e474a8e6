#include "coordinator/job_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "base/log.h"
#include "base/sha256.h"
#include "coordinator/job_preparation.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/sharding.h"
#include "storage/local_blob_copy.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

namespace {

// A global read from the store, with the size and sha256 of the bytes actually read.
struct ReadGlobal {
  weights::WeightSet weights;
  std::string sha256;
  uint64_t size_bytes = 0;
};

// Reads the global weights blob, checking its bytes against `expected_sha256` (the metadata store's record; empty:
// nothing recorded) before anything is parsed. The directory store's Head answers the checksum it recorded when it
// wrote the blob, so the file is hashed here again: a file changed on disk since then is caught.
// `what` names the blob in the message ("the global weights", "the server state").
StatusOr<ReadGlobal> ReadVerifiedGlobal(storage::BlobStore& blobs, const std::string& key,
                                        const std::string& expected_sha256, const std::filesystem::path& spool_dir,
                                        const std::string& what = "the global weights") {
  PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy, storage::LocalBlobCopy::Open(blobs, key, spool_dir));
  ReadGlobal global{.weights = {}, .sha256 = copy.sha256(), .size_bytes = copy.size_bytes()};
  if (!copy.downloaded()) {
    PARSYN_ASSIGN_OR_RETURN(global.sha256, Sha256File(copy.path()));
  }
  if (!expected_sha256.empty() && global.sha256 != expected_sha256) {
    const bool weights = what == "the global weights";
    return DataLossError(what + " " + key + (weights ? " have" : " has") + " sha256 " + global.sha256 + ", but the " +
                         (weights ? "metadata store" : "committed global") + " recorded " + expected_sha256 +
                         ": the blob changed after it was written; the job does not train on it");
  }
  PARSYN_ASSIGN_OR_RETURN(global.weights, weights::ReadSafetensorsFile(copy.path()));
  return global;
}

}  // namespace

http::Awaitable<Status> JobRunner::LoadGlobal(std::string_view key_view, std::string_view sha256_view) {
  const std::string key(key_view), sha256(sha256_view);
  StatusOr<ReadGlobal> global = co_await loop::Offload(
      host_.pool(), [&] { return ReadVerifiedGlobal(host_.blobs(), key, sha256, host_.spool_dir()); });
  if (!global.ok()) {
    if (global.status().code() == StatusCode::kDataLoss) co_return global.status();  // it names the blob already
    co_return global.status().WithContext("reading the global weights " + key);
  }
  global_.Set(key, global->sha256, global->size_bytes,
              std::make_shared<weights::WeightSet>(std::move(global->weights)));
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::LoadServerState() {
  if (!aggregator_.strategy()->has_state()) co_return Status::Ok();
  if (job_.committed_round == 0) co_return aggregator_.strategy()->RestoreState(nullptr);
  auto recorded = global_.weights()->metadata().find(kServerStateShaKey);
  if (recorded == global_.weights()->metadata().end()) {
    co_return DataLossError(
        "the global weights " + global_.key() + " of round " + std::to_string(job_.committed_round) + " name no " +
        std::string(aggregator_.strategy()->name()) + " server state: the job cannot resume its server optimizer");
  }
  const std::string key = global_.key().substr(0, global_.key().rfind('/') + 1) + kServerStateFile;
  const std::string sha256 = recorded->second;
  StatusOr<ReadGlobal> state = co_await loop::Offload(host_.pool(), [&] {
    return ReadVerifiedGlobal(host_.blobs(), key, sha256, host_.spool_dir(), "the server state");
  });
  if (!state.ok()) {
    if (state.status().code() == StatusCode::kDataLoss) co_return state.status();
    co_return DataLossError("reading the server state " + key + ": " + state.status().message());
  }
  Status restored = aggregator_.strategy()->RestoreState(&state->weights);
  if (!restored.ok()) co_return DataLossError("the server state " + key + ": " + restored.message());
  co_return Status::Ok();
}

std::string JobRunner::InitialGlobalSha256(std::string* key) const {
  if (spec_.config.use_peft) {
    *key = fmt::format("jobs/{}/rounds/{:06}/global.safetensors", job_.id, 0);
    StatusOr<std::string> image = InitialAdapterImage(model_, spec_);
    return image.ok() ? Sha256Hex(*image) : "";  // an error here shows when the blob is parsed
  }
  for (const storage::ModelFile& f : model_.files) {
    if (f.path == "model.safetensors") {
      *key = f.blob_key;
      return f.sha256;
    }
  }
  // A sharded checkpoint's joined global (JoinedShardsImage): its bytes are written by setup from the model's
  // checked files; joining them again to check it would read the whole model on every resume.
  *key = fmt::format("jobs/{}/rounds/{:06}/global.safetensors", job_.id, 0);
  return "";
}

http::Awaitable<Status> JobRunner::Setup() {
  storage::MetadataStore& store = host_.store();
  const int64_t job_id = job_.id;
  const JobSpec& spec = spec_;
  const auto setup_start = std::chrono::steady_clock::now();
  const JobPreparationInputs inputs{.store = host_.store(),
                                    .blobs = host_.blobs(),
                                    .spec = spec_,
                                    .config = engine_config_,
                                    .job_id = job_id,
                                    .spool_dir = host_.spool_dir()};
  StatusOr<PreparedJob> prepared = co_await loop::Offload(host_.pool(), [&] { return PrepareJob(inputs); });
  if (!prepared.ok()) co_return prepared.status();
  PARSYN_LOG_INFO(
      "training job {}: {} shards prepared in {:.0f} ms (split {:.0f} ms, shard files into the blob store {:.0f} ms, "
      "records {:.0f} ms, validation checksums {:.0f} ms)",
      job_id, prepared->shards.size(), MillisSince(setup_start), prepared->split_ms, prepared->blobs_ms,
      prepared->records_ms, prepared->checksums_ms);
  model_ = std::move(prepared->model);
  dataset_ = std::move(prepared->dataset);
  shards_ = std::move(prepared->shards);
  validation_sha256_ = std::move(prepared->validation_sha256);
  // The starting global is checked as a restart checks it: the model file against the model's record, a PEFT job's
  // adapters against the ones just made (a blob left by an interrupted setup is reused only if it is the same).
  std::string initial_key;
  const std::string initial_sha256 = InitialGlobalSha256(&initial_key);
  Status loaded = co_await LoadGlobal(prepared->global_key, initial_sha256);
  if (!loaded.ok()) co_return loaded;

  // A non-IID partition makes the shards' sizes uneven by design, known only now that the labels are read: the
  // create answer's size warnings assumed the even split (docs/training.md, "Warnings").
  if (spec.distributed.enabled && spec.distributed.partition.method != PartitionMethod::kIid) {
    std::vector<int64_t> train_rows;
    for (const storage::Shard& s : shards_) train_rows.push_back(s.train_rows);
    if (std::optional<std::string> uneven = UnevenShardsWarning(train_rows)) {
      auto event_appended = host_.AppendEvent(job_id, "warning", {{"message", *uneven}});
      co_await std::move(event_appended);
    }
  }

  const int64_t now = host_.clock().UnixMillis();
  StatusOr<storage::TrainingJob> running =
      co_await loop::Offload(host_.pool(), [&] { return store.SetJobStatus(job_id, JobStatus::kRunning, now); });
  if (!running.ok()) co_return running.status();
  job_ = *running;
  {
    auto event_appended = host_.AppendEvent(job_id, "job_status", {{"status", "running"}});
    co_await std::move(event_appended);
  }

  if (!engine_config_.workers_hold_data) {
    for (const storage::Shard& s : shards_) engine_config_.shard_train_rows.push_back(s.train_rows);
  }
  engine_ = std::make_unique<RoundEngine>(engine_config_, *aggregator_.strategy(), host_.clock());
  const std::vector<int64_t> idle = host_.IdleWorkers();
  const auto start_start = std::chrono::steady_clock::now();
  auto handled = Handle([&] { return engine_->Start(idle); });  // kCoAwaitTemporaries
  Status started = co_await std::move(handled);
  PARSYN_LOG_INFO("training job {}: started over {} idle workers in {:.0f} ms (set up in {:.0f} ms in all)", job_id,
                  idle.size(), MillisSince(start_start), MillisSince(setup_start));
  co_return StartedOrRecovering(started);
}

StatusOr<JobRunner::StoredJob> JobRunner::ReadStoredJob(const std::string& running_attempt_failure, int64_t now) {
  storage::MetadataStore& store = host_.store();
  const int64_t job_id = job_.id;
  StoredJob l;
  PARSYN_ASSIGN_OR_RETURN(l.model, store.GetModel(job_.model_id));
  if (!engine_config_.workers_hold_data) {
    PARSYN_ASSIGN_OR_RETURN(l.dataset, store.GetDataset(job_.dataset_id));
  }
  PARSYN_ASSIGN_OR_RETURN(l.shards, store.ListShards(job_id));
  if (!engine_config_.workers_hold_data) {
    PARSYN_ASSIGN_OR_RETURN(l.validation_sha256, ValidationChecksums(host_.blobs(), l.shards, l.dataset.format));
  }
  PARSYN_ASSIGN_OR_RETURN(l.rounds, store.ListRounds(job_id));
  // The attempt in flight when the coordinator stopped cannot finish: its tasks and partial sums are gone.
  for (storage::Round& r : l.rounds) {
    if (r.status != storage::RoundStatus::kRunning) continue;
    storage::RoundFailure failure{.job_id = job_id,
                                  .round = r.round,
                                  .attempt = r.attempt,
                                  .reason = running_attempt_failure,
                                  .ended_at_ms = now,
                                  .bytes_down = r.bytes_down.value_or(0),
                                  .bytes_up = r.bytes_up.value_or(0),
                                  .counts_toward_fault_tolerance = false};
    if (engine_config_.async) {
      // Its accepted updates are carried into the version's next attempt (its folder keeps their uploads).
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::RoundUpdate> updates, store.ListUpdates(job_id, r.round, r.attempt));
      for (storage::RoundUpdate& u : updates) {
        if (u.status == storage::UpdateStatus::kAccepted && u.trained_on_round) l.carried.push_back(std::move(u));
      }
      std::stable_sort(l.carried.begin(), l.carried.end(),
                       [](const auto& a, const auto& b) { return a.received_at_ms < b.received_at_ms; });
    }
    PARSYN_RETURN_IF_ERROR(store.FailRound(failure));
    r.status = storage::RoundStatus::kFailed;
    if (!engine_config_.async) DeleteUpdatesInBackground(AttemptPrefix(r.round, r.attempt) + "/updates/");
  }
  PARSYN_ASSIGN_OR_RETURN(l.job, store.GetJob(job_id));
  // The warning about uneven local datasets is appended once per job, also across restarts.
  if (engine_config_.workers_hold_data) {
    PARSYN_RETURN_IF_ERROR(storage::ForEachJobEventOfType(store, job_id, "warning", [&](const storage::JobEvent& e) {
      if (e.payload_json.find(kUnevenLocalDataWarning) != std::string::npos) l.local_sizes_warned = true;
    }));
  }
  return l;
}

EngineCheckpoint JobRunner::CheckpointFrom(const std::vector<storage::Round>& rounds, std::string& global_key,
                                           std::string& global_sha) {
  EngineCheckpoint checkpoint;
  checkpoint.last_committed_round = job_.committed_round;
  checkpoint.consecutive_failed_rounds = job_.consecutive_failed_rounds;
  for (const storage::Round& r : rounds) {
    if (r.round == job_.committed_round + 1)
      checkpoint.attempts_of_next_round = std::max(checkpoint.attempts_of_next_round, r.attempt);
    if (r.round == job_.committed_round && r.status == storage::RoundStatus::kCommitted) {
      global_key = r.global_blob_key;
      global_sha = r.global_sha256;
    }
  }
  // Early stopping's state, replayed from the losses measured during training, in order: the starting weights' and
  // those of globals 1..committed_round-1 (the last global's loss, if stored, is the final evaluation's: the job had
  // already decided to end, and the replay reaches that decision again).
  if (job_.initial_validation_loss) RecordEvaluation(checkpoint, engine_config_, 0, *job_.initial_validation_loss);
  for (const storage::Round& r : rounds) {
    if (r.status == storage::RoundStatus::kCommitted && r.round < job_.committed_round && r.validation_loss) {
      RecordEvaluation(checkpoint, engine_config_, r.round, *r.validation_loss);
    }
  }
  engine_config_.shard_train_rows.clear();
  for (const storage::Shard& s : shards_) {
    if (s.worker_id) checkpoint.shards[*s.worker_id] = s.shard_index;
    if (!engine_config_.workers_hold_data) engine_config_.shard_train_rows.push_back(s.train_rows);
  }
  return checkpoint;
}

http::Awaitable<StatusOr<EngineCheckpoint>> JobRunner::LoadCheckpoint(std::string running_attempt_failure) {
  const int64_t now = host_.clock().UnixMillis();
  StatusOr<StoredJob> loaded =
      co_await loop::Offload(host_.pool(), [&] { return ReadStoredJob(running_attempt_failure, now); });
  if (!loaded.ok()) co_return loaded.status();
  model_ = std::move(loaded->model);
  dataset_ = std::move(loaded->dataset);
  shards_ = std::move(loaded->shards);
  validation_sha256_ = std::move(loaded->validation_sha256);
  job_ = loaded->job;
  local_sizes_warned_ = local_sizes_warned_ || loaded->local_sizes_warned;

  std::string global_key, global_sha;
  const EngineCheckpoint checkpoint = CheckpointFrom(loaded->rounds, global_key, global_sha);
  // The global is checked against the metadata store's record of it (the committed round's, or before the first
  // commit the starting weights'), and the job fails, naming the blob, rather than train on other bytes.
  if (global_key.empty()) global_sha = InitialGlobalSha256(&global_key);
  Status global = co_await LoadGlobal(global_key, global_sha);
  if (!global.ok()) co_return global;
  Status state = co_await LoadServerState();
  if (!state.ok()) co_return state;
  carried_updates_ = std::move(loaded->carried);
  {
    auto loaded_earlier = LoadGlobalsOfCarriedUpdates(loaded->rounds);  // kCoAwaitTemporaries
    co_await std::move(loaded_earlier);
  }
  {
    // Uploads of the attempt that was failed above will never complete.
    auto aborted = AbortIncompleteUploads(RoundsPrefix());  // kCoAwaitTemporaries
    co_await std::move(aborted);
  }
  co_return checkpoint;
}

http::Awaitable<Status> JobRunner::Resume() {
  auto loading = LoadCheckpoint("the coordinator restarted during the round");  // kCoAwaitTemporaries
  StatusOr<EngineCheckpoint> loaded = co_await std::move(loading);
  if (!loaded.ok()) co_return loaded.status();
  const EngineCheckpoint checkpoint = *loaded;
  const int64_t job_id = job_.id;

  PARSYN_LOG_INFO("training job {}: resuming after round {} (attempt {} of round {} next)", job_id,
                  checkpoint.last_committed_round, checkpoint.attempts_of_next_round + 1,
                  checkpoint.last_committed_round + 1);
  {
    auto event_appended =
        host_.AppendEvent(job_id, "job_resumed", {{"committed_round", checkpoint.last_committed_round}});
    co_await std::move(event_appended);
  }
  engine_ = std::make_unique<RoundEngine>(engine_config_, *aggregator_.strategy(), host_.clock());
  const std::vector<int64_t> idle = host_.IdleWorkers();
  const std::vector<CarriedUpdate> carried = CarriedForEngine();
  auto handled = Handle([&] { return engine_->Restore(checkpoint, idle, carried); });  // kCoAwaitTemporaries
  Status restored = co_await std::move(handled);
  co_return StartedOrRecovering(restored);
}

http::Awaitable<void> JobRunner::LoadGlobalsOfCarriedUpdates(const std::vector<storage::Round>& rounds) {
  std::vector<storage::RoundUpdate> kept;
  for (storage::RoundUpdate& u : carried_updates_) {
    const int base = *u.trained_on_round;
    if (base != job_.committed_round && global_.Earlier(base) == nullptr) {
      std::string key, sha256;
      if (base == 0) sha256 = InitialGlobalSha256(&key);
      for (const storage::Round& r : rounds) {
        if (r.round == base && r.status == storage::RoundStatus::kCommitted) {
          key = r.global_blob_key;
          sha256 = r.global_sha256;
        }
      }
      StatusOr<ReadGlobal> global = co_await loop::Offload(
          host_.pool(), [&] { return ReadVerifiedGlobal(host_.blobs(), key, sha256, host_.spool_dir()); });
      if (!global.ok()) {
        PARSYN_LOG_WARN(
            "training job {}: the update of worker {} is not carried over the restart: global {} of round "
            "{}: {}",
            job_.id, u.worker_id, key, base, global.status().ToString());
        continue;
      }
      global_.KeepEarlier(base, std::make_shared<weights::WeightSet>(std::move(global->weights)));
    }
    kept.push_back(std::move(u));
  }
  carried_updates_ = std::move(kept);
}

std::vector<CarriedUpdate> JobRunner::CarriedForEngine() const {
  std::vector<CarriedUpdate> out;
  for (const storage::RoundUpdate& u : carried_updates_) {
    const std::optional<std::pair<int, int>> task = TaskOfUpdateKey(u.blob_key, u.worker_id);
    if (!task) continue;
    out.push_back({.worker = u.worker_id,
                   .sample_count = u.num_samples,
                   .train_loss = u.train_loss.value_or(0.0),
                   .task_round = task->first,
                   .task_attempt = task->second});
  }
  return out;
}

Status JobRunner::StartedOrRecovering(const Status& started) const {
  // Only a start the engine refused fails the job; a failed action (a store write) is retried by the runner itself.
  if (started.ok() || engine_->phase() == JobPhase::kNotStarted) return started;
  PARSYN_LOG_WARN("training job {}: started, retrying after: {}", job_.id, started.ToString());
  return Status::Ok();
}

}  // namespace parsyn::coordinator
