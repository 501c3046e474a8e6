#include "storage/sql/sql_schema.h"

#include <string>

#include "base/log.h"

namespace parsyn::storage {
namespace {

// Version 1: everything the coordinator persists (as SQLite's old version 7 and PostgreSQL's old version 6 had it).
// Enum columns hold the names ToString() gives; CHECKs keep anything else out. Timestamps are Unix milliseconds, but
// for the lease's expiry, which is the database's clock's (PostgreSQL only: a SQLite file has one coordinator).
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE settings (
  name TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE datasets (
  id {auto_id},
  name TEXT NOT NULL,
  format TEXT NOT NULL CHECK (format IN ('jsonl', 'csv')),
  kind TEXT NOT NULL CHECK (kind IN ('text', 'prompt_completion', 'tabular')),
  row_count BIGINT NOT NULL,
  size_bytes BIGINT NOT NULL,
  sha256 TEXT NOT NULL,
  blob_key TEXT NOT NULL UNIQUE,
  created_at_ms BIGINT NOT NULL
);
CREATE TABLE models (
  id {auto_id},
  name TEXT NOT NULL,
  model_type TEXT NOT NULL,
  config_json TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  created_at_ms BIGINT NOT NULL
);
CREATE TABLE model_files (
  model_id BIGINT NOT NULL REFERENCES models(id) ON DELETE CASCADE,
  path TEXT NOT NULL,
  blob_key TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  sha256 TEXT NOT NULL,
  PRIMARY KEY (model_id, path)
);
CREATE TABLE workers (
  id {auto_id},
  name TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('own', 'managed')),
  token_sha256 TEXT NOT NULL UNIQUE,
  device TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('offline', 'online', 'busy')),
  last_heartbeat_at_ms BIGINT,
  revoked BOOLEAN NOT NULL,
  created_at_ms BIGINT NOT NULL,
  trainers_json TEXT NOT NULL DEFAULT ''
);
CREATE TABLE jobs (
  id {auto_id},
  name TEXT NOT NULL,
  dataset_id BIGINT REFERENCES datasets(id),
  model_id BIGINT NOT NULL REFERENCES models(id),
  spec_json TEXT NOT NULL,
  status TEXT NOT NULL
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'stopped', 'cancelled')),
  failure_reason TEXT NOT NULL,
  current_round INTEGER NOT NULL,
  committed_round INTEGER NOT NULL,
  consecutive_failed_rounds INTEGER NOT NULL,
  created_at_ms BIGINT NOT NULL,
  started_at_ms BIGINT,
  finished_at_ms BIGINT,
  status_reason TEXT NOT NULL DEFAULT '',
  initial_validation_loss DOUBLE PRECISION,
  final_validation_loss DOUBLE PRECISION,
  best_round INTEGER,
  best_validation_loss DOUBLE PRECISION,
  private_seed TEXT NOT NULL DEFAULT ''
);
CREATE INDEX jobs_by_status ON jobs(status);
CREATE TABLE job_artifacts (
  job_id BIGINT NOT NULL REFERENCES jobs(id),
  name TEXT NOT NULL,
  blob_key TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  sha256 TEXT NOT NULL,
  created_at_ms BIGINT NOT NULL,
  PRIMARY KEY (job_id, name)
);
CREATE TABLE shards (
  job_id BIGINT NOT NULL REFERENCES jobs(id),
  shard_index INTEGER NOT NULL,
  worker_id BIGINT REFERENCES workers(id),
  blob_key TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  train_rows BIGINT NOT NULL,
  validation_rows BIGINT NOT NULL,
  label_histogram TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job_id, shard_index),
  UNIQUE (job_id, worker_id)
);
CREATE TABLE rounds (
  job_id BIGINT NOT NULL REFERENCES jobs(id),
  round INTEGER NOT NULL CHECK (round >= 1),
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  status TEXT NOT NULL CHECK (status IN ('running', 'committed', 'failed')),
  started_at_ms BIGINT NOT NULL,
  ended_at_ms BIGINT,
  train_loss DOUBLE PRECISION,
  validation_loss DOUBLE PRECISION,
  bytes_moved BIGINT NOT NULL,
  global_blob_key TEXT NOT NULL,
  global_sha256 TEXT NOT NULL,
  failure_reason TEXT NOT NULL,
  PRIMARY KEY (job_id, round, attempt)
);
CREATE TABLE round_participants (
  job_id BIGINT NOT NULL,
  round INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  worker_id BIGINT NOT NULL REFERENCES workers(id),
  PRIMARY KEY (job_id, round, attempt, worker_id),
  FOREIGN KEY (job_id, round, attempt) REFERENCES rounds(job_id, round, attempt)
);
CREATE TABLE round_updates (
  job_id BIGINT NOT NULL,
  round INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  worker_id BIGINT NOT NULL REFERENCES workers(id),
  blob_key TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  num_samples BIGINT NOT NULL,
  train_loss DOUBLE PRECISION,
  metrics_json TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('accepted', 'rejected')),
  reject_reason TEXT NOT NULL,
  received_at_ms BIGINT NOT NULL,
  PRIMARY KEY (job_id, round, attempt, worker_id),
  FOREIGN KEY (job_id, round, attempt) REFERENCES rounds(job_id, round, attempt)
);
CREATE TABLE metric_points (
  id {auto_id},
  job_id BIGINT NOT NULL REFERENCES jobs(id),
  round INTEGER NOT NULL,
  worker_id BIGINT NOT NULL REFERENCES workers(id),
  step BIGINT NOT NULL,
  loss DOUBLE PRECISION,
  throughput DOUBLE PRECISION,
  utilization DOUBLE PRECISION,
  time_ms BIGINT NOT NULL
);
CREATE INDEX metric_points_by_job ON metric_points(job_id, time_ms);
CREATE INDEX metric_points_by_job_id ON metric_points(job_id, id);
CREATE TABLE job_events (
  id {auto_id},
  job_id BIGINT NOT NULL REFERENCES jobs(id),
  type TEXT NOT NULL,
  payload_json TEXT NOT NULL,
  time_ms BIGINT NOT NULL
);
CREATE INDEX job_events_by_job ON job_events(job_id, id);
CREATE INDEX job_events_by_type ON job_events(job_id, type, id);
CREATE TABLE coordinator_lease (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  holder TEXT NOT NULL,
  holder_url TEXT NOT NULL,
  epoch BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL
);
)sql";

