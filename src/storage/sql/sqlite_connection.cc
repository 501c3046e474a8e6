#include "storage/sql/sqlite_connection.h"

#include <cctype>

#include "storage/disk_full.h"

namespace parsyn::storage {
namespace {

constexpr int kBusyTimeoutMs = 5000;

// SQLite's schema_version 2..7, before the shared history (its version 1 is in sqlite_store_test.cc, which builds
// old files from it). Kept as they shipped: files at any of those versions are brought forward through them.
//
// Version 2: the validation losses of a job's weights. Before it, a round's validation_loss was the loss of the global
// the round started from (round - 1's) and the final evaluation's loss was only an event: each loss moves to the round
// whose global it measured, and the job gets its initial, final and best figures.
constexpr std::string_view kLegacyV2 = R"sql(
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

// Version 3: a job over the workers' own data has no dataset: jobs.dataset_id may be NULL. SQLite cannot drop a NOT
// NULL in place, so the table is rebuilt (migrations run with foreign keys off; see SqliteMetadataStore::Open).
constexpr std::string_view kLegacyV3 = R"sql(
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

constexpr Migration kSqliteLegacyMigrations[] = {
    {2, kLegacyV2},
    {3, kLegacyV3},
    // Version 4: each shard's label histogram (distributed.partition); '' for the shards of older jobs.
    {4, "ALTER TABLE shards ADD COLUMN label_histogram TEXT NOT NULL DEFAULT '';"},
    // Version 5: the trainers each worker last announced (its hello's "trainers", JSON text); '' before any.
    {5, "ALTER TABLE workers ADD COLUMN trainers_json TEXT NOT NULL DEFAULT '';"},
    // Version 6: each job's private seed (storage::TrainingJob::private_seed), drawn for the jobs already stored.
    {6,
     "ALTER TABLE jobs ADD COLUMN private_seed TEXT NOT NULL DEFAULT '';"
     "UPDATE jobs SET private_seed = lower(hex(randomblob(32)));"},
    // Version 7: a job's events of one type (its warnings) are read through an index.
    {7, "CREATE INDEX job_events_by_type ON job_events(job_id, type, id);"},
};

// From SQLite's version 7 to the shared version 1, which PostgreSQL had reached by other steps: metric points get
// an id column (their rowid until now, kept as the id so that pages already handed out stay valid) and its index,
// and the coordinator lease's table exists (unused: a SQLite file has one coordinator).
constexpr std::string_view kSqliteLegacyToShared = R"sql(
CREATE TABLE metric_points_rebuilt (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  round INTEGER NOT NULL,
  worker_id INTEGER NOT NULL REFERENCES workers(id),
  step INTEGER NOT NULL,
  loss REAL,
  throughput REAL,
  utilization REAL,
  time_ms INTEGER NOT NULL
);
INSERT INTO metric_points_rebuilt
  SELECT rowid, job_id, round, worker_id, step, loss, throughput, utilization, time_ms FROM metric_points;
DROP TABLE metric_points;
ALTER TABLE metric_points_rebuilt RENAME TO metric_points;
CREATE INDEX metric_points_by_job ON metric_points(job_id, time_ms);
CREATE INDEX metric_points_by_job_id ON metric_points(job_id, id);
CREATE TABLE coordinator_lease (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  holder TEXT NOT NULL,
  holder_url TEXT NOT NULL,
  epoch BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL
);
)sql";

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

// `sql` with PostgreSQL's $n placeholders (outside quoted literals) written as SQLite's ?n.
std::string WithSqlitePlaceholders(std::string_view sql) {
  std::string out(sql);
  bool quoted = false;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '\'') quoted = !quoted;
    if (!quoted && out[i] == '$' && std::isdigit(static_cast<unsigned char>(out[i + 1]))) out[i] = '?';
  }
  return out;
}

