#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <string>
#include <string_view>

#include "storage/legacy_schema_for_test.h"
#include "storage/sql/sql_schema.h"
#include "storage/sql/sqlite_connection.h"
#include "storage/sqlite_store.h"
#include "storage/temp_dir_for_test.h"

// SQLite files as builds before the shared SQL schema left them (its schema_version 1..7), opened by today's store.
namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;

// SQLite's schema version 1 as it shipped; its later old steps are SqliteLegacyMigrations().
constexpr std::string_view kSqliteSchemaV1 = R"sql(
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

// Runs `sql` on the file at `path` on a connection of its own (foreign keys off, as old builds migrated); returns ""
// or SQLite's error.
std::string RawExec(const fs::path& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string error;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    error = sqlite3_errmsg(db);
  } else {
    char* message = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) error = message ? message : "failed";
    sqlite3_free(message);
  }
  sqlite3_close(db);
  return error;
}

// Builds the file at `path` as a build at SQLite's old schema `version` left it: version 1's tables with `rows_sql`
// written into them, then the old steps up to `version`.
void BuildOldFile(const fs::path& path, int version, std::string_view rows_sql) {
  std::string sql = "BEGIN;" + std::string(kSqliteSchemaV1) + std::string(rows_sql);
  for (const Migration& step : SqliteLegacyMigrations()) {
    if (step.version <= version) sql += std::string(step.sql);
  }
  sql += "CREATE TABLE schema_version (version INTEGER NOT NULL);";
  sql += "INSERT INTO schema_version VALUES (" + std::to_string(version) + "); COMMIT;";
  ASSERT_EQ(RawExec(path, sql), "");
}

std::unique_ptr<SqliteMetadataStore> OpenOrFail(const fs::path& path) {
  auto store = SqliteMetadataStore::Open(path.string());
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

// The first column of the first row of `sql` on the store's connection, as text.
std::string FirstCellText(SqliteMetadataStore& store, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(store.handle_for_testing(), sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) return "<error>";
  std::string out = "<no row>";
  if (sqlite3_step(stmt) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  return out;
}

class SqliteLegacySchemaTest : public ::testing::TestWithParam<int> {};

// A file at each old version, holding a record of every kind, opens at the shared version with every record intact,
// and takes writes; a second open changes nothing.
TEST_P(SqliteLegacySchemaTest, OldFileMovesToTheSharedVersionWithEveryRow) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  BuildOldFile(db, GetParam(), kLegacyRowsSql);
  {
    auto store = OpenOrFail(db);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(SqliteMigrations().size()));
    EXPECT_EQ(FirstCellText(*store, "SELECT version FROM schema_version"), std::to_string(kRetiredLegacySchemaVersion));
    EXPECT_EQ(FirstCellText(*store, "PRAGMA foreign_keys"), "1");
    ExpectLegacyRowsReadBack(*store);
  }
  auto reopened = OpenOrFail(db);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->GetJob(2)->name, "new job");
  EXPECT_EQ(reopened->ListMetricsPage(1, 0, 10)->size(), 4u);
}

INSTANTIATE_TEST_SUITE_P(OldVersions, SqliteLegacySchemaTest, ::testing::Range(1, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "v" + std::to_string(info.param); });

// A database written before version 2 kept on each round the loss of the global it started from, and the final
// evaluation's loss only as an event: after the migration each loss is on the round whose global it measured.
TEST(SqliteOldFileTest, OldVersion2MovesEachValidationLossToTheGlobalItMeasured) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  {
    BuildOldFile(db, 1,
                 "INSERT INTO datasets VALUES (1, 'd', 'jsonl', 'text', 1, 1, 's', 'k', 0);"
                 "INSERT INTO models VALUES (1, 'm', 'llama', '{}', 1, 0);"
                 "INSERT INTO jobs VALUES (1, 'old', 1, 1, '{}', 'succeeded', '', 3, 3, 0, 0, 1, 2);"
                 "INSERT INTO jobs VALUES (2, 'broke', 1, 1, '{}', 'failed', 'no workers', 1, 0, 1, 0, 1, 2);"
                 "INSERT INTO rounds VALUES (1, 1, 1, 'committed', 0, 1, 2.0, 3.0, 0, 'g1', 's1', '');"
                 "INSERT INTO rounds VALUES (1, 2, 1, 'failed', 0, 1, NULL, NULL, 0, '', '', 'lost');"
                 "INSERT INTO rounds VALUES (1, 2, 2, 'committed', 0, 1, 1.5, 2.0, 0, 'g2', 's2', '');"
                 "INSERT INTO rounds VALUES (1, 3, 1, 'committed', 0, 1, 1.2, 2.5, 0, 'g3', 's3', '');"
                 "INSERT INTO job_events (job_id, type, payload_json, time_ms) VALUES (1, 'global_evaluated', "
                 "'{\"global_round\": 3, \"validation_loss\": 1.75, \"validation_samples\": 4}', 5);");
  }
  auto store = OpenOrFail(db);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(SqliteMigrations().size()));
  StatusOr<std::vector<Round>> rounds = store->ListRounds(1);
  ASSERT_TRUE(rounds.ok()) << rounds.status().ToString();
  std::vector<std::optional<double>> losses;
  for (const Round& r : *rounds) losses.push_back(r.validation_loss);
  EXPECT_THAT(losses, ::testing::ElementsAre(2.0, std::nullopt, 2.5, 1.75));
  TrainingJob job = *store->GetJob(1);
  EXPECT_EQ(job.initial_validation_loss, 3.0);
  EXPECT_EQ(job.final_validation_loss, 1.75);
  EXPECT_EQ(job.best_round, 3);
  EXPECT_EQ(job.best_validation_loss, 1.75);
  TrainingJob failed = *store->GetJob(2);
  EXPECT_EQ(failed.status_reason, "no workers");
  EXPECT_EQ(failed.best_round, std::nullopt);
}