// Rounds record their bytes down to the workers and up from them; bytes_moved stays their sum. Rows written before
// keep NULL: their split is unknown.
constexpr std::string_view kSchemaV2 = R"sql(
ALTER TABLE rounds ADD COLUMN bytes_down BIGINT;
ALTER TABLE rounds ADD COLUMN bytes_up BIGINT;
)sql";

// An asynchronous job's updates record the committed round whose global each trained on. Rows written before, and a
// synchronous job's, keep NULL (their round - 1).
constexpr std::string_view kSchemaV3 = R"sql(
ALTER TABLE round_updates ADD COLUMN trained_on_round INTEGER;
)sql";

// The audit log (coordinator/audit_chain.h): each record whole, in chain order, with the members its filters read.
constexpr std::string_view kSchemaV4 = R"sql(
CREATE TABLE audit_records (
  seq BIGINT PRIMARY KEY,
  time_ms BIGINT NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  outcome TEXT NOT NULL,
  record_json TEXT NOT NULL
);
CREATE INDEX audit_records_by_actor ON audit_records(actor, seq);
CREATE INDEX audit_records_by_action ON audit_records(action, seq);
)sql";

// Users and their API keys (only each key's sha256). User 1, "admin", is the first platform_admin: the admin key
// (settings.admin_key_sha256) is its key.
constexpr std::string_view kSchemaV5 = R"sql(
CREATE TABLE users (
  id {auto_id},
  name TEXT NOT NULL UNIQUE,
  platform_admin BOOLEAN NOT NULL,
  created_at_ms BIGINT NOT NULL
);
INSERT INTO users (name, platform_admin, created_at_ms) VALUES ('admin', TRUE, 0);
CREATE TABLE api_keys (
  id {auto_id},
  user_id BIGINT NOT NULL REFERENCES users(id),
  name TEXT NOT NULL,
  key_sha256 TEXT NOT NULL UNIQUE,
  created_at_ms BIGINT NOT NULL,
  expires_at_ms BIGINT,
  revoked_at_ms BIGINT
);
CREATE INDEX api_keys_by_user ON api_keys(user_id, id);
)sql";

