// RoundEngine's asynchronous rounds (round_engine.h, "Asynchronous rounds"): versions built from a buffer of updates,
// tasks that outlive the version they started on, and each task's own deadline.
#include <algorithm>
#include <cstdio>
#include <string>

#include "coordinator/round_engine.h"
#include "strategy/seed.h"

namespace parsyn::coordinator {

void RoundEngine::BeginVersion(Actions& out, std::span<const CarriedUpdate> carried) {
  // Tasks in training stay (their results may join this version); the rest of the last version's entries go.
  std::vector<Participant> kept;
  for (Participant& p : participants_) {
    if (p.state == ParticipantState::kTraining || p.state == ParticipantState::kValidating)
      kept.push_back(std::move(p));
  }
  participants_ = std::move(kept);
  participant_index_.clear();
  for (size_t i = 0; i < participants_.size(); ++i) participant_index_.emplace(participants_[i].worker, i);
  join_deadline_.reset();
  phase_ = JobPhase::kTraining;
  out.push_back(StartRound{.round = round_, .attempt = attempt_});
  for (const CarriedUpdate& c : carried) {
    if (FindParticipant(c.worker) != nullptr) continue;  // one update per worker per version
    participant_index_.emplace(c.worker, participants_.size());
    Participant& p = participants_.emplace_back();
    p.worker = c.worker;
    p.shard = checkpoint_.shards.at(c.worker);
    p.state = ParticipantState::kDropped;
    SetState(p, ParticipantState::kValidating);
    p.sample_count = c.sample_count;
    p.train_loss = c.train_loss;
    p.task_round = c.task_round;
    p.task_attempt = c.task_attempt;
    out.push_back(ValidateUpdate{.worker = c.worker,
                                 .round = round_,
                                 .attempt = attempt_,
                                 .shard = p.shard,
                                 .sample_count = c.sample_count,
                                 .trained_on_round = c.task_round - 1,
                                 .staleness = round_ - c.task_round,
                                 .task_round = c.task_round,
                                 .task_attempt = c.task_attempt});
  }
  TryAssignAsync(out);
}

void RoundEngine::TryAssignAsync(Actions& out) {
  if (phase_ != JobPhase::kTraining || stop_requested_) return;
  int free = config_.async->max_concurrency - training_participants_;
  if (free <= 0 || idle_bound_workers_ == 0) return;
  const Clock::TimePoint now = clock_.Now();
  for (const auto& [worker, presence] : presence_) {
    if (free == 0) break;
    if (presence != Presence::kIdle || !CanTakePart(worker)) continue;
    // One task and one update per worker per version (the version's folder holds the task's upload, its records the
    // update's verdict): a worker that had a task of this version, or an update judged in it, takes its next task in
    // the next version. One whose task of an earlier version was dropped here may train again at once.
    Participant* p = FindParticipant(worker);
    if (p != nullptr &&
        (p->state != ParticipantState::kDropped || (p->task_round == round_ && p->task_attempt == attempt_))) {
      continue;
    }
    const std::optional<int> shard = ShardOf(worker);
    if (!shard) continue;
    if (p == nullptr) {
      participant_index_.emplace(worker, participants_.size());
      p = &participants_.emplace_back();
      p->state = ParticipantState::kDropped;  // SetState counts it as it becomes kTraining
    }
    *p = Participant{.worker = worker, .shard = *shard, .state = p->state};
    SetState(*p, ParticipantState::kTraining);
    p->task_round = round_;
    p->task_attempt = attempt_;
    p->task_deadline = now + config_.aggregation_timeout;
    SetPresence(worker, Presence::kBusy);
    out.push_back(AssignTask{.worker = worker,
                             .round = round_,
                             .attempt = attempt_,
                             .shard = *shard,
                             .seed = strategy::TaskSeed(config_.job_seed, round_, *shard),
                             .kind = TaskKind::kTrain});
    --free;
  }
}

void RoundEngine::CheckBufferFull(Actions& out) {
  if (phase_ != JobPhase::kTraining) return;
  std::vector<const Participant*> accepted;
  for (const Participant& p : participants_) {
    if (p.state == ParticipantState::kAccepted) accepted.push_back(&p);
  }
  if (static_cast<int>(accepted.size()) < config_.async->buffer_size) {
    TryAssignAsync(out);  // a slot may have come free
    if (open_participants_ > 0) return;
    // Nothing trains and no idle worker may take a task of this version: those left gave it an update that was
    // rejected or a task that failed. A new attempt lets every worker train again (the buffer is lost).
    for (const Participant& p : participants_) {
      if (p.state != ParticipantState::kAccepted && presence_.at(p.worker) == Presence::kIdle) {
        FailAttempt(AttemptName() + ": " + std::to_string(accepted.size()) + " of the buffer's " +
                        std::to_string(config_.async->buffer_size) +
                        " updates were accepted, and the idle workers left have had a task of this version already "
                        "(its update rejected, or the task failed or was dropped); starting the version again",
                    out);
        return;
      }
    }
    return;
  }
  std::sort(accepted.begin(), accepted.end(),
            [](const Participant* a, const Participant* b) { return a->accepted_order < b->accepted_order; });
  PushAggregate(accepted, out);
}

void RoundEngine::DropOverdueTasks(Actions& out) {
  const Clock::TimePoint now = clock_.Now();
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g s", std::chrono::duration<double>(config_.aggregation_timeout).count());
  for (Participant& p : participants_) {
    if (p.state == ParticipantState::kTraining && p.task_deadline <= now) {
      Drop(p, DropCause::kStraggler, std::string("no result within aggregation_timeout (") + timeout + ") of its task",
           out);
    }
  }
}

std::optional<Clock::TimePoint> RoundEngine::NextTaskDeadline() const {
  std::optional<Clock::TimePoint> next;
  for (const Participant& p : participants_) {
    if (p.state == ParticipantState::kTraining && (!next || p.task_deadline < *next)) next = p.task_deadline;
  }
  return next;
}

Status RoundEngine::CheckAsyncResult(const Participant* p, WorkerId worker, int round, int attempt) const {
  const std::string task = "round " + std::to_string(round) + " attempt " + std::to_string(attempt);
  if (p == nullptr || p->task_round != round || p->task_attempt != attempt) {
    return FailedPreconditionError("result for " + task + " refused: worker " + std::to_string(worker) +
                                   " has no such task in training (the job is building version " +
                                   std::to_string(round_) + ", " + AttemptName() + ")");
  }
  if (p->state == ParticipantState::kDropped) {
    return FailedPreconditionError("worker " + std::to_string(worker) + " was dropped from " + task + ": " + p->reason);
  }
  if (p->state == ParticipantState::kTraining && Staleness(*p) > config_.async->max_staleness) {
    return FailedPreconditionError("result for " + task + " refused: its update trained on version " +
                                   std::to_string(round - 1) + ", " + std::to_string(Staleness(*p)) +
                                   " versions before the latest (" + std::to_string(round_ - 1) +
                                   "), past distributed.async.max_staleness (" +
                                   std::to_string(config_.async->max_staleness) + "); take new work");
  }
  return Status::Ok();
}

bool RoundEngine::TaskOpen(WorkerId worker, int round, int attempt) const {
  const Participant* p = FindParticipant(worker);
  return p != nullptr && p->state == ParticipantState::kTraining && p->task_round == round &&
         p->task_attempt == attempt;
}

}  // namespace parsyn::coordinator
