// RoundEngine's inputs (round_engine.h): workers coming and going, task and result reports, the aggregation's outcome,
// the tick that enforces the deadlines, stop and cancel. The round's own steps (assign, complete, commit, fail, end)
// are in round_engine.cc.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "coordinator/round_engine.h"

namespace parsyn::coordinator {
namespace {

std::string Seconds(Clock::Duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

Actions RoundEngine::WorkerAvailable(WorkerId worker) {
  Actions out;
  if (IsTerminal(phase_) || !CanTakePart(worker)) return out;
  if (Participant* p = FindParticipant(worker); p != nullptr && p->state == ParticipantState::kTraining) {
    Drop(*p, DropCause::kAbandoned, "the worker asked for a new task before reporting " + AttemptName(), out);
    SetPresence(worker, Presence::kIdle);
    CheckRoundComplete(out);
  } else {
    SetPresence(worker, Presence::kIdle);
  }
  ShardOf(worker);  // binds a slot in arrival order (slot mode), even when it cannot take part yet
  if (config_.async && phase_ == JobPhase::kTraining) {
    CheckRoundComplete(out);  // a task for it, or (all left idle having had one) the version's next attempt
  } else if (phase_ != JobPhase::kNotStarted) {
    TryAssign(out);
  }
  return out;
}

Actions RoundEngine::WorkerDisconnected(WorkerId worker) {
  Actions out;
  if (IsTerminal(phase_) || !IsEligible(worker)) return out;
  SetPresence(worker, Presence::kOffline);
  // An uploaded update (being validated, or accepted) still counts: only a result not yet received is lost.
  if (Participant* p = FindParticipant(worker); p != nullptr && p->state == ParticipantState::kTraining) {
    Drop(*p, DropCause::kDisconnected, "the worker disconnected during " + AttemptName(), out);
    CheckRoundComplete(out);
  }
  return out;
}

StatusOr<Actions> RoundEngine::TaskFailed(WorkerId worker, int round, int attempt, std::string_view reason) {
  if (config_.async && phase_ == JobPhase::kTraining) {
    Participant* p = FindParticipant(worker);
    if (!TaskOpen(worker, round, attempt)) {
      return FailedPreconditionError("worker " + std::to_string(worker) + " has no task of round " +
                                     std::to_string(round) + " attempt " + std::to_string(attempt) + " in training");
    }
    Actions out;
    Drop(*p, DropCause::kTaskFailed, std::string(reason), out);
    CheckRoundComplete(out);
    return out;
  }
  if (phase_ == JobPhase::kNotStarted || IsTerminal(phase_) || phase_ == JobPhase::kWaitingToRetry || round != round_ ||
      attempt != attempt_) {
    return FailedPreconditionError("failure report for round " + std::to_string(round) + " attempt " +
                                   std::to_string(attempt) + " ignored: the job is at " + AttemptName());
  }
  Participant* p = FindParticipant(worker);
  if (p == nullptr || p->state != ParticipantState::kTraining) {
    return FailedPreconditionError("worker " + std::to_string(worker) + " has no task in training in " + AttemptName());
  }
  Actions out;
  Drop(*p, DropCause::kTaskFailed, std::string(reason), out);
  CheckRoundComplete(out);
  return out;
}

StatusOr<bool> RoundEngine::ExpectsResult(WorkerId worker, int round, int attempt) const {
  if (phase_ == JobPhase::kNotStarted || IsTerminal(phase_)) {
    return FailedPreconditionError("the job is " + std::string(JobPhaseName(phase_)) + "; result for round " +
                                   std::to_string(round) + " attempt " + std::to_string(attempt) + " refused");
  }
  if (config_.async && phase_ != JobPhase::kEvaluating) {
    const Participant* p = FindParticipant(worker);
    PARSYN_RETURN_IF_ERROR(CheckAsyncResult(p, worker, round, attempt));
    if (phase_ != JobPhase::kTraining) {
      return FailedPreconditionError("result for round " + std::to_string(round) + " refused: the job is " +
                                     std::string(JobPhaseName(phase_)) + "; report it again");
    }
    return p->state == ParticipantState::kTraining;  // otherwise a repeat: the first report stands
  }
  if (round != round_ || attempt != attempt_) {
    return FailedPreconditionError("result for round " + std::to_string(round) + " attempt " + std::to_string(attempt) +
                                   " refused: the job is at " + AttemptName());
  }
  if (phase_ == JobPhase::kWaitingToRetry) {
    return FailedPreconditionError("result for " + AttemptName() + " refused: that attempt failed");
  }
  const Participant* p = FindParticipant(worker);
  if (p == nullptr)
    return FailedPreconditionError("worker " + std::to_string(worker) + " has no task in " + AttemptName());
  switch (p->state) {
    case ParticipantState::kDropped:
      return FailedPreconditionError("worker " + std::to_string(worker) + " was dropped from " + AttemptName() + ": " +
                                     p->reason);
    case ParticipantState::kValidating:
    case ParticipantState::kAccepted:
    case ParticipantState::kRejected: return false;  // a repeat (e.g. a retried request): the first report stands
    case ParticipantState::kTraining: break;
  }
  return true;
}

StatusOr<Actions> RoundEngine::ResultUploaded(const WorkerResult& r) {
  StatusOr<bool> expected = ExpectsResult(r.worker, r.round, r.attempt);
  if (!expected.ok()) return expected.status();
  if (!*expected) return Actions{};
  Participant* p = FindParticipant(r.worker);

  Actions out;
  p->validation_samples = r.validation_samples > 0 && std::isfinite(r.validation_loss) ? r.validation_samples : 0;
  p->validation_loss = p->validation_samples > 0 ? r.validation_loss : 0.0;
  if (phase_ == JobPhase::kEvaluating) {
    SetState(*p, ParticipantState::kAccepted);
    CheckRoundComplete(out);
    return out;
  }

  std::string problem;
  const size_t shard = static_cast<size_t>(p->shard);
  if (r.sample_count <= 0) {
    problem = "sample count " + std::to_string(r.sample_count) + " is not positive";
  } else if (shard < config_.shard_train_rows.size() && r.sample_count > config_.shard_train_rows[shard]) {
    problem = "sample count " + std::to_string(r.sample_count) + " exceeds the " +
              std::to_string(config_.shard_train_rows[shard]) + " training rows of shard " + std::to_string(p->shard);
  } else if (config_.max_samples_per_worker > 0 && r.sample_count > config_.max_samples_per_worker) {
    problem = "sample count " + std::to_string(r.sample_count) + " exceeds the job's data.max_samples_per_worker (" +
              std::to_string(config_.max_samples_per_worker) + ")";
  } else if (!std::isfinite(r.train_loss)) {
    problem = "training loss is not finite";
  }
  if (!problem.empty()) {
    Drop(*p, DropCause::kRejected, "result rejected: " + problem, out);
    CheckRoundComplete(out);
    return out;
  }
  SetState(*p, ParticipantState::kValidating);
  p->sample_count = r.sample_count;
  p->train_loss = r.train_loss;
  out.push_back(ValidateUpdate{.worker = r.worker,
                               .round = round_,
                               .attempt = attempt_,
                               .shard = p->shard,
                               .sample_count = r.sample_count,
                               .trained_on_round = p->task_round - 1,
                               .staleness = round_ - p->task_round,
                               .task_round = p->task_round,
                               .task_attempt = p->task_attempt});
  return out;
}

StatusOr<Actions> RoundEngine::UpdateValidated(WorkerId worker, int round, int attempt, const Status& verdict) {
  Participant* p =
      (phase_ == JobPhase::kTraining && round == round_ && attempt == attempt_) ? FindParticipant(worker) : nullptr;
  if (p == nullptr || p->state != ParticipantState::kValidating) {
    return FailedPreconditionError("no validation is pending for worker " + std::to_string(worker) + " in round " +
                                   std::to_string(round) + " attempt " + std::to_string(attempt));
  }
  Actions out;
  if (verdict.ok()) {
    SetState(*p, ParticipantState::kAccepted);
    p->accepted_order = ++accepted_updates_;
  } else {
    Drop(*p, DropCause::kRejected, "update rejected: " + verdict.message(), out);
  }
  CheckRoundComplete(out);
  return out;
}

StatusOr<Actions> RoundEngine::AggregationFinished(int round, int attempt, const Status& outcome) {
  if (phase_ != JobPhase::kAggregating || round != round_ || attempt != attempt_) {
    return FailedPreconditionError("no aggregation is pending for round " + std::to_string(round) + " attempt " +
                                   std::to_string(attempt));
  }
  Actions out;
  if (outcome.ok()) {
    Commit(out);
  } else {
    FailAttempt(AttemptName() + ": aggregation failed: " + outcome.message(), out);
  }
  return out;
}

Actions RoundEngine::Tick() {
  Actions out;
  const std::optional<Clock::TimePoint> due = next_deadline();
  if (!due || clock_.Now() < *due) return out;
  if (phase_ == JobPhase::kWaitingToRetry) {
    BeginAttempt(out);
    return out;
  }
  if (config_.async && phase_ == JobPhase::kTraining) {
    DropOverdueTasks(out);
    CheckRoundComplete(out);  // gives the freed slots to idle workers
    return out;
  }
  if (phase_ == JobPhase::kWaitingForWorkers && clock_.Now() < deadline_) {
    TryAssign(out);  // the join window passed: start with the idle workers
    return out;
  }
  if (phase_ == JobPhase::kWaitingForWorkers) {
    FailAttempt(AttemptName() + ": fewer than min_workers (" + std::to_string(config_.min_workers) +
                    ") eligible workers were available within aggregation_timeout (" +
                    Seconds(config_.aggregation_timeout) + ")",
                out);
    return out;
  }
  if (phase_ == JobPhase::kEvaluating && participants_.empty() && clock_.Now() < deadline_) {
    TryAssign(out);  // the join window passed: evaluate with the idle workers
    return out;
  }
  if (phase_ == JobPhase::kEvaluating && participants_.empty()) {
    FinishEvaluation(out);  // no worker came to evaluate: the job's rounds are all committed regardless
    return out;
  }
  for (Participant& p : participants_) {
    if (p.state == ParticipantState::kTraining) {
      Drop(p, DropCause::kStraggler,
           "no result within aggregation_timeout (" + Seconds(config_.aggregation_timeout) + ")", out);
    }
  }
  CheckRoundComplete(out);
  return out;
}

Actions RoundEngine::Stop() {
  Actions out;
  if (IsTerminal(phase_)) return out;
  if (phase_ == JobPhase::kAggregating) {
    stop_requested_ = true;  // commit the round being aggregated, then stop
    return out;
  }
  EndJob(JobPhase::kStopped, out);
  return out;
}

Actions RoundEngine::Cancel() {
  Actions out;
  if (!IsTerminal(phase_)) EndJob(JobPhase::kCancelled, out);
  return out;
}

std::optional<Clock::TimePoint> RoundEngine::next_deadline() const {
  switch (phase_) {
    case JobPhase::kWaitingForWorkers: return join_deadline_ ? std::min(deadline_, *join_deadline_) : deadline_;
    case JobPhase::kWaitingToRetry: return deadline_;
    case JobPhase::kTraining:
      if (config_.async) return NextTaskDeadline();
      [[fallthrough]];
    case JobPhase::kEvaluating: {
      if (participants_.empty()) return join_deadline_ ? std::min(deadline_, *join_deadline_) : deadline_;
      if (training_participants_ > 0) return deadline_;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::vector<ParticipantView> RoundEngine::participants() const {
  std::vector<ParticipantView> out;
  for (const Participant& p : participants_) {
    out.push_back({.worker = p.worker,
                   .shard = p.shard,
                   .state = p.state,
                   .reason = p.reason,
                   .task_round = p.task_round,
                   .task_attempt = p.task_attempt});
  }
  return out;
}

int RoundEngine::ParticipantsNotDropped() const {
  return static_cast<int>(std::count_if(participants_.begin(), participants_.end(),
                                        [](const Participant& p) { return p.state != ParticipantState::kDropped; }));
}

}  // namespace parsyn::coordinator
