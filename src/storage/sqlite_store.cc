#include "storage/sqlite_store.h"

#include <algorithm>
#include <map>
#include <set>
#include <type_traits>

#include "base/log.h"
#include "storage/disk_full.h"

namespace parsyn::storage {
namespace {

constexpr int kBusyTimeoutMs = 5000;

// Version 1: everything the coordinator persists. Enum columns hold the names ToString() gives; CHECKs keep
// anything else out. Timestamps are Unix milliseconds.
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE settings (
  name TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE datasets (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  format TEXT NOT NULL CHECK (format IN ('jsonl', 'csv')),
  kind TEXT NOT NULL CHECK (kind IN ('text', 'prompt_completion', 'tabular')),
  row_count INTEGER NOT NULL,
  size_bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  blob_key TEXT NOT NULL UNIQUE,
  created_at_ms INTEGER NOT NULL
);
CREATE TABLE models (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  model_type TEXT NOT NULL,
  config_json TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL
);
CREATE TABLE model_files (
  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
  path TEXT NOT NULL,
  blob_key TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  PRIMARY KEY (model_id, path)
);
CREATE TABLE workers (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('own', 'managed')),
  token_sha256 TEXT NOT NULL UNIQUE,
  device TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('offline', 'online', 'busy')),
  last_heartbeat_at_ms INTEGER,
  revoked INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL
);
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  dataset_id INTEGER NOT NULL REFERENCES datasets(id),
  model_id INTEGER NOT NULL REFERENCES models(id),
  spec_json TEXT NOT NULL,
  status TEXT NOT NULL
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'stopped', 'cancelled')),
  failure_reason TEXT NOT NULL,
  current_round INTEGER NOT NULL,
  committed_round INTEGER NOT NULL,
  consecutive_failed_rounds INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  started_at_ms INTEGER,
  finished_at_ms INTEGER
);
CREATE INDEX jobs_by_status ON jobs(status);
CREATE TABLE job_artifacts (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  name TEXT NOT NULL,
  blob_key TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, name)
);
CREATE TABLE shards (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  shard_index INTEGER NOT NULL,
  worker_id INTEGER REFERENCES workers(id),
  blob_key TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  train_rows INTEGER NOT NULL,
  validation_rows INTEGER NOT NULL,
  PRIMARY KEY (job_id, shard_index),
  UNIQUE (job_id, worker_id)
);
CREATE TABLE rounds (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  round INTEGER NOT NULL CHECK (round >= 1),
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  status TEXT NOT NULL CHECK (status IN ('running', 'committed', 'failed')),
  started_at_ms INTEGER NOT NULL,
  ended_at_ms INTEGER,
  train_loss REAL,
  validation_loss REAL,
  bytes_moved INTEGER NOT NULL,
  global_blob_key TEXT NOT NULL,
  global_sha256 TEXT NOT NULL,
  failure_reason TEXT NOT NULL,
  PRIMARY KEY (job_id, round, attempt)
);
CREATE TABLE round_participants (
  job_id INTEGER NOT NULL,
  round INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  worker_id INTEGER NOT NULL REFERENCES workers(id),
  PRIMARY KEY (job_id, round, attempt, worker_id),
  FOREIGN KEY (job_id, round, attempt) REFERENCES rounds(job_id, round, attempt)
);
CREATE TABLE round_updates (
  job_id INTEGER NOT NULL,
  round INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  worker_id INTEGER NOT NULL REFERENCES workers(id),
  blob_key TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  num_samples INTEGER NOT NULL,
  train_loss REAL,
  metrics_json TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('accepted', 'rejected')),
  reject_reason TEXT NOT NULL,
  received_at_ms INTEGER NOT NULL,
  PRIMARY KEY (job_id, round, attempt, worker_id),
  FOREIGN KEY (job_id, round, attempt) REFERENCES rounds(job_id, round, attempt)
);
CREATE TABLE metric_points (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  round INTEGER NOT NULL,
  worker_id INTEGER NOT NULL REFERENCES workers(id),
  step INTEGER NOT NULL,
  loss REAL,
  throughput REAL,
  utilization REAL,
  time_ms INTEGER NOT NULL
);
CREATE INDEX metric_points_by_job ON metric_points(job_id, time_ms);
CREATE TABLE job_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  type TEXT NOT NULL,
  payload_json TEXT NOT NULL,
  time_ms INTEGER NOT NULL
);
CREATE INDEX job_events_by_job ON job_events(job_id, id);
)sql";

// Version 2: the validation losses of a job's weights. Before it, a round's validation_loss was the loss of the global
// the round started from (round - 1's) and the final evaluation's loss was only an event: each loss moves to the round
// whose global it measured, and the job gets its initial, final and best figures.
constexpr std::string_view kSchemaV2 = R"sql(
ALTER TABLE jobs ADD COLUMN status_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN initial_validation_loss REAL;
ALTER TABLE jobs ADD COLUMN final_validation_loss REAL;
ALTER TABLE jobs ADD COLUMN best_round INTEGER;
ALTER TABLE jobs ADD COLUMN best_validation_loss REAL;
UPDATE jobs SET status_reason = failure_reason WHERE status = 'failed';
CREATE TEMP TABLE v1_round_losses AS
  SELECT job_id, round, validation_loss FROM rounds WHERE status = 'committed' AND validation_loss IS NOT NULL;
UPDATE jobs SET initial_validation_loss =
  (SELECT validation_loss FROM v1_round_losses o WHERE o.job_id = jobs.id AND o.round = 1);
UPDATE rounds SET validation_loss =
  (SELECT validation_loss FROM v1_round_losses o WHERE o.job_id = rounds.job_id AND o.round = rounds.round + 1)
  WHERE status = 'committed';
UPDATE rounds SET validation_loss =
  (SELECT json_extract(e.payload_json, '$.validation_loss') FROM job_events e
   WHERE e.job_id = rounds.job_id AND e.type = 'global_evaluated'
     AND json_extract(e.payload_json, '$.global_round') = rounds.round
   ORDER BY e.id DESC LIMIT 1)
  WHERE status = 'committed' AND validation_loss IS NULL;
UPDATE rounds SET validation_loss = NULL WHERE status != 'committed';
UPDATE jobs SET final_validation_loss =
  (SELECT validation_loss FROM rounds r
   WHERE r.job_id = jobs.id AND r.round = jobs.committed_round AND r.status = 'committed')
  WHERE status = 'succeeded';
UPDATE jobs SET best_round =
  (SELECT round FROM rounds r WHERE r.job_id = jobs.id AND r.status = 'committed' AND r.validation_loss IS NOT NULL
   ORDER BY r.validation_loss, r.round LIMIT 1);
UPDATE jobs SET best_validation_loss =
  (SELECT validation_loss FROM rounds r WHERE r.job_id = jobs.id AND r.round = jobs.best_round
     AND r.status = 'committed');
DROP TABLE v1_round_losses;
)sql";

