#include "coordinator/job_runner.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "base/log.h"
#include "base/strings.h"
#include "coordinator/job_runner_internal.h"
#include "coordinator/server_metrics.h"
#include "storage/disk_full.h"

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
      task_config_json_(protocol::TrainingConfigToJson(spec_.config).dump()),
      aggregator_(job_, spec_, engine_config_.num_shards),
      mutex_(host.executor()),
      launched_(host.executor()),
      secure_changed_(host.executor()) {
  // data.source "workers": only workers whose session announced a data file of their own take part.
  if (engine_config_.workers_hold_data) {
    engine_config_.worker_has_data = [&host](WorkerId w) { return host.WorkerHasLocalData(w); };
  }
  // Only workers of the job's project (or the managed pool) offering the job's trainer for its model take part (the
  // model's kind is known once Setup read it).
  engine_config_.worker_offers_trainer = [this](WorkerId w) {
    return host_.WorkerServesProject(w, job_.project_id) &&
           host_.WorkerOffersTrainer(w, spec_.config.trainer, model_.model_type);
  };
}

JobRunner::~JobRunner() = default;

bool JobRunner::finished() const { return ended_; }

bool JobRunner::IsEligible(int64_t worker_id) const {
  return !ended_ && engine_ != nullptr && engine_->IsEligible(worker_id);
}

std::optional<uint64_t> JobRunner::UpdateSizeCap(std::string_view blob_key) const {
  if (engine_ == nullptr || ended_) return std::nullopt;
  if (engine_config_.async) {
    // A task in training may be of an earlier version than the one in progress.
    for (const ParticipantView& p : engine_->participants()) {
      if (p.state == ParticipantState::kTraining &&
          blob_key.starts_with(AttemptPrefix(p.task_round, p.task_attempt) + "/updates/")) {
        return MaxUpdateUploadBytes();
      }
    }
    return std::nullopt;
  }
  const std::string prefix = AttemptPrefix(engine_->round(), engine_->attempt()) + "/updates/";
  if (blob_key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return MaxUpdateUploadBytes();
}

void JobRunner::AddBytesDown(uint64_t bytes) {
  attempt_.AddBytesDown(static_cast<int64_t>(bytes));
  Metrics().job_blob_bytes.WithLabels({"down"}).Inc(static_cast<double>(bytes));
}

void JobRunner::AddBytesUp(uint64_t bytes) {
  attempt_.AddBytesUp(static_cast<int64_t>(bytes));
  Metrics().job_blob_bytes.WithLabels({"up"}).Inc(static_cast<double>(bytes));
}

http::Awaitable<Status> JobRunner::Launch() {
  // No co_await inside ?: (g++ 12 mishandles the temporaries of conditional co_awaits).
  Status status;
  if (aggregator_.strategy() == nullptr) {
    status = aggregator_.error();
  } else if (job_.status == JobStatus::kQueued) {
    status = co_await Setup();
  } else {
    status = co_await Resume();
  }
  if (!status.ok()) {
    PARSYN_LOG_ERROR("training job {}: {}", job_.id, status.ToString());
    // The reason is shown to users (the API, the dashboard): the server's file paths stay in its log.
    std::string reason = "could not start: " + WithoutLocalPaths(status.message());
    // A job that could not start has failed for good: a full disk's advice is to create it again, not to wait.
    if (reason.ends_with(storage::kDiskFullAdvice)) {
      reason.resize(reason.size() - storage::kDiskFullAdvice.size());
      reason += ", free space and create the job again";
    }
    const int64_t now = host_.clock().UnixMillis();
    StatusOr<storage::TrainingJob> failed = co_await loop::Offload(
        host_.pool(), [&] { return host_.store().SetJobStatus(job_.id, JobStatus::kFailed, now, reason); });
    if (failed.ok()) job_ = *failed;
    ended_ = true;
    {
      auto event_appended = host_.AppendEvent(job_.id, "job_status", {{"status", "failed"}, {"reason", reason}});
      co_await std::move(event_appended);
    }
  }
  launched_.Notify();
  co_return status;
}

http::Awaitable<void> JobRunner::AwaitLaunched() {
  // The timeout only guards against a notification sent between the check and the wait.
  while (engine_ == nullptr && !ended_) co_await launched_.Wait(std::chrono::seconds(1));
}

http::Awaitable<Status> JobRunner::Handle(std::function<StatusOr<Actions>()> event) {
  Status s;
  // Pass 0 handles the event; pass 1, only when a batch with this job's writes failed meanwhile, resyncs at once (as
  // a failed single write did within its event) rather than at the next event or tick.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int64_t> deliver;
    WriteQueue::TicketPtr written;
    {
      co_await mutex_.Lock();
      loop::LoopLock lock(mutex_);
      auto handled = HandleLocked(pass == 0 ? std::move(event) : [] { return StatusOr<Actions>(Actions{}); });
      Status h = co_await std::move(handled);  // kCoAwaitTemporaries: created above
      if (pass == 0) s = h;
      deliver.swap(tasks_to_deliver_);
      if (!outstanding_writes_.empty()) written = outstanding_writes_.back();
    }
    // The job's mutex is free again: while this event's writes wait for their batch, the next events run and queue
    // theirs, which share a commit (group commit). The answer (and a task) goes out only once they are durable.
    if (written) {
      auto applied = WriteQueue::Wait(written);  // kCoAwaitTemporaries
      co_await std::move(applied);
    }
    CollectWriteErrors();
    const Status failed = !write_error_.ok() ? write_error_ : (written ? written->status : Status::Ok());
    if (failed.ok()) {
      loop::LoopSlice slice;  // a round start delivers 10,000 tasks here
      for (int64_t worker : deliver) {
        if (slice.Over()) co_await loop::YieldToLoop();
        DeliverQueuedTask(worker);
      }
      break;
    }
    // The tasks of this pass never go out; the answer is the error.
    if (s.ok()) s = failed;
  }
  co_return s;
}

