#include "storage/sql/sql_metadata_store.h"

#include <map>
#include <set>
#include <tuple>

#include "storage/sql/sql_schema.h"
#include "storage/sql/sql_store_internal.h"

namespace parsyn::storage {

using namespace sql_internal;  // NOLINT(google-build-using-namespace): this file implements what it declares

SqlMetadataStore::SqlMetadataStore(std::unique_ptr<SqlConnection> db) : db_(std::move(db)) {}

SqlMetadataStore::~SqlMetadataStore() = default;

Status SqlMetadataStore::BeginFencedWriteLocked(SqlTransaction& txn) {
  if (fencing_epoch_ == 0) return Status::Ok();
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  return CheckFenceLocked();
}

StatusOr<int> SqlMetadataStore::SchemaVersion() {
  PARSYN_LOCK_AND_CONNECT();
  return ReadSchemaVersion(*db_);
}

// ---- datasets

StatusOr<Dataset> SqlMetadataStore::CreateDataset(const Dataset& dataset) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "INSERT INTO datasets (name, format, kind, row_count, size_bytes, sha256, blob_key, "
                 "created_at_ms, project_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id");
  q->Bind(dataset.name, ToString(dataset.format), ToString(dataset.kind), dataset.row_count, dataset.size_bytes,
          dataset.sha256, dataset.blob_key, dataset.created_at_ms, dataset.project_id);
  StatusOr<int64_t> id = q->RunReturningId();
  if (id.status().code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("a dataset with blob key '" + dataset.blob_key + "' already exists");
  }
  PARSYN_RETURN_IF_ERROR(id.status());
  Dataset stored = dataset;
  stored.id = *id;
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  return stored;
}

StatusOr<Dataset> SqlMetadataStore::GetDataset(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kDatasetColumns + " FROM datasets WHERE id = $1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("dataset " + std::to_string(id) + " not found");
  return ReadDataset(*q);
}

StatusOr<std::vector<Dataset>> SqlMetadataStore::ListDatasets(const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kDatasetColumns + " FROM datasets WHERE id > $1 AND " + kInPageProject +
                        " ORDER BY id LIMIT $2");
  q->Bind(page.after_id, page.limit, page.project_id);
  return ReadAll<Dataset>(*q, ReadDataset);
}

Status SqlMetadataStore::DeleteDataset(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_RETURN_IF_ERROR(DeleteUnlessUsedLocked("DELETE FROM datasets WHERE id = $1", "dataset", id));
  return txn.CommitIfBegun();
}

Status SqlMetadataStore::DeleteUnlessUsedLocked(const char* sql, std::string_view what, int64_t id) {
  PARSYN_PREPARE(q, sql);
  q->Bind(id);
  Status s = q->Run();
  if (q->violated() == SqlConstraint::kForeignKey) {
    return FailedPreconditionError(std::string(what) + " " + std::to_string(id) + " is used by a training job");
  }
  PARSYN_RETURN_IF_ERROR(s);
  if (q->changes() == 0) return NotFoundError(std::string(what) + " " + std::to_string(id) + " not found");
  return Status::Ok();
}

// ---- models