// Version 3: a job over the workers' own data (data.source "workers") has no dataset: jobs.dataset_id may be NULL.
// SQLite cannot drop a NOT NULL in place, so the table is rebuilt (migrations run with foreign keys off; see Open).
constexpr std::string_view kSchemaV3 = R"sql(
CREATE TABLE jobs_rebuilt (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  dataset_id INTEGER REFERENCES datasets(id),
  model_id INTEGER NOT NULL REFERENCES models(id),
  spec_json TEXT NOT NULL,
  status TEXT NOT NULL
    CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'stopped', 'cancelled')),
  failure_reason TEXT NOT NULL,
  current_round INTEGER NOT NULL,
  committed_round INTEGER NOT NULL,
  consecutive_failed_rounds INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  started_at_ms INTEGER,
  finished_at_ms INTEGER,
  status_reason TEXT NOT NULL DEFAULT '',
  initial_validation_loss REAL,
  final_validation_loss REAL,
  best_round INTEGER,
  best_validation_loss REAL
);
INSERT INTO jobs_rebuilt SELECT * FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_rebuilt RENAME TO jobs;
CREATE INDEX jobs_by_status ON jobs(status);
)sql";

// Version 4: each shard's label histogram (distributed.partition); '' for the shards of older jobs.
constexpr std::string_view kSchemaV4 = R"sql(
ALTER TABLE shards ADD COLUMN label_histogram TEXT NOT NULL DEFAULT '';
)sql";

// Version 5: the trainers each worker last announced (its hello's "trainers", JSON text); '' before any.
constexpr std::string_view kSchemaV5 = R"sql(
ALTER TABLE workers ADD COLUMN trainers_json TEXT NOT NULL DEFAULT '';
)sql";

// Version 6: each job's private seed (storage::TrainingJob::private_seed), drawn for the jobs already stored.
constexpr std::string_view kSchemaV6 = R"sql(
ALTER TABLE jobs ADD COLUMN private_seed TEXT NOT NULL DEFAULT '';
UPDATE jobs SET private_seed = lower(hex(randomblob(32)));
)sql";

// Version 7: a job's events of one type (its warnings) are read through an index, whatever else the job holds.
constexpr std::string_view kSchemaV7 = R"sql(
CREATE INDEX job_events_by_type ON job_events(job_id, type, id);
)sql";

constexpr Migration kMigrations[] = {{1, kSchemaV1}, {2, kSchemaV2}, {3, kSchemaV3}, {4, kSchemaV4},
                                     {5, kSchemaV5}, {6, kSchemaV6}, {7, kSchemaV7}};

struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using StmtPtr = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// Maps a failed SQLite call to a Status; `context` says what was being done.
Status SqliteError(sqlite3* db, int rc, std::string_view context) {
  std::string message = std::string(context) + ": " + sqlite3_errmsg(db) + " (sqlite " + std::to_string(rc) + ")";
  switch (rc) {
    case SQLITE_CONSTRAINT_PRIMARYKEY:
    case SQLITE_CONSTRAINT_UNIQUE: return AlreadyExistsError(std::move(message));
    case SQLITE_CONSTRAINT_FOREIGNKEY: return FailedPreconditionError(std::move(message));
    default: break;
  }
  // Out of space (SQLITE_FULL, or an I/O error whose cause was ENOSPC/EDQUOT): say so, naming the database file.
  if ((rc & 0xff) == SQLITE_FULL || ((rc & 0xff) == SQLITE_IOERR && IsDiskFullErrno(sqlite3_system_errno(db)))) {
    const char* file = sqlite3_db_filename(db, "main");
    return DiskFullError(file != nullptr && *file != '\0' ? file : "the metadata store", message);
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PROTOCOL: return UnavailableError(std::move(message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return DataLossError(std::move(message));
    case SQLITE_CONSTRAINT: return InvalidArgumentError(std::move(message));
    default: return InternalError(std::move(message));
  }
}

Status Exec(sqlite3* db, std::string_view sql, std::string_view context) {
  int rc = sqlite3_exec(db, std::string(sql).c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db, sqlite3_extended_errcode(db), context);
  return Status::Ok();
}

// One use of a prepared statement: binds parameters, steps, reads columns, and resets the statement when done so
// the cache can hand it out again.
class Query {
 public:
  Query(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~Query() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  // Binds the arguments to ?1, ?2, ... in order. std::nullopt binds NULL.
  template <typename... Args>
  Query& Bind(const Args&... args) {
    int index = 0;
    (BindOne(++index, args), ...);
    return *this;
  }

  // True with a row to read, false when done.
  StatusOr<bool> Step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    error_code_ = sqlite3_extended_errcode(db_);
    return SqliteError(db_, error_code_, "sqlite statement failed");
  }
  // Runs a statement that returns no rows.
  Status Run() { return Step().status(); }
  // The extended error code of the last failed Step(), for callers that turn a constraint into a better message.
  int error_code() const { return error_code_; }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::optional<int64_t> OptInt(int col) const { return IsNull(col) ? std::nullopt : std::optional(Int(col)); }
  std::optional<double> OptReal(int col) const { return IsNull(col) ? std::nullopt : std::optional(Real(col)); }
  std::string Text(int col) const {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    return text ? std::string(reinterpret_cast<const char*>(text), sqlite3_column_bytes(stmt_, col)) : "";
  }

 private:
  template <typename T>
  void BindOne(int index, const T& value) {
    // Bind errors can only be programmer errors (index out of range); they surface as a failed Step().
    if constexpr (std::is_same_v<T, std::nullopt_t>) {
      sqlite3_bind_null(stmt_, index);
    } else if constexpr (std::is_same_v<T, bool>) {
      sqlite3_bind_int64(stmt_, index, value ? 1 : 0);
    } else if constexpr (std::is_integral_v<T>) {
      sqlite3_bind_int64(stmt_, index, static_cast<int64_t>(value));
    } else if constexpr (std::is_floating_point_v<T>) {
      sqlite3_bind_double(stmt_, index, value);
    } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
      std::string_view s = value;
      sqlite3_bind_text(stmt_, index, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
    } else {  // std::optional<U>
      if (value) {
        BindOne(index, *value);
      } else {
        sqlite3_bind_null(stmt_, index);
      }
    }
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int error_code_ = SQLITE_OK;
};

// BEGIN IMMEDIATE ... COMMIT, rolled back when it goes out of scope uncommitted. IMMEDIATE takes the write lock at
// the start, so a transaction never fails half-way for want of it.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) Exec(db_, "ROLLBACK", "rolling back").IgnoreError();  // a failed rollback leaves nothing to do
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  Status Begin() {
    PARSYN_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE", "starting a transaction"));
    open_ = true;
    return Status::Ok();
  }
  Status Commit() {
    Status s = Exec(db_, "COMMIT", "committing");
    if (s.ok()) open_ = false;
    return s;
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

std::string JobName(int64_t id) { return "training job " + std::to_string(id); }
std::string RoundName(int64_t job_id, int32_t round, int32_t attempt) {
  return "round " + std::to_string(round) + " attempt " + std::to_string(attempt) + " of " + JobName(job_id);
}

// A stored enum name that does not parse means the file was edited or damaged.
template <typename E>
StatusOr<E> ParseStored(StatusOr<E> parsed, std::string_view where) {
  if (!parsed.ok()) return DataLossError(std::string(where) + ": " + parsed.status().message());
  return parsed;
}

constexpr const char* kDatasetColumns =
    "id, name, format, kind, row_count, size_bytes, sha256, blob_key, created_at_ms";
constexpr const char* kModelColumns = "id, name, model_type, config_json, size_bytes, created_at_ms";
constexpr const char* kWorkerColumns =
    "id, name, kind, token_sha256, device, status, last_heartbeat_at_ms, revoked, created_at_ms, trainers_json";
constexpr const char* kJobColumns =
    "id, name, dataset_id, model_id, spec_json, status, failure_reason, current_round, committed_round, "
    "consecutive_failed_rounds, created_at_ms, started_at_ms, finished_at_ms, status_reason, "
    "initial_validation_loss, final_validation_loss, best_round, best_validation_loss, private_seed";
constexpr const char* kRoundColumns =
    "job_id, round, attempt, status, started_at_ms, ended_at_ms, train_loss, validation_loss, bytes_moved, "
    "global_blob_key, global_sha256, failure_reason";
constexpr const char* kUpdateColumns =
    "job_id, round, attempt, worker_id, blob_key, sha256, size_bytes, num_samples, train_loss, metrics_json, status, "
    "reject_reason, received_at_ms";

StatusOr<Dataset> ReadDataset(const Query& q) {
  Dataset d;
  d.id = q.Int(0);
  d.name = q.Text(1);
  PARSYN_ASSIGN_OR_RETURN(d.format, ParseStored(ParseDatasetFormat(q.Text(2)), "datasets row"));
  PARSYN_ASSIGN_OR_RETURN(d.kind, ParseStored(ParseDatasetKind(q.Text(3)), "datasets row"));
  d.row_count = q.Int(4);
  d.size_bytes = q.Int(5);
  d.sha256 = q.Text(6);
  d.blob_key = q.Text(7);
  d.created_at_ms = q.Int(8);
  return d;
}

Model ReadModel(const Query& q) {
  Model m;
  m.id = q.Int(0);
  m.name = q.Text(1);
  m.model_type = q.Text(2);
  m.config_json = q.Text(3);
  m.size_bytes = q.Int(4);
  m.created_at_ms = q.Int(5);
  return m;
}

StatusOr<Worker> ReadWorker(const Query& q) {
  Worker w;
  w.id = q.Int(0);
  w.name = q.Text(1);
  PARSYN_ASSIGN_OR_RETURN(w.kind, ParseStored(ParseWorkerKind(q.Text(2)), "workers row"));
  w.token_sha256 = q.Text(3);
  w.device = q.Text(4);
  PARSYN_ASSIGN_OR_RETURN(w.status, ParseStored(ParseWorkerStatus(q.Text(5)), "workers row"));
  w.last_heartbeat_at_ms = q.OptInt(6);
  w.revoked = q.Int(7) != 0;
  w.created_at_ms = q.Int(8);
  w.trainers_json = q.Text(9);
  return w;
}

StatusOr<TrainingJob> ReadJob(const Query& q) {
  TrainingJob j;
  j.id = q.Int(0);
  j.name = q.Text(1);
  j.dataset_id = q.OptInt(2).value_or(0);  // NULL: the job trains on the workers' own data
  j.model_id = q.Int(3);
  j.spec_json = q.Text(4);
  PARSYN_ASSIGN_OR_RETURN(j.status, ParseStored(ParseJobStatus(q.Text(5)), "jobs row"));
  j.failure_reason = q.Text(6);
  j.current_round = static_cast<int32_t>(q.Int(7));
  j.committed_round = static_cast<int32_t>(q.Int(8));
  j.consecutive_failed_rounds = static_cast<int32_t>(q.Int(9));
  j.created_at_ms = q.Int(10);
  j.started_at_ms = q.OptInt(11);
  j.finished_at_ms = q.OptInt(12);
  j.status_reason = q.Text(13);
  j.initial_validation_loss = q.OptReal(14);
  j.final_validation_loss = q.OptReal(15);
  if (std::optional<int64_t> best = q.OptInt(16)) j.best_round = static_cast<int32_t>(*best);
  j.best_validation_loss = q.OptReal(17);
  j.private_seed = q.Text(18);
  return j;
}

StatusOr<Round> ReadRound(const Query& q) {
  Round r;
  r.job_id = q.Int(0);
  r.round = static_cast<int32_t>(q.Int(1));
  r.attempt = static_cast<int32_t>(q.Int(2));
  PARSYN_ASSIGN_OR_RETURN(r.status, ParseStored(ParseRoundStatus(q.Text(3)), "rounds row"));
  r.started_at_ms = q.Int(4);
  r.ended_at_ms = q.OptInt(5);
  r.train_loss = q.OptReal(6);
  r.validation_loss = q.OptReal(7);
  r.bytes_moved = q.Int(8);
  r.global_blob_key = q.Text(9);
  r.global_sha256 = q.Text(10);
  r.failure_reason = q.Text(11);
  return r;
}

StatusOr<RoundUpdate> ReadUpdate(const Query& q) {
  RoundUpdate u;
  u.job_id = q.Int(0);
  u.round = static_cast<int32_t>(q.Int(1));
  u.attempt = static_cast<int32_t>(q.Int(2));
  u.worker_id = q.Int(3);
  u.blob_key = q.Text(4);
  u.sha256 = q.Text(5);
  u.size_bytes = q.Int(6);
  u.num_samples = q.Int(7);
  u.train_loss = q.OptReal(8);
  u.metrics_json = q.Text(9);
  PARSYN_ASSIGN_OR_RETURN(u.status, ParseStored(ParseUpdateStatus(q.Text(10)), "round_updates row"));
  u.reject_reason = q.Text(11);
  u.received_at_ms = q.Int(12);
  return u;
}

}  // namespace

std::span<const Migration> SqliteMigrations() { return kMigrations; }

class SqliteMetadataStore::StatementCache {
 public:
  explicit StatementCache(sqlite3* db) : db_(db) {}

  // A Query over the cached statement for `sql`, prepared on first use. Statements are reused across calls, which
  // is safe because the store's mutex serialises every use of the connection.
  StatusOr<std::unique_ptr<Query>> Prepare(std::string_view sql) {
    auto it = statements_.find(sql);
    if (it == statements_.end()) {
      sqlite3_stmt* raw = nullptr;
      int rc =
          sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
      if (rc != SQLITE_OK) {
        return SqliteError(db_, sqlite3_extended_errcode(db_), "preparing '" + std::string(sql) + "'");
      }
      it = statements_.emplace(std::string(sql), StmtPtr(raw)).first;
    }
    return std::make_unique<Query>(db_, it->second.get());
  }

 private:
  sqlite3* db_;
  std::map<std::string, StmtPtr, std::less<>> statements_;
};

// Shorthand inside member functions: prepares `sql` into `var` or returns the error.
#define PARSYN_PREPARE(var, sql) PARSYN_ASSIGN_OR_RETURN(auto var, statements_->Prepare(sql))

SqliteMetadataStore::SqliteMetadataStore(std::unique_ptr<sqlite3, DbCloser> db)
    : db_(std::move(db)), statements_(std::make_unique<StatementCache>(db_.get())) {
  sqlite3_commit_hook(
      db_.get(),
      [](void* commits) {
        static_cast<std::atomic<int64_t>*>(commits)->fetch_add(1, std::memory_order_relaxed);
        return 0;  // 0: let the commit proceed
      },
      &commits_);
}

// The statements must be finalized before the connection closes.
SqliteMetadataStore::~SqliteMetadataStore() { statements_.reset(); }

namespace {

StatusOr<int> ReadSchemaVersion(sqlite3* db) {
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT version FROM schema_version", -1, &raw, nullptr) != SQLITE_OK) {
    return SqliteError(db, sqlite3_extended_errcode(db), "reading the schema version");
  }
  StmtPtr stmt(raw);
  int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_ROW) return static_cast<int>(sqlite3_column_int64(stmt.get(), 0));
  if (rc == SQLITE_DONE) return 0;
  return SqliteError(db, sqlite3_extended_errcode(db), "reading the schema version");
}

Status Migrate(sqlite3* db, const std::string& path, std::span<const Migration> migrations) {
  for (size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return InternalError("migration list is not numbered 1..n (entry " + std::to_string(i) + " has version " +
                           std::to_string(migrations[i].version) + ")");
    }
  }
  {
    Transaction txn(db);
    PARSYN_RETURN_IF_ERROR(txn.Begin());
    PARSYN_RETURN_IF_ERROR(
        Exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", "creating schema_version"));
    PARSYN_RETURN_IF_ERROR(Exec(db,
                                "INSERT INTO schema_version SELECT 0 WHERE NOT EXISTS "
                                "(SELECT 1 FROM schema_version)",
                                "initialising schema_version"));
    PARSYN_RETURN_IF_ERROR(txn.Commit());
  }
  const int known = static_cast<int>(migrations.size());
  for (const Migration& migration : migrations) {
    Transaction txn(db);
    PARSYN_RETURN_IF_ERROR(txn.Begin());
    // Read under the write lock: another process may have migrated since we looked.
    PARSYN_ASSIGN_OR_RETURN(int current, ReadSchemaVersion(db));
    if (current > known) {
      return FailedPreconditionError("database " + path + " has schema version " + std::to_string(current) +
                                     ", newer than this build's " + std::to_string(known) + "; use a newer parsyn");
    }
    if (current >= migration.version) continue;
    Status applied = Exec(db, migration.sql, "applying migration " + std::to_string(migration.version));
    if (!applied.ok()) return InternalError(applied.message());
    PARSYN_RETURN_IF_ERROR(
        Exec(db, "UPDATE schema_version SET version = " + std::to_string(migration.version), "bumping version"));
    PARSYN_RETURN_IF_ERROR(txn.Commit());
    PARSYN_LOG_INFO("metadata store {}: applied schema migration {}", path, migration.version);
  }
  PARSYN_ASSIGN_OR_RETURN(int current, ReadSchemaVersion(db));
  if (current > known) {
    return FailedPreconditionError("database " + path + " has schema version " + std::to_string(current) +
                                   ", newer than this build's " + std::to_string(known) + "; use a newer parsyn");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<SqliteMetadataStore>> SqliteMetadataStore::Open(const std::string& path,
                                                                         std::span<const Migration> migrations) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  std::unique_ptr<sqlite3, DbCloser> db(raw);
  if (rc != SQLITE_OK) {
    std::string message = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    return UnavailableError("opening metadata store " + path + ": " + message);
  }
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  // WAL lets readers (another `parsyn` reading the file) proceed during a write; FULL fsyncs the WAL on every
  // commit, so an acknowledged change survives power loss, not only a crash.
  PARSYN_RETURN_IF_ERROR(Exec(db.get(), "PRAGMA journal_mode=WAL", "enabling WAL"));
  PARSYN_RETURN_IF_ERROR(Exec(db.get(), "PRAGMA synchronous=FULL", "setting synchronous=FULL"));
  // Migrations run before foreign keys are enforced: rebuilding a table (drop, rename) must not cascade into the rows
  // that refer to it. foreign_key_check then proves the data still holds together.
  PARSYN_RETURN_IF_ERROR(Migrate(db.get(), path, migrations));
  {
    sqlite3_stmt* raw_check = nullptr;
    if (sqlite3_prepare_v2(db.get(), "PRAGMA foreign_key_check", -1, &raw_check, nullptr) != SQLITE_OK) {
      return SqliteError(db.get(), sqlite3_extended_errcode(db.get()), "checking foreign keys");
    }
    StmtPtr check(raw_check);
    if (sqlite3_step(check.get()) == SQLITE_ROW) {
      return InternalError("metadata store " + path + ": a row of table " +
                           reinterpret_cast<const char*>(sqlite3_column_text(check.get(), 0)) +
                           " refers to a missing row after the schema migrations");
    }
  }
  PARSYN_RETURN_IF_ERROR(Exec(db.get(), "PRAGMA foreign_keys=ON", "enabling foreign keys"));
  return std::unique_ptr<SqliteMetadataStore>(new SqliteMetadataStore(std::move(db)));
}

StatusOr<int> SqliteMetadataStore::SchemaVersion() {
  std::lock_guard lock(mu_);
  return ReadSchemaVersion(db_.get());
}

// ---- datasets

StatusOr<Dataset> SqliteMetadataStore::CreateDataset(const Dataset& dataset) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "INSERT INTO datasets (name, format, kind, row_count, size_bytes, sha256, blob_key, "
                 "created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  q->Bind(dataset.name, ToString(dataset.format), ToString(dataset.kind), dataset.row_count, dataset.size_bytes,
          dataset.sha256, dataset.blob_key, dataset.created_at_ms);
  Status s = q->Run();
  if (s.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("a dataset with blob key '" + dataset.blob_key + "' already exists");
  }
  PARSYN_RETURN_IF_ERROR(s);
  Dataset stored = dataset;
  stored.id = sqlite3_last_insert_rowid(db_.get());
  return stored;
}

StatusOr<Dataset> SqliteMetadataStore::GetDataset(int64_t id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kDatasetColumns + " FROM datasets WHERE id = ?1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("dataset " + std::to_string(id) + " not found");
  return ReadDataset(*q);
}

StatusOr<std::vector<Dataset>> SqliteMetadataStore::ListDatasets(const IdPage& page) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kDatasetColumns + " FROM datasets WHERE id > ?1 ORDER BY id LIMIT ?2");
  q->Bind(page.after_id, page.limit);
  std::vector<Dataset> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    PARSYN_ASSIGN_OR_RETURN(Dataset d, ReadDataset(*q));
    out.push_back(std::move(d));
  }
}