http::Awaitable<Status> JobRunner::HandleLocked(std::function<StatusOr<Actions>()> event) {
  if (engine_ == nullptr)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " is not running yet");
  CollectWriteErrors();
  if (!write_error_.ok() && !resync_needed_) {
    // A batch with this job's writes failed after its event was answered: the engine is ahead of the store.
    resync_needed_ = true;
    resync_reason_ = write_error_.message();
    resync_after_ = {};
  }
  if (resync_needed_) {
    if (host_.clock().Now() < resync_after_) {
      co_return UnavailableError("training job " + std::to_string(job_.id) +
                                 " is waiting to retry its round after a store error");
    }
    auto resynced = Resync();  // kCoAwaitTemporaries
    Status r = co_await std::move(resynced);
    if (!r.ok()) co_return r;
  }
  StatusOr<Actions> actions = event();
  if (!actions.ok()) co_return actions.status();
  auto execution = Execute(std::move(*actions));
  Status s = co_await std::move(execution);
  if (resync_needed_) {
    // A transient error is usually over by now: retry the round at once rather than at the next tick.
    auto resynced = Resync();  // kCoAwaitTemporaries
    Status r = co_await std::move(resynced);
    if (!r.ok()) PARSYN_LOG_WARN("training job {}: {} (retried on the timer)", job_.id, r.ToString());
  }
  co_return s;
}

WriteQueue::TicketPtr JobRunner::QueueWrites(std::vector<storage::BatchWrite> records,
                                             std::vector<JobHost::QueuedEvent> events) {
  return outstanding_writes_.emplace_back(host_.QueueJobWrites(job_.id, std::move(records), std::move(events)));
}

void JobRunner::CollectWriteErrors() {
  while (!outstanding_writes_.empty() && outstanding_writes_.front()->done) {
    const Status& s = outstanding_writes_.front()->status;
    if (!s.ok() && write_error_.ok()) write_error_ = s;
    outstanding_writes_.pop_front();
  }
}

http::Awaitable<Status> JobRunner::DrainWrites() {
  if (!outstanding_writes_.empty()) {
    // Batches are applied in queue order: once the last ticket is done, so are all before it.
    auto applied = WriteQueue::Wait(outstanding_writes_.back());  // kCoAwaitTemporaries
    co_await std::move(applied);
  }
  CollectWriteErrors();
  co_return write_error_;
}