// Old version 3 rebuilt the jobs table so that a job over the workers' own data needs no dataset: a version-2 file
// keeps its jobs and everything that refers to them, and foreign keys still hold afterwards.
TEST(SqliteOldFileTest, JobsWithoutADatasetAfterMigratingAnOldVersion2File) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  BuildOldFile(db, 2,
               "INSERT INTO datasets VALUES (1, 'd', 'jsonl', 'text', 1, 1, 's', 'datasets/1', 0);"
               "INSERT INTO models VALUES (1, 'm', 'llama', '{}', 1, 0);"
               "INSERT INTO jobs (name, dataset_id, model_id, spec_json, status, failure_reason, current_round, "
               "committed_round, consecutive_failed_rounds, created_at_ms) "
               "VALUES ('old', 1, 1, '{}', 'running', '', 0, 0, 0, 1);"
               "INSERT INTO shards VALUES (1, 0, NULL, '', '', 0, 0);"
               "INSERT INTO rounds (job_id, round, attempt, status, started_at_ms, bytes_moved, global_blob_key, "
               "global_sha256, failure_reason) VALUES (1, 1, 1, 'running', 1, 0, '', '', '');");
  // Version 2 requires a dataset: the row is refused.
  EXPECT_THAT(RawExec(db,
                      "INSERT INTO jobs (name, dataset_id, model_id, spec_json, status, failure_reason, "
                      "current_round, committed_round, consecutive_failed_rounds, created_at_ms) "
                      "VALUES ('x', NULL, 1, '{}', 'queued', '', 0, 0, 0, 1)"),
              ::testing::HasSubstr("NOT NULL"));
  auto store = OpenOrFail(db);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(SqliteMigrations().size()));
  EXPECT_EQ(FirstCellText(*store, "PRAGMA foreign_keys"), "1");
  EXPECT_EQ(store->GetJob(1)->name, "old");
  // Old version 6 drew a private seed for the job already stored: 64 hex digits, not a constant.
  const std::string seed = store->GetJob(1)->private_seed;
  EXPECT_EQ(seed.size(), 64u) << seed;
  EXPECT_EQ(seed.find_first_not_of("0123456789abcdef"), std::string::npos) << seed;
  EXPECT_NE(seed, std::string(64, '0'));
  ASSERT_EQ(store->ListShards(1)->size(), 1u);
  EXPECT_EQ(store->ListShards(1)->at(0).label_histogram_json, "");  // old version 4's default for older shards
  EXPECT_EQ(store->ListRounds(1)->size(), 1u);
  // Rounds from before the bytes were split keep their total; the split is unknown.
  EXPECT_EQ(store->ListRounds(1)->at(0).bytes_down, std::nullopt);
  EXPECT_EQ(store->ListRounds(1)->at(0).bytes_up, std::nullopt);
  TrainingJob local;
  local.name = "local data";
  local.model_id = 1;
  StatusOr<TrainingJob> created = store->CreateJob(local);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(store->GetJob(created->id)->dataset_id, 0);
  EXPECT_EQ(FirstCellText(*store, "SELECT count(*) FROM jobs WHERE dataset_id IS NULL"), "1");
  local.dataset_id = 999;
  EXPECT_EQ(store->CreateJob(local).status().message(), "dataset 999 not found");
}

// A file from a build newer than any old version, yet without the shared history's table, is refused.
TEST(SqliteOldFileTest, UnknownOldVersionIsRefused) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  ASSERT_EQ(
      RawExec(db, "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (8);"),
      "");
  auto store = SqliteMetadataStore::Open(db.string());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), ::testing::HasSubstr("old schema version 8, newer than this build's 7"));
}

}  // namespace
}  // namespace parsyn::storage