Status SqliteMetadataStore::DeleteDataset(int64_t id) {
  std::lock_guard lock(mu_);
  return DeleteUnlessUsedLocked("DELETE FROM datasets WHERE id = ?1", "dataset", id);
}

Status SqliteMetadataStore::DeleteUnlessUsedLocked(const char* sql, std::string_view what, int64_t id) {
  PARSYN_PREPARE(q, sql);
  q->Bind(id);
  Status s = q->Run();
  if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
    return FailedPreconditionError(std::string(what) + " " + std::to_string(id) + " is used by a training job");
  }
  PARSYN_RETURN_IF_ERROR(s);
  if (sqlite3_changes(db_.get()) == 0)
    return NotFoundError(std::string(what) + " " + std::to_string(id) + " not found");
  return Status::Ok();
}

// ---- models

StatusOr<Model> SqliteMetadataStore::CreateModel(const Model& model) {
  std::set<std::string_view> paths;
  for (const ModelFile& f : model.files) {
    if (!paths.insert(f.path).second) {
      return InvalidArgumentError("model file path '" + f.path + "' appears more than once");
    }
  }
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  Model stored = model;
  {
    PARSYN_PREPARE(q,
                   "INSERT INTO models (name, model_type, config_json, size_bytes, created_at_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5)");
    q->Bind(model.name, model.model_type, model.config_json, model.size_bytes, model.created_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
    stored.id = sqlite3_last_insert_rowid(db_.get());
  }
  for (const ModelFile& f : model.files) {
    PARSYN_PREPARE(q,
                   "INSERT INTO model_files (model_id, path, blob_key, size_bytes, sha256) "
                   "VALUES (?1, ?2, ?3, ?4, ?5)");
    q->Bind(stored.id, f.path, f.blob_key, f.size_bytes, f.sha256);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

StatusOr<Model> SqliteMetadataStore::GetModel(int64_t id) {
  std::lock_guard lock(mu_);
  Model m;
  {
    PARSYN_PREPARE(q, std::string("SELECT ") + kModelColumns + " FROM models WHERE id = ?1");
    q->Bind(id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return NotFoundError("model " + std::to_string(id) + " not found");
    m = ReadModel(*q);
  }
  PARSYN_PREPARE(q, "SELECT path, blob_key, size_bytes, sha256 FROM model_files WHERE model_id = ?1 ORDER BY path");
  q->Bind(id);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return m;
    m.files.push_back(ModelFile{q->Text(0), q->Text(1), q->Int(2), q->Text(3)});
  }
}

StatusOr<std::vector<Model>> SqliteMetadataStore::ListModels(const IdPage& page) {
  std::lock_guard lock(mu_);
  std::vector<Model> out;
  std::map<int64_t, size_t> index_of;
  {
    PARSYN_PREPARE(q, std::string("SELECT ") + kModelColumns + " FROM models WHERE id > ?1 ORDER BY id LIMIT ?2");
    q->Bind(page.after_id, page.limit);
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
                 "WHERE model_id > ?1 AND model_id <= ?2 ORDER BY model_id, path");
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

Status SqliteMetadataStore::DeleteModel(int64_t id) {
  std::lock_guard lock(mu_);
  return DeleteUnlessUsedLocked("DELETE FROM models WHERE id = ?1", "model", id);
}

// ---- workers

StatusOr<Worker> SqliteMetadataStore::CreateWorker(const Worker& worker) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "INSERT INTO workers (name, kind, token_sha256, device, status, last_heartbeat_at_ms, revoked, "
                 "created_at_ms, trainers_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  q->Bind(worker.name, ToString(worker.kind), worker.token_sha256, worker.device, ToString(worker.status),
          worker.last_heartbeat_at_ms, worker.revoked, worker.created_at_ms, worker.trainers_json);
  Status s = q->Run();
  if (s.code() == StatusCode::kAlreadyExists) return AlreadyExistsError("a worker with this token already exists");
  PARSYN_RETURN_IF_ERROR(s);
  Worker stored = worker;
  stored.id = sqlite3_last_insert_rowid(db_.get());
  return stored;
}

StatusOr<Worker> SqliteMetadataStore::GetWorker(int64_t id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE id = ?1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("worker " + std::to_string(id) + " not found");
  return ReadWorker(*q);
}

StatusOr<Worker> SqliteMetadataStore::FindWorkerByTokenHash(std::string_view token_sha256) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE token_sha256 = ?1");
  q->Bind(token_sha256);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  // The message never echoes the hash: it is a credential's fingerprint.
  if (!row) return NotFoundError("no worker has this token");
  return ReadWorker(*q);
}

StatusOr<std::vector<Worker>> SqliteMetadataStore::ListWorkers(const IdPage& page) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kWorkerColumns + " FROM workers WHERE id > ?1 ORDER BY id LIMIT ?2");
  q->Bind(page.after_id, page.limit);
  std::vector<Worker> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    PARSYN_ASSIGN_OR_RETURN(Worker w, ReadWorker(*q));
    out.push_back(std::move(w));
  }
}

