#include "coordinator/round_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

namespace parsyn::coordinator {

RoundEngine::RoundEngine(RoundEngineConfig config, const strategy::Strategy& strategy, const Clock& clock)
    : config_(std::move(config)), strategy_(strategy), clock_(clock) {
  for (size_t i = 0; i < config_.eligible_workers.size(); ++i) {
    eligible_position_.emplace(config_.eligible_workers[i], static_cast<int>(i));
  }
  unseen_selected_workers_ = static_cast<int>(eligible_position_.size());
  RecountFromCheckpoint();
}

void RoundEngine::RecountFromCheckpoint() {
  slot_taken_.assign(static_cast<size_t>(std::max(0, config_.num_shards)), 0);
  for (const auto& [worker, shard] : checkpoint_.shards) {
    if (shard >= 0 && shard < config_.num_shards) slot_taken_[static_cast<size_t>(shard)] = 1;
  }
  first_free_slot_ = 0;
  idle_bound_workers_ = 0;
  busy_bound_workers_ = 0;
  for (const auto& [worker, presence] : presence_) CountPresence(worker, presence, +1);
}

void RoundEngine::CountPresence(WorkerId worker, Presence presence, int delta) {
  if (presence == Presence::kOffline || checkpoint_.shards.count(worker) == 0) return;
  (presence == Presence::kIdle ? idle_bound_workers_ : busy_bound_workers_) += delta;
}

void RoundEngine::SetPresence(WorkerId worker, Presence presence) {
  auto [it, inserted] = presence_.try_emplace(worker, Presence::kOffline);
  if (inserted && eligible_position_.count(worker) > 0) --unseen_selected_workers_;
  CountPresence(worker, it->second, -1);
  it->second = presence;
  CountPresence(worker, presence, +1);
}

void RoundEngine::SetState(Participant& p, ParticipantState state) {
  auto open = [](ParticipantState s) { return s == ParticipantState::kTraining || s == ParticipantState::kValidating; };
  open_participants_ += static_cast<int>(open(state)) - static_cast<int>(open(p.state));
  training_participants_ +=
      static_cast<int>(state == ParticipantState::kTraining) - static_cast<int>(p.state == ParticipantState::kTraining);
  p.state = state;
}

Status RoundEngine::CheckConfig() const {
  const RoundEngineConfig& c = config_;
  if (c.num_rounds < 1) return InvalidArgumentError("num_rounds must be >= 1, got " + std::to_string(c.num_rounds));
  if (c.min_workers < 1 || c.min_workers > c.max_workers) {
    return InvalidArgumentError("need 1 <= min_workers <= max_workers, got " + std::to_string(c.min_workers) + " and " +
                                std::to_string(c.max_workers));
  }
  if (c.aggregation_timeout.count() <= 0) return InvalidArgumentError("aggregation_timeout must be positive");
  if (c.join_window.count() < 0 || c.retry_backoff.count() < 0) {
    return InvalidArgumentError("join_window and retry_backoff must not be negative");
  }
  if (c.fault_tolerance < 1)
    return InvalidArgumentError("fault_tolerance must be >= 1, got " + std::to_string(c.fault_tolerance));
  if (c.num_shards < c.min_workers) {
    return InvalidArgumentError("min_workers (" + std::to_string(c.min_workers) + ") exceeds the number of shards (" +
                                std::to_string(c.num_shards) + ")");
  }
  if (!c.eligible_workers.empty() && c.num_shards > static_cast<int>(c.eligible_workers.size())) {
    return InvalidArgumentError("the " + std::to_string(c.num_shards) + " shards exceed the " +
                                std::to_string(c.eligible_workers.size()) +
                                " eligible workers: some data would never be trained");
  }
  if (std::set<WorkerId>(c.eligible_workers.begin(), c.eligible_workers.end()).size() != c.eligible_workers.size()) {
    return InvalidArgumentError("eligible_workers lists a worker twice");
  }
  if (c.workers_hold_data && (!c.worker_has_data || c.max_samples_per_worker < 1 || !c.shard_train_rows.empty())) {
    return InvalidArgumentError(
        "workers_hold_data needs worker_has_data, max_samples_per_worker >= 1 and no shard_train_rows");
  }
  if (c.async &&
      (c.async->buffer_size < 1 || c.async->max_concurrency < c.async->buffer_size || c.async->max_staleness < 0)) {
    return InvalidArgumentError("async needs 1 <= buffer_size <= max_concurrency and max_staleness >= 0");
  }
  if (!c.shard_train_rows.empty() && c.shard_train_rows.size() != static_cast<size_t>(c.num_shards)) {
    return InvalidArgumentError("shard_train_rows has " + std::to_string(c.shard_train_rows.size()) + " entries for " +
                                std::to_string(c.num_shards) + " shards");
  }
  return Status::Ok();
}

StatusOr<Actions> RoundEngine::Start(std::span<const WorkerId> idle_workers) {
  return Restore(EngineCheckpoint{}, idle_workers);
}

StatusOr<Actions> RoundEngine::Restore(const EngineCheckpoint& checkpoint, std::span<const WorkerId> idle_workers,
                                       std::span<const CarriedUpdate> carried) {
  if (phase_ != JobPhase::kNotStarted) return FailedPreconditionError("the round engine has already started");
  PARSYN_RETURN_IF_ERROR(CheckConfig());
  const EngineCheckpoint& cp = checkpoint;
  if (cp.last_committed_round < 0 || cp.last_committed_round > config_.num_rounds) {
    return InvalidArgumentError("checkpoint's last committed round " + std::to_string(cp.last_committed_round) +
                                " is outside 0.." + std::to_string(config_.num_rounds));
  }
  if (cp.attempts_of_next_round < 0) return InvalidArgumentError("checkpoint's attempt count is negative");
  if (cp.evaluations_without_improvement < 0 || cp.best_global_round < 0 ||
      cp.best_global_round > cp.last_committed_round) {
    return InvalidArgumentError("checkpoint's early-stopping state does not fit its committed rounds");
  }
  if (cp.consecutive_failed_rounds < 0 || cp.consecutive_failed_rounds >= config_.fault_tolerance) {
    return InvalidArgumentError("checkpoint's " + std::to_string(cp.consecutive_failed_rounds) +
                                " consecutive failed rounds do not fit fault_tolerance " +
                                std::to_string(config_.fault_tolerance) + " of a running job");
  }
  std::set<int> bound;
  for (const auto& [worker, shard] : cp.shards) {
    if (shard < 0 || shard >= config_.num_shards || !bound.insert(shard).second || !IsEligible(worker)) {
      return InvalidArgumentError("checkpoint binds worker " + std::to_string(worker) + " to shard " +
                                  std::to_string(shard) + ", which the job's configuration does not allow");
    }
  }
  for (const CarriedUpdate& c : carried) {
    if (!config_.async || !cp.shards.contains(c.worker) || c.task_round < 1 ||
        c.task_round > cp.last_committed_round + 1) {
      return InvalidArgumentError("an update of worker " + std::to_string(c.worker) + " (round " +
                                  std::to_string(c.task_round) + ") cannot be carried into this job's next version");
    }
  }
  checkpoint_ = cp;
  RecountFromCheckpoint();
  for (WorkerId w : idle_workers) {
    if (!CanTakePart(w)) continue;
    SetPresence(w, Presence::kIdle);
    ShardOf(w);  // binds a slot in arrival order
  }
  // Workers that said they were available before the start follow, by id (the checkpoint replaced their bindings).
  for (const auto& [w, presence] : presence_) {
    if (presence == Presence::kIdle) ShardOf(w);
  }
  Actions out;
  if (!carried.empty() && !EarlyStopReached(checkpoint_, config_) && cp.last_committed_round < config_.num_rounds) {
    round_ = checkpoint_.last_committed_round + 1;
    attempt_ = ++checkpoint_.attempts_of_next_round;
    BeginVersion(out, carried);
    return out;
  }
  BeginAttempt(out);
  return out;
}

bool RoundEngine::IsEligible(WorkerId worker) const {
  return config_.eligible_workers.empty() || eligible_position_.count(worker) > 0;
}

bool RoundEngine::CanTakePart(WorkerId worker) const {
  return IsEligible(worker) && (!config_.workers_hold_data || config_.worker_has_data(worker)) &&
         (!config_.worker_offers_trainer || config_.worker_offers_trainer(worker));
}

std::optional<int> RoundEngine::ShardOf(WorkerId worker) {
  if (auto it = checkpoint_.shards.find(worker); it != checkpoint_.shards.end()) return it->second;
  if (!IsEligible(worker)) return std::nullopt;
  int shard = -1;
  if (static_cast<int>(config_.eligible_workers.size()) == config_.num_shards) {
    // One shard per listed worker, by position: the same worker trains the same rows however workers arrive.
    shard = eligible_position_.at(worker);
  } else {
    // Slots, first come first served; a worker keeps its slot for the job (also while it is offline).
    while (first_free_slot_ < config_.num_shards && slot_taken_[static_cast<size_t>(first_free_slot_)]) {
      ++first_free_slot_;
    }
    if (first_free_slot_ >= config_.num_shards) return std::nullopt;
    shard = first_free_slot_;
  }
  if (shard < static_cast<int>(slot_taken_.size())) slot_taken_[static_cast<size_t>(shard)] = 1;
  checkpoint_.shards[worker] = shard;
  if (auto it = presence_.find(worker); it != presence_.end()) CountPresence(worker, it->second, +1);
  return shard;
}

RoundEngine::Participant* RoundEngine::FindParticipant(WorkerId worker) {
  return const_cast<Participant*>(std::as_const(*this).FindParticipant(worker));
}

const RoundEngine::Participant* RoundEngine::FindParticipant(WorkerId worker) const {
  auto it = participant_index_.find(worker);
  return it == participant_index_.end() ? nullptr : &participants_[it->second];
}

std::string RoundEngine::AttemptName() const {
  if (round_ > config_.num_rounds) return "the final evaluation (attempt " + std::to_string(attempt_) + ")";
  return "round " + std::to_string(round_) + " attempt " + std::to_string(attempt_);
}

void RoundEngine::BeginAttempt(Actions& out) {
  // The final evaluation keeps the number num_rounds + 1 also after an early stop: a task's round says which it is.
  round_ = EarlyStopReached(checkpoint_, config_) ? config_.num_rounds + 1 : checkpoint_.last_committed_round + 1;
  attempt_ = ++checkpoint_.attempts_of_next_round;
  if (config_.async && round_ <= config_.num_rounds) {
    BeginVersion(out);
    return;
  }
  participants_.clear();
  participant_index_.clear();
  open_participants_ = 0;
  training_participants_ = 0;
  join_deadline_.reset();
  deadline_ = clock_.Now() + config_.aggregation_timeout;
  if (round_ > config_.num_rounds) {
    phase_ = JobPhase::kEvaluating;
  } else {
    phase_ = JobPhase::kWaitingForWorkers;
    out.push_back(StartRound{.round = round_, .attempt = attempt_});
  }
  TryAssign(out);
}

void RoundEngine::TryAssign(Actions& out) {
  if (config_.async && phase_ == JobPhase::kTraining) {
    TryAssignAsync(out);
    return;
  }
  const bool evaluating = phase_ == JobPhase::kEvaluating;
  if (!(phase_ == JobPhase::kWaitingForWorkers || (evaluating && participants_.empty()))) return;

  // The final evaluation waits for the workers as a round does (its loss is then measured on the same validation
  // slices as the globals before it), but is best effort: one worker will do. Decided from the counts first: this
  // runs on every worker's arrival, and only the last arrival pays for listing the candidates.
  if (!ReadyToAssign(idle_bound_workers_, evaluating ? 1 : config_.min_workers)) return;
  std::vector<strategy::Candidate> candidates;  // by worker id, as presence_ is ordered
  for (const auto& [worker, presence] : presence_) {
    if (presence != Presence::kIdle) continue;
    if (std::optional<int> shard = ShardOf(worker)) candidates.push_back({.worker_id = worker, .shard = *shard});
  }
  const strategy::RoundContext ctx{.job_seed = config_.job_seed,
                                   .round = round_,
                                   .min_workers = evaluating ? 1 : config_.min_workers,
                                   .max_workers = config_.max_workers,
                                   .sampling = evaluating ? strategy::Sampling{} : config_.sampling};
  const std::vector<strategy::ParticipantConfig> chosen = strategy_.ConfigureRound(ctx, candidates);
  if (chosen.empty()) return;

  for (const strategy::ParticipantConfig& c : chosen) {
    auto k = std::lower_bound(
        candidates.begin(), candidates.end(), c.worker_id,
        [](const strategy::Candidate& candidate, WorkerId worker) { return candidate.worker_id < worker; });
    const bool is_candidate = k != candidates.end() && k->worker_id == c.worker_id && k->shard == c.shard;
    if (!is_candidate || FindParticipant(c.worker_id) != nullptr) continue;  // a strategy bug; never assign twice
    participant_index_.emplace(c.worker_id, participants_.size());
    Participant& p = participants_.emplace_back();
    p.worker = c.worker_id;
    p.shard = c.shard;
    p.task_round = round_;
    p.task_attempt = attempt_;
    ++open_participants_;  // a new participant is kTraining
    ++training_participants_;
    SetPresence(c.worker_id, Presence::kBusy);
    out.push_back(AssignTask{.worker = c.worker_id,
                             .round = round_,
                             .attempt = attempt_,
                             .shard = c.shard,
                             .seed = c.seed,
                             .kind = evaluating ? TaskKind::kEvaluate : TaskKind::kTrain});
  }
  if (participants_.empty()) return;
  if (!evaluating) phase_ = JobPhase::kTraining;
}

bool RoundEngine::ReadyToAssign(int idle_candidates, int needed) {
  if (idle_candidates < needed) return false;
  if (idle_candidates >= config_.max_workers) return true;
  // Selected workers that are online but busy: they hold a shard and have not said they are idle (the last
  // reporters of the previous round, typically, a moment before they poll again); and listed workers this engine has
  // not heard from yet (one saying hello a moment after the job was created, or after a coordinator restart).
  if (busy_bound_workers_ == 0 && unseen_selected_workers_ == 0) return true;
  const Clock::TimePoint now = clock_.Now();
  if (!join_deadline_) join_deadline_ = now + config_.join_window;
  return now >= *join_deadline_;
}

void RoundEngine::Drop(Participant& p, DropCause cause, std::string reason, Actions& out) {
  SetState(p, cause == DropCause::kRejected ? ParticipantState::kRejected : ParticipantState::kDropped);
  p.reason = reason;
  out.push_back(DropWorker{.worker = p.worker,
                           .round = round_,
                           .attempt = attempt_,
                           .cause = cause,
                           .reason = std::move(reason),
                           .task_round = p.task_round,
                           .task_attempt = p.task_attempt});
}

void RoundEngine::PushAggregate(const std::vector<const Participant*>& accepted, Actions& out) {
  AggregateRound aggregate;
  aggregate.round = round_;
  aggregate.attempt = attempt_;
  double loss_sum = 0;
  int64_t samples = 0;
  for (const Participant* p : accepted) {
    aggregate.updates.push_back({.worker = p->worker,
                                 .shard = p->shard,
                                 .sample_count = p->sample_count,
                                 .train_loss = p->train_loss,
                                 .trained_on_round = p->task_round - 1,
                                 .staleness = round_ - p->task_round});
    loss_sum += static_cast<double>(p->sample_count) * p->train_loss;
    samples += p->sample_count;
  }
  aggregate.train_loss = samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0;
  phase_ = JobPhase::kAggregating;
  out.push_back(std::move(aggregate));
}

void RoundEngine::CheckRoundComplete(Actions& out) {
  if (config_.async && phase_ == JobPhase::kTraining) {
    CheckBufferFull(out);
    return;
  }
  if (phase_ != JobPhase::kTraining && !(phase_ == JobPhase::kEvaluating && !participants_.empty())) return;
  if (open_participants_ > 0) return;
  int accepted = 0;
  for (const Participant& p : participants_) {
    if (p.state == ParticipantState::kAccepted) ++accepted;
  }
  if (phase_ == JobPhase::kEvaluating) {
    FinishEvaluation(out);
    return;
  }
  if (accepted >= config_.min_workers) {
    std::vector<const Participant*> updates;
    for (const Participant& p : participants_) {
      if (p.state == ParticipantState::kAccepted) updates.push_back(&p);
    }
    std::sort(updates.begin(), updates.end(),
              [](const Participant* a, const Participant* b) { return a->shard < b->shard; });
    PushAggregate(updates, out);
    return;
  }
  std::string reason = AttemptName() + ": " + std::to_string(accepted) + " of " + std::to_string(participants_.size()) +
                       " participants returned an accepted update, fewer than min_workers (" +
                       std::to_string(config_.min_workers) + ")";
  for (const Participant& p : participants_) {
    if (p.state != ParticipantState::kAccepted) reason += "; worker " + std::to_string(p.worker) + ": " + p.reason;
  }
  FailAttempt(std::move(reason), out);
}

void RoundEngine::FailAttempt(std::string reason, Actions& out) {
  const int failures = ++checkpoint_.consecutive_failed_rounds;
  out.push_back(FailRound{.round = round_, .attempt = attempt_, .reason = reason, .consecutive_failures = failures});
  if (stop_requested_) {
    EndJob(JobPhase::kStopped, out);
  } else if (failures >= config_.fault_tolerance) {
    EndJob(JobPhase::kFailed, out);
    out.push_back(JobFailed{.last_committed_round = checkpoint_.last_committed_round,
                            .reason = "round " + std::to_string(round_) + " failed " + std::to_string(failures) +
                                      " time(s) in a row (fault_tolerance " + std::to_string(config_.fault_tolerance) +
                                      "); last failure: " + reason});
  } else if (const Clock::Duration backoff = RetryBackoff(config_, failures); backoff.count() > 0 && !config_.async) {
    phase_ = JobPhase::kWaitingToRetry;  // Tick begins the next attempt at deadline_
    deadline_ = clock_.Now() + backoff;
  } else {
    BeginAttempt(out);
  }
}

void RoundEngine::EmitEvaluation(int global_round, bool final, Actions& out) {
  double loss_sum = 0;
  int64_t validation_samples = 0;
  for (const Participant& p : participants_) {
    // Only updates that trained on that global measured it (in an asynchronous job, some trained on older ones).
    if (p.state == ParticipantState::kAccepted && p.validation_samples > 0 &&
        (final || p.task_round == global_round + 1)) {
      loss_sum += static_cast<double>(p.validation_samples) * p.validation_loss;
      validation_samples += p.validation_samples;
    }
  }
  if (validation_samples == 0) return;
  const double loss = loss_sum / static_cast<double>(validation_samples);
  RecordEvaluation(checkpoint_, config_, global_round, loss);
  out.push_back(GlobalEvaluated{
      .global_round = global_round, .validation_loss = loss, .validation_samples = validation_samples, .final = final});
}

void RoundEngine::Commit(Actions& out) {
  // Round r's workers evaluated global r-1 before training on it.
  EmitEvaluation(round_ - 1, /*final=*/false, out);
  double train_loss_sum = 0;
  int64_t samples = 0;
  int updates = 0;
  std::vector<std::pair<int64_t, int>> staleness;  // (accepted order, staleness)
  for (const Participant& p : participants_) {
    if (p.state != ParticipantState::kAccepted) continue;
    ++updates;
    samples += p.sample_count;
    train_loss_sum += static_cast<double>(p.sample_count) * p.train_loss;
    if (config_.async) staleness.emplace_back(p.accepted_order, round_ - p.task_round);
  }
  std::sort(staleness.begin(), staleness.end());
  CommitRound commit{.round = round_,
                     .attempt = attempt_,
                     .train_loss = samples > 0 ? train_loss_sum / static_cast<double>(samples) : 0.0,
                     .num_updates = updates,
                     .num_samples = samples};
  for (const auto& [order, s] : staleness) commit.staleness.push_back(s);
  out.push_back(std::move(commit));
  checkpoint_.last_committed_round = round_;
  checkpoint_.attempts_of_next_round = 0;
  checkpoint_.consecutive_failed_rounds = 0;
  if (stop_requested_) {
    EndJob(JobPhase::kStopped, out);
    return;
  }
  if (config_.async && (round_ >= config_.num_rounds || EarlyStopReached(checkpoint_, config_))) {
    // Tasks still training on an earlier version have no version left to join.
    for (Participant& p : participants_) {
      if (p.state == ParticipantState::kTraining || p.state == ParticipantState::kValidating) {
        Drop(p, DropCause::kJobEnded, "the job committed its last version", out);
      }
    }
  }
  BeginAttempt(out);  // the final evaluation once every round is committed or early stopping says so
}

void RoundEngine::FinishEvaluation(Actions& out) {
  // An early stop was decided when the last round committed: the final global's loss does not undo it.
  std::string reason = EarlyStopReason();
  EmitEvaluation(checkpoint_.last_committed_round, /*final=*/true, out);
  EndJob(JobPhase::kSucceeded, out, std::move(reason));
}

std::string RoundEngine::EarlyStopReason() const {
  const EngineCheckpoint& cp = checkpoint_;
  if (!EarlyStopReached(cp, config_) || cp.last_committed_round >= config_.num_rounds) return "";
  char best[96] = "";
  if (cp.best_validation_loss && cp.best_global_round == 0) {
    std::snprintf(best, sizeof best, "; lowest validation loss %.6g, of the starting weights",
                  *cp.best_validation_loss);
  } else if (cp.best_validation_loss) {
    std::snprintf(best, sizeof best, "; lowest validation loss %.6g, after round %d", *cp.best_validation_loss,
                  cp.best_global_round);
  }
  char min_delta[32];
  std::snprintf(min_delta, sizeof min_delta, "%g", config_.early_stopping->min_delta);
  return "stopped early after round " + std::to_string(cp.last_committed_round) + " of " +
         std::to_string(config_.num_rounds) + ": the validation loss did not improve by more than min_delta " +
         min_delta + " for " + std::to_string(config_.early_stopping->patience) +
         " evaluated global(s) in a row (patience)" + best;
}

void RoundEngine::EndJob(JobPhase terminal, Actions& out, std::string success_reason) {
  const char* why = terminal == JobPhase::kCancelled ? "the job was cancelled"
                    : terminal == JobPhase::kStopped ? "the job was stopped"
                                                     : "the job ended";
  for (Participant& p : participants_) {
    if (p.state == ParticipantState::kTraining || p.state == ParticipantState::kValidating) {
      Drop(p, DropCause::kJobEnded, why, out);
    }
  }
  phase_ = terminal;
  const int last = checkpoint_.last_committed_round;
  switch (terminal) {
    case JobPhase::kSucceeded:
      out.push_back(JobSucceeded{.final_round = last, .reason = std::move(success_reason)});
      break;
    case JobPhase::kStopped: out.push_back(JobStopped{.last_committed_round = last}); break;
    case JobPhase::kCancelled: out.push_back(JobCancelled{.last_committed_round = last}); break;
    default: break;  // kFailed: the caller of EndJob adds JobFailed with its reason
  }
}

}  // namespace parsyn::coordinator