StatusOr<Model> SqlMetadataStore::CreateModel(const Model& model) {
  std::set<std::string_view> paths;
  for (const ModelFile& f : model.files) {
    if (!paths.insert(f.path).second) {
      return InvalidArgumentError("model file path '" + f.path + "' appears more than once");
    }
  }
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  Model stored = model;
  {
    PARSYN_PREPARE(q,
                   "INSERT INTO models (name, model_type, config_json, size_bytes, created_at_ms, project_id) "
                   "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id");
    q->Bind(model.name, model.model_type, model.config_json, model.size_bytes, model.created_at_ms, model.project_id);
    PARSYN_ASSIGN_OR_RETURN(stored.id, q->RunReturningId());
  }
  for (const ModelFile& f : model.files) {
    PARSYN_PREPARE(q,
                   "INSERT INTO model_files (model_id, path, blob_key, size_bytes, sha256) "
                   "VALUES ($1, $2, $3, $4, $5)");
    q->Bind(stored.id, f.path, f.blob_key, f.size_bytes, f.sha256);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

StatusOr<Model> SqlMetadataStore::GetModel(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  Model m;
  {
    PARSYN_PREPARE(q, std::string("SELECT ") + kModelColumns + " FROM models WHERE id = $1");
    q->Bind(id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return NotFoundError("model " + std::to_string(id) + " not found");
    m = ReadModel(*q);
  }
  PARSYN_PREPARE(q, "SELECT path, blob_key, size_bytes, sha256 FROM model_files WHERE model_id = $1 ORDER BY path");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(m.files, ReadAll<ModelFile>(*q, [](const SqlStatement& row) {
                            return ModelFile{row.Text(0), row.Text(1), row.Int(2), row.Text(3)};
                          }));
  return m;
}

StatusOr<std::vector<Model>> SqlMetadataStore::ListModels(const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  std::vector<Model> out;
  std::map<int64_t, size_t> index_of;
  {
    PARSYN_PREPARE(q, std::string("SELECT ") + kModelColumns + " FROM models WHERE id > $1 AND " + kInPageProject +
                          " ORDER BY id LIMIT $2");
    q->Bind(page.after_id, page.limit, page.project_id);
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
      if (!row) break;
      index_of[q->Int(0)] = out.size();
      out.push_back(ReadModel(*q));
    }
  }
  if (out.empty()) return out;
  PARSYN_PREPARE(q,
                 "SELECT model_id, path, blob_key, size_bytes, sha256 FROM model_files "
                 "WHERE model_id > $1 AND model_id <= $2 ORDER BY model_id, path");
  q->Bind(page.after_id, out.back().id);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    auto it = index_of.find(q->Int(0));
    if (it != index_of.end()) {
      out[it->second].files.push_back(ModelFile{q->Text(1), q->Text(2), q->Int(3), q->Text(4)});
    }
  }
}

Status SqlMetadataStore::DeleteModel(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_RETURN_IF_ERROR(DeleteUnlessUsedLocked("DELETE FROM models WHERE id = $1", "model", id));
  return txn.CommitIfBegun();
}

// ---- workers

StatusOr<Worker> SqlMetadataStore::CreateWorker(const Worker& worker) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "INSERT INTO workers (name, kind, token_sha256, device, status, last_heartbeat_at_ms, revoked, "
                 "created_at_ms, trainers_json, project_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
                 "RETURNING id");
  q->Bind(worker.name, ToString(worker.kind), worker.token_sha256, worker.device, ToString(worker.status),
          worker.last_heartbeat_at_ms, worker.revoked, worker.created_at_ms, worker.trainers_json, worker.project_id);
  StatusOr<int64_t> id = q->RunReturningId();
  if (id.status().code() == StatusCode::kAlreadyExists)
    return AlreadyExistsError("a worker with this token already exists");
  PARSYN_RETURN_IF_ERROR(id.status());
  Worker stored = worker;
  stored.id = *id;
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  return stored;
}

StatusOr<Worker> SqlMetadataStore::GetWorker(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE id = $1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("worker " + std::to_string(id) + " not found");
  return ReadWorker(*q);
}

StatusOr<Worker> SqlMetadataStore::FindWorkerByTokenHash(std::string_view token_sha256) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE token_sha256 = $1");
  q->Bind(token_sha256);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  // The message never echoes the hash: it is a credential's fingerprint.
  if (!row) return NotFoundError("no worker has this token");
  return ReadWorker(*q);
}

StatusOr<std::vector<Worker>> SqlMetadataStore::ListWorkers(const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE id > $1 AND (kind = 'managed' OR " +
                        kInPageProject + ") ORDER BY id LIMIT $2");
  q->Bind(page.after_id, page.limit, page.project_id);
  return ReadAll<Worker>(*q, ReadWorker);
}

Status SqlMetadataStore::UpdateWorker(const Worker& worker) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "UPDATE workers SET name = $2, device = $3, status = $4, last_heartbeat_at_ms = $5, "
                 "revoked = $6, trainers_json = $7 WHERE id = $1");
  q->Bind(worker.id, worker.name, worker.device, ToString(worker.status), worker.last_heartbeat_at_ms, worker.revoked,
          worker.trainers_json);
  PARSYN_RETURN_IF_ERROR(q->Run());
  if (q->changes() == 0) return NotFoundError("worker " + std::to_string(worker.id) + " not found");
  return txn.CommitIfBegun();
}