Status SqliteMetadataStore::UpdateWorker(const Worker& worker) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "UPDATE workers SET name = ?2, device = ?3, status = ?4, last_heartbeat_at_ms = ?5, "
                 "revoked = ?6, trainers_json = ?7 WHERE id = ?1");
  q->Bind(worker.id, worker.name, worker.device, ToString(worker.status), worker.last_heartbeat_at_ms, worker.revoked,
          worker.trainers_json);
  PARSYN_RETURN_IF_ERROR(q->Run());
  if (sqlite3_changes(db_.get()) == 0) return NotFoundError("worker " + std::to_string(worker.id) + " not found");
  return Status::Ok();
}

Status SqliteMetadataStore::RecordWorkersSeen(std::span<const WorkerSeen> seen) {
  if (seen.empty()) return Status::Ok();
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  for (const WorkerSeen& w : seen) {
    PARSYN_PREPARE(q, "UPDATE workers SET last_heartbeat_at_ms = ?2 WHERE id = ?1");
    q->Bind(w.worker_id, w.last_heartbeat_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

// ---- admin key

Status SqliteMetadataStore::SetAdminKeyHash(std::string_view key_sha256) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "INSERT INTO settings (name, value) VALUES ('admin_key_sha256', ?1) "
                 "ON CONFLICT (name) DO UPDATE SET value = excluded.value");
  q->Bind(key_sha256);
  return q->Run();
}

StatusOr<std::string> SqliteMetadataStore::GetAdminKeyHash() {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, "SELECT value FROM settings WHERE name = 'admin_key_sha256'");
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("no admin API key has been set");
  return q->Text(0);
}

// ---- jobs

StatusOr<TrainingJob> SqliteMetadataStore::LoadJobLocked(int64_t job_id) {
  PARSYN_PREPARE(q, std::string("SELECT ") + kJobColumns + " FROM jobs WHERE id = ?1");
  q->Bind(job_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError(JobName(job_id) + " not found");
  return ReadJob(*q);
}

StatusOr<TrainingJob> SqliteMetadataStore::CreateJob(const TrainingJob& job) {
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  // Checked here rather than left to the foreign keys so the error names what is missing.
  for (auto [table, what, id] :
       {std::tuple{"datasets", "dataset", job.dataset_id}, std::tuple{"models", "model", job.model_id}}) {
    if (id == 0 && std::string_view(table) == "datasets") continue;  // no dataset: stored as NULL
    PARSYN_PREPARE(q, std::string("SELECT 1 FROM ") + table + " WHERE id = ?1");
    q->Bind(id);
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
                   "current_round, committed_round, consecutive_failed_rounds, created_at_ms, private_seed) "
                   "VALUES (?1, ?2, ?3, ?4, 'queued', '', 0, 0, 0, ?5, ?6)");
    q->Bind(job.name, job.dataset_id == 0 ? std::optional<int64_t>() : std::optional(job.dataset_id), job.model_id,
            job.spec_json, job.created_at_ms, job.private_seed);
    PARSYN_RETURN_IF_ERROR(q->Run());
    stored.id = sqlite3_last_insert_rowid(db_.get());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

StatusOr<TrainingJob> SqliteMetadataStore::GetJob(int64_t id) {
  std::lock_guard lock(mu_);
  return LoadJobLocked(id);
}

StatusOr<std::vector<TrainingJob>> SqliteMetadataStore::ListJobs(std::optional<JobStatus> status, const IdPage& page) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kJobColumns +
                        " FROM jobs WHERE (?1 IS NULL OR status = ?1) AND id > ?2 ORDER BY id LIMIT ?3");
  q->Bind(status ? std::optional<std::string_view>(ToString(*status)) : std::nullopt, page.after_id, page.limit);
  std::vector<TrainingJob> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    PARSYN_ASSIGN_OR_RETURN(TrainingJob j, ReadJob(*q));
    out.push_back(std::move(j));
  }
}

