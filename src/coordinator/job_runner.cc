#include "coordinator/job_runner.h"

#include <fmt/format.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "base/log.h"
#include "coordinator/service.h"
#include "coordinator/sharding.h"
#include "data/dataset.h"
#include "storage/byte_source.h"
#include "storage/local_blob_copy.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"
#include "weights/sha256.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

// Events are appended as `{ auto event_appended = service_.AppendEvent(...); co_await std::move(event_appended); }`:
// g++ 12 miscompiles braced initializer lists inside co_await expressions.

namespace {

// Updates carry the global's tensors: the same bytes plus a header that may differ in key order and metadata.
constexpr uint64_t kUpdateHeaderSlackBytes = 1 << 20;

std::string_view DatasetExtension(storage::DatasetFormat format) {
  return format == storage::DatasetFormat::kCsv ? "csv" : "jsonl";
}

// Reads a safetensors blob memory-mapped: the directory store's own file, or (S3) a local copy downloaded once,
// whose mapping outlives the copy's file.
StatusOr<weights::WeightSet> ReadWeightsBlob(storage::BlobStore& blobs, const std::string& key,
                                             const std::filesystem::path& spool_dir) {
  PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy copy, storage::LocalBlobCopy::Open(blobs, key, spool_dir));
  return weights::ReadSafetensorsFile(copy.path());
}

StatusOr<storage::BlobInfo> PutBytes(storage::BlobStore& blobs, const std::string& key, std::string bytes) {
  storage::StringByteSource source(std::move(bytes));
  StatusOr<storage::BlobInfo> info = blobs.Put(key, source);
  // A blob left by a run that crashed before recording it holds the same deterministic bytes: reuse it.
  if (!info.ok() && info.status().code() == StatusCode::kAlreadyExists) return blobs.Head(key);
  return info;
}

std::string ToLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// For the debug log's per-phase timings.
double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Everything about an uploaded update that does not touch the strategy: its key, size, sha256, format, layout and
// values, all checked on the bytes as stored (with S3, on the one local copy that is also what gets accumulated,
// whatever the store's metadata says). Sets *size_bytes once the size is known. InvalidArgument names what is
// wrong; other codes are store errors. Blocking (a pool thread).
StatusOr<weights::WeightSet> CheckUpdateFile(storage::BlobStore& blobs, const ResultReport& report,
                                             const std::string& expected_key, uint64_t max_bytes,
                                             const weights::WeightSet& global, const std::filesystem::path& spool_dir,
                                             uint64_t* size_bytes) {
  if (report.blob_key != expected_key) {
    return InvalidArgumentError("update blob key '" + report.blob_key + "' is not this task's '" + expected_key + "'");
  }
  StatusOr<storage::LocalBlobCopy> copy = storage::LocalBlobCopy::Open(blobs, report.blob_key, spool_dir, max_bytes);
  if (!copy.ok()) {
    switch (copy.status().code()) {
      case StatusCode::kNotFound:
        return InvalidArgumentError("update was not uploaded to its signed URL (" + report.blob_key + ")");
      case StatusCode::kResourceExhausted:
        return InvalidArgumentError("update is larger than the " + std::to_string(max_bytes) +
                                    " bytes allowed for this job's weights");
      default: return copy.status();
    }
  }
  *size_bytes = copy->size_bytes();
  if (copy->sha256() != ToLower(report.sha256)) {
    return InvalidArgumentError("update sha256 " + copy->sha256() + " differs from the reported " + report.sha256);
  }
  StatusOr<weights::WeightSet> update = weights::ReadSafetensorsFile(copy->path());
  if (!update.ok()) return InvalidArgumentError("update is not a valid safetensors file: " + update.status().message());
  PARSYN_RETURN_IF_ERROR(global.CheckSameLayout(*update).WithContext("update layout differs from the global"));
  PARSYN_RETURN_IF_ERROR(weights::CheckFinite(*update));
  return update;
}

