#include "coordinator/job_runner.h"

#include <fmt/format.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>

#include "base/log.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/server_metrics.h"
#include "protocol/messages.h"
#include "storage/byte_source.h"
#include "storage/local_blob_copy.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

std::string JobRunner::AttemptPrefix(int round, int attempt) const {
  return fmt::format("jobs/{}/rounds/{:06}-a{}", job_.id, round, attempt);
}

std::string JobRunner::UpdateKey(int round, int attempt, int64_t worker_id) const {
  return fmt::format("{}/updates/w{}.safetensors", AttemptPrefix(round, attempt), worker_id);
}

std::optional<std::pair<int, int>> JobRunner::TaskOfUpdateKey(const std::string& key, int64_t worker_id) const {
  const std::string rounds = fmt::format("jobs/{}/rounds/", job_.id);
  int round = 0, attempt = 0;
  if (!key.starts_with(rounds) || std::sscanf(key.c_str() + rounds.size(), "%d-a%d/", &round, &attempt) != 2 ||
      UpdateKey(round, attempt, worker_id) != key) {
    return std::nullopt;
  }
  return std::pair(round, attempt);
}

http::Awaitable<Status> JobRunner::OnStartRound(const coordinator::StartRound& a, const std::deque<Action>& work) {
  storage::Round round{
      .job_id = job_.id, .round = a.round, .attempt = a.attempt, .started_at_ms = host_.clock().UnixMillis()};
  // The participants chosen together with the start (workers already waiting); later arrivals show in the updates.
  for (const Action& next : work) {
    if (const auto* t = std::get_if<AssignTask>(&next); t && t->round == a.round && t->attempt == a.attempt) {
      round.participants.push_back(t->worker);
    }
  }
  attempt_.Begin(round.participants);
  // An asynchronous job's updates carried over a restart (Restore announces them next): their reports, as stored.
  for (const storage::RoundUpdate& u : carried_updates_) {
    if (const std::optional<std::pair<int, int>> task = TaskOfUpdateKey(u.blob_key, u.worker_id)) {
      json metrics = json::parse(u.metrics_json, nullptr, false);
      attempt_.RecordResult(u.worker_id, ResultReport{.round = task->first,
                                                      .attempt = task->second,
                                                      .blob_key = u.blob_key,
                                                      .sha256 = u.sha256,
                                                      .sample_count = u.num_samples,
                                                      .train_loss = u.train_loss.value_or(0.0),
                                                      .metrics = metrics.is_object() ? metrics : json::object()});
    }
  }
  carried_updates_.clear();
  rank_globals_.BeginAttempt();
  secure_.reset();  // the attempt's SecureRound comes with its first tasks (OnAssignTask)
  // Of an earlier attempt: stale (an asynchronous job's tasks outlive the version they started on).
  if (!engine_config_.async) undelivered_tasks_.clear();
  global_.DropPending();
  global_.DropPendingValidationLoss();
  Status started = co_await loop::Offload(host_.pool(), [&] { return host_.store().StartRound(round); });
  if (!started.ok()) co_return started;
  Status begun = co_await loop::Offload(host_.pool(), [&] { return aggregator_.Begin(a.round, *global_.weights()); });
  if (!begun.ok()) co_return begun;
  global_.ForgetZstdCopy();
  if (spec_.distributed.compression.zstd_level > 0) {
    auto written = WriteGlobalZstdCopy(a.round, a.attempt);  // kCoAwaitTemporaries
    co_await std::move(written);
  }
  {
    auto event_appended = host_.AppendEvent(job_.id, "round_started",
                                            {{"round", a.round},
                                             {"attempt", a.attempt},
                                             {"total_rounds", engine_config_.num_rounds},
                                             {"participants", round.participants}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

weights::WireEncoding JobRunner::UpdateEncoding() const {
  const protocol::UpdateCompression& c = spec_.distributed.compression;
  weights::WireEncoding encoding{.delta = c.delta, .zstd_level = c.zstd_level, .error_feedback = c.error_feedback};
  if (StatusOr<weights::UpdateCodec> codec = weights::ParseUpdateCodec(c.update); codec.ok()) encoding.codec = *codec;
  return encoding;
}

uint64_t JobRunner::MaxUpdateUploadBytes() const {
  // zstd's worst case on incompressible bytes is the input plus ~1/256 of it (ZSTD_compressBound); 1/128 is ample.
  const uint64_t zstd_framing = spec_.distributed.compression.zstd_level > 0 ? global_.size_bytes() / 128 : 0;
  if (secure_) {  // a masked input: ring_bits / 8 bytes per element, whatever the global's dtypes
    const secagg::RoundSetup& setup = secure_->setup();
    return static_cast<uint64_t>(setup.ring_bits / 8) * setup.vector_length;
  }
  return global_.size_bytes() + kUpdateHeaderSlackBytes + zstd_framing;
}

http::Awaitable<void> JobRunner::WriteGlobalZstdCopy(int round, int attempt) {
  using ZstdCopy = GlobalWeights::ZstdCopy;
  const std::string key = AttemptPrefix(round, attempt) + "/global.safetensors.zst";
  const std::string global_key = global_.key();
  const int level = spec_.distributed.compression.zstd_level;
  const std::filesystem::path spool =
      host_.spool_dir() / fmt::format("global-{}-{}-a{}.safetensors.zst", job_.id, round, attempt);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<ZstdCopy> copy = co_await loop::Offload(host_.pool(), [&]() -> StatusOr<ZstdCopy> {
    PARSYN_ASSIGN_OR_RETURN(storage::LocalBlobCopy plain,
                            storage::LocalBlobCopy::Open(host_.blobs(), global_key, host_.spool_dir()));
    struct RemoveSpool {
      std::filesystem::path path;
      ~RemoveSpool() {
        std::error_code ignored;
        std::filesystem::remove(path, ignored);
      }
    } remove_spool{spool};
    PARSYN_ASSIGN_OR_RETURN(uint64_t size, weights::ZstdCompressFile(plain.path(), spool, level));
    PARSYN_ASSIGN_OR_RETURN(std::string sha256, Sha256File(spool));
    PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, storage::OpenFileSource(spool));
    // Not durable: an attempt in flight at a restart is retried as a new attempt, which writes its own copy.
    StatusOr<storage::BlobInfo> put = host_.blobs().Put(key, *source, {.expected_sha256 = sha256, .durable = false});
    if (!put.ok() && put.status().code() != StatusCode::kAlreadyExists) return put.status();
    if (!put.ok()) {
      PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo existing, host_.blobs().Head(key));
      if (existing.sha256 != sha256) return DataLossError("the blob " + key + " exists with other bytes");
    }
    return ZstdCopy{.of_global = global_key, .key = key, .sha256 = sha256, .size_bytes = size};
  });
  if (!copy.ok()) {
    PARSYN_LOG_WARN(
        "training job {}: round {}: could not write the zstd copy of the global (tasks offer the plain "
        "global): {}",
        job_.id, round, copy.status().ToString());
    co_return;
  }
  PARSYN_LOG_DEBUG("training job {}: round {} global compressed with zstd-{}: {} -> {} bytes in {:.1f} ms", job_.id,
                   round, level, global_.size_bytes(), copy->size_bytes, MillisSince(start));
  global_.SetZstdCopy(std::move(*copy));
}

StatusOr<TaskMessage> JobRunner::BuildTask(const AssignTask& a) const {
  const storage::Shard& shard = shards_.at(static_cast<size_t>(a.shard));
  protocol::Task task;
  task.task_id = fmt::format("{}-{}-{}-w{}", job_.id, a.round, a.attempt, a.worker);
  task.job_id = job_.id;
  task.kind = a.kind == TaskKind::kTrain ? protocol::TaskKind::kTrain : protocol::TaskKind::kEvaluate;
  task.round = a.round;
  task.attempt = a.attempt;
  task.total_rounds = engine_config_.num_rounds;
  task.shard = a.shard;
  task.seed = a.seed;
  task.steps_per_round = spec_.distributed.steps_per_round;
  task.config = spec_.config;
  // FedProx: the proximal term's weight (0 for every other strategy: plain local training); the trainer adds
  // mu/2 * ||w - w_global||^2 to its loss. Evaluation tasks train nothing.
  if (a.kind == TaskKind::kTrain) task.proximal_mu = spec_.distributed.strategy_options.mu;
  task.secure_aggregation = a.kind == TaskKind::kTrain && secure_.has_value();
  task.deadline_unix_ms = host_.clock().UnixMillis() + engine_config_.aggregation_timeout.count();
  // The task's URLs last as long as its attempt (plus a margin), not beyond, and name the worker they were given to.
  const std::chrono::seconds url_ttl = host_.TaskUrlTtl(engine_config_.aggregation_timeout);
  task.global_weights = {.url = host_.BlobGetUrl(global_.key(), url_ttl, a.worker),
                         .sha256 = global_.sha256(),
                         .size_bytes = global_.size_bytes(),
                         .round = engine_->last_committed_round()};
  const RankGlobals::Global* lower_rank = LowerRankGlobal(a);
  if (lower_rank != nullptr) {
    // A worker of a lower LoRA rank starts from the global at its rank, sent whole (no zstd copy or delta of it), with
    // the job's lora_alpha: PEFT's scaling alpha / r for its rank (docs/training.md, "Workers of different ranks").
    const int rank = *rank_globals_.RankOf(a.worker);
    task.global_weights = {.url = host_.BlobGetUrl(lower_rank->key, url_ttl, a.worker),
                           .sha256 = lower_rank->sha256,
                           .size_bytes = lower_rank->size_bytes,
                           .round = engine_->last_committed_round()};
    task.config.lora_r = rank;
  }
  const GlobalWeights::ZstdCopy* zstd = lower_rank == nullptr ? global_.zstd_copy() : nullptr;
  if (zstd != nullptr) {  // not a previous global's (the final evaluation)
    task.global_weights.zstd = protocol::TaskZstdCopy{
        .url = host_.BlobGetUrl(zstd->key, url_ttl, a.worker), .sha256 = zstd->sha256, .size_bytes = zstd->size_bytes};
  }
  if (const GlobalWeights::DeltaCopy* delta = lower_rank == nullptr ? global_.delta_copy() : nullptr) {
    task.global_weights.delta = protocol::TaskGlobalDelta{
        .url = host_.BlobGetUrl(delta->key, url_ttl, a.worker),
        .sha256 = delta->sha256,
        .size_bytes = delta->size_bytes,
        .base_sha256 = delta->base_sha256,
        .codec = std::string(protocol::GlobalDeltaCodec(spec_.distributed.compression.global)),
        .zstd = spec_.distributed.compression.zstd_level > 0,
        .metadata = {delta->metadata.begin(), delta->metadata.end()}};
  }
  if (engine_config_.workers_hold_data) {
    // The worker trains and evaluates on its own file (split with the job's seed); `data` stays empty.
    task.data_source = protocol::DataSource::kWorkers;
  } else {
    // Each file with its recorded sha256: the worker caches by it and checks its download against it.
    task.data = {.format = std::string(storage::ToString(dataset_.format)),
                 .kind = std::string(storage::ToString(dataset_.kind)),
                 .train_url = host_.BlobGetUrl(shard.blob_key, url_ttl, a.worker),
                 .train_sha256 = shard.sha256,
                 .train_rows = shard.train_rows,
                 .validation_url = host_.BlobGetUrl(ValidationKey(shard, dataset_.format), url_ttl, a.worker),
                 .validation_sha256 = validation_sha256_.at(static_cast<size_t>(a.shard)),
                 .validation_rows = shard.validation_rows};
  }
  task.model = {.id = model_.id, .name = model_.name, .model_type = model_.model_type, .files = {}};
  for (const storage::ModelFile& f : model_.files) {
    task.model.files.push_back({.path = f.path,
                                .url = host_.BlobGetUrl(f.blob_key, url_ttl, a.worker),
                                .sha256 = f.sha256,
                                .size_bytes = static_cast<uint64_t>(f.size_bytes)});  // a stored blob's size
  }
  if (a.kind == TaskKind::kTrain) {
    task.compression = spec_.distributed.compression;  // how the worker encodes its update
    PARSYN_ASSIGN_OR_RETURN(task.update_upload, UpdateUploadGrant(a.worker, UpdateKey(a.round, a.attempt, a.worker)));
  }
  // The job's config, dumped once, unless the task's rank changed it.
  const std::string_view config_json = lower_rank == nullptr ? std::string_view(task_config_json_) : std::string_view();
  return TaskMessage{.round = a.round, .attempt = a.attempt, .json = protocol::TaskJsonText(task, config_json)};
}

StatusOr<protocol::UpdateUpload> JobRunner::UpdateUploadGrant(int64_t worker_id, const std::string& key) const {
  protocol::UpdateUpload grant{.blob_key = key, .max_size_bytes = MaxUpdateUploadBytes()};
  storage::BlobUrlIssuer& urls = host_.blob_urls();
  const std::chrono::seconds ttl = host_.TaskUrlTtl(engine_config_.aggregation_timeout);
  auto headers_of = [](const std::vector<std::pair<std::string, std::string>>& headers) {
    return protocol::HttpHeaders(headers.begin(), headers.end());
  };
  const MultipartUpload* multipart = attempt_.multipart_upload(worker_id);
  if (multipart == nullptr || multipart->key != key) {
    PARSYN_ASSIGN_OR_RETURN(storage::UrlGrant put, host_.BlobPutGrant(key, ttl, worker_id));
    grant.url = put.url;
    if (!put.headers.empty()) grant.headers = headers_of(put.headers);
    return grant;
  }
  // Enough parts for the largest update accepted; the worker sends as many as its file needs. (A multipart upload
  // was only started when the store has them.)
  storage::MultipartUrlIssuer& parts_issuer = *urls.multipart();
  protocol::UpdateUpload::Multipart parts{.part_size_bytes = parts_issuer.part_size_bytes(), .parts = {}};
  const uint64_t count = (grant.max_size_bytes + parts.part_size_bytes - 1) / parts.part_size_bytes;
  for (uint64_t n = 1; n <= count; ++n) {
    PARSYN_ASSIGN_OR_RETURN(storage::UrlGrant part,
                            parts_issuer.PartGrant(key, multipart->upload_id, static_cast<int>(n), ttl));
    parts.parts.push_back(
        {.part_number = static_cast<int64_t>(n), .url = part.url, .headers = headers_of(part.headers)});
  }
  grant.multipart = std::move(parts);
  return grant;
}

http::Awaitable<Status> JobRunner::OnAssignTask(const AssignTask& a, const std::deque<Action>& work) {
  if (a.shard < 0 || static_cast<size_t>(a.shard) >= shards_.size()) {
    co_return InternalError("the round engine assigned shard " + std::to_string(a.shard) + " of " +
                            std::to_string(shards_.size()));
  }
  if (a.kind == TaskKind::kTrain && spec_.distributed.secure_aggregation.enabled &&
      (!secure_ || secure_->setup().attempt != SecureAttemptName(job_.id, a.round, a.attempt))) {
    // The attempt's first tasks (with the round's start, or later when no worker was idle then) fix its participants.
    if (Status secure = BeginSecureAttempt(a, work); !secure.ok()) co_return secure;
  }
  storage::Shard& shard = shards_[static_cast<size_t>(a.shard)];
  const auto assign_start = std::chrono::steady_clock::now();
  // Group commit: the task's records and event go into the next batch, and the task is delivered once that batch is
  // durable, by Execute between its slices or by Handle (the worker keeps its shard for the whole job: stored before
  // the task goes out). Memory is updated now; if the batch fails, the job resyncs from the store (which reloads both).
  std::vector<storage::BatchWrite> records;
  if (shard.worker_id != a.worker) {
    records.push_back(storage::ShardAssignment{.job_id = job_.id, .shard_index = a.shard, .worker_id = a.worker});
    shard.worker_id = a.worker;
  }
  if (a.kind == TaskKind::kTrain && attempt_.AddStoredParticipant(a.worker)) {
    // A late joiner (its task goes out after the attempt started): the attempt's participants list it too. (The
    // final evaluation is no round of the store.)
    records.push_back(
        storage::RoundParticipant{.job_id = job_.id, .round = a.round, .attempt = a.attempt, .worker_id = a.worker});
  }
  // LoRA: the rank the worker trains (lora_rank_spec.h); one above what it announced refuses the task.
  const Status ranked = a.kind == TaskKind::kTrain && spec_.config.use_peft ? ChooseLoraRank(a.worker) : Status::Ok();
  json assigned = {{"worker_id", a.worker},
                   {"round", a.round},
                   {"attempt", a.attempt},
                   {"shard", a.shard},
                   {"kind", a.kind == TaskKind::kTrain ? "train" : "evaluate"}};
  std::optional<int> rank = a.kind == TaskKind::kTrain ? rank_globals_.RankOf(a.worker) : std::nullopt;
  if (ranked.ok() && rank && spec_.lora_ranks.mixed()) {
    assigned["lora_rank"] = *rank;
  }
  std::vector<JobHost::QueuedEvent> events;
  events.push_back({"task_assigned", std::move(assigned)});
  WriteQueue::TicketPtr written = QueueWrites(std::move(records), std::move(events));
  Status started = Status::Ok();
  if (a.kind == TaskKind::kTrain) {
    // kCoAwaitTemporaries: the awaitable is created before the co_await.
    auto multipart = StartMultipartUploadIfLarge(a.worker, UpdateKey(a.round, a.attempt, a.worker));
    started = co_await std::move(multipart);
    if (started.ok()) started = ranked;
    if (started.ok() && spec_.config.use_peft) {
      auto made = MakeRankGlobal(a);  // kCoAwaitTemporaries
      started = co_await std::move(made);
    }
  }
  StatusOr<TaskMessage> task = started.ok() ? BuildTask(a) : StatusOr<TaskMessage>(started);
  if (!task.ok()) {
    // Nothing went out: the worker leaves this attempt with the reason (a store outage shows up here) and is
    // offered the next one. Reported once this event is done (the job's mutex is held). The reason is shown on the
    // dashboard: the server's own file paths are cut to their file names (the log keeps them).
    PARSYN_LOG_ERROR("training job {}: cannot prepare the task of worker {}: {}", job_.id, a.worker,
                     task.status().ToString());
    boost::asio::co_spawn(
        host_.executor(),
        TaskFailedDetached(a.worker, a.round, a.attempt,
                           "the coordinator could not prepare the task: " + WithoutLocalPaths(task.status().message())),
        boost::asio::detached);
    co_return Status::Ok();
  }
  undelivered_tasks_[a.worker] =
      QueuedTask{.task = std::move(*task), .queued_at = assign_start, .written = std::move(written)};
  tasks_to_deliver_.push_back(a.worker);
  ObservePhase("task_assign", MillisSince(assign_start));
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::StartMultipartUploadIfLarge(int64_t worker_id, std::string key) {
  storage::MultipartUrlIssuer* multipart = host_.blob_urls().multipart();
  if (multipart == nullptr || MaxUpdateUploadBytes() <= multipart->multipart_threshold_bytes()) {
    co_return Status::Ok();
  }
  StatusOr<std::string> upload_id = co_await loop::Offload(host_.pool(), [&] { return multipart->StartUpload(key); });
  if (!upload_id.ok()) co_return upload_id.status().WithContext("starting the multipart upload of " + key);
  attempt_.AddMultipartUpload(worker_id, MultipartUpload{.key = key, .upload_id = *upload_id});
  co_return Status::Ok();
}

http::Awaitable<void> JobRunner::CompleteMultipartUpload(int64_t worker_id, std::string key) {
  // Taken: a repeated result finds the object complete, or nothing to complete.
  const std::optional<MultipartUpload> upload = attempt_.TakeMultipartUpload(worker_id, key);
  if (!upload) co_return;
  storage::MultipartUrlIssuer* multipart = host_.blob_urls().multipart();  // non-null: it started the upload
  StatusOr<storage::BlobInfo> done =
      co_await loop::Offload(host_.pool(), [&] { return multipart->CompleteUpload(upload->key, upload->upload_id); });
  // On failure (parts missing or too small, store down) the check that follows finds no update and says so.
  if (!done.ok()) {
    PARSYN_LOG_WARN("training job {}: completing worker {}'s multipart upload of {}: {}", job_.id, worker_id,
                    upload->key, done.status().ToString());
  }
}

http::Awaitable<void> JobRunner::AbortIncompleteUploads(std::string prefix) {
  attempt_.ForgetMultipartUploads();
  storage::MultipartUrlIssuer* multipart = host_.blob_urls().multipart();
  if (multipart == nullptr) co_return;
  if (abort_sweep_pending_) prefix = RoundsPrefix();  // an earlier abort failed: sweep every round of the job
  StatusOr<int> aborted = co_await loop::Offload(host_.pool(), [&] { return multipart->AbortUploadsUnder(prefix); });
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

void JobRunner::DeleteUpdatesInBackground(std::string prefix) {
  if (host_.keep_updates()) return;
  boost::asio::post(host_.pool(), [&blobs = host_.blobs(), prefix = std::move(prefix), job_id = job_.id] {
    StatusOr<std::vector<std::string>> keys = blobs.List(prefix);
    // Recycled: nothing reads a finished attempt's updates, and the next round's uploads reuse their pages.
    const Status deleted = keys.ok() ? blobs.Recycle(*keys) : keys.status();
    // Only space: a leftover is never read.
    if (!deleted.ok()) {
      PARSYN_LOG_WARN("training job {}: deleting the updates under {}: {}", job_id, prefix, deleted.ToString());
    }
  });
}

std::string JobRunner::RoundsPrefix() const { return fmt::format("jobs/{}/rounds/", job_.id); }

http::Awaitable<void> JobRunner::TaskFailedDetached(int64_t worker_id, int round, int attempt, std::string reason) {
  auto failed = TaskFailed(worker_id, round, attempt, std::move(reason));  // kCoAwaitTemporaries
  Status s = co_await std::move(failed);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: dropping worker {}: {}", job_.id, worker_id, s.ToString());
}

}  // namespace parsyn::coordinator
