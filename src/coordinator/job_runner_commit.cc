#include "coordinator/job_runner.h"

#include <fmt/format.h>

#include "base/log.h"
#include "coordinator/api_json.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/server_metrics.h"
#include "data/llama_config.h"
#include "storage/byte_source.h"
#include "weights/lora_layout.h"
#include "weights/peft_config.h"
#include "weights/safetensors.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

http::Awaitable<Status> JobRunner::OnAggregateRound(const AggregateRound& a, std::deque<Action>& work) {
  const std::string key = AttemptPrefix(a.round, a.attempt) + "/global.safetensors";
  const std::string state_key = AttemptPrefix(a.round, a.attempt) + "/" + kServerStateFile;
  // The new global is a durable blob before the engine hears that aggregation finished (and so before commit).
  Aggregator::FinishTimings timings;
  const Aggregator::Base base{.key = global_.key(), .sha256 = global_.sha256(), .weights = *global_.weights()};
  // A secure attempt's mean comes from its unmasked sum (waiting for the survivors' shares); others' from the
  // updates the round's aggregation holds.
  std::optional<StatusOr<weights::WeightSet>> secure_mean;
  if (secure_) {
    auto unmasked = SecureMean(a.round, a.attempt);  // kCoAwaitTemporaries
    secure_mean = co_await std::move(unmasked);
  }
  StatusOr<Aggregator::Aggregated> aggregated =
      co_await loop::Offload(host_.pool(), [&]() -> StatusOr<Aggregator::Aggregated> {
        if (!secure_mean)
          return aggregator_.FinishRound(host_.blobs(), key, state_key, base, host_.spool_dir(), &timings);
        if (!secure_mean->ok()) return secure_mean->status();
        return aggregator_.FinishSecureRound(**std::move(secure_mean), static_cast<int>(a.updates.size()),
                                             host_.blobs(), key, state_key, base, host_.spool_dir(), &timings);
      });
  PARSYN_LOG_DEBUG("training job {}: round {} aggregated: finish {:.1f} ms, serialize {:.1f} ms, durable put {:.1f} ms",
                   job_.id, a.round, timings.finish_ms, timings.serialize_ms, timings.put_ms);
  ObservePhase("aggregate_finish", timings.finish_ms);
  ObservePhase("aggregate_serialize", timings.serialize_ms);
  ObservePhase("aggregate_put", timings.put_ms);
  Status outcome = aggregated.status();
  if (aggregated.ok()) {
    global_.SetPending({.key = key,
                        .sha256 = aggregated->info.sha256,
                        .weights = aggregated->weights,
                        .delta = std::move(aggregated->delta)});
  } else {
    PARSYN_LOG_ERROR("training job {}: aggregating round {}: {}", job_.id, a.round, outcome.ToString());
  }
  StatusOr<Actions> next = engine_->AggregationFinished(a.round, a.attempt, outcome);
  if (!next.ok()) co_return next.status();
  work.insert(work.begin(), next->begin(), next->end());
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnGlobalEvaluated(const GlobalEvaluated& a) {
  if (a.final) {
    Status recorded = co_await loop::Offload(host_.pool(), [&] {
      return host_.store().RecordFinalValidationLoss(job_.id, a.global_round, a.validation_loss);
    });
    if (!recorded.ok()) co_return recorded;
  } else {
    global_.set_pending_validation_loss(a.validation_loss);  // stored by the commit that follows, in its transaction
  }
  {
    auto event_appended = host_.AppendEvent(job_.id, "global_evaluated",
                                            {{"global_round", a.global_round},
                                             {"validation_loss", a.validation_loss},
                                             {"validation_samples", a.validation_samples},
                                             {"final", a.final}});
    co_await std::move(event_appended);
  }
  co_return Status::Ok();
}

http::Awaitable<Status> JobRunner::OnCommitRound(const coordinator::CommitRound& a) {
  if (!global_.pending()) co_return InternalError("round " + std::to_string(a.round) + " commits without a global");
  storage::RoundCommit commit{.job_id = job_.id,
                              .round = a.round,
                              .attempt = a.attempt,
                              .global_blob_key = global_.pending()->key,
                              .global_sha256 = global_.pending()->sha256,
                              .ended_at_ms = host_.clock().UnixMillis(),
                              .train_loss = a.num_updates > 0 ? std::optional<double>(a.train_loss) : std::nullopt,
                              .previous_global_validation_loss = global_.pending_validation_loss(),
                              .bytes_down = attempt_.bytes_down(),
                              .bytes_up = attempt_.bytes_up()};
  const std::string artifact_name = fmt::format("rounds/{:06}/global.safetensors", a.round);
  const auto commit_start = std::chrono::steady_clock::now();
  StatusOr<storage::BlobInfo> info =
      co_await loop::Offload(host_.pool(), [&] { return host_.blobs().Head(global_.pending()->key); });
  if (!info.ok()) co_return info.status();
  Status committed = co_await loop::Offload(host_.pool(), [&]() -> Status {
    PARSYN_RETURN_IF_ERROR(host_.store().CommitRound(commit));
    // Every committed global stays downloadable as an artifact of the job.
    Status added = host_.store().AddJobArtifact({.job_id = job_.id,
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
  ObservePhase("commit", MillisSince(commit_start));
  Metrics().rounds.WithLabels({"committed"}).Inc();
  if (attempt_.started() != std::chrono::steady_clock::time_point{}) {
    Metrics().round_duration.WithLabels({}).Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - attempt_.started()).count());
  }
  if (engine_config_.async) KeepGlobalsForTasksInTraining();
  job_.committed_round = a.round;
  aggregator_.strategy()->CommitState();  // the next round steps from this round's server state
  global_.CommitPending(info->size_bytes);
  {
    json committed_data = {{"round", a.round},
                           {"attempt", a.attempt},
                           {"total_rounds", engine_config_.num_rounds},
                           {"train_loss", a.train_loss},
                           {"num_updates", a.num_updates},
                           {"num_samples", a.num_samples},
                           {"global_sha256", global_.sha256()}};
    if (engine_config_.async) committed_data["staleness"] = a.staleness;  // a version's updates', in their order
    // dp_fedavg: the round's privacy report; GET .../rounds reads it back from this event (RoundPrivacyJson), stored
    // in the commit's batch.
    if (std::optional<strategy::RoundPrivacy> privacy = aggregator_.strategy()->CommittedRoundPrivacy()) {
      committed_data["privacy"] = RoundPrivacyJson(privacy->round, privacy->options);
    }
    auto event_appended = host_.AppendEvent(job_.id, "round_committed", std::move(committed_data));
    co_await std::move(event_appended);
  }
  global_.DropPendingValidationLoss();
  if (engine_config_.async) {
    DeleteVersionUpdates();  // the version's folder still takes the uploads of its tasks in training
    co_return Status::Ok();
  }
  {
    auto aborted = AbortIncompleteUploads(AttemptPrefix(a.round, a.attempt) + "/");  // kCoAwaitTemporaries
    co_await std::move(aborted);
  }
  DeleteUpdatesInBackground(AttemptPrefix(a.round, a.attempt) + "/updates/");
  co_return Status::Ok();
}

void JobRunner::DeleteVersionUpdates() {
  for (const auto& [worker, report] : attempt_.results()) {
    // Only a key the job made for that task: a reported key is the worker's word until checked.
    if (report.blob_key == UpdateKey(report.round, report.attempt, worker)) DeleteUpdatesInBackground(report.blob_key);
  }
}

void JobRunner::KeepGlobalsForTasksInTraining() {
  global_.KeepEarlier(job_.committed_round, global_.weights());
  std::set<int> needed;
  for (const ParticipantView& p : engine_->participants()) {
    if (p.state == ParticipantState::kTraining || p.state == ParticipantState::kValidating) {
      needed.insert(p.task_round - 1);
    }
  }
  global_.ForgetEarlierExcept(needed);
}

http::Awaitable<Status> JobRunner::OnFailRound(const coordinator::FailRound& a, const std::deque<Action>& work) {
  storage::RoundFailure failure{.job_id = job_.id,
                                .round = a.round,
                                .attempt = a.attempt,
                                .reason = a.reason,
                                .ended_at_ms = host_.clock().UnixMillis(),
                                .bytes_down = attempt_.bytes_down(),
                                .bytes_up = attempt_.bytes_up()};
  for (const Action& next : work) {
    if (const auto* f = std::get_if<JobFailed>(&next)) failure.fail_job_reason = f->reason;
  }
  // The attempt's tasks still waiting for their batch never go out (an asynchronous job's outlive the version).
  if (!engine_config_.async) undelivered_tasks_.clear();
  Status failed = co_await loop::Offload(host_.pool(), [&] { return host_.store().FailRound(failure); });
  if (!failed.ok()) co_return failed;
  Metrics().rounds.WithLabels({"failed"}).Inc();
  global_.DropPending();
  if (engine_config_.async) {
    DeleteVersionUpdates();  // the version's folder still takes the uploads of its tasks in training
  } else {
    auto aborted = AbortIncompleteUploads(AttemptPrefix(a.round, a.attempt) + "/");  // kCoAwaitTemporaries
    co_await std::move(aborted);
    DeleteUpdatesInBackground(AttemptPrefix(a.round, a.attempt) + "/updates/");
  }
  {
    auto event_appended = host_.AppendEvent(job_.id, "round_failed",
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
  const int64_t now = host_.clock().UnixMillis();
  const std::string global_key = global_.key();
  const std::string global_sha = global_.sha256();
  const int64_t global_size = static_cast<int64_t>(global_.size_bytes());
  std::string adapter_config;
  if (spec_.config.use_peft) {
    // The one adapter_config.json writer (weights/peft_config.h), as `parsyn train` writes it; the base model named
    // by its config.json's _name_or_path when it has one, else by its registered name.
    StatusOr<data::LlamaConfig> base = data::ParseLlamaConfig(model_.config_json);
    adapter_config = weights::PeftAdapterConfigJson(
        {.r = spec_.config.lora_r,
         .lora_alpha = spec_.config.lora_alpha,
         .lora_dropout = spec_.config.lora_dropout,
         .target_modules = spec_.config.lora_target_modules,
         .base_model_name_or_path = base.ok() ? data::BaseModelNameOrPath(*base, model_.name) : model_.name});
  }
  const bool peft = spec_.config.use_peft;
  const std::string prefix = peft ? "adapter_model" : "model";
  Status written = co_await loop::Offload(host_.pool(), [&]() -> Status {
    auto add = [&](std::string name, std::string key, int64_t size, std::string sha) -> Status {
      Status s = host_.store().AddJobArtifact({.job_id = job_.id,
                                               .name = std::move(name),
                                               .blob_key = std::move(key),
                                               .size_bytes = size,
                                               .sha256 = std::move(sha),
                                               .created_at_ms = now});
      return s.code() == StatusCode::kAlreadyExists ? Status::Ok() : s;
    };
    PARSYN_RETURN_IF_ERROR(add(prefix + ".safetensors", global_key, global_size, global_sha));
    std::optional<storage::BlobInfo> config_info;
    if (peft) {
      PARSYN_ASSIGN_OR_RETURN(config_info, PutBytes(host_.blobs(), adapter_config_key, adapter_config));
      PARSYN_RETURN_IF_ERROR(add("adapter_config.json", adapter_config_key,
                                 static_cast<int64_t>(config_info->size_bytes), config_info->sha256));
    }
    // best/: the committed global with the lowest validation loss (the job's best_round), in the same form.
    PARSYN_ASSIGN_OR_RETURN(storage::TrainingJob stored, host_.store().GetJob(job_.id));
    if (!stored.best_round) return Status::Ok();
    const std::string round_global = fmt::format("rounds/{:06}/global.safetensors", *stored.best_round);
    PARSYN_ASSIGN_OR_RETURN(std::vector<storage::JobArtifact> artifacts, host_.store().ListJobArtifacts(job_.id));
    for (const storage::JobArtifact& a : artifacts) {
      if (a.name != round_global) continue;
      PARSYN_RETURN_IF_ERROR(add("best/" + prefix + ".safetensors", a.blob_key, a.size_bytes, a.sha256));
      if (config_info) {
        PARSYN_RETURN_IF_ERROR(add("best/adapter_config.json", adapter_config_key,
                                   static_cast<int64_t>(config_info->size_bytes), config_info->sha256));
      }
    }
    return Status::Ok();
  });
  co_return written;
}

http::Awaitable<Status> JobRunner::OnJobEnded(JobStatus status, std::string_view reason_view) {
  const std::string reason(reason_view);
  undelivered_tasks_.clear();  // tasks still waiting for their batch never go out
  Status artifacts = Status::Ok();
  if (status == JobStatus::kSucceeded || status == JobStatus::kStopped) artifacts = co_await WriteFinalArtifacts();
  const int64_t now = host_.clock().UnixMillis();
  StatusOr<storage::TrainingJob> ended = co_await loop::Offload(host_.pool(), [&]() -> StatusOr<storage::TrainingJob> {
    PARSYN_ASSIGN_OR_RETURN(storage::TrainingJob current, host_.store().GetJob(job_.id));
    if (current.status != status) {  // else FailRound already failed it in the same transaction
      PARSYN_ASSIGN_OR_RETURN(current, host_.store().SetJobStatus(job_.id, status, now, reason));
    }
    // An attempt still waiting or training when the job was stopped or cancelled ends with the job.
    PARSYN_ASSIGN_OR_RETURN(std::vector<storage::Round> rounds, host_.store().ListRounds(job_.id));
    for (const storage::Round& r : rounds) {
      if (r.status != storage::RoundStatus::kRunning) continue;
      PARSYN_RETURN_IF_ERROR(
          host_.store().FailRound({.job_id = job_.id,
                                   .round = r.round,
                                   .attempt = r.attempt,
                                   .reason = "the job ended (" + std::string(storage::ToString(status)) + ")",
                                   .ended_at_ms = now,
                                   .bytes_down = attempt_.bytes_down(),
                                   .bytes_up = attempt_.bytes_up(),
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
  for (const ParticipantView& p : engine_->participants()) host_.TaskFinished(p.worker, job_.id);
  json payload = {{"status", storage::ToString(status)}, {"committed_round", job_.committed_round}};
  if (!reason.empty()) payload["reason"] = reason;
  if (job_.final_validation_loss) payload["final_validation_loss"] = *job_.final_validation_loss;
  if (job_.best_round) {
    payload["best_round"] = *job_.best_round;
    payload["best_validation_loss"] = *job_.best_validation_loss;
  }
  {
    auto event_appended = host_.AppendEvent(job_.id, "job_status", payload);
    co_await std::move(event_appended);
  }
  global_.ReleaseWeights();  // the weights are in the blob store; an ended job holds no memory
  if (!artifacts.ok()) co_return artifacts;
  co_return ended.status();
}

}  // namespace parsyn::coordinator