json ParticipantsJson(const std::vector<ParticipantView>& views, const std::map<int64_t, json>& progress) {
  json out = json::array();
  for (const ParticipantView& p : views) {
    json w = {{"worker_id", p.worker}, {"shard", p.shard}, {"state", ParticipantStateName(p.state)}};
    if (!p.reason.empty()) w["reason"] = p.reason;
    if (auto it = progress.find(p.worker); it != progress.end()) w["progress"] = it->second;
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

JobRunner::JobRunner(Service& service, storage::TrainingJob job, JobSpec spec)
    : service_(service),
      job_(std::move(job)),
      spec_(std::move(spec)),
      engine_config_(EngineConfigFor(spec_)),
      mutex_(service.executor()) {}

JobRunner::~JobRunner() = default;

bool JobRunner::finished() const { return ended_; }

bool JobRunner::IsEligible(int64_t worker_id) const {
  if (ended_ || engine_ == nullptr) return false;
  if (engine_config_.eligible_workers.empty()) return true;
  return std::find(engine_config_.eligible_workers.begin(), engine_config_.eligible_workers.end(), worker_id) !=
         engine_config_.eligible_workers.end();
}

std::string JobRunner::AttemptPrefix(int round, int attempt) const {
  return fmt::format("jobs/{}/rounds/{:06}-a{}", job_.id, round, attempt);
}

std::string JobRunner::UpdateKey(int round, int attempt, int64_t worker_id) const {
  return fmt::format("{}/updates/w{}.safetensors", AttemptPrefix(round, attempt), worker_id);
}

std::optional<uint64_t> JobRunner::UpdateSizeCap(std::string_view blob_key) const {
  if (engine_ == nullptr || ended_) return std::nullopt;
  const std::string prefix = AttemptPrefix(engine_->round(), engine_->attempt()) + "/updates/";
  if (blob_key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return global_size_bytes_ + kUpdateHeaderSlackBytes;
}

http::Awaitable<Status> JobRunner::Launch() {
  // No co_await inside ?: (g++ 12 mishandles the temporaries of conditional co_awaits).
  Status status;
  if (job_.status == JobStatus::kQueued) {
    status = co_await Setup();
  } else {
    status = co_await Resume();
  }
  if (!status.ok()) {
    PARSYN_LOG_ERROR("training job {}: {}", job_.id, status.ToString());
    const std::string reason = "could not start: " + status.message();
    const int64_t now = service_.clock().UnixMillis();
    StatusOr<storage::TrainingJob> failed = co_await Offload(
        service_.pool(), [&] { return service_.store().SetJobStatus(job_.id, JobStatus::kFailed, now, reason); });
    if (failed.ok()) job_ = *failed;
    ended_ = true;
    {
      auto event_appended = service_.AppendEvent(job_.id, "job_status", {{"status", "failed"}, {"reason", reason}});
      co_await std::move(event_appended);
    }
  }
  co_return status;
}

http::Awaitable<Status> JobRunner::LoadGlobal(std::string_view key_view, std::string_view sha256_view) {
  const std::string key(key_view), sha256(sha256_view);
  StatusOr<weights::WeightSet> global =
      co_await Offload(service_.pool(), [&] { return ReadWeightsBlob(service_.blobs(), key, service_.spool_dir()); });
  if (!global.ok()) co_return global.status().WithContext("reading the global weights " + key);
  StatusOr<storage::BlobInfo> info = co_await Offload(service_.pool(), [&] { return service_.blobs().Head(key); });
  if (!info.ok()) co_return info.status();
  global_ = std::make_shared<weights::WeightSet>(std::move(*global));
  global_key_ = key;
  global_sha256_ = sha256.empty() ? info->sha256 : sha256;
  global_size_bytes_ = info->size_bytes;
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::Setup() {
  storage::MetadataStore& store = service_.store();
  storage::BlobStore& blobs = service_.blobs();
  const int64_t job_id = job_.id;
  const JobSpec& spec = spec_;
  const std::filesystem::path tmp_dir = service_.options().data_dir / "tmp";
  const std::filesystem::path spool_dir = service_.spool_dir();

  // Shards and the initial global, written once per job; a setup interrupted by a crash redoes what is missing.
  struct Prepared {
    storage::Model model;
    storage::Dataset dataset;
    std::vector<storage::Shard> shards;
    std::string global_key;
  };
  const RoundEngineConfig& config = engine_config_;
  StatusOr<Prepared> prepared = co_await Offload(service_.pool(), [&]() -> StatusOr<Prepared> {
    Prepared p;
    PARSYN_ASSIGN_OR_RETURN(p.model, store.GetModel(spec.model_id));
    PARSYN_ASSIGN_OR_RETURN(p.dataset, store.GetDataset(spec.dataset_id));
    PARSYN_ASSIGN_OR_RETURN(p.shards, store.ListShards(job_id));
    if (p.shards.empty()) {
      PARSYN_ASSIGN_OR_RETURN(std::vector<Shard> split, SplitRows(p.dataset.row_count, config.num_shards,
                                                                  spec.config.validation_fraction, spec.config.seed));
      PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy dataset_copy,
                              storage::LocalBlobCopy::Open(blobs, p.dataset.blob_key, spool_dir));
      const std::filesystem::path& source = dataset_copy.path();
      std::error_code ec;
      std::filesystem::create_directories(tmp_dir, ec);
      const data::DatasetFormat format =
          p.dataset.format == storage::DatasetFormat::kCsv ? data::DatasetFormat::kCsv : data::DatasetFormat::kJsonl;
      data::TabularOptions tabular;
      if (!spec.config.label_column.empty()) tabular.label_column = spec.config.label_column;
      const bool fixed_owners = config.num_shards == static_cast<int>(config.eligible_workers.size());
      for (size_t i = 0; i < split.size(); ++i) {
        storage::Shard shard;
        shard.shard_index = static_cast<int32_t>(i);
        if (fixed_owners) shard.worker_id = config.eligible_workers[i];
        shard.train_rows = static_cast<int64_t>(split[i].train_rows.size());
        shard.validation_rows = static_cast<int64_t>(split[i].validation_rows.size());
        for (const char* part : {"train", "validation"}) {
          const std::string key =
              fmt::format("jobs/{}/shards/{:03}/{}.{}", job_id, i, part, DatasetExtension(p.dataset.format));
          const std::filesystem::path file = tmp_dir / fmt::format("job{}-shard{}-{}", job_id, i, part);
          const auto& rows = std::string_view(part) == "train" ? split[i].train_rows : split[i].validation_rows;
          PARSYN_RETURN_IF_ERROR(data::WriteSubsetFile(source, format, rows, file, tabular));
          PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> in, storage::OpenFileSource(file));
          StatusOr<storage::BlobInfo> info = blobs.Put(key, *in);
          if (!info.ok() && info.status().code() == StatusCode::kAlreadyExists) info = blobs.Head(key);
          std::filesystem::remove(file, ec);
          if (!info.ok()) return info.status();
          if (std::string_view(part) == "train") {
            shard.blob_key = key;
            shard.sha256 = info->sha256;
          }
        }
        p.shards.push_back(std::move(shard));
      }
      PARSYN_RETURN_IF_ERROR(store.CreateShards(job_id, p.shards));
      PARSYN_ASSIGN_OR_RETURN(p.shards, store.ListShards(job_id));
    }
    if (spec.config.use_peft) {
      p.global_key = fmt::format("jobs/{}/rounds/{:06}/global.safetensors", job_id, 0);
      weights::LoraLayoutOptions lora;
      lora.r = spec.config.lora_r;
      lora.target_modules = spec.config.lora_target_modules;
      PARSYN_ASSIGN_OR_RETURN(weights::WeightSet adapters,
                              weights::InitialLoraAdapters(p.model.config_json, lora, spec.config.seed));
      std::vector<std::byte> image = weights::SerializeSafetensors(adapters);
      PARSYN_RETURN_IF_ERROR(
          PutBytes(blobs, p.global_key, std::string(reinterpret_cast<const char*>(image.data()), image.size()))
              .status());
    } else {
      // Full fine-tuning starts from the model's own weights.
      for (const storage::ModelFile& f : p.model.files) {
        if (f.path == "model.safetensors") p.global_key = f.blob_key;
      }
      if (p.global_key.empty()) {
        return FailedPreconditionError("model " + std::to_string(p.model.id) +
                                       " has no model.safetensors to fine-tune (use_peft is false)");
      }
    }
    return p;
  });
  if (!prepared.ok()) co_return prepared.status();
  model_ = std::move(prepared->model);
  dataset_ = std::move(prepared->dataset);
  shards_ = std::move(prepared->shards);
  Status loaded = co_await LoadGlobal(prepared->global_key, {});
  if (!loaded.ok()) co_return loaded;

  const int64_t now = service_.clock().UnixMillis();
  StatusOr<storage::TrainingJob> running =
      co_await Offload(service_.pool(), [&] { return store.SetJobStatus(job_id, JobStatus::kRunning, now); });
  if (!running.ok()) co_return running.status();
  job_ = *running;
  {
    auto event_appended = service_.AppendEvent(job_id, "job_status", {{"status", "running"}});
    co_await std::move(event_appended);
  }

  for (const storage::Shard& s : shards_) engine_config_.shard_train_rows.push_back(s.train_rows);
  engine_ = std::make_unique<RoundEngine>(engine_config_, strategy_, service_.clock());
  const std::vector<int64_t> idle = service_.IdleWorkers();
  auto handled = Handle([&] { return engine_->Start(idle); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

http::Awaitable<Status> JobRunner::Resume() {
  storage::MetadataStore& store = service_.store();
  const int64_t job_id = job_.id;
  const int64_t now = service_.clock().UnixMillis();
  struct Loaded {
    storage::Model model;
    storage::Dataset dataset;
    std::vector<storage::Shard> shards;
    std::vector<storage::Round> rounds;
    storage::TrainingJob job;
  };
  StatusOr<Loaded> loaded = co_await Offload(service_.pool(), [&]() -> StatusOr<Loaded> {
    Loaded l;
    PARSYN_ASSIGN_OR_RETURN(l.model, store.GetModel(job_.model_id));
    PARSYN_ASSIGN_OR_RETURN(l.dataset, store.GetDataset(job_.dataset_id));
    PARSYN_ASSIGN_OR_RETURN(l.shards, store.ListShards(job_id));
    PARSYN_ASSIGN_OR_RETURN(l.rounds, store.ListRounds(job_id));
    // The attempt in flight when the coordinator stopped cannot finish: its tasks and partial sums are gone.
    for (storage::Round& r : l.rounds) {
      if (r.status != storage::RoundStatus::kRunning) continue;
      storage::RoundFailure failure{.job_id = job_id,
                                    .round = r.round,
                                    .attempt = r.attempt,
                                    .reason = "the coordinator restarted during the round",
                                    .ended_at_ms = now,
                                    .bytes_moved = r.bytes_moved,
                                    .counts_toward_fault_tolerance = false};
      PARSYN_RETURN_IF_ERROR(store.FailRound(failure));
      r.status = storage::RoundStatus::kFailed;
    }
    PARSYN_ASSIGN_OR_RETURN(l.job, store.GetJob(job_id));
    return l;
  });
  if (!loaded.ok()) co_return loaded.status();
  model_ = std::move(loaded->model);
  dataset_ = std::move(loaded->dataset);
  shards_ = std::move(loaded->shards);
  job_ = loaded->job;

  EngineCheckpoint checkpoint;
  checkpoint.last_committed_round = job_.committed_round;
  checkpoint.consecutive_failed_rounds = job_.consecutive_failed_rounds;
  std::string global_key, global_sha;
  for (const storage::Round& r : loaded->rounds) {
    if (r.round == job_.committed_round + 1)
      checkpoint.attempts_of_next_round = std::max(checkpoint.attempts_of_next_round, r.attempt);
    if (r.round == job_.committed_round && r.status == storage::RoundStatus::kCommitted) {
      global_key = r.global_blob_key;
      global_sha = r.global_sha256;
    }
  }
  for (const storage::Shard& s : shards_) {
    if (s.worker_id) checkpoint.shards[*s.worker_id] = s.shard_index;
    engine_config_.shard_train_rows.push_back(s.train_rows);
  }
  if (global_key.empty()) {
    if (spec_.config.use_peft) {
      global_key = fmt::format("jobs/{}/rounds/{:06}/global.safetensors", job_id, 0);
    } else {
      for (const storage::ModelFile& f : model_.files) {
        if (f.path == "model.safetensors") global_key = f.blob_key;
      }
    }
  }
  Status global = co_await LoadGlobal(global_key, global_sha);
  if (!global.ok()) co_return global;
  {
    // Uploads of the attempt that the restart failed will never complete.
    auto aborted = AbortIncompleteUploads(RoundsPrefix());  // kCoAwaitTemporaries
    co_await std::move(aborted);
  }

  PARSYN_LOG_INFO("training job {}: resuming after round {} (attempt {} of round {} next)", job_id,
                  checkpoint.last_committed_round, checkpoint.attempts_of_next_round + 1,
                  checkpoint.last_committed_round + 1);
  {
    auto event_appended =
        service_.AppendEvent(job_id, "job_resumed", {{"committed_round", checkpoint.last_committed_round}});
    co_await std::move(event_appended);
  }
  engine_ = std::make_unique<RoundEngine>(engine_config_, strategy_, service_.clock());
  const std::vector<int64_t> idle = service_.IdleWorkers();
  auto handled = Handle([&] { return engine_->Restore(checkpoint, idle); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

http::Awaitable<Status> JobRunner::Handle(std::function<StatusOr<Actions>()> event) {
  co_await mutex_.Lock();
  LoopLock lock(mutex_);
  if (engine_ == nullptr)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " is not running yet");
  StatusOr<Actions> actions = event();
  if (!actions.ok()) co_return actions.status();
  auto execution = Execute(std::move(*actions));
  co_return co_await std::move(execution);
}

http::Awaitable<Status> JobRunner::Execute(Actions actions) {  // by value: see kCoAwaitTemporaries
  std::deque<Action> work(actions.begin(), actions.end());
  Status first_error;
  while (!work.empty()) {
    Action action = std::move(work.front());
    work.pop_front();
    Status s = co_await Do(action, work);
    if (!s.ok()) {
      // The engine has moved on; carry out the rest so memory and store stay as close as possible, and report.
      PARSYN_LOG_ERROR("training job {}: {}", job_.id, s.ToString());
      if (first_error.ok()) first_error = s;
    }
  }
  co_return first_error;
}

http::Awaitable<Status> JobRunner::Do(const Action& action, std::deque<Action>& work) {
  if (const auto* a = std::get_if<coordinator::StartRound>(&action)) co_return co_await OnStartRound(*a, work);
  if (const auto* a = std::get_if<AssignTask>(&action)) co_return co_await OnAssignTask(*a);
  if (const auto* a = std::get_if<ValidateUpdate>(&action)) co_return co_await OnValidateUpdate(*a, work);
  if (const auto* a = std::get_if<DropWorker>(&action)) co_return co_await OnDropWorker(*a);
  if (const auto* a = std::get_if<AggregateRound>(&action)) co_return co_await OnAggregateRound(*a, work);
  if (const auto* a = std::get_if<GlobalEvaluated>(&action)) {
    // Round r's workers evaluated global r-1: stored with round r when it commits (or as an event for the last).
    pending_validation_loss_ = a->validation_loss;
    {
      auto event_appended = service_.AppendEvent(job_.id, "global_evaluated",
                                                 {{"global_round", a->global_round},
                                                  {"validation_loss", a->validation_loss},
                                                  {"validation_samples", a->validation_samples}});
      co_await std::move(event_appended);
    }
    co_return Status::Ok();
  }
  if (const auto* a = std::get_if<coordinator::CommitRound>(&action)) co_return co_await OnCommitRound(*a);
  if (const auto* a = std::get_if<coordinator::FailRound>(&action)) co_return co_await OnFailRound(*a, work);
  if (std::get_if<JobSucceeded>(&action)) co_return co_await OnJobEnded(JobStatus::kSucceeded, {});
  if (const auto* a = std::get_if<JobFailed>(&action)) co_return co_await OnJobEnded(JobStatus::kFailed, a->reason);
  if (std::get_if<JobStopped>(&action)) co_return co_await OnJobEnded(JobStatus::kStopped, {});
  if (std::get_if<JobCancelled>(&action)) co_return co_await OnJobEnded(JobStatus::kCancelled, {});
  co_return InternalError("unknown round engine action");
}

http::Awaitable<Status> JobRunner::OnStartRound(const coordinator::StartRound& a, const std::deque<Action>& work) {
  storage::Round round{
      .job_id = job_.id, .round = a.round, .attempt = a.attempt, .started_at_ms = service_.clock().UnixMillis()};
  // The participants chosen together with the start (workers already waiting); later arrivals show in the updates.
  for (const Action& next : work) {
    if (const auto* t = std::get_if<AssignTask>(&next); t && t->round == a.round && t->attempt == a.attempt) {
      round.participants.push_back(t->worker);
    }
  }
  results_.clear();
  recorded_updates_.clear();
  verified_update_bytes_.clear();
  multipart_uploads_.clear();
  progress_.clear();
  last_verdicts_.clear();
  bytes_moved_ = 0;
  pending_global_.reset();
  pending_validation_loss_.reset();
  Status started = co_await Offload(service_.pool(), [&] { return service_.store().StartRound(round); });
  if (!started.ok()) co_return started;
  Status begun = co_await Offload(service_.pool(), [&] { return strategy_.Begin(a.round, *global_); });
  if (!begun.ok()) co_return begun;
  {
    auto event_appended = service_.AppendEvent(job_.id, "round_started",
                                               {{"round", a.round},
                                                {"attempt", a.attempt},
                                                {"total_rounds", engine_config_.num_rounds},
                                                {"participants", round.participants}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

StatusOr<json> JobRunner::BuildTask(const AssignTask& a) const {
  const storage::Shard& shard = shards_.at(static_cast<size_t>(a.shard));
  const std::string validation_key = shard.blob_key.substr(0, shard.blob_key.rfind('/')) + "/validation." +
                                     std::string(DatasetExtension(dataset_.format));
  json model_files = json::array();
  for (const storage::ModelFile& f : model_.files) {
    model_files.push_back({{"path", f.path},
                           {"url", service_.BlobGetUrl(f.blob_key)},
                           {"sha256", f.sha256},
                           {"size_bytes", f.size_bytes}});
  }
  json spec = JobSpecToJson(spec_);
  json task = {
      {"task_id", fmt::format("{}-{}-{}-w{}", job_.id, a.round, a.attempt, a.worker)},
      {"job_id", job_.id},
      {"kind", a.kind == TaskKind::kTrain ? "train" : "evaluate"},
      {"round", a.round},
      {"attempt", a.attempt},
      {"total_rounds", engine_config_.num_rounds},
      {"shard", a.shard},
      {"seed", a.seed},
      {"steps_per_round", spec_.distributed.steps_per_round},
      {"config", spec["config"]},
      {"deadline_unix_ms", service_.clock().UnixMillis() + engine_config_.aggregation_timeout.count()},
      {"global_weights",
       {{"url", service_.BlobGetUrl(global_key_)},
        {"sha256", global_sha256_},
        {"size_bytes", global_size_bytes_},
        {"round", engine_->last_committed_round()}}},
      {"data",
       {{"format", storage::ToString(dataset_.format)},
        {"kind", storage::ToString(dataset_.kind)},
        {"train_url", service_.BlobGetUrl(shard.blob_key)},
        {"train_rows", shard.train_rows},
        {"validation_url", service_.BlobGetUrl(validation_key)},
        {"validation_rows", shard.validation_rows}}},
      {"model", {{"id", model_.id}, {"name", model_.name}, {"model_type", model_.model_type}, {"files", model_files}}},
  };
  if (a.kind == TaskKind::kTrain) {
    PARSYN_ASSIGN_OR_RETURN(task["update_upload"],
                            UpdateUploadGrant(a.worker, UpdateKey(a.round, a.attempt, a.worker)));
  }
  return task;
}

StatusOr<json> JobRunner::UpdateUploadGrant(int64_t worker_id, const std::string& key) const {
  const uint64_t max_bytes = global_size_bytes_ + kUpdateHeaderSlackBytes;
  json grant = {{"blob_key", key}, {"max_size_bytes", max_bytes}};
  storage::S3BlobStore* s3 = service_.s3();
  if (s3 == nullptr) {
    grant["url"] = service_.SignedBlobUrl("PUT", key);
    return grant;
  }
  const std::chrono::seconds ttl = service_.options().signed_url_ttl;
  auto headers_json = [](const storage::HttpHeaders& headers) {
    json out = json::object();
    for (const auto& [name, value] : headers) out[name] = value;
    return out;
  };
  auto multipart = multipart_uploads_.find(worker_id);
  if (multipart == multipart_uploads_.end() || multipart->second.key != key) {
    PARSYN_ASSIGN_OR_RETURN(storage::PresignedRequest put, s3->PresignPut(key, ttl));
    grant["url"] = put.url;
    grant["headers"] = headers_json(put.headers);
    return grant;
  }
  // Enough parts for the largest update accepted; the worker sends as many as its file needs.
  const uint64_t part_size = s3->options().part_size_bytes;
  const uint64_t parts = (max_bytes + part_size - 1) / part_size;
  json part_grants = json::array();
  for (uint64_t n = 1; n <= parts; ++n) {
    PARSYN_ASSIGN_OR_RETURN(storage::PresignedRequest part,
                            s3->PresignUploadPart(key, multipart->second.upload_id, static_cast<int>(n), ttl));
    part_grants.push_back({{"part_number", n}, {"url", part.url}, {"headers", headers_json(part.headers)}});
  }
  grant["multipart"] = {{"part_size_bytes", part_size}, {"parts", std::move(part_grants)}};
  return grant;
}

http::Awaitable<Status> JobRunner::OnAssignTask(const AssignTask& a) {
  if (a.shard < 0 || static_cast<size_t>(a.shard) >= shards_.size()) {
    co_return InternalError("the round engine assigned shard " + std::to_string(a.shard) + " of " +
                            std::to_string(shards_.size()));
  }
  storage::Shard& shard = shards_[static_cast<size_t>(a.shard)];
  const auto assign_start = std::chrono::steady_clock::now();
  if (shard.worker_id != a.worker) {
    // The worker keeps this shard for the whole job: stored before the task goes out.
    Status assigned =
        co_await Offload(service_.pool(), [&] { return service_.store().AssignShard(job_.id, a.shard, a.worker); });
    if (!assigned.ok()) co_return assigned;
    shard.worker_id = a.worker;
  }
  {
    auto event_appended = service_.AppendEvent(job_.id, "task_assigned",
                                               {{"worker_id", a.worker},
                                                {"round", a.round},
                                                {"attempt", a.attempt},
                                                {"shard", a.shard},
                                                {"kind", a.kind == TaskKind::kTrain ? "train" : "evaluate"}});
    co_await std::move(event_appended);
  }
  const double stored_ms = MillisSince(assign_start);
  Status started = Status::Ok();
  if (a.kind == TaskKind::kTrain) {
    // kCoAwaitTemporaries: the awaitable is created before the co_await.
    auto multipart = StartMultipartUploadIfLarge(a.worker, UpdateKey(a.round, a.attempt, a.worker));
    started = co_await std::move(multipart);
  }
  StatusOr<json> task = started.ok() ? BuildTask(a) : StatusOr<json>(started);
  if (!task.ok()) {
    // Nothing went out: the worker leaves this attempt with the reason (a store outage shows up here) and is
    // offered the next one. Reported once this event is done (the job's mutex is held).
    PARSYN_LOG_ERROR("training job {}: cannot prepare the task of worker {}: {}", job_.id, a.worker,
                     task.status().ToString());
    boost::asio::co_spawn(service_.executor(),
                          TaskFailedDetached(a.worker, a.round, a.attempt,
                                             "the coordinator could not prepare the task: " + task.status().message()),
                          boost::asio::detached);
    co_return Status::Ok();
  }
  const bool delivered = service_.DeliverTask(a.worker, job_.id, std::move(*task));
  PARSYN_LOG_DEBUG("training job {}: round {} task for worker {}: stored {:.1f} ms, delivered {:.1f} ms", job_.id,
                   a.round, a.worker, stored_ms, MillisSince(assign_start));
  if (!delivered) {
    // The worker left between becoming idle and getting the task: tell the engine once this event is done.
    boost::asio::co_spawn(service_.executor(), WorkerDisconnected(a.worker), boost::asio::detached);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::StartMultipartUploadIfLarge(int64_t worker_id, std::string key) {
  storage::S3BlobStore* s3 = service_.s3();
  if (s3 == nullptr || global_size_bytes_ + kUpdateHeaderSlackBytes <= s3->options().multipart_threshold_bytes) {
    co_return Status::Ok();
  }
  StatusOr<std::string> upload_id = co_await Offload(service_.pool(), [&] { return s3->StartMultipartUpload(key); });
  if (!upload_id.ok()) co_return upload_id.status().WithContext("starting the multipart upload of " + key);
  multipart_uploads_[worker_id] = MultipartUpload{.key = key, .upload_id = *upload_id};
  co_return Status::Ok();
}

http::Awaitable<void> JobRunner::CompleteMultipartUpload(int64_t worker_id, std::string key) {
  auto it = multipart_uploads_.find(worker_id);
  if (it == multipart_uploads_.end() || it->second.key != key) co_return;
  const MultipartUpload upload = it->second;
  multipart_uploads_.erase(it);  // a repeated result finds the object complete, or nothing to complete
  storage::S3BlobStore* s3 = service_.s3();
  StatusOr<storage::BlobInfo> done =
      co_await Offload(service_.pool(), [&] { return s3->CompleteMultipartUpload(upload.key, upload.upload_id); });
  // On failure (parts missing or too small, store down) the check that follows finds no update and says so.
  if (!done.ok()) {
    PARSYN_LOG_WARN("training job {}: completing worker {}'s multipart upload of {}: {}", job_.id, worker_id,
                    upload.key, done.status().ToString());
  }
}

http::Awaitable<void> JobRunner::AbortIncompleteUploads(std::string prefix) {
  multipart_uploads_.clear();
  storage::S3BlobStore* s3 = service_.s3();
  if (s3 == nullptr) co_return;
  if (abort_sweep_pending_) prefix = RoundsPrefix();  // an earlier abort failed: sweep every round of the job
  StatusOr<int> aborted = co_await Offload(service_.pool(), [&] { return s3->AbortIncompleteUploads(prefix); });
  if (!aborted.ok()) {
    abort_sweep_pending_ = true;
    PARSYN_LOG_WARN("training job {}: aborting incomplete uploads under {} (retried when the next attempt ends): {}",
                    job_.id, prefix, aborted.status().ToString());
    co_return;
  }
  abort_sweep_pending_ = abort_sweep_pending_ && prefix != RoundsPrefix();
  if (*aborted > 0) {
    PARSYN_LOG_INFO("training job {}: aborted {} incomplete upload(s) under {}", job_.id, *aborted, prefix);
  }
}

std::string JobRunner::RoundsPrefix() const { return fmt::format("jobs/{}/rounds/", job_.id); }

http::Awaitable<void> JobRunner::TaskFailedDetached(int64_t worker_id, int round, int attempt, std::string reason) {
  auto failed = TaskFailed(worker_id, round, attempt, std::move(reason));  // kCoAwaitTemporaries
  Status s = co_await std::move(failed);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: dropping worker {}: {}", job_.id, worker_id, s.ToString());
}

http::Awaitable<Status> JobRunner::RecordUpdate(int64_t worker_id, int round, int attempt, const Status& verdict) {
  if (recorded_updates_.count(worker_id) != 0) co_return Status::Ok();
  auto it = results_.find(worker_id);
  if (it == results_.end()) co_return Status::Ok();
  const ResultReport& r = it->second;
  storage::RoundUpdate update{
      .job_id = job_.id,
      .round = round,
      .attempt = attempt,
      .worker_id = worker_id,
      .blob_key = r.blob_key,
      .sha256 = r.sha256,
      .num_samples = r.sample_count,
      .train_loss = std::isfinite(r.train_loss) ? std::optional<double>(r.train_loss) : std::nullopt,
      .metrics_json = r.metrics.dump(),
      .status = verdict.ok() ? storage::UpdateStatus::kAccepted : storage::UpdateStatus::kRejected,
      .reject_reason = verdict.ok() ? "" : verdict.message(),
      .received_at_ms = service_.clock().UnixMillis()};
  // The size as checked; else (a rejected update) as the store says, except on S3, where a Head of an object the
  // worker wrote without our sha256 metadata would download it again just for a number.
  std::optional<uint64_t> verified_bytes;
  if (auto v = verified_update_bytes_.find(r.blob_key); v != verified_update_bytes_.end()) verified_bytes = v->second;
  const bool ask_store = !verified_bytes && service_.s3() == nullptr;
  if (verified_bytes) {
    update.size_bytes = static_cast<int64_t>(*verified_bytes);
    // Directory store: counted when the worker PUT it through /blobs. S3: it went straight to the store.
    if (service_.s3() != nullptr) bytes_moved_ += update.size_bytes;
  }
  Status stored = co_await Offload(service_.pool(), [&] {  // one trip to the pool: the size, then the record
    if (ask_store) {
      StatusOr<storage::BlobInfo> info = service_.blobs().Head(r.blob_key);
      if (info.ok()) update.size_bytes = static_cast<int64_t>(info->size_bytes);
    }
    return service_.store().RecordUpdate(update);
  });
  if (!stored.ok() && stored.code() != StatusCode::kAlreadyExists) co_return stored;
  recorded_updates_.insert(worker_id);
  last_verdicts_[worker_id] = verdict.ok() ? "" : verdict.message();
  {
    auto event_appended = service_.AppendEvent(job_.id, verdict.ok() ? "update_accepted" : "update_rejected",
                                               {{"worker_id", worker_id},
                                                {"round", round},
                                                {"attempt", attempt},
                                                {"sample_count", r.sample_count},
                                                {"reason", verdict.ok() ? "" : verdict.message()}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnValidateUpdate(const ValidateUpdate& a, std::deque<Action>& work) {
  auto it = results_.find(a.worker);
  if (it == results_.end()) co_return InternalError("no result recorded for worker " + std::to_string(a.worker));
  const ResultReport report = it->second;
  const std::string expected_key = UpdateKey(a.round, a.attempt, a.worker);
  const uint64_t max_bytes = global_size_bytes_ + kUpdateHeaderSlackBytes;
  std::shared_ptr<weights::WeightSet> global = global_;
  // An update checked early by Result() (outside the job mutex) only needs accumulating here.
  std::optional<StatusOr<weights::WeightSet>> checked;
  if (auto c = checked_updates_.find(a.worker); c != checked_updates_.end() && c->second.ready &&
                                                c->second.round == a.round && c->second.attempt == a.attempt &&
                                                c->second.blob_key == report.blob_key) {
    checked = std::move(c->second.update);
    checked_updates_.erase(c);
  }
  // The strategy keeps accepted updates to add several in one pass; with no other result on its way in (being
  // checked or waiting for the job), it adds them now, while the job is idle, instead of in the aggregation.
  const bool others_on_their_way = !checked_updates_.empty();
  // Validation and accumulation run on the pool; the strategy is touched by nobody else meanwhile (job mutex).
  const bool checked_early = checked.has_value();
  double check_ms = 0, accept_ms = 0;
  uint64_t update_bytes = 0;
  Status verdict = co_await Offload(service_.pool(), [&]() -> Status {
    const auto check_start = std::chrono::steady_clock::now();
    if (!checked) {
      checked = CheckUpdateFile(service_.blobs(), report, expected_key, max_bytes, *global, service_.spool_dir(),
                                &update_bytes);
    }
    check_ms = MillisSince(check_start);
    if (!checked->ok()) return checked->status();
    const auto accept_start = std::chrono::steady_clock::now();
    // Taken over so that the strategy may add several updates in one pass over its sums (it still judges now).
    Status accepted = strategy_.AcceptOwned(std::move(**checked), a.sample_count);
    if (!others_on_their_way) strategy_.AddKeptUpdates();
    accept_ms = MillisSince(accept_start);
    return accepted;
  });
  checked.reset();
  if (update_bytes > 0) verified_update_bytes_[report.blob_key] = update_bytes;
  PARSYN_LOG_DEBUG("training job {}: round {} update of worker {}: check {:.1f} ms{}, accumulate {:.1f} ms", job_.id,
                   a.round, a.worker, check_ms, checked_early ? " (checked early)" : "", accept_ms);
  if (!verdict.ok() && verdict.code() != StatusCode::kInvalidArgument) {
    PARSYN_LOG_WARN("training job {}: validating the update of worker {}: {}", job_.id, a.worker, verdict.ToString());
  }
  const auto record_start = std::chrono::steady_clock::now();
  Status recorded = co_await RecordUpdate(a.worker, a.round, a.attempt, verdict);
  PARSYN_LOG_DEBUG("training job {}: round {} update of worker {} recorded in {:.1f} ms", job_.id, a.round, a.worker,
                   MillisSince(record_start));
  StatusOr<Actions> next = engine_->UpdateValidated(a.worker, a.round, a.attempt, verdict);
  if (!next.ok()) co_return next.status();
  work.insert(work.begin(), next->begin(), next->end());
  co_return recorded;
}

http::Awaitable<Status> JobRunner::OnDropWorker(const DropWorker& a) {
  // A result refused before validation (e.g. its sample count) is still recorded, with the reason.
  if (a.cause == DropCause::kRejected) {
    const Status rejection = InvalidArgumentError(a.reason);
    Status recorded = co_await RecordUpdate(a.worker, a.round, a.attempt, rejection);
    if (!recorded.ok()) co_return recorded;
  }
  if (a.cause == DropCause::kStraggler || a.cause == DropCause::kJobEnded) {
    service_.AbandonTask(a.worker, job_.id, a.round, a.attempt);
  }
  {
    auto event_appended = service_.AppendEvent(job_.id, "worker_dropped",
                                               {{"worker_id", a.worker},
                                                {"round", a.round},
                                                {"attempt", a.attempt},
                                                {"cause", DropCauseName(a.cause)},
                                                {"reason", a.reason}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnAggregateRound(const AggregateRound& a, std::deque<Action>& work) {
  const std::string key = AttemptPrefix(a.round, a.attempt) + "/global.safetensors";
  struct Aggregated {
    std::shared_ptr<weights::WeightSet> weights;
    storage::BlobInfo info;
  };
  // The new global is a durable blob before the engine hears that aggregation finished (and so before commit).
  double finish_ms = 0, serialize_ms = 0, put_ms = 0;
  StatusOr<Aggregated> aggregated = co_await Offload(service_.pool(), [&]() -> StatusOr<Aggregated> {
    auto phase_start = std::chrono::steady_clock::now();
    PARSYN_ASSIGN_OR_RETURN(weights::WeightSet mean, strategy_.Finish());
    finish_ms = MillisSince(phase_start);
    phase_start = std::chrono::steady_clock::now();
    mean.metadata()["format"] = "pt";
    const std::vector<std::byte> image = weights::SerializeSafetensors(mean);
    serialize_ms = MillisSince(phase_start);
    phase_start = std::chrono::steady_clock::now();
    // Streamed from the image itself (PutBytes would take a copy of it).
    struct ImageSource final : storage::ByteSource {
      std::span<const std::byte> rest;
      StatusOr<size_t> Read(std::span<std::byte> buffer) override {
        const size_t n = std::min(buffer.size(), rest.size());
        std::copy_n(rest.begin(), n, buffer.begin());
        rest = rest.subspan(n);
        return n;
      }
    } source;
    source.rest = image;
    Aggregated out;
    StatusOr<storage::BlobInfo> stored = service_.blobs().Put(key, source);
    // As in PutBytes: a global left by a run that crashed before its commit holds the same deterministic bytes.
    if (!stored.ok() && stored.status().code() == StatusCode::kAlreadyExists) stored = service_.blobs().Head(key);
    PARSYN_ASSIGN_OR_RETURN(out.info, std::move(stored));
    put_ms = MillisSince(phase_start);
    out.weights = std::make_shared<weights::WeightSet>(std::move(mean));
    return out;
  });
  PARSYN_LOG_DEBUG("training job {}: round {} aggregated: finish {:.1f} ms, serialize {:.1f} ms, durable put {:.1f} ms",
                   job_.id, a.round, finish_ms, serialize_ms, put_ms);
  Status outcome = aggregated.status();
  if (aggregated.ok()) {
    pending_global_ = PendingGlobal{.key = key, .sha256 = aggregated->info.sha256, .weights = aggregated->weights};
    bytes_moved_ += static_cast<int64_t>(aggregated->info.size_bytes);
  } else {
    PARSYN_LOG_ERROR("training job {}: aggregating round {}: {}", job_.id, a.round, outcome.ToString());
  }
  StatusOr<Actions> next = engine_->AggregationFinished(a.round, a.attempt, outcome);
  if (!next.ok()) co_return next.status();
  work.insert(work.begin(), next->begin(), next->end());
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnCommitRound(const coordinator::CommitRound& a) {
  if (!pending_global_) co_return InternalError("round " + std::to_string(a.round) + " commits without a global");
  storage::RoundCommit commit{.job_id = job_.id,
                              .round = a.round,
                              .attempt = a.attempt,
                              .global_blob_key = pending_global_->key,
                              .global_sha256 = pending_global_->sha256,
                              .ended_at_ms = service_.clock().UnixMillis(),
                              .train_loss = a.num_updates > 0 ? std::optional<double>(a.train_loss) : std::nullopt,
                              .validation_loss = pending_validation_loss_,
                              .bytes_moved = bytes_moved_};
  const std::string artifact_name = fmt::format("rounds/{:06}/global.safetensors", a.round);
  const auto commit_start = std::chrono::steady_clock::now();
  StatusOr<storage::BlobInfo> info =
      co_await Offload(service_.pool(), [&] { return service_.blobs().Head(pending_global_->key); });
  if (!info.ok()) co_return info.status();
  Status committed = co_await Offload(service_.pool(), [&]() -> Status {
    PARSYN_RETURN_IF_ERROR(service_.store().CommitRound(commit));
    // Every committed global stays downloadable as an artifact of the job.
    Status added = service_.store().AddJobArtifact({.job_id = job_.id,
                                                    .name = artifact_name,
                                                    .blob_key = commit.global_blob_key,
                                                    .size_bytes = static_cast<int64_t>(info->size_bytes),
                                                    .sha256 = commit.global_sha256,
                                                    .created_at_ms = commit.ended_at_ms});
    if (!added.ok() && added.code() != StatusCode::kAlreadyExists) return added;
    return Status::Ok();
  });
  if (!committed.ok()) co_return committed;
  PARSYN_LOG_DEBUG("training job {}: round {} committed in the store in {:.1f} ms", job_.id, a.round,
                   MillisSince(commit_start));
  job_.committed_round = a.round;
  global_ = pending_global_->weights;
  global_key_ = pending_global_->key;
  global_sha256_ = pending_global_->sha256;
  global_size_bytes_ = info->size_bytes;
  pending_global_.reset();
  {
    auto event_appended =
        service_.AppendEvent(job_.id, "round_committed",
                             {{"round", a.round},
                              {"attempt", a.attempt},
                              {"total_rounds", engine_config_.num_rounds},
                              {"train_loss", a.train_loss},
                              {"validation_loss", pending_validation_loss_ ? json(*pending_validation_loss_) : json()},
                              {"num_updates", a.num_updates},
                              {"num_samples", a.num_samples},
                              {"global_sha256", global_sha256_}});
    co_await std::move(event_appended);
  }
  pending_validation_loss_.reset();
  {
    auto aborted = AbortIncompleteUploads(AttemptPrefix(a.round, a.attempt) + "/");  // kCoAwaitTemporaries
    co_await std::move(aborted);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnFailRound(const coordinator::FailRound& a, const std::deque<Action>& work) {
  storage::RoundFailure failure{.job_id = job_.id,
                                .round = a.round,
                                .attempt = a.attempt,
                                .reason = a.reason,
                                .ended_at_ms = service_.clock().UnixMillis(),
                                .bytes_moved = bytes_moved_};
  for (const Action& next : work) {
    if (const auto* f = std::get_if<JobFailed>(&next)) failure.fail_job_reason = f->reason;
  }
  Status failed = co_await Offload(service_.pool(), [&] { return service_.store().FailRound(failure); });
  if (!failed.ok()) co_return failed;
  pending_global_.reset();
  {
    auto aborted = AbortIncompleteUploads(AttemptPrefix(a.round, a.attempt) + "/");  // kCoAwaitTemporaries
    co_await std::move(aborted);
  }
  {
    auto event_appended = service_.AppendEvent(job_.id, "round_failed",
                                               {{"round", a.round},
                                                {"attempt", a.attempt},
                                                {"reason", a.reason},
                                                {"consecutive_failures", a.consecutive_failures},
                                                {"fault_tolerance", engine_config_.fault_tolerance}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::WriteFinalArtifacts() {
  if (job_.committed_round == 0) co_return Status::Ok();  // nothing trained: no result to publish
  const std::string adapter_config_key = fmt::format("jobs/{}/artifacts/adapter_config.json", job_.id);
  const int64_t now = service_.clock().UnixMillis();
  const std::string global_key = global_key_;
  const std::string global_sha = global_sha256_;
  const int64_t global_size = static_cast<int64_t>(global_size_bytes_);
  json adapter_config;
  if (spec_.config.use_peft) {
    StatusOr<std::vector<std::string>> targets = weights::NormalizeLoraTargets(spec_.config.lora_target_modules);
    adapter_config = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"base_model_name_or_path", model_.name},
                      {"r", spec_.config.lora_r},
                      {"lora_alpha", spec_.config.lora_alpha},
                      {"lora_dropout", spec_.config.lora_dropout},
                      {"target_modules", targets.ok() ? *targets : spec_.config.lora_target_modules},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"modules_to_save", nullptr},
                      {"revision", nullptr}};
  }
  const bool peft = spec_.config.use_peft;
  Status written = co_await Offload(service_.pool(), [&]() -> Status {
    auto add = [&](std::string name, std::string key, int64_t size, std::string sha) -> Status {
      Status s = service_.store().AddJobArtifact({.job_id = job_.id,
                                                  .name = std::move(name),
                                                  .blob_key = std::move(key),
                                                  .size_bytes = size,
                                                  .sha256 = std::move(sha),
                                                  .created_at_ms = now});
      return s.code() == StatusCode::kAlreadyExists ? Status::Ok() : s;
    };
    if (!peft) return add("model.safetensors", global_key, global_size, global_sha);
    PARSYN_RETURN_IF_ERROR(add("adapter_model.safetensors", global_key, global_size, global_sha));
    PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo info,
                            PutBytes(service_.blobs(), adapter_config_key, adapter_config.dump(2) + "\n"));
    return add("adapter_config.json", adapter_config_key, static_cast<int64_t>(info.size_bytes), info.sha256);
  });
  co_return written;
}

http::Awaitable<Status> JobRunner::OnJobEnded(JobStatus status, std::string_view reason_view) {
  const std::string reason(reason_view);
  Status artifacts = Status::Ok();
  if (status == JobStatus::kSucceeded || status == JobStatus::kStopped) artifacts = co_await WriteFinalArtifacts();
  const int64_t now = service_.clock().UnixMillis();
  StatusOr<storage::TrainingJob> ended = co_await Offload(service_.pool(), [&]() -> StatusOr<storage::TrainingJob> {
    PARSYN_ASSIGN_OR_RETURN(storage::TrainingJob current, service_.store().GetJob(job_.id));
    if (current.status != status) {  // else FailRound already failed it in the same transaction
      PARSYN_ASSIGN_OR_RETURN(current, service_.store().SetJobStatus(job_.id, status, now, reason));
    }
    // An attempt still waiting or training when the job was stopped or cancelled ends with the job.
    PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Round> rounds, service_.store().ListRounds(job_.id));
    for (const storage::Round& r : rounds) {
      if (r.status != storage::RoundStatus::kRunning) continue;
      PARSYN_RETURN_IF_ERROR(
          service_.store().FailRound({.job_id = job_.id,
                                      .round = r.round,
                                      .attempt = r.attempt,
                                      .reason = "the job ended (" + std::string(storage::ToString(status)) + ")",
                                      .ended_at_ms = now,
                                      .bytes_moved = bytes_moved_,
                                      .counts_toward_fault_tolerance = false}));
    }
    return current;
  });
  if (ended.ok()) job_ = *ended;
  ended_ = true;
  {
    auto aborted = AbortIncompleteUploads(RoundsPrefix());  // kCoAwaitTemporaries: every attempt's leftovers
    co_await std::move(aborted);
  }
  // Workers still holding a task of this job are told through DropWorker(kJobEnded); free their slots here.
  for (const ParticipantView& p : engine_->participants()) service_.TaskFinished(p.worker, job_.id);
  json payload = {{"status", storage::ToString(status)}, {"committed_round", job_.committed_round}};
  if (!reason.empty()) payload["reason"] = reason;
  {
    auto event_appended = service_.AppendEvent(job_.id, "job_status", payload);
    co_await std::move(event_appended);
  }
  global_.reset();  // the weights are in the blob store; an ended job holds no memory
  if (!artifacts.ok()) co_return artifacts;
  co_return ended.status();
}

http::Awaitable<void> JobRunner::WorkerAvailable(int64_t worker_id, std::function<bool()> still_available) {
  if (ended_) co_return;
  auto handled = Handle([&]() -> StatusOr<Actions> {  // kCoAwaitTemporaries
    if (still_available && !still_available()) return Actions{};
    return engine_->WorkerAvailable(worker_id);
  });
  Status s = co_await std::move(handled);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: worker {} available: {}", job_.id, worker_id, s.ToString());
}

http::Awaitable<void> JobRunner::WorkerDisconnected(int64_t worker_id) {
  if (ended_) co_return;
  auto handled =
      Handle([&] { return StatusOr<Actions>(engine_->WorkerDisconnected(worker_id)); });  // kCoAwaitTemporaries
  Status s = co_await std::move(handled);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: worker {} disconnected: {}", job_.id, worker_id, s.ToString());
}

http::Awaitable<Status> JobRunner::TaskFailed(int64_t worker_id, int round, int attempt, std::string reason) {
  if (ended_) {
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has ended (" +
                                      std::string(storage::ToString(job_.status)) + ")");
  }
  PARSYN_LOG_WARN("training job {}: worker {} reports its task of round {} attempt {} failed: {}", job_.id, worker_id,
                  round, attempt, reason);
  auto handled = Handle([&] { return engine_->TaskFailed(worker_id, round, attempt, reason); });  // kCoAwaitTemporaries
  Status s = co_await std::move(handled);
  if (s.ok()) service_.TaskFinished(worker_id, job_.id);
  co_return s;
}

bool JobRunner::TickDue() const {
  if (ended_ || engine_ == nullptr) return false;
  std::optional<Clock::TimePoint> deadline = engine_->next_deadline();
  return deadline && *deadline <= service_.clock().Now();
}

http::Awaitable<void> JobRunner::Tick() {
  if (ended_) co_return;
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Tick()); });  // kCoAwaitTemporaries
  Status s = co_await std::move(handled);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: timer: {}", job_.id, s.ToString());
}

http::Awaitable<Status> JobRunner::Stop() {
  if (ended_)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has already ended (" +
                                      std::string(storage::ToString(job_.status)) + ")");
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Stop()); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

http::Awaitable<Status> JobRunner::Cancel() {
  if (ended_)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has already ended (" +
                                      std::string(storage::ToString(job_.status)) + ")");
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Cancel()); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

http::Awaitable<StatusOr<json>> JobRunner::Result(int64_t worker_id, ResultReport report) {
  if (ended_) {
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has ended (" +
                                      std::string(storage::ToString(job_.status)) + "); result refused");
  }
  const int round = report.round, attempt = report.attempt;
  if (!report.blob_key.empty()) {
    auto completed = CompleteMultipartUpload(worker_id, report.blob_key);  // kCoAwaitTemporaries
    co_await std::move(completed);
  }
  // Reading and checking an update is the slow part of a result: done here, before waiting for the job's mutex, so
  // results check in parallel on the pool; only the accumulation is serial. Bounded, since a checked update is held
  // in memory until its turn; beyond the bound the check runs under the mutex as before.
  const bool check_early = round <= engine_config_.num_rounds && !report.blob_key.empty() && global_ != nullptr &&
                           checked_updates_.size() < kMaxEarlyCheckedUpdates && checked_updates_.count(worker_id) == 0;
  if (check_early) {
    checked_updates_[worker_id] = CheckedUpdate{.round = round, .attempt = attempt, .blob_key = report.blob_key};
    const std::string expected_key = UpdateKey(round, attempt, worker_id);
    const uint64_t max_bytes = global_size_bytes_ + kUpdateHeaderSlackBytes;
    std::shared_ptr<weights::WeightSet> global = global_;
    const auto check_start = std::chrono::steady_clock::now();
    uint64_t update_bytes = 0;
    StatusOr<weights::WeightSet> update = co_await Offload(service_.pool(), [&] {
      return CheckUpdateFile(service_.blobs(), report, expected_key, max_bytes, *global, service_.spool_dir(),
                             &update_bytes);
    });
    if (update_bytes > 0) verified_update_bytes_[report.blob_key] = update_bytes;
    PARSYN_LOG_DEBUG("training job {}: round {} update of worker {} checked early in {:.1f} ms", job_.id, round,
                     worker_id, MillisSince(check_start));
    if (auto c = checked_updates_.find(worker_id); c != checked_updates_.end()) {
      c->second.update = std::move(update);
      c->second.ready = true;
    }
  }
  bool duplicate = false;
  Status refused;
  auto handled = Handle([&]() -> StatusOr<Actions> {
    WorkerResult result{.worker = worker_id,
                        .round = round,
                        .attempt = attempt,
                        .sample_count = report.sample_count,
                        .train_loss = report.train_loss,
                        .validation_samples = report.validation_samples,
                        .validation_loss = report.validation_loss};
    StatusOr<Actions> actions = engine_->ResultUploaded(result);
    if (!actions.ok()) {
      refused = actions.status();
    } else if (actions->empty()) {
      duplicate = true;
    } else {
      results_[worker_id] = report;
    }
    return actions;
  });
  Status s = co_await std::move(handled);              // created above, not inside the co_await: kCoAwaitTemporaries
  if (check_early) checked_updates_.erase(worker_id);  // not consumed: the result was refused or a duplicate
  if (!refused.ok()) co_return refused;                // late, unexpected or from a dropped worker: nothing changed
  service_.TaskFinished(worker_id, job_.id);
  if (!s.ok()) co_return s;
  json out = {{"job_id", job_.id}, {"round", round}, {"attempt", attempt}};
  if (round > engine_config_.num_rounds) {
    out["status"] = "evaluated";
  } else if (auto it = last_verdicts_.find(worker_id); it != last_verdicts_.end()) {
    out["status"] = duplicate ? "duplicate" : (it->second.empty() ? "accepted" : "rejected");
    if (!it->second.empty()) out["reason"] = it->second;
  } else {
    out["status"] = duplicate ? "duplicate" : "received";
  }
  co_return out;
}

void JobRunner::RecordProgress(int64_t worker_id, const json& progress) { progress_[worker_id] = progress; }

json JobRunner::LiveView() const {
  if (engine_ == nullptr) return json::object();
  return {{"phase", JobPhaseName(engine_->phase())},
          {"round", engine_->round()},
          {"attempt", engine_->attempt()},
          {"committed_round", engine_->last_committed_round()},
          {"total_rounds", engine_config_.num_rounds},
          {"workers", ParticipantsJson(engine_->participants(), progress_)}};
}

}  // namespace parsyn::coordinator
