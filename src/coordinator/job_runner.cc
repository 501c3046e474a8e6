#include "coordinator/job_runner.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "base/log.h"
#include "coordinator/job_runner_internal.h"

namespace parsyn::coordinator {

using nlohmann::json;
using storage::JobStatus;

namespace {

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

// Events are appended as `{ auto event_appended = host_.AppendEvent(...); co_await std::move(event_appended); }`:
// g++ 12 miscompiles braced initializer lists inside co_await expressions.

JobRunner::JobRunner(JobHost& host, storage::TrainingJob job, JobSpec spec)
    : host_(host),
      job_(std::move(job)),
      spec_(std::move(spec)),
      engine_config_(EngineConfigFor(spec_)),
      mutex_(host.executor()) {}

JobRunner::~JobRunner() = default;

bool JobRunner::finished() const { return ended_; }

bool JobRunner::IsEligible(int64_t worker_id) const {
  if (ended_ || engine_ == nullptr) return false;
  if (engine_config_.eligible_workers.empty()) return true;
  return std::find(engine_config_.eligible_workers.begin(), engine_config_.eligible_workers.end(), worker_id) !=
         engine_config_.eligible_workers.end();
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
    const int64_t now = host_.clock().UnixMillis();
    StatusOr<storage::TrainingJob> failed = co_await Offload(
        host_.pool(), [&] { return host_.store().SetJobStatus(job_.id, JobStatus::kFailed, now, reason); });
    if (failed.ok()) job_ = *failed;
    ended_ = true;
    {
      auto event_appended = host_.AppendEvent(job_.id, "job_status", {{"status", "failed"}, {"reason", reason}});
      co_await std::move(event_appended);
    }
  }
  co_return status;
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
      auto event_appended = host_.AppendEvent(job_.id, "global_evaluated",
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
  if (s.ok()) host_.TaskFinished(worker_id, job_.id);
  co_return s;
}

bool JobRunner::TickDue() const {
  if (ended_ || engine_ == nullptr) return false;
  std::optional<Clock::TimePoint> deadline = engine_->next_deadline();
  return deadline && *deadline <= host_.clock().Now();
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