Status SqlMetadataStore::RecordWorkersSeen(std::span<const WorkerSeen> seen) {
  if (seen.empty()) return Status::Ok();
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  for (const WorkerSeen& w : seen) {
    PARSYN_PREPARE(q, "UPDATE workers SET last_heartbeat_at_ms = $2 WHERE id = $1");
    q->Bind(w.worker_id, w.last_heartbeat_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

// ---- admin key

Status SqlMetadataStore::SetAdminKeyHash(std::string_view key_sha256) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "INSERT INTO settings (name, value) VALUES ('admin_key_sha256', $1) "
                 "ON CONFLICT (name) DO UPDATE SET value = excluded.value");
  q->Bind(key_sha256);
  PARSYN_RETURN_IF_ERROR(q->Run());
  return txn.CommitIfBegun();
}

StatusOr<std::string> SqlMetadataStore::GetAdminKeyHash() {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT value FROM settings WHERE name = 'admin_key_sha256'");
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("no admin API key has been set");
  return q->Text(0);
}

// ---- jobs

StatusOr<TrainingJob> SqlMetadataStore::LoadJobLocked(int64_t job_id, bool for_update) {
  // With a row lock (PostgreSQL's FOR UPDATE) the job's row is held until the transaction ends: concurrent writers
  // of one job (two coordinators) queue here, as SQLite writers queue on BEGIN IMMEDIATE.
  PARSYN_PREPARE(q, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE id = $1" +
                        std::string(for_update ? db_->RowLock() : ""));
  q->Bind(job_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError(JobName(job_id) + " not found");
  return ReadJob(*q);
}

StatusOr<TrainingJob> SqlMetadataStore::CreateJob(const TrainingJob& job) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  // Checked here rather than left to the foreign keys so the error names what is missing; a shared row lock keeps
  // the row from being deleted before the commit.
  for (auto [table, what, id] :
       {std::tuple{"datasets", "dataset", job.dataset_id}, std::tuple{"models", "model", job.model_id}}) {
    if (id == 0 && std::string_view(table) == "datasets") continue;  // no dataset: stored as NULL
    PARSYN_PREPARE(q, std::string("SELECT 1 FROM ") + table + " WHERE id = $1 AND project_id = $2" +
                          std::string(db_->SharedRowLock()));
    q->Bind(id, job.project_id);  // another project's is as unknown as one that does not exist
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return NotFoundError(std::string(what) + " " + std::to_string(id) + " not found");
  }
  TrainingJob stored = job;
  stored.status = JobStatus::kQueued;
  stored.failure_reason.clear();
  stored.status_reason.clear();
  stored.initial_validation_loss = stored.final_validation_loss = stored.best_validation_loss = std::nullopt;
  stored.best_round.reset();
  stored.current_round = stored.committed_round = stored.consecutive_failed_rounds = 0;
  stored.started_at_ms.reset();
  stored.finished_at_ms.reset();
  {
    PARSYN_PREPARE(q,
                   "INSERT INTO jobs (name, dataset_id, model_id, spec_json, status, failure_reason, "
                   "current_round, committed_round, consecutive_failed_rounds, created_at_ms, private_seed, "
                   "project_id) VALUES ($1, $2, $3, $4, 'queued', '', 0, 0, 0, $5, $6, $7) RETURNING id");
    q->Bind(job.name, job.dataset_id == 0 ? std::optional<int64_t>() : std::optional(job.dataset_id), job.model_id,
            job.spec_json, job.created_at_ms, job.private_seed, job.project_id);
    PARSYN_ASSIGN_OR_RETURN(stored.id, q->RunReturningId());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

StatusOr<TrainingJob> SqlMetadataStore::GetJob(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  return LoadJobLocked(id);
}

StatusOr<std::vector<TrainingJob>> SqlMetadataStore::ListJobs(std::optional<JobStatus> status, const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kJobColumns +
                        " FROM jobs WHERE (CAST($1 AS TEXT) IS NULL OR status = CAST($1 AS TEXT)) AND id > $2 AND " +
                        kInPageProjectAt4 + " ORDER BY id LIMIT $3");
  q->Bind(status ? std::optional<std::string_view>(ToString(*status)) : std::nullopt, page.after_id, page.limit,
          page.project_id);
  return ReadAll<TrainingJob>(*q, ReadJob);
}

StatusOr<TrainingJob> SqlMetadataStore::SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                                     std::string_view reason) {
  if (status == JobStatus::kQueued) {
    return FailedPreconditionError(JobName(job_id) + " cannot move back to queued");
  }
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(job_id, /*for_update=*/true));
  if (IsTerminal(job.status)) {
    return FailedPreconditionError(JobName(job_id) + " is already " + std::string(ToString(job.status)));
  }
  job.status = status;
  if (status == JobStatus::kRunning && !job.started_at_ms) job.started_at_ms = time_ms;
  if (IsTerminal(status)) job.finished_at_ms = time_ms;
  if (status == JobStatus::kFailed) job.failure_reason = std::string(reason);
  if (IsTerminal(status)) job.status_reason = std::string(reason);
  {
    PARSYN_PREPARE(q,
                   "UPDATE jobs SET status = $2, failure_reason = $3, started_at_ms = $4, finished_at_ms = $5, "
                   "status_reason = $6 WHERE id = $1");
    q->Bind(job_id, ToString(job.status), job.failure_reason, job.started_at_ms, job.finished_at_ms, job.status_reason);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return job;
}

Status SqlMetadataStore::CheckFenceLocked() {
  if (fencing_epoch_ == 0) return Status::Ok();  // this store takes no part in leader election
  // A shared row lock: a standby's takeover (an UPDATE of this row) waits until this transaction ends.
  PARSYN_PREPARE(
      q, "SELECT epoch, holder, holder_url FROM coordinator_lease WHERE id = 1" + std::string(db_->SharedRowLock()));
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (row && q->Int(0) == fencing_epoch_) return Status::Ok();
  const std::string now_held =
      row ? "the leader is " + q->Text(1) + " (" + q->Text(2) + ") at epoch " + std::to_string(q->Int(0)) : "no leader";
  if (fencing_epoch_ < 0) {
    return FailedPreconditionError("fenced: this coordinator is not the leader (" + now_held + "); write refused");
  }
  return FailedPreconditionError("fenced: this coordinator's leadership (epoch " + std::to_string(fencing_epoch_) +
                                 ") has passed on (" + now_held + "); write refused");
}

// ---- artifacts

Status SqlMetadataStore::AddJobArtifact(const JobArtifact& artifact) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "INSERT INTO job_artifacts (job_id, name, blob_key, size_bytes, sha256, created_at_ms) "
                 "VALUES ($1, $2, $3, $4, $5, $6)");
  q->Bind(artifact.job_id, artifact.name, artifact.blob_key, artifact.size_bytes, artifact.sha256,
          artifact.created_at_ms);
  Status s = q->Run();
  if (q->violated() == SqlConstraint::kForeignKey) return NotFoundError(JobName(artifact.job_id) + " not found");
  if (s.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError(JobName(artifact.job_id) + " already has an artifact named '" + artifact.name + "'");
  }
  PARSYN_RETURN_IF_ERROR(s);
  return txn.CommitIfBegun();
}

