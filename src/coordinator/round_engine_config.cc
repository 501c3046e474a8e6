// The round engine's configuration from a job spec, the retry backoff, and the JSON spellings of its enums
// (round_engine.h); the state machine itself is round_engine.cc.
#include <algorithm>

#include "coordinator/round_engine.h"

namespace parsyn::coordinator {

std::string_view DropCauseName(DropCause cause) {
  switch (cause) {
    case DropCause::kDisconnected: return "disconnected";
    case DropCause::kAbandoned: return "abandoned";
    case DropCause::kStraggler: return "straggler";
    case DropCause::kRejected: return "rejected";
    case DropCause::kJobEnded: return "job_ended";
    case DropCause::kTaskFailed: return "task_failed";
  }
  return "?";
}

std::string_view JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kNotStarted: return "not_started";
    case JobPhase::kWaitingForWorkers: return "waiting_for_workers";
    case JobPhase::kWaitingToRetry: return "waiting_to_retry";
    case JobPhase::kTraining: return "training";
    case JobPhase::kAggregating: return "aggregating";
    case JobPhase::kEvaluating: return "evaluating";
    case JobPhase::kSucceeded: return "succeeded";
    case JobPhase::kFailed: return "failed";
    case JobPhase::kStopped: return "stopped";
    case JobPhase::kCancelled: return "cancelled";
  }
  return "?";
}

bool IsTerminal(JobPhase phase) {
  return phase == JobPhase::kSucceeded || phase == JobPhase::kFailed || phase == JobPhase::kStopped ||
         phase == JobPhase::kCancelled;
}

std::string_view ParticipantStateName(ParticipantState state) {
  switch (state) {
    case ParticipantState::kTraining: return "training";
    case ParticipantState::kValidating: return "validating";
    case ParticipantState::kAccepted: return "accepted";
    case ParticipantState::kRejected: return "rejected";
    case ParticipantState::kDropped: return "dropped";
  }
  return "?";
}

RoundEngineConfig EngineConfigFor(const JobSpec& spec) {
  const DistributedConfig& d = spec.distributed;
  RoundEngineConfig config;
  config.job_seed = spec.config.seed;
  config.num_rounds = d.num_rounds;
  config.min_workers = d.min_workers;
  config.max_workers = d.max_workers;
  config.aggregation_timeout = Clock::Duration(d.aggregation_timeout_ms);
  config.fault_tolerance = d.fault_tolerance;
  config.eligible_workers = spec.SelectedWorkers();
  config.join_window = Clock::Duration(d.join_window_ms);
  config.retry_backoff = kDefaultRetryBackoff;
  config.early_stopping = d.early_stopping;
  if (d.enabled) config.sampling = d.strategy_options.sampling;
  if (d.enabled && d.async.enabled) {
    config.async = RoundEngineConfig::Async{.buffer_size = d.async.buffer_size,
                                            .max_concurrency = d.async.MaxConcurrency(d.max_workers),
                                            .max_staleness = d.async.max_staleness};
  }
  // The caller supplies worker_has_data (from the workers' hellos).
  config.workers_hold_data = spec.data.source == DataSource::kWorkers;
  config.max_samples_per_worker = spec.data.max_samples_per_worker;
  if (!d.enabled) {
    config.num_shards = 1;  // one worker trains on all the data
  } else {
    config.num_shards =
        config.eligible_workers.empty() ? d.max_workers : static_cast<int>(config.eligible_workers.size());
  }
  return config;
}

void RecordEvaluation(EngineCheckpoint& checkpoint, const RoundEngineConfig& config, int global_round,
                      double validation_loss) {
  const double min_delta = config.early_stopping ? config.early_stopping->min_delta : 0.0;
  const std::optional<double> best = checkpoint.best_validation_loss;
  if (!best || validation_loss < *best - min_delta) {
    checkpoint.evaluations_without_improvement = 0;
  } else {
    ++checkpoint.evaluations_without_improvement;
  }
  if (!best || validation_loss < *best) {
    checkpoint.best_validation_loss = validation_loss;
    checkpoint.best_global_round = global_round;
  }
}

bool EarlyStopReached(const EngineCheckpoint& checkpoint, const RoundEngineConfig& config) {
  return config.early_stopping && checkpoint.evaluations_without_improvement >= config.early_stopping->patience;
}

Clock::Duration RetryBackoff(const RoundEngineConfig& config, int consecutive_failures) {
  if (config.retry_backoff.count() <= 0 || consecutive_failures < 1) return Clock::Duration{0};
  Clock::Duration backoff = config.retry_backoff;
  for (int k = 1; k < consecutive_failures && backoff < config.aggregation_timeout; ++k) backoff *= 2;
  return std::min(backoff, config.aggregation_timeout);
}

}  // namespace parsyn::coordinator