void JobRunner::DeliverQueuedTask(int64_t worker_id) {
  auto it = undelivered_tasks_.find(worker_id);
  if (it == undelivered_tasks_.end()) return;  // dropped, or its attempt ended, meanwhile
  QueuedTask queued = std::move(it->second);
  undelivered_tasks_.erase(it);
  if (ended_ || engine_ == nullptr || !engine_->TaskOpen(worker_id, queued.task.round, queued.task.attempt)) return;
  ObservePhase("task_store", MillisSince(queued.queued_at));  // until its records were durable
  if (!host_.DeliverTask(worker_id, job_.id, std::move(queued.task))) {
    // The worker left between becoming idle and getting the task: tell the engine.
    boost::asio::co_spawn(host_.executor(), WorkerDisconnected(worker_id), boost::asio::detached);
  }
}

void JobRunner::DeliverDurableTasks() {
  // 10,000 tasks take ~0.4 s to build on one core: their batches are applied meanwhile (the flusher runs between
  // slices), and the first workers start training instead of waiting for the last task.
  CollectWriteErrors();
  if (!write_error_.ok()) return;  // Handle answers with the error; the tasks never go out
  size_t ready = 0;
  for (; ready < tasks_to_deliver_.size(); ++ready) {
    auto it = undelivered_tasks_.find(tasks_to_deliver_[ready]);
    if (it == undelivered_tasks_.end() || !it->second.written) continue;  // dropped meanwhile, or nothing to wait for
    // Batches apply in queue order: the first task still waiting ends the run of durable ones.
    if (!it->second.written->done || !it->second.written->status.ok()) break;
  }
  for (size_t i = 0; i < ready; ++i) DeliverQueuedTask(tasks_to_deliver_[i]);
  tasks_to_deliver_.erase(tasks_to_deliver_.begin(), tasks_to_deliver_.begin() + static_cast<std::ptrdiff_t>(ready));
}

http::Awaitable<Status> JobRunner::Resync() {
  // The workers drop the tasks of the abandoned attempt (undelivered ones are removed, queued ones never go out).
  for (const ParticipantView& p : engine_->participants()) {
    host_.AbandonTask(p.worker, job_.id, p.task_round, p.task_attempt);
  }
  undelivered_tasks_.clear();
  tasks_to_deliver_.clear();
  {
    // The reload reads what the store holds: the writes still queued land first (their errors are why we are here).
    auto drained = DrainWrites();  // kCoAwaitTemporaries
    co_await std::move(drained);
    write_error_ = Status::Ok();
  }
  global_.DropPending();
  auto loading = LoadCheckpoint("a store error during the attempt: " + resync_reason_);  // kCoAwaitTemporaries
  StatusOr<EngineCheckpoint> checkpoint = co_await std::move(loading);
  if (!checkpoint.ok() && checkpoint.status().code() == StatusCode::kDataLoss) {
    // The committed global no longer matches its record: retrying cannot help, and training on it is refused.
    PARSYN_LOG_ERROR("training job {}: {}", job_.id, checkpoint.status().ToString());
    auto ended = OnJobEnded(JobStatus::kFailed, checkpoint.status().message());  // kCoAwaitTemporaries
    Status s = co_await std::move(ended);
    if (!s.ok()) PARSYN_LOG_WARN("training job {}: {}", job_.id, s.ToString());
    co_return checkpoint.status();
  }
  if (!checkpoint.ok()) {
    resync_after_ = host_.clock().Now() + kResyncRetryInterval;
    co_return checkpoint.status().WithContext("reloading the job after a store error");
  }
  resync_needed_ = false;
  PARSYN_LOG_WARN(
      "training job {}: retrying after a store error: resuming after round {} (attempt {} of round {} next)", job_.id,
      checkpoint->last_committed_round, checkpoint->attempts_of_next_round + 1, checkpoint->last_committed_round + 1);
  {
    auto event_appended = host_.AppendEvent(
        job_.id, "job_resumed", {{"committed_round", checkpoint->last_committed_round}, {"reason", resync_reason_}});
    co_await std::move(event_appended);
  }
  engine_ = std::make_unique<RoundEngine>(engine_config_, *aggregator_.strategy(), host_.clock());
  StatusOr<Actions> actions = engine_->Restore(*checkpoint, host_.IdleWorkers(), CarriedForEngine());
  if (!actions.ok()) co_return actions.status();
  auto execution = Execute(std::move(*actions));
  Status s = co_await std::move(execution);
  if (resync_needed_) resync_after_ = host_.clock().Now() + kResyncRetryInterval;
  co_return s;
}