StatusOr<TrainingJob> SqliteMetadataStore::SetJobStatus(int64_t job_id, JobStatus status, int64_t time_ms,
                                                        std::string_view reason) {
  if (status == JobStatus::kQueued) {
    return FailedPreconditionError(JobName(job_id) + " cannot move back to queued");
  }
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(job_id));
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
                   "UPDATE jobs SET status = ?2, failure_reason = ?3, started_at_ms = ?4, finished_at_ms = ?5, "
                   "status_reason = ?6 WHERE id = ?1");
    q->Bind(job_id, ToString(job.status), job.failure_reason, job.started_at_ms, job.finished_at_ms, job.status_reason);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return job;
}

// ---- artifacts

Status SqliteMetadataStore::AddJobArtifact(const JobArtifact& artifact) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "INSERT INTO job_artifacts (job_id, name, blob_key, size_bytes, sha256, created_at_ms) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  q->Bind(artifact.job_id, artifact.name, artifact.blob_key, artifact.size_bytes, artifact.sha256,
          artifact.created_at_ms);
  Status s = q->Run();
  if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) return NotFoundError(JobName(artifact.job_id) + " not found");
  if (s.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError(JobName(artifact.job_id) + " already has an artifact named '" + artifact.name + "'");
  }
  return s;
}

StatusOr<std::vector<JobArtifact>> SqliteMetadataStore::ListJobArtifacts(int64_t job_id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "SELECT job_id, name, blob_key, size_bytes, sha256, created_at_ms FROM job_artifacts "
                 "WHERE job_id = ?1 ORDER BY name");
  q->Bind(job_id);
  std::vector<JobArtifact> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    out.push_back(JobArtifact{q->Int(0), q->Text(1), q->Text(2), q->Int(3), q->Text(4), q->Int(5)});
  }
}

// ---- shards

Status SqliteMetadataStore::CreateShards(int64_t job_id, std::span<const Shard> shards) {
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
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(LoadJobLocked(job_id).status());
  {
    PARSYN_PREPARE(q, "SELECT 1 FROM shards WHERE job_id = ?1 LIMIT 1");
    q->Bind(job_id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (row) return AlreadyExistsError(JobName(job_id) + " already has shards");
  }
  for (const Shard& s : shards) {
    PARSYN_PREPARE(q,
                   "INSERT INTO shards (job_id, shard_index, worker_id, blob_key, sha256, train_rows, "
                   "validation_rows, label_histogram) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
    q->Bind(job_id, s.shard_index, s.worker_id, s.blob_key, s.sha256, s.train_rows, s.validation_rows,
            s.label_histogram_json);
    Status st = q->Run();
    if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return NotFoundError("worker " + std::to_string(s.worker_id.value_or(0)) + " not found");
    }
    PARSYN_RETURN_IF_ERROR(st);
  }
  return txn.Commit();
}

StatusOr<std::vector<Shard>> SqliteMetadataStore::ListShards(int64_t job_id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "SELECT job_id, shard_index, worker_id, blob_key, sha256, train_rows, validation_rows, "
                 "label_histogram FROM shards WHERE job_id = ?1 ORDER BY shard_index");
  q->Bind(job_id);
  std::vector<Shard> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    out.push_back(Shard{q->Int(0), static_cast<int32_t>(q->Int(1)), q->OptInt(2), q->Text(3), q->Text(4), q->Int(5),
                        q->Int(6), q->Text(7)});
  }
}

Status SqliteMetadataStore::AssignShard(int64_t job_id, int32_t shard_index, int64_t worker_id) {
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(AssignShardLocked(ShardAssignment{job_id, shard_index, worker_id}));
  return txn.Commit();
}

Status SqliteMetadataStore::AssignShardLocked(const ShardAssignment& a) {
  const auto [job_id, shard_index, worker_id] = a;
  const std::string shard_name = "shard " + std::to_string(shard_index) + " of " + JobName(job_id);
  {
    PARSYN_PREPARE(q, "SELECT worker_id FROM shards WHERE job_id = ?1 AND shard_index = ?2");
    q->Bind(job_id, shard_index);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return NotFoundError(shard_name + " not found");
    std::optional<int64_t> holder = q->OptInt(0);
    if (holder == worker_id) return Status::Ok();
    if (holder) return FailedPreconditionError(shard_name + " belongs to worker " + std::to_string(*holder));
  }
  {
    PARSYN_PREPARE(q, "SELECT shard_index FROM shards WHERE job_id = ?1 AND worker_id = ?2");
    q->Bind(job_id, worker_id);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (row) {
      return FailedPreconditionError("worker " + std::to_string(worker_id) + " already holds shard " +
                                     std::to_string(q->Int(0)) + " of " + JobName(job_id));
    }
  }
  {
    PARSYN_PREPARE(q, "UPDATE shards SET worker_id = ?3 WHERE job_id = ?1 AND shard_index = ?2");
    q->Bind(job_id, shard_index, worker_id);
    Status s = q->Run();
    if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return NotFoundError("worker " + std::to_string(worker_id) + " not found");
    }
    return s;
  }
}

// ---- rounds

StatusOr<Round> SqliteMetadataStore::LoadRoundLocked(int64_t job_id, int32_t round, int32_t attempt) {
  PARSYN_PREPARE(
      q, std::string("SELECT ") + kRoundColumns + " FROM rounds WHERE job_id = ?1 AND round = ?2 AND attempt = ?3");
  q->Bind(job_id, round, attempt);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError(RoundName(job_id, round, attempt) + " not found");
  return ReadRound(*q);
}

Status SqliteMetadataStore::LoadParticipantsLocked(std::vector<Round>& rounds) {
  if (rounds.empty()) return Status::Ok();
  std::map<std::pair<int32_t, int32_t>, Round*> by_attempt;
  for (Round& r : rounds) by_attempt[{r.round, r.attempt}] = &r;
  PARSYN_PREPARE(q,
                 "SELECT round, attempt, worker_id FROM round_participants WHERE job_id = ?1 "
                 "ORDER BY round, attempt, worker_id");
  q->Bind(rounds.front().job_id);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return Status::Ok();
    auto it = by_attempt.find({static_cast<int32_t>(q->Int(0)), static_cast<int32_t>(q->Int(1))});
    if (it != by_attempt.end()) it->second->participants.push_back(q->Int(2));
  }
}

