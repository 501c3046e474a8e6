#include <algorithm>
#include <map>
#include <type_traits>
#include <variant>

#include "storage/sql/sql_metadata_store.h"
#include "storage/sql/sql_store_internal.h"

// SqlMetadataStore's rounds, updates, metrics, events and batches (the rest is in sql_metadata_store.cc).
namespace parsyn::storage {

using namespace sql_internal;  // NOLINT(google-build-using-namespace): this file implements what it declares

// ---- rounds

StatusOr<Round> SqlMetadataStore::LoadRoundLocked(int64_t job_id, int32_t round, int32_t attempt) {
  PARSYN_PREPARE(
      q, std::string("SELECT ") + kRoundColumns + " FROM rounds WHERE job_id = $1 AND round = $2 AND attempt = $3");
  q->Bind(job_id, round, attempt);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError(RoundName(job_id, round, attempt) + " not found");
  return ReadRound(*q);
}

Status SqlMetadataStore::LoadParticipantsLocked(std::vector<Round>& rounds) {
  if (rounds.empty()) return Status::Ok();
  std::map<std::pair<int32_t, int32_t>, Round*> by_attempt;
  for (Round& r : rounds) by_attempt[{r.round, r.attempt}] = &r;
  PARSYN_PREPARE(q,
                 "SELECT round, attempt, worker_id FROM round_participants WHERE job_id = $1 "
                 "ORDER BY round, attempt, worker_id");
  q->Bind(rounds.front().job_id);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return Status::Ok();
    auto it = by_attempt.find({static_cast<int32_t>(q->Int(0)), static_cast<int32_t>(q->Int(1))});
    if (it != by_attempt.end()) it->second->participants.push_back(q->Int(2));
  }
}