// Projects and their members. Everything stored before belongs to project 1, "default"; a managed worker's project_id
// is not read (the managed pool serves every project).
constexpr std::string_view kSchemaV6 = R"sql(
CREATE TABLE projects (
  id {auto_id},
  name TEXT NOT NULL UNIQUE,
  created_at_ms BIGINT NOT NULL
);
INSERT INTO projects (name, created_at_ms) VALUES ('default', 0);
CREATE TABLE project_members (
  project_id BIGINT NOT NULL REFERENCES projects(id),
  user_id BIGINT NOT NULL REFERENCES users(id),
  role TEXT NOT NULL CHECK (role IN ('viewer', 'editor', 'owner')),
  PRIMARY KEY (project_id, user_id)
);
ALTER TABLE datasets ADD COLUMN project_id BIGINT NOT NULL DEFAULT 1 REFERENCES projects(id);
ALTER TABLE models ADD COLUMN project_id BIGINT NOT NULL DEFAULT 1 REFERENCES projects(id);
ALTER TABLE workers ADD COLUMN project_id BIGINT NOT NULL DEFAULT 1 REFERENCES projects(id);
ALTER TABLE jobs ADD COLUMN project_id BIGINT NOT NULL DEFAULT 1 REFERENCES projects(id);
CREATE INDEX datasets_by_project ON datasets(project_id, id);
CREATE INDEX models_by_project ON models(project_id, id);
CREATE INDEX jobs_by_project ON jobs(project_id, id);
ALTER TABLE audit_records ADD COLUMN project_id BIGINT NOT NULL DEFAULT 0;
CREATE INDEX audit_records_by_project ON audit_records(project_id, seq);
)sql";

constexpr Migration kMigrations[] = {{1, kSchemaV1}, {2, kSchemaV2}, {3, kSchemaV3},
                                     {4, kSchemaV4}, {5, kSchemaV5}, {6, kSchemaV6}};

constexpr std::string_view kAutoIdToken = "{auto_id}";

// `sql` with "{auto_id}" written as `db`'s id column type.
std::string ForConnection(std::string_view sql, const SqlConnection& db) {
  std::string out(sql);
  for (size_t at = out.find(kAutoIdToken); at != std::string::npos; at = out.find(kAutoIdToken, at)) {
    out.replace(at, kAutoIdToken.size(), db.AutoIdType());
  }
  return out;
}

// The single row of a one-column version table; 0 when it has none.
StatusOr<int> ReadVersionRow(SqlConnection& db, std::string_view table) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<SqlStatement> q, db.Prepare("SELECT version FROM " + std::string(table)));
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  return row ? static_cast<int>(q->Int(0)) : 0;
}

Status TooNew(const SqlConnection& db, std::string_view what, int version, int known) {
  return FailedPreconditionError(db.Describe() + " has " + std::string(what) + " " + std::to_string(version) +
                                 ", newer than this build's " + std::to_string(known) + "; use a newer parsyn");
}