Status SqliteMetadataStore::StartRound(const Round& round) {
  const std::string name = RoundName(round.job_id, round.round, round.attempt);
  if (round.round < 1 || round.attempt < 1) {
    return InvalidArgumentError(name + ": round and attempt numbers start at 1");
  }
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(round.job_id));
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
                   "SELECT COALESCE(MAX(attempt), 0), COALESCE(SUM(status = 'running'), 0) FROM rounds "
                   "WHERE job_id = ?1 AND round = ?2");
    q->Bind(round.job_id, round.round);
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    int64_t last_attempt = row ? q->Int(0) : 0;
    int64_t running = row ? q->Int(1) : 0;
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
                   "INSERT INTO rounds (job_id, round, attempt, status, started_at_ms, bytes_moved, "
                   "global_blob_key, global_sha256, failure_reason) "
                   "VALUES (?1, ?2, ?3, 'running', ?4, 0, '', '', '')");
    q->Bind(round.job_id, round.round, round.attempt, round.started_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  for (int64_t worker_id : round.participants) {
    PARSYN_PREPARE(q, "INSERT INTO round_participants (job_id, round, attempt, worker_id) VALUES (?1, ?2, ?3, ?4)");
    q->Bind(round.job_id, round.round, round.attempt, worker_id);
    Status s = q->Run();
    if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return NotFoundError(name + ": participant worker " + std::to_string(worker_id) + " not found");
    }
    if (s.code() == StatusCode::kAlreadyExists) {
      return InvalidArgumentError(name + ": worker " + std::to_string(worker_id) + " is listed twice");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  {
    PARSYN_PREPARE(q, "UPDATE jobs SET current_round = ?2 WHERE id = ?1");
    q->Bind(round.job_id, round.round);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqliteMetadataStore::CommitRound(const RoundCommit& commit) {
  const std::string name = RoundName(commit.job_id, commit.round, commit.attempt);
  if (commit.global_blob_key.empty() || commit.global_sha256.empty()) {
    return InvalidArgumentError("committing " + name + ": the new global's blob key and sha256 are required");
  }
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_ASSIGN_OR_RETURN(Round round, LoadRoundLocked(commit.job_id, commit.round, commit.attempt));
  if (round.status != RoundStatus::kRunning) {
    return FailedPreconditionError(name + " is already " + std::string(ToString(round.status)));
  }
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(commit.job_id));
  if (job.status != JobStatus::kRunning) {
    return FailedPreconditionError("cannot commit " + name + ": the job is " + std::string(ToString(job.status)));
  }
  // The round first, then the job: both or neither reach the file (the transaction), in either order.
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET status = 'committed', ended_at_ms = ?4, train_loss = ?5, "
                   "bytes_moved = ?6, global_blob_key = ?7, global_sha256 = ?8 "
                   "WHERE job_id = ?1 AND round = ?2 AND attempt = ?3");
    q->Bind(commit.job_id, commit.round, commit.attempt, commit.ended_at_ms, commit.train_loss, commit.bytes_moved,
            commit.global_blob_key, commit.global_sha256);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  if (commit.previous_global_validation_loss) {
    if (commit.round == 1) {
      PARSYN_PREPARE(q, "UPDATE jobs SET initial_validation_loss = ?2 WHERE id = ?1");
      q->Bind(commit.job_id, *commit.previous_global_validation_loss);
      PARSYN_RETURN_IF_ERROR(q->Run());
    } else {
      PARSYN_RETURN_IF_ERROR(
          SetRoundValidationLossLocked(job, commit.round - 1, *commit.previous_global_validation_loss));
    }
  }
  {
    PARSYN_PREPARE(q,
                   "UPDATE jobs SET committed_round = ?2, current_round = ?2, consecutive_failed_rounds = 0 "
                   "WHERE id = ?1");
    q->Bind(commit.job_id, commit.round);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqliteMetadataStore::FailRound(const RoundFailure& failure) {
  const std::string name = RoundName(failure.job_id, failure.round, failure.attempt);
  if (failure.reason.empty()) return InvalidArgumentError("failing " + name + ": a reason is required");
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_ASSIGN_OR_RETURN(Round round, LoadRoundLocked(failure.job_id, failure.round, failure.attempt));
  if (round.status != RoundStatus::kRunning) {
    return FailedPreconditionError(name + " is already " + std::string(ToString(round.status)));
  }
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(failure.job_id));
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET status = 'failed', ended_at_ms = ?4, bytes_moved = ?5, failure_reason = ?6 "
                   "WHERE job_id = ?1 AND round = ?2 AND attempt = ?3");
    q->Bind(failure.job_id, failure.round, failure.attempt, failure.ended_at_ms, failure.bytes_moved, failure.reason);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  if (!IsTerminal(job.status)) {
    const bool fail_job = failure.fail_job_reason.has_value();
    PARSYN_PREPARE(q,
                   "UPDATE jobs SET consecutive_failed_rounds = consecutive_failed_rounds + ?2, "
                   "status = CASE WHEN ?3 THEN 'failed' ELSE status END, "
                   "failure_reason = CASE WHEN ?3 THEN ?4 ELSE failure_reason END, "
                   "status_reason = CASE WHEN ?3 THEN ?4 ELSE status_reason END, "
                   "finished_at_ms = CASE WHEN ?3 THEN ?5 ELSE finished_at_ms END WHERE id = ?1");
    q->Bind(failure.job_id, failure.counts_toward_fault_tolerance ? 1 : 0, fail_job,
            failure.fail_job_reason.value_or(""), failure.ended_at_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqliteMetadataStore::SetRoundValidationLossLocked(const TrainingJob& job, int32_t round, double loss) {
  {
    PARSYN_PREPARE(q,
                   "UPDATE rounds SET validation_loss = ?3 WHERE job_id = ?1 AND round = ?2 AND status = 'committed'");
    q->Bind(job.id, round, loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
    if (sqlite3_changes(db_.get()) != 1) {
      return FailedPreconditionError(JobName(job.id) + " has no committed round " + std::to_string(round) +
                                     " to record a validation loss for");
    }
  }
  // The earliest round keeps best_round on a tie.
  if (!job.best_validation_loss || loss < *job.best_validation_loss ||
      (loss == *job.best_validation_loss && job.best_round && round < *job.best_round)) {
    PARSYN_PREPARE(q, "UPDATE jobs SET best_round = ?2, best_validation_loss = ?3 WHERE id = ?1");
    q->Bind(job.id, round, loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return Status::Ok();
}

Status SqliteMetadataStore::RecordFinalValidationLoss(int64_t job_id, int32_t round, double validation_loss) {
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_ASSIGN_OR_RETURN(TrainingJob job, LoadJobLocked(job_id));
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
    PARSYN_PREPARE(q, "UPDATE jobs SET final_validation_loss = ?2 WHERE id = ?1");
    q->Bind(job_id, validation_loss);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  return txn.Commit();
}

Status SqliteMetadataStore::AddRoundParticipant(int64_t job_id, int32_t round, int32_t attempt, int64_t worker_id) {
  std::lock_guard lock(mu_);
  return AddRoundParticipantLocked(RoundParticipant{job_id, round, attempt, worker_id});
}

Status SqliteMetadataStore::AddRoundParticipantLocked(const RoundParticipant& p) {
  const auto [job_id, round, attempt, worker_id] = p;
  PARSYN_RETURN_IF_ERROR(LoadRoundLocked(job_id, round, attempt).status());
  PARSYN_PREPARE(q,
                 "INSERT OR IGNORE INTO round_participants (job_id, round, attempt, worker_id) "
                 "VALUES (?1, ?2, ?3, ?4)");
  q->Bind(job_id, round, attempt, worker_id);
  Status s = q->Run();
  if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
    return NotFoundError(RoundName(job_id, round, attempt) + ": participant worker " + std::to_string(worker_id) +
                         " not found");
  }
  return s;
}

StatusOr<Round> SqliteMetadataStore::GetRound(int64_t job_id, int32_t round, int32_t attempt) {
  std::lock_guard lock(mu_);
  PARSYN_ASSIGN_OR_RETURN(Round r, LoadRoundLocked(job_id, round, attempt));
  PARSYN_PREPARE(q,
                 "SELECT worker_id FROM round_participants WHERE job_id = ?1 AND round = ?2 AND attempt = ?3 "
                 "ORDER BY worker_id");
  q->Bind(job_id, round, attempt);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return r;
    r.participants.push_back(q->Int(0));
  }
}

StatusOr<std::vector<Round>> SqliteMetadataStore::ListRounds(int64_t job_id) {
  std::lock_guard lock(mu_);
  std::vector<Round> out;
  {
    PARSYN_PREPARE(q,
                   std::string("SELECT ") + kRoundColumns + " FROM rounds WHERE job_id = ?1 ORDER BY round, attempt");
    q->Bind(job_id);
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
      if (!row) break;
      PARSYN_ASSIGN_OR_RETURN(Round r, ReadRound(*q));
      out.push_back(std::move(r));
    }
  }
  PARSYN_RETURN_IF_ERROR(LoadParticipantsLocked(out));
  return out;
}

// ---- updates

Status SqliteMetadataStore::RecordUpdate(const RoundUpdate& update) {
  std::lock_guard lock(mu_);
  return RecordUpdateLocked(update);
}

Status SqliteMetadataStore::RecordUpdateLocked(const RoundUpdate& update) {
  const std::string name = RoundName(update.job_id, update.round, update.attempt);
  PARSYN_RETURN_IF_ERROR(LoadRoundLocked(update.job_id, update.round, update.attempt).status());
  PARSYN_PREPARE(q, std::string("INSERT INTO round_updates (") + kUpdateColumns +
                        ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
  q->Bind(update.job_id, update.round, update.attempt, update.worker_id, update.blob_key, update.sha256,
          update.size_bytes, update.num_samples, update.train_loss, update.metrics_json, ToString(update.status),
          update.reject_reason, update.received_at_ms);
  Status s = q->Run();
  if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
    return NotFoundError("worker " + std::to_string(update.worker_id) + " not found");
  }
  if (s.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("worker " + std::to_string(update.worker_id) + " already has an update for " + name);
  }
  return s;
}

StatusOr<std::vector<RoundUpdate>> SqliteMetadataStore::ListUpdates(int64_t job_id, int32_t round, int32_t attempt) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, std::string("SELECT ") + kUpdateColumns +
                        " FROM round_updates WHERE job_id = ?1 AND round = ?2 AND attempt = ?3 ORDER BY worker_id");
  q->Bind(job_id, round, attempt);
  std::vector<RoundUpdate> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    PARSYN_ASSIGN_OR_RETURN(RoundUpdate u, ReadUpdate(*q));
    out.push_back(std::move(u));
  }
}

// ---- metrics

Status SqliteMetadataStore::AppendMetrics(std::span<const MetricPoint> points) {
  if (points.empty()) return Status::Ok();
  std::lock_guard lock(mu_);
  // One transaction per batch: one fsync for the lot instead of one per point.
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  for (const MetricPoint& p : points) {
    PARSYN_PREPARE(q,
                   "INSERT INTO metric_points (job_id, round, worker_id, step, loss, throughput, utilization, "
                   "time_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
    q->Bind(p.job_id, p.round, p.worker_id, p.step, p.loss, p.throughput, p.utilization, p.time_ms);
    Status s = q->Run();
    if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) {
      return NotFoundError("metric point names " + JobName(p.job_id) + " or worker " + std::to_string(p.worker_id) +
                           ", which does not exist");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  return txn.Commit();
}

StatusOr<std::vector<MetricPoint>> SqliteMetadataStore::ListMetrics(int64_t job_id, std::optional<int64_t> worker_id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "SELECT job_id, round, worker_id, step, loss, throughput, utilization, time_ms "
                 "FROM metric_points WHERE job_id = ?1 AND (?2 IS NULL OR worker_id = ?2) "
                 "ORDER BY time_ms, worker_id, step");
  q->Bind(job_id, worker_id);
  std::vector<MetricPoint> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    out.push_back(MetricPoint{q->Int(0), static_cast<int32_t>(q->Int(1)), q->Int(2), q->Int(3), q->OptReal(4),
                              q->OptReal(5), q->OptReal(6), q->Int(7)});
  }
}

StatusOr<std::vector<StoredMetricPoint>> SqliteMetadataStore::ListMetricsPage(int64_t job_id, int64_t after_id,
                                                                              int limit) {
  std::lock_guard lock(mu_);
  // The rowid orders points as stored; the job's index narrows the scan to the job's rows.
  PARSYN_PREPARE(q,
                 "SELECT rowid, job_id, round, worker_id, step, loss, throughput, utilization, time_ms "
                 "FROM metric_points WHERE job_id = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3");
  q->Bind(job_id, after_id, static_cast<int64_t>(std::max(limit, 0)));
  std::vector<StoredMetricPoint> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    out.push_back({q->Int(0), MetricPoint{q->Int(1), static_cast<int32_t>(q->Int(2)), q->Int(3), q->Int(4),
                                          q->OptReal(5), q->OptReal(6), q->OptReal(7), q->Int(8)}});
  }
}