Status SqlMetadataStore::StartRound(const Round& round) {
  const std::string name = RoundName(round.job_id, round.round, round.attempt);
  if (round.round < 1 || round.attempt < 1) {
    return InvalidArgumentError(name + ": round and attempt numbers start at 1");
  }
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(round.job_id, /*for_update=*/true));
  if (job.status != JobStatus::kRunning) {
    return FailedPreconditionError("cannot start " + name + ": the job is " + std::string(ToString(job.status)));
  }
  if (round.round != job.committed_round + 1) {
    return FailedPreconditionError("cannot start " + name + ": the last committed round is " +
                                   std::to_string(job.committed_round) + ", so the next is " +
                                   std::to_string(job.committed_round + 1));
  }
  {
    PARSYN_PREPARE(q,
                   "SELECT COALESCE(MAX(attempt), 0), COALESCE(SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END), 0) "
                   "FROM rounds "
                   "WHERE job_id = $1 AND round = $2");
    q->Bind(round.job_id, round.round);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    int64_t last_attempt = row ? q->Int(0) : 0;
    int64_t running = row ? q->Int(1) : 0;
    PARSYN_RETURN_IF_ERROR(q->Run());
    if (running > 0) {
      return FailedPreconditionError("cannot start " + name + ": attempt " + std::to_string(last_attempt) +
                                     " is still running");
    }
    if (round.attempt != last_attempt + 1) {
      return FailedPreconditionError("cannot start " + name + ": the next attempt is " +
                                     std::to_string(last_attempt + 1));
    }
  }
  {
    PARSYN_PREPARE(q,
                   "INSERT INTO rounds (job_id, round, attempt, status, started_at_ms, bytes_moved, bytes_down, "
                   "bytes_up, global_blob_key, global_sha256, failure_reason) "
                   "VALUES ($1, $2, $3, 'running', $4, 0, 0, 0, '', '', '')");
    q->Bind(round.job_id, round.round, round.attempt, round.started_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  for (int64_t worker_id : round.participants) {
    PARSYN_PREPARE(q, "INSERT INTO round_participants (job_id, round, attempt, worker_id) VALUES ($1, $2, $3, $4)");
    q->Bind(round.job_id, round.round, round.attempt, worker_id);
    Status s = q->Run();
    if (q->violated() == SqlConstraint::kForeignKey) {
      return NotFoundError(name + ": participant worker " + std::to_string(worker_id) + " not found");
    }
    if (s.code() == StatusCode::kAlreadyExists) {
      return InvalidArgumentError(name + ": worker " + std::to_string(worker_id) + " is listed twice");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  {
    PARSYN_PREPARE(q, "UPDATE jobs SET current_round = $2 WHERE id = $1");
    q->Bind(round.job_id, round.round);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqlMetadataStore::CommitRound(const RoundCommit& commit) {
  const std::string name = RoundName(commit.job_id, commit.round, commit.attempt);
  if (commit.global_blob_key.empty() || commit.global_sha256.empty()) {
    return InvalidArgumentError("committing " + name + ": the new global's blob key and sha256 are required");
  }
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  // The job's row is locked before anything is read (an absent job is reported below, as the missing round).
  std::optional<TrainingJob> locked;
  if (StatusOr<TrainingJob> j = LoadJobLocked(commit.job_id, /*for_update=*/true); j.ok()) {
    locked = std::move(*j);
  } else if (j.status().code() != StatusCode::kNotFound) {
    return j.status();
  }
  PARSYN_ASSIGN_OR_RETURN(Round round, LoadRoundLocked(commit.job_id, commit.round, commit.attempt));
  if (round.status != RoundStatus::kRunning) {
    return FailedPreconditionError(name + " is already " + std::string(ToString(round.status)));
  }
  if (!locked) return NotFoundError(JobName(commit.job_id) + " not found");
  const TrainingJob& job = *locked;
  if (job.status != JobStatus::kRunning) {
    return FailedPreconditionError("cannot commit " + name + ": the job is " + std::string(ToString(job.status)));
  }
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET status = 'committed', ended_at_ms = $4, train_loss = $5, "
                   "bytes_moved = $6, global_blob_key = $7, global_sha256 = $8, bytes_down = $9, bytes_up = $10 "
                   "WHERE job_id = $1 AND round = $2 AND attempt = $3");
    q->Bind(commit.job_id, commit.round, commit.attempt, commit.ended_at_ms, commit.train_loss,
            commit.bytes_down + commit.bytes_up, commit.global_blob_key, commit.global_sha256, commit.bytes_down,
            commit.bytes_up);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  if (commit.previous_global_validation_loss) {
    if (commit.round == 1) {
      PARSYN_PREPARE(q, "UPDATE jobs SET initial_validation_loss = $2 WHERE id = $1");
      q->Bind(commit.job_id, *commit.previous_global_validation_loss);
      PARSYN_RETURN_IF_ERROR(q->Run());
    } else {
      PARSYN_RETURN_IF_ERROR(
          SetRoundValidationLossLocked(job, commit.round - 1, *commit.previous_global_validation_loss));
    }
  }
  {
    PARSYN_PREPARE(q,
                   "UPDATE jobs SET committed_round = $2, current_round = $2, consecutive_failed_rounds = 0 "
                   "WHERE id = $1");
    q->Bind(commit.job_id, commit.round);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqlMetadataStore::FailRound(const RoundFailure& failure) {
  const std::string name = RoundName(failure.job_id, failure.round, failure.attempt);
  if (failure.reason.empty()) return InvalidArgumentError("failing " + name + ": a reason is required");
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  std::optional<TrainingJob> locked;
  if (StatusOr<TrainingJob> j = LoadJobLocked(failure.job_id, /*for_update=*/true); j.ok()) {
    locked = std::move(*j);
  } else if (j.status().code() != StatusCode::kNotFound) {
    return j.status();
  }
  PARSYN_ASSIGN_OR_RETURN(Round round, LoadRoundLocked(failure.job_id, failure.round, failure.attempt));
  if (round.status != RoundStatus::kRunning) {
    return FailedPreconditionError(name + " is already " + std::string(ToString(round.status)));
  }
  if (!locked) return NotFoundError(JobName(failure.job_id) + " not found");
  const TrainingJob& job = *locked;
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET status = 'failed', ended_at_ms = $4, bytes_moved = $5, failure_reason = $6, "
                   "bytes_down = $7, bytes_up = $8 "
                   "WHERE job_id = $1 AND round = $2 AND attempt = $3");
    q->Bind(failure.job_id, failure.round, failure.attempt, failure.ended_at_ms, failure.bytes_down + failure.bytes_up,
            failure.reason, failure.bytes_down, failure.bytes_up);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  if (!IsTerminal(job.status)) {
    const bool fail_job = failure.fail_job_reason.has_value();
    PARSYN_PREPARE(
        q,
        "UPDATE jobs SET consecutive_failed_rounds = consecutive_failed_rounds + $2, "
        "status = CASE WHEN CAST($3 AS BOOLEAN) THEN 'failed' ELSE status END, "
        "failure_reason = CASE WHEN CAST($3 AS BOOLEAN) THEN CAST($4 AS TEXT) ELSE failure_reason END, "
        "status_reason = CASE WHEN CAST($3 AS BOOLEAN) THEN CAST($4 AS TEXT) ELSE status_reason END, "
        "finished_at_ms = CASE WHEN CAST($3 AS BOOLEAN) THEN CAST($5 AS BIGINT) ELSE finished_at_ms END WHERE id = $1");
    q->Bind(failure.job_id, failure.counts_toward_fault_tolerance ? 1 : 0, fail_job,
            failure.fail_job_reason.value_or(""), failure.ended_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqlMetadataStore::SetRoundValidationLossLocked(const TrainingJob& job, int32_t round, double loss) {
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET validation_loss = $3 WHERE job_id = $1 AND round = $2 AND status = 'committed'");
    q->Bind(job.id, round, loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
    if (q->changes() != 1) {
      return FailedPreconditionError(JobName(job.id) + " has no committed round " + std::to_string(round) +
                                     " to record a validation loss for");
    }
  }
  // The earliest round keeps best_round on a tie.
  if (!job.best_validation_loss || loss < *job.best_validation_loss ||
      (loss == *job.best_validation_loss && job.best_round && round < *job.best_round)) {
    PARSYN_PREPARE(q, "UPDATE jobs SET best_round = $2, best_validation_loss = $3 WHERE id = $1");
    q->Bind(job.id, round, loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return Status::Ok();
}

Status SqlMetadataStore::RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(job_id, /*for_update=*/true));
  if (IsTerminal(job.status)) {
    return FailedPreconditionError("cannot record the final validation loss of " + JobName(job_id) + ": it is " +
                                   std::string(ToString(job.status)));
  }
  if (round < 1 || round != job.committed_round) {
    return FailedPreconditionError("the final validation loss of " + JobName(job_id) +
                                   " is that of its committed round " + std::to_string(job.committed_round) +
                                   ", not round " + std::to_string(round));
  }
  PARSYN_RETURN_IF_ERROR(SetRoundValidationLossLocked(job, round, validation_loss));
  {
    PARSYN_PREPARE(q, "UPDATE jobs SET final_validation_loss = $2 WHERE id = $1");
    q->Bind(job_id, validation_loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqlMetadataStore::AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_RETURN_IF_ERROR(AddRoundParticipantLocked(RoundParticipant{job_id, round, attempt, worker_id}));
  return txn.CommitIfBegun();
}

Status SqlMetadataStore::AddRoundParticipantLocked(const RoundParticipant& p) {
  const auto [job_id, round, attempt, worker_id] = p;
  PARSYN_RETURN_IF_ERROR(LoadRoundLocked(job_id, round, attempt).status());
  PARSYN_PREPARE(q,
                 "INSERT INTO round_participants (job_id, round, attempt, worker_id) "
                 "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING");
  q->Bind(job_id, round, attempt, worker_id);
  Status s = q->Run();
  if (q->violated() == SqlConstraint::kForeignKey) {
    return NotFoundError(RoundName(job_id, round, attempt) + ": participant worker " + std::to_string(worker_id) +
                         " not found");
  }
  return s;
}

StatusOr<Round> SqlMetadataStore::GetRound(int64_t job_id, int32_t round, int32_t attempt) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_ASSIGN_OR_RETURN(Round r, LoadRoundLocked(job_id, round, attempt));
  PARSYN_PREPARE(q,
                 "SELECT worker_id FROM round_participants WHERE job_id = $1 AND round = $2 AND attempt = $3 "
                 "ORDER BY worker_id");
  q->Bind(job_id, round, attempt);
  PARSYN_ASSIGN_OR_RETURN(r.participants, ReadAll<int64_t>(*q, [](const SqlStatement& row) { return row.Int(0); }));
  return r;
}

StatusOr<std::vector<Round>> SqlMetadataStore::ListRounds(int64_t job_id) {
  PARSYN_LOCK_AND_CONNECT();
  std::vector<Round> out;
  {
    PARSYN_PREPARE(q,
                   std::string("SELECT ") + kRoundColumns + " FROM rounds WHERE job_id = $1 ORDER BY round, attempt");
    q->Bind(job_id);
    PARSYN_ASSIGN_OR_RETURN(out, ReadAll<Round>(*q, ReadRound));
  }
  PARSYN_RETURN_IF_ERROR(LoadParticipantsLocked(out));
  return out;
}

// ---- updates

Status SqlMetadataStore::RecordUpdate(const RoundUpdate& update) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_RETURN_IF_ERROR(RecordUpdateLocked(update));
  return txn.CommitIfBegun();
}

Status SqlMetadataStore::RecordUpdateLocked(const RoundUpdate& update) {
  const std::string name = RoundName(update.job_id, update.round, update.attempt);
  PARSYN_RETURN_IF_ERROR(LoadRoundLocked(update.job_id, update.round, update.attempt).status());
  PARSYN_PREPARE(q, std::string("INSERT INTO round_updates (") + kUpdateColumns +
                        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)");
  q->Bind(update.job_id, update.round, update.attempt, update.worker_id, update.blob_key, update.sha256,
          update.size_bytes, update.num_samples, update.train_loss, update.metrics_json, ToString(update.status),
          update.reject_reason, update.received_at_ms, update.trained_on_round);
  Status s = q->Run();
  if (q->violated() == SqlConstraint::kForeignKey) {
    return NotFoundError("worker " + std::to_string(update.worker_id) + " not found");
  }
  if (s.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("worker " + std::to_string(update.worker_id) + " already has an update for " + name);
  }
  return s;
}

StatusOr<std::vector<RoundUpdate>> SqlMetadataStore::ListUpdates(int64_t job_id, int32_t round, int32_t attempt) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kUpdateColumns +
                        " FROM round_updates WHERE job_id = $1 AND round = $2 AND attempt = $3 ORDER BY worker_id");
  q->Bind(job_id, round, attempt);
  return ReadAll<RoundUpdate>(*q, ReadUpdate);
}

// ---- metrics

Status SqlMetadataStore::AppendMetrics(std::span<const MetricPoint> points) {
  if (points.empty()) return Status::Ok();
  PARSYN_LOCK_AND_CONNECT();
  // One transaction per batch: one WAL flush for the lot instead of one per point.
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  for (const MetricPoint& p : points) {
    PARSYN_PREPARE(q,
                   "INSERT INTO metric_points (job_id, round, worker_id, step, loss, throughput, utilization, "
                   "time_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)");
    q->Bind(p.job_id, p.round, p.worker_id, p.step, p.loss, p.throughput, p.utilization, p.time_ms);
    Status s = q->Run();
    if (q->violated() == SqlConstraint::kForeignKey) {
      return NotFoundError("metric point names " + JobName(p.job_id) + " or worker " + std::to_string(p.worker_id) +
                           ", which does not exist");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  return txn.Commit();
}

StatusOr<std::vector<MetricPoint>> SqlMetadataStore::ListMetrics(int64_t job_id, std::optional<int64_t> worker_id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(
      q,
      "SELECT job_id, round, worker_id, step, loss, throughput, utilization, time_ms "
      "FROM metric_points WHERE job_id = $1 AND (CAST($2 AS BIGINT) IS NULL OR worker_id = CAST($2 AS BIGINT)) "
      "ORDER BY time_ms, worker_id, step, id");
  q->Bind(job_id, worker_id);
  return ReadAll<MetricPoint>(*q, [](const SqlStatement& row) {
    return MetricPoint{row.Int(0),     static_cast<int32_t>(row.Int(1)),
                       row.Int(2),     row.Int(3),
                       row.OptReal(4), row.OptReal(5),
                       row.OptReal(6), row.Int(7)};
  });
}

StatusOr<std::vector<StoredMetricPoint>> SqlMetadataStore::ListMetricsPage(int64_t job_id, int64_t after_id,
                                                                           int limit) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q,
                 "SELECT id, job_id, round, worker_id, step, loss, throughput, utilization, time_ms "
                 "FROM metric_points WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3");
  q->Bind(job_id, after_id, static_cast<int64_t>(std::max(limit, 0)));
  return ReadAll<StoredMetricPoint>(*q, [](const SqlStatement& row) {
    return StoredMetricPoint{
        row.Int(0), MetricPoint{row.Int(1), static_cast<int32_t>(row.Int(2)), row.Int(3), row.Int(4), row.OptReal(5),
                                row.OptReal(6), row.OptReal(7), row.Int(8)}};
  });
}

StatusOr<int64_t> SqlMetadataStore::CountMetrics(int64_t job_id, int64_t worker_id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT COUNT(*) FROM metric_points WHERE job_id = $1 AND worker_id = $2");
  q->Bind(job_id, worker_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return InternalError("COUNT(*) returned no row");
  return q->Int(0);
}

// ---- events

StatusOr<int64_t> SqlMetadataStore::AppendJobEvent(const JobEvent& event) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_ASSIGN_OR_RETURN(const int64_t id, AppendJobEventLocked(event));
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  return id;
}

StatusOr<int64_t> SqlMetadataStore::AppendJobEventLocked(const JobEvent& event) {
  PARSYN_PREPARE(q,
                 "INSERT INTO job_events (job_id, type, payload_json, time_ms) VALUES ($1, $2, $3, $4) RETURNING id");
  q->Bind(event.job_id, event.type, event.payload_json, event.time_ms);
  StatusOr<int64_t> id = q->RunReturningId();
  if (q->violated() == SqlConstraint::kForeignKey) return NotFoundError(JobName(event.job_id) + " not found");
  return id;
}

StatusOr<std::vector<JobEvent>> SqlMetadataStore::ListJobEvents(int64_t job_id, int64_t after_id, int limit,
                                                                const JobEventFilter& filter) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q,
                 "SELECT id, job_id, type, payload_json, time_ms FROM job_events WHERE job_id = $1 AND id > $2 "
                 "AND ($4 = '' OR (type = $4) <> $5) ORDER BY id LIMIT $3");
  q->Bind(job_id, after_id, static_cast<int64_t>(std::max(limit, 0)), filter.type, filter.exclude_type);
  return ReadAll<JobEvent>(*q, [](const SqlStatement& row) {
    return JobEvent{row.Int(0), row.Int(1), row.Text(2), row.Text(3), row.Int(4)};
  });
}

StatusOr<int64_t> SqlMetadataStore::LastJobEventId(int64_t job_id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT COALESCE(MAX(id), 0) FROM job_events WHERE job_id = $1");
  q->Bind(job_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return InternalError("MAX(id) returned no row");
  return q->Int(0);
}

// ---- batches

StatusOr<std::vector<int64_t>> SqlMetadataStore::ApplyBatch(std::span<const BatchWrite> writes) {
  std::vector<int64_t> event_ids;
  if (writes.empty()) return event_ids;
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  // The batch's job writes are checked against the lease in their (the batch's) transaction, as single ones are.
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  for (size_t i = 0; i < writes.size(); ++i) {
    Status s = std::visit(
        [&](const auto& w) -> Status {
          using W = std::decay_t<decltype(w)>;
          if constexpr (std::is_same_v<W, JobEvent>) {
            StatusOr<int64_t> id = AppendJobEventLocked(w);
            if (id.ok()) event_ids.push_back(*id);
            return id.status();
          } else if constexpr (std::is_same_v<W, RoundUpdate>) {
            return RecordUpdateLocked(w);
          } else if constexpr (std::is_same_v<W, ShardAssignment>) {
            return AssignShardLocked(w);
          } else {
            return AddRoundParticipantLocked(w);
          }
        },
        writes[i]);
    // The transaction rolls back on return: nothing of the batch is kept.
    if (!s.ok()) return s.WithContext(BatchWriteName(i, writes.size()));
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return event_ids;
}

}  // namespace parsyn::storage