StatusOr<std::vector<JobArtifact>> SqlMetadataStore::ListJobArtifacts(int64_t job_id) {
  PARSYN_LOCK_AND_CONNECT();
  // By bytes, whatever the database's locale.
  PARSYN_PREPARE(q,
                 "SELECT job_id, name, blob_key, size_bytes, sha256, created_at_ms FROM job_artifacts "
                 "WHERE job_id = $1 ORDER BY name" +
                     std::string(db_->ByteOrder()));
  q->Bind(job_id);
  return ReadAll<JobArtifact>(*q, [](const SqlStatement& row) {
    return JobArtifact{row.Int(0), row.Text(1), row.Text(2), row.Int(3), row.Text(4), row.Int(5)};
  });
}

// ---- shards

Status SqlMetadataStore::CreateShards(int64_t job_id, std::span<const Shard> shards) {
  if (shards.empty()) return InvalidArgumentError(JobName(job_id) + ": no shards given");
  std::vector<bool> seen(shards.size(), false);
  std::set<int64_t> workers;
  for (const Shard& s : shards) {
    if (s.shard_index < 0 || static_cast<size_t>(s.shard_index) >= shards.size() || seen[s.shard_index]) {
      return InvalidArgumentError(JobName(job_id) + ": shard indices must be 0.." + std::to_string(shards.size() - 1) +
                                  " once each, got " + std::to_string(s.shard_index));
    }
    seen[s.shard_index] = true;
    if (s.worker_id && !workers.insert(*s.worker_id).second) {
      return InvalidArgumentError(JobName(job_id) + ": worker " + std::to_string(*s.worker_id) +
                                  " is given more than one shard");
    }
  }
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  PARSYN_RETURN_IF_ERROR(LoadJobLocked(job_id, /*for_update=*/true).status());
  {
    PARSYN_PREPARE(q, "SELECT 1 FROM shards WHERE job_id = $1 LIMIT 1");
    q->Bind(job_id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (row) return AlreadyExistsError(JobName(job_id) + " already has shards");
  }
  for (const Shard& s : shards) {
    PARSYN_PREPARE(q,
                   "INSERT INTO shards (job_id, shard_index, worker_id, blob_key, sha256, train_rows, "
                   "validation_rows, label_histogram) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)");
    q->Bind(job_id, s.shard_index, s.worker_id, s.blob_key, s.sha256, s.train_rows, s.validation_rows,
            s.label_histogram_json);
    Status st = q->Run();
    if (q->violated() == SqlConstraint::kForeignKey) {
      return NotFoundError("worker " + std::to_string(s.worker_id.value_or(0)) + " not found");
    }
    PARSYN_RETURN_IF_ERROR(st);
  }
  return txn.Commit();
}

StatusOr<std::vector<Shard>> SqlMetadataStore::ListShards(int64_t job_id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q,
                 "SELECT job_id, shard_index, worker_id, blob_key, sha256, train_rows, validation_rows, "
                 "label_histogram FROM shards WHERE job_id = $1 ORDER BY shard_index");
  q->Bind(job_id);
  return ReadAll<Shard>(*q, [](const SqlStatement& row) {
    return Shard{
        row.Int(0), static_cast<int32_t>(row.Int(1)), row.OptInt(2), row.Text(3), row.Text(4), row.Int(5), row.Int(6),
        row.Text(7)};
  });
}