// A run of a cached statement; resets it when destroyed so the cache can hand it out again.
class SqliteStatement final : public SqlStatement {
 public:
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~SqliteStatement() override {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  SqliteStatement(const SqliteStatement&) = delete;
  SqliteStatement& operator=(const SqliteStatement&) = delete;

  StatusOr<bool> Step() override {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) {
      changes_ = sqlite3_changes(db_);
      return false;
    }
    const int code = sqlite3_extended_errcode(db_);
    if (code == SQLITE_CONSTRAINT_FOREIGNKEY) violated_ = SqlConstraint::kForeignKey;
    if (code == SQLITE_CONSTRAINT_PRIMARYKEY || code == SQLITE_CONSTRAINT_UNIQUE) violated_ = SqlConstraint::kUnique;
    return SqliteError(db_, code, "sqlite statement failed");
  }
  SqlConstraint violated() const override { return violated_; }
  int64_t changes() const override { return changes_; }

  bool IsNull(int col) const override { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const override { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const override { return sqlite3_column_double(stmt_, col); }
  bool Bool(int col) const override { return Int(col) != 0; }
  std::string Text(int col) const override {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    return text ? std::string(reinterpret_cast<const char*>(text), sqlite3_column_bytes(stmt_, col)) : "";
  }

 protected:
  // Bind errors can only be programmer errors (index out of range); they surface as a failed Step().
  void BindNull() override { sqlite3_bind_null(stmt_, ++index_); }
  void BindInt(int64_t value) override { sqlite3_bind_int64(stmt_, ++index_, value); }
  void BindReal(double value) override { sqlite3_bind_double(stmt_, ++index_, value); }
  void BindBool(bool value) override { sqlite3_bind_int64(stmt_, ++index_, value ? 1 : 0); }
  void BindText(std::string_view value) override {
    sqlite3_bind_text(stmt_, ++index_, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int index_ = 0;
  SqlConstraint violated_ = SqlConstraint::kNone;
  int64_t changes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<SqliteConnection>> SqliteConnection::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return UnavailableError("opening metadata store " + path + ": " + message);
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  return std::unique_ptr<SqliteConnection>(new SqliteConnection(db, path));
}

SqliteConnection::SqliteConnection(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {
  sqlite3_commit_hook(
      db_,
      [](void* commits) {
        static_cast<std::atomic<int64_t>*>(commits)->fetch_add(1, std::memory_order_relaxed);
        return 0;  // 0: let the commit proceed
      },
      &commits_);
}

// The statements must be finalized before the connection closes.
SqliteConnection::~SqliteConnection() {
  statements_.clear();
  sqlite3_close_v2(db_);
}

StatusOr<std::unique_ptr<SqlStatement>> SqliteConnection::Prepare(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    const std::string text = WithSqlitePlaceholders(sql);
    sqlite3_stmt* raw = nullptr;
    int rc =
        sqlite3_prepare_v3(db_, text.data(), static_cast<int>(text.size()), SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, sqlite3_extended_errcode(db_), "preparing '" + text + "'");
    it = statements_.emplace(std::string(sql), raw).first;
  }
  return std::unique_ptr<SqlStatement>(std::make_unique<SqliteStatement>(db_, it->second.get()));
}

Status SqliteConnection::Exec(std::string_view sql, std::string_view context) {
  int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, sqlite3_extended_errcode(db_), context);
  return Status::Ok();
}

Status SqliteConnection::Rollback() {
  if (sqlite3_get_autocommit(db_) != 0) return Status::Ok();  // no transaction is open
  return Exec("ROLLBACK", "rolling back");
}

StatusOr<std::optional<std::string>> SqliteConnection::QueryText(std::string_view sql, std::string_view context) {
  sqlite3_stmt* raw = nullptr;
  if (sqlite3_prepare_v2(db_, std::string(sql).c_str(), -1, &raw, nullptr) != SQLITE_OK) {
    return SqliteError(db_, sqlite3_extended_errcode(db_), context);
  }
  std::unique_ptr<sqlite3_stmt, StatementDeleter> stmt(raw);
  int rc = sqlite3_step(stmt.get());
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) return SqliteError(db_, sqlite3_extended_errcode(db_), context);
  const unsigned char* text = sqlite3_column_text(stmt.get(), 0);
  return std::optional<std::string>(text ? reinterpret_cast<const char*>(text) : "");
}

std::span<const Migration> SqliteLegacyMigrations() { return kSqliteLegacyMigrations; }

std::span<const Migration> SqliteConnection::LegacyMigrations() const { return kSqliteLegacyMigrations; }

std::string_view SqliteConnection::LegacyToSharedSql() const { return kSqliteLegacyToShared; }

}  // namespace parsyn::storage