http::Awaitable<Status> JobRunner::Execute(Actions actions) {  // by value: see kCoAwaitTemporaries
  std::deque<Action> work(actions.begin(), actions.end());
  Status first_error;
  // The job's mutex stays held across the yields; only other jobs' and workers' requests run meanwhile.
  loop::LoopSlice slice;
  while (!work.empty()) {
    if (slice.Over()) {
      DeliverDurableTasks();
      co_await loop::YieldToLoop();
    }
    Action action = std::move(work.front());
    work.pop_front();
    Status s = co_await Do(action, work);
    if (!s.ok()) {
      PARSYN_LOG_ERROR("training job {}: {}", job_.id, s.ToString());
      if (first_error.ok()) first_error = s;
      if (!ended_) {
        // The engine has moved on past what the store holds (e.g. a round it committed that the store did not):
        // the rest of its actions would build on that. The attempt is abandoned instead, and the job is reloaded
        // from the store and retries the round (Resync).
        resync_needed_ = true;
        resync_reason_ = s.message();
        break;
      }
      // The job has ended: carry out the rest so memory and store stay as close as possible, and report.
    }
  }
  co_return first_error;
}

http::Awaitable<Status> JobRunner::Do(const Action& action, std::deque<Action>& work) {
  // Order: a write the runner makes directly (a round's start, commit or failure, a loss, the job's end) comes after
  // the job's queued writes (tasks, updates): it waits for them, and does not happen if one of them failed.
  if (!std::holds_alternative<AssignTask>(action) && !std::holds_alternative<ValidateUpdate>(action) &&
      !std::holds_alternative<DropWorker>(action) && !std::holds_alternative<AggregateRound>(action)) {
    auto drained = DrainWrites();  // kCoAwaitTemporaries
    Status s = co_await std::move(drained);
    if (!s.ok()) co_return s;
  }
  if (const auto* a = std::get_if<coordinator::StartRound>(&action)) co_return co_await OnStartRound(*a, work);
  if (const auto* a = std::get_if<AssignTask>(&action)) co_return co_await OnAssignTask(*a, work);
  if (const auto* a = std::get_if<ValidateUpdate>(&action)) co_return co_await OnValidateUpdate(*a, work);
  if (const auto* a = std::get_if<DropWorker>(&action)) co_return co_await OnDropWorker(*a);
  if (const auto* a = std::get_if<AggregateRound>(&action)) co_return co_await OnAggregateRound(*a, work);
  if (const auto* a = std::get_if<GlobalEvaluated>(&action)) co_return co_await OnGlobalEvaluated(*a);
  if (const auto* a = std::get_if<coordinator::CommitRound>(&action)) co_return co_await OnCommitRound(*a);
  if (const auto* a = std::get_if<coordinator::FailRound>(&action)) co_return co_await OnFailRound(*a, work);
  if (const auto* a = std::get_if<JobSucceeded>(&action))
    co_return co_await OnJobEnded(JobStatus::kSucceeded, a->reason);
  if (const auto* a = std::get_if<JobFailed>(&action)) co_return co_await OnJobEnded(JobStatus::kFailed, a->reason);
  if (std::get_if<JobStopped>(&action)) co_return co_await OnJobEnded(JobStatus::kStopped, {});
  if (std::get_if<JobCancelled>(&action)) co_return co_await OnJobEnded(JobStatus::kCancelled, {});
  co_return InternalError("unknown round engine action");
}