Status SqlMetadataStore::AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  PARSYN_RETURN_IF_ERROR(AssignShardLocked(ShardAssignment{job_id, shard_index, worker_id}));
  return txn.Commit();
}

Status SqlMetadataStore::AssignShardLocked(const ShardAssignment& a) {
  const auto [job_id, shard_index, worker_id] = a;
  const std::string shard_name = "shard " + std::to_string(shard_index) + " of " + JobName(job_id);
  {
    // The job's row first: two assignments to one job queue here instead of both seeing the shard free.
    PARSYN_PREPARE(q, "SELECT 1 FROM jobs WHERE id = $1" + std::string(db_->RowLock()));
    q->Bind(job_id);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  {
    PARSYN_PREPARE(q, "SELECT worker_id FROM shards WHERE job_id = $1 AND shard_index = $2");
    q->Bind(job_id, shard_index);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return NotFoundError(shard_name + " not found");
    std::optional<int64_t> holder = q->OptInt(0);
    if (holder == worker_id) return Status::Ok();
    if (holder) return FailedPreconditionError(shard_name + " belongs to worker " + std::to_string(*holder));
  }
  {
    PARSYN_PREPARE(q, "SELECT shard_index FROM shards WHERE job_id = $1 AND worker_id = $2");
    q->Bind(job_id, worker_id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (row) {
      return FailedPreconditionError("worker " + std::to_string(worker_id) + " already holds shard " +
                                     std::to_string(q->Int(0)) + " of " + JobName(job_id));
    }
  }
  {
    PARSYN_PREPARE(q, "UPDATE shards SET worker_id = $3 WHERE job_id = $1 AND shard_index = $2");
    q->Bind(job_id, shard_index, worker_id);
    Status s = q->Run();
    if (q->violated() == SqlConstraint::kForeignKey) {
      return NotFoundError("worker " + std::to_string(worker_id) + " not found");
    }
    return s;
  }
}

}  // namespace parsyn::storage