StatusOr<int64_t> SqliteMetadataStore::CountMetrics(int64_t job_id, int64_t worker_id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, "SELECT COUNT(*) FROM metric_points WHERE job_id = ?1 AND worker_id = ?2");
  q->Bind(job_id, worker_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return InternalError("COUNT(*) returned no row");
  return q->Int(0);
}

// ---- events

StatusOr<int64_t> SqliteMetadataStore::AppendJobEvent(const JobEvent& event) {
  std::lock_guard lock(mu_);
  return AppendJobEventLocked(event);
}

StatusOr<int64_t> SqliteMetadataStore::AppendJobEventLocked(const JobEvent& event) {
  PARSYN_PREPARE(q, "INSERT INTO job_events (job_id, type, payload_json, time_ms) VALUES (?1, ?2, ?3, ?4)");
  q->Bind(event.job_id, event.type, event.payload_json, event.time_ms);
  Status s = q->Run();
  if (q->error_code() == SQLITE_CONSTRAINT_FOREIGNKEY) return NotFoundError(JobName(event.job_id) + " not found");
  PARSYN_RETURN_IF_ERROR(s);
  return sqlite3_last_insert_rowid(db_.get());
}

StatusOr<std::vector<JobEvent>> SqliteMetadataStore::ListJobEvents(int64_t job_id, int64_t after_id, int limit,
                                                                   const JobEventFilter& filter) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q,
                 "SELECT id, job_id, type, payload_json, time_ms FROM job_events WHERE job_id = ?1 AND id > ?2 "
                 "AND (?4 = '' OR (type = ?4) <> ?5) ORDER BY id LIMIT ?3");
  q->Bind(job_id, after_id, limit, filter.type, filter.exclude_type);
  std::vector<JobEvent> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
    if (!row) return out;
    out.push_back(JobEvent{q->Int(0), q->Int(1), q->Text(2), q->Text(3), q->Int(4)});
  }
}

StatusOr<int64_t> SqliteMetadataStore::LastJobEventId(int64_t job_id) {
  std::lock_guard lock(mu_);
  PARSYN_PREPARE(q, "SELECT COALESCE(MAX(id), 0) FROM job_events WHERE job_id = ?1");
  q->Bind(job_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return InternalError("MAX(id) returned no row");
  return q->Int(0);
}

// ---- batches

StatusOr<std::vector<int64_t>> SqliteMetadataStore::ApplyBatch(std::span<const BatchWrite> writes) {
  std::vector<int64_t> event_ids;
  if (writes.empty()) return event_ids;
  std::lock_guard lock(mu_);
  Transaction txn(db_.get());
  PARSYN_RETURN_IF_ERROR(txn.Begin());
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

#undef PARSYN_PREPARE

}  // namespace parsyn::storage