http::Awaitable<void> JobRunner::WorkerAvailable(int64_t worker_id, std::function<bool()> still_available) {
  if (ended_) co_return;
  auto handled = Handle([&]() -> StatusOr<Actions> {  // kCoAwaitTemporaries
    if (still_available && !still_available()) return Actions{};
    // Its task of this job is on its way (waiting for its batch): the offer is stale, as if the task had been
    // delivered already.
    if (undelivered_tasks_.contains(worker_id)) return Actions{};
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
  PARSYN_LOG_WARN("training job {}: worker {} reports its task of {} (attempt {}) failed: {}", job_.id, worker_id,
                  protocol::RoundLabel(round, engine_config_.num_rounds), attempt, reason);
  auto handled = Handle([&] { return engine_->TaskFailed(worker_id, round, attempt, reason); });  // kCoAwaitTemporaries
  Status s = co_await std::move(handled);
  if (s.ok()) host_.TaskFinished(worker_id, job_.id);
  co_return s;
}

bool JobRunner::TickDue() const {
  if (ended_ || engine_ == nullptr) return false;
  if (resync_needed_) return resync_after_ <= host_.clock().Now();
  if (!write_error_.ok()) return true;  // a batch failed after its event was answered: resync now
  std::optional<Clock::TimePoint> deadline = engine_->next_deadline();
  if (secure_ && secure_->deadline() && (!deadline || *secure_->deadline() < *deadline)) deadline = secure_->deadline();
  return deadline && *deadline <= host_.clock().Now();
}

http::Awaitable<void> JobRunner::Tick() {
  if (ended_) co_return;
  if (secure_) {  // outside the job's mutex: an aggregation waiting for shares holds it
    secure_->Tick(host_.clock().Now());
    secure_changed_.Notify();
  }
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Tick()); });  // kCoAwaitTemporaries
  Status s = co_await std::move(handled);
  if (!s.ok()) PARSYN_LOG_WARN("training job {}: timer: {}", job_.id, s.ToString());
}

http::Awaitable<Status> JobRunner::Stop() {
  co_await AwaitLaunched();
  if (ended_)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has already ended (" +
                                      std::string(storage::ToString(job_.status)) + ")");
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Stop()); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

http::Awaitable<Status> JobRunner::Cancel() {
  co_await AwaitLaunched();
  if (ended_)
    co_return FailedPreconditionError("training job " + std::to_string(job_.id) + " has already ended (" +
                                      std::string(storage::ToString(job_.status)) + ")");
  auto handled = Handle([&] { return StatusOr<Actions>(engine_->Cancel()); });  // kCoAwaitTemporaries
  co_return co_await std::move(handled);
}

void JobRunner::RecordProgress(int64_t worker_id, const json& progress) {
  attempt_.RecordProgress(worker_id, progress);
}

json JobRunner::LiveView() const {
  if (engine_ == nullptr) return json::object();
  json view = LivePhase();
  view["committed_round"] = job_.committed_round;  // as stored (the engine may be ahead until Resync)
  view["total_rounds"] = engine_config_.num_rounds;
  view["workers"] = ParticipantsJson(engine_->participants(), attempt_.progress());
  // A store write failed (a full disk, say): until the retry gets through, nothing can be recorded, so the live
  // view is where the reason shows ("disk full: <path>, free space and the job resumes").
  if (resync_needed_) view["store_error"] = resync_reason_;
  return view;
}

json JobRunner::LiveSummary() const {
  if (engine_ == nullptr) return json::object();
  json summary = LivePhase();
  summary.erase("attempt");
  summary["active_workers"] = engine_->ParticipantsNotDropped();
  return summary;
}

json JobRunner::LivePhase() const {
  json view = {{"phase", JobPhaseName(engine_->phase())}, {"round", engine_->round()}, {"attempt", engine_->attempt()}};
  // The engine runs the final evaluation as "round" num_rounds + 1; it belongs to the job's end, not to its rounds,
  // so the view names it and shows no round number above total_rounds (nor while the job's end is being recorded).
  if (engine_->round() > engine_config_.num_rounds) {
    if (engine_->phase() == JobPhase::kEvaluating) view["phase"] = "final_evaluation";
    view.erase("round");
    view.erase("attempt");
  }
  return view;
}

}  // namespace parsyn::coordinator