// In the caller's transaction: brings a database at one of its kind's old versions (`schema_version` 1..) to shared
// version 1 and retires `schema_version`. Returns the shared version the database is now at: 1, or 0 for a database
// without any schema yet.
StatusOr<int> AdoptLegacySchema(SqlConnection& db) {
  PARSYN_RETURN_IF_ERROR(db.Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                                 "reading the old schema version"));
  PARSYN_ASSIGN_OR_RETURN(const int legacy, ReadVersionRow(db, "schema_version"));
  const std::span<const Migration> steps = db.LegacyMigrations();
  const int last = steps.back().version;
  if (legacy > last) return TooNew(db, "old schema version", legacy, last);
  int shared = 0;
  if (legacy > 0) {
    for (const Migration& step : steps) {
      if (step.version <= legacy) continue;
      Status applied = db.Exec(step.sql, "applying old migration " + std::to_string(step.version));
      if (!applied.ok()) return InternalError(applied.message());
    }
    Status adopted = db.Exec(db.LegacyToSharedSql(), "moving to the shared schema version 1");
    if (!adopted.ok()) return InternalError(adopted.message());
    PARSYN_LOG_INFO("metadata store {}: old schema version {} is now shared version 1", db.Describe(), legacy);
    shared = 1;
  }
  PARSYN_RETURN_IF_ERROR(db.Exec("DELETE FROM schema_version; INSERT INTO schema_version VALUES (" +
                                     std::to_string(kRetiredLegacySchemaVersion) + ")",
                                 "retiring the old schema version"));
  return shared;
}

// Creates `parsyn_schema_version` on a database's first open by this build, adopting an old schema if there is one.
Status InitialiseSchemaVersion(SqlConnection& db) {
  SqlTransaction txn(db);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(db.LockSchema());
  PARSYN_RETURN_IF_ERROR(db.Exec("CREATE TABLE IF NOT EXISTS parsyn_schema_version (version INTEGER NOT NULL)",
                                 "creating parsyn_schema_version"));
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<SqlStatement> q, db.Prepare("SELECT 1 FROM parsyn_schema_version"));
  PARSYN_ASSIGN_OR_RETURN(bool initialised, q->Step());
  q.reset();
  if (initialised) return Status::Ok();
  PARSYN_ASSIGN_OR_RETURN(const int version, AdoptLegacySchema(db));
  PARSYN_RETURN_IF_ERROR(db.Exec("INSERT INTO parsyn_schema_version VALUES (" + std::to_string(version) + ")",
                                 "initialising parsyn_schema_version"));
  return txn.Commit();
}

}  // namespace

std::span<const Migration> SqlMigrations() { return kMigrations; }

StatusOr<int> ReadSchemaVersion(SqlConnection& db) { return ReadVersionRow(db, "parsyn_schema_version"); }

Status MigrateSchema(SqlConnection& db, std::span<const Migration> migrations) {
  for (size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return InternalError("migration list is not numbered 1..n (entry " + std::to_string(i) + " has version " +
                           std::to_string(migrations[i].version) + ")");
    }
  }
  PARSYN_RETURN_IF_ERROR(InitialiseSchemaVersion(db));
  const int known = static_cast<int>(migrations.size());
  for (const Migration& migration : migrations) {
    SqlTransaction txn(db);
    PARSYN_RETURN_IF_ERROR(txn.Begin());
    // Read under the lock: another process may have migrated since we looked.
    PARSYN_RETURN_IF_ERROR(db.LockSchema());
    PARSYN_ASSIGN_OR_RETURN(int current, ReadSchemaVersion(db));
    if (current > known) return TooNew(db, "schema version", current, known);
    if (current >= migration.version) continue;
    Status applied =
        db.Exec(ForConnection(migration.sql, db), "applying migration " + std::to_string(migration.version));
    if (!applied.ok()) return InternalError(applied.message());
    PARSYN_RETURN_IF_ERROR(db.Exec("UPDATE parsyn_schema_version SET version = " + std::to_string(migration.version),
                                   "bumping the schema version"));
    PARSYN_RETURN_IF_ERROR(txn.Commit());
    PARSYN_LOG_INFO("metadata store {}: applied schema migration {}", db.Describe(), migration.version);
  }
  PARSYN_ASSIGN_OR_RETURN(int current, ReadSchemaVersion(db));
  if (current > known) return TooNew(db, "schema version", current, known);
  return Status::Ok();
}

}  // namespace parsyn::storage
