#include "storage/sqlite_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "storage/faulty_metadata_store.h"
#include "storage/metadata_store_contract.h"
#include "storage/temp_dir_for_test.h"
#include "storage/timed_metadata_store.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(
    Sqlite, MetadataStoreContractTest,
    ::testing::Values(
        MetadataStoreBackend{
            "file", [](const fs::path& dir) { return OpenMetadataStore("sqlite://" + (dir / "meta.db").string()); },
            true},
        MetadataStoreBackend{"memory", [](const fs::path&) { return OpenMetadataStore(":memory:"); }, false},
        // The fault-injection wrapper, with no fault armed, must be indistinguishable from its store.
        MetadataStoreBackend{
            "faulty_passthrough",
            [](const fs::path& dir) -> StatusOr<std::unique_ptr<MetadataStore>> {
              PARSYN_ASSIGN_OR_RETURN(auto inner, OpenMetadataStore("sqlite://" + (dir / "meta.db").string()));
              return std::unique_ptr<MetadataStore>(std::make_unique<FaultyMetadataStore>(std::move(inner)));
            },
            true},
        // The timing wrapper (what the coordinator runs on) must be too.
        MetadataStoreBackend{
            "timed",
            [](const fs::path& dir) -> StatusOr<std::unique_ptr<MetadataStore>> {
              PARSYN_ASSIGN_OR_RETURN(auto inner, OpenMetadataStore("sqlite://" + (dir / "meta.db").string()));
              static metrics::Registry registry;
              return std::unique_ptr<MetadataStore>(std::make_unique<TimedMetadataStore>(
                  std::move(inner), registry.Histogram("store_seconds", "Store latency.", {"operation"}),
                  registry.Counter("store_errors_total", "Store errors.", {"operation"})));
            },
            true}),
    MetadataStoreBackendName);

TEST(TimedMetadataStoreTest, TimesEachCallByOperationAndCountsErrors) {
  metrics::Registry registry;
  metrics::HistogramFamily& latency = registry.Histogram("store_seconds", "Store latency.", {"operation"});
  metrics::CounterFamily& errors = registry.Counter("store_errors_total", "Store errors.", {"operation"});
  StatusOr<std::unique_ptr<MetadataStore>> inner = OpenMetadataStore(":memory:");
  ASSERT_TRUE(inner.ok());
  TimedMetadataStore timed(std::move(inner).value(), latency, errors);
  MetadataStore& store = timed;  // as callers see it (the interface carries the default arguments)
  ASSERT_TRUE(store.ListJobs().ok());
  ASSERT_TRUE(store.ListJobs().ok());
  EXPECT_FALSE(store.GetJob(42).ok());
  EXPECT_EQ(latency.WithLabels({"list_jobs"}).Read().count, 2u);
  EXPECT_EQ(latency.WithLabels({"get_job"}).Read().count, 1u);
  EXPECT_EQ(errors.WithLabels({"get_job"}).value(), 1);
  EXPECT_THAT(registry.Render(), HasSubstr("store_errors_total{operation=\"get_job\"} 1\n"));
}

// Runs one SQL statement on the store's connection and returns the first column of its first row as text.
std::string QueryText(SqliteMetadataStore& store, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(store.handle_for_testing(), sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return std::string("<prepare failed: ") + sqlite3_errmsg(store.handle_for_testing()) + ">";
  }
  std::string out = "<no row>";
  if (sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    out = text ? reinterpret_cast<const char*>(text) : "<null>";
  }
  sqlite3_finalize(stmt);
  return out;
}

void Exec(SqliteMetadataStore& store, const std::string& sql) {
  char* error = nullptr;
  int rc = sqlite3_exec(store.handle_for_testing(), sql.c_str(), nullptr, nullptr, &error);
  ASSERT_EQ(rc, SQLITE_OK) << (error ? error : "") << " in " << sql;
}

std::unique_ptr<SqliteMetadataStore> MustOpen(const fs::path& path,
                                              std::span<const Migration> migrations = SqliteMigrations()) {
  auto store = SqliteMetadataStore::Open(path.string(), migrations);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

TEST(SqliteStoreTest, FileStoreUsesWalFullSyncAndForeignKeys) {
  TempDirForTest dir;
  auto store = MustOpen(dir.path() / "meta.db");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(QueryText(*store, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(QueryText(*store, "PRAGMA synchronous"), "2");  // FULL
  EXPECT_EQ(QueryText(*store, "PRAGMA foreign_keys"), "1");
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(SqliteMigrations().size()));
}

TEST(SqliteStoreTest, MigrationsApplyOnceInOrderAndKeepData) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  const Migration v1[] = {{1, "CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT NOT NULL);"}};
  const Migration v2[] = {v1[0], {2, "ALTER TABLE things ADD COLUMN colour TEXT NOT NULL DEFAULT 'red';"}};
  {
    auto store = MustOpen(db, v1);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), 1);
    Exec(*store, "INSERT INTO things (name) VALUES ('kept')");
  }
  {
    // A second open with the same list changes nothing (a re-run CREATE TABLE would fail).
    auto store = MustOpen(db, v1);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), 1);
  }
  for (int open = 0; open < 2; ++open) {
    auto store = MustOpen(db, v2);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), 2);
    EXPECT_EQ(QueryText(*store, "SELECT name || '/' || colour FROM things"), "kept/red");
  }
}

// A database written before version 2 kept on each round the loss of the global it started from, and the final
// evaluation's loss only as an event: after the migration each loss is on the round whose global it measured.
TEST(SqliteStoreTest, Version2MovesEachValidationLossToTheGlobalItMeasured) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  {
    auto v1 = MustOpen(db, SqliteMigrations().first(1));
    ASSERT_NE(v1, nullptr);
    Exec(*v1,
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
  auto store = MustOpen(db);
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

TEST(SqliteStoreTest, DatabaseFromANewerBuildIsRefused) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  const Migration v1[] = {{1, "CREATE TABLE a (x);"}};
  const Migration v2[] = {v1[0], {2, "CREATE TABLE b (x);"}};
  ASSERT_NE(MustOpen(db, v2), nullptr);
  auto old_build = SqliteMetadataStore::Open(db.string(), v1);
  EXPECT_EQ(old_build.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(old_build.status().message(), HasSubstr("schema version 2, newer than this build's 1"));
}

TEST(SqliteStoreTest, FailedMigrationKeepsNothingOfItself) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  const Migration good[] = {{1, "CREATE TABLE a (x);"}};
  // Its first statement succeeds, its second fails: the whole step must roll back.
  const Migration broken[] = {good[0], {2, "CREATE TABLE half_done (x); INSERT INTO no_such_table VALUES (1);"}};
  ASSERT_NE(MustOpen(db, good), nullptr);
  auto failed = SqliteMetadataStore::Open(db.string(), broken);
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_THAT(failed.status().message(), HasSubstr("applying migration 2"));
  EXPECT_THAT(failed.status().message(), HasSubstr("no_such_table"));
  auto store = MustOpen(db, good);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), 1);
  EXPECT_EQ(QueryText(*store, "SELECT count(*) FROM sqlite_master WHERE name = 'half_done'"), "0");
}

// Version 3 rebuilds the jobs table so that a job over the workers' own data needs no dataset: a version-2 database
// keeps its jobs (and version 2's columns) and everything that refers to them, and foreign keys still hold afterwards.
// (The store's code reads version 2's columns, so the old database is made at version 2.)
TEST(SqliteStoreTest, JobsWithoutADatasetAfterMigratingAVersion2Database) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  int64_t old_job = 0;
  {
    auto store = MustOpen(db, SqliteMigrations().subspan(0, 2));
    ASSERT_NE(store, nullptr);
    Dataset d;
    d.blob_key = "datasets/1";
    d = *store->CreateDataset(d);
    Model m = *store->CreateModel(Model{});
    // Jobs as version 2's code wrote them (today's code writes later versions' columns too).
    const std::string insert_job =
        "INSERT INTO jobs (name, dataset_id, model_id, spec_json, status, failure_reason, current_round, "
        "committed_round, consecutive_failed_rounds, created_at_ms) VALUES ('old', ";
    EXPECT_EQ(QueryText(*store, insert_job + std::to_string(d.id) + ", " + std::to_string(m.id) +
                                    ", '{}', 'running', '', 0, 0, 0, 1)"),
              "<no row>");
    old_job = std::stoll(QueryText(*store, "SELECT max(id) FROM jobs"));
    // Version 2's shards table, written as that version's code wrote it (today's code also writes version 4's
    // label_histogram).
    EXPECT_EQ(QueryText(*store,
                        "INSERT INTO shards (job_id, shard_index, worker_id, blob_key, sha256, train_rows, "
                        "validation_rows) VALUES (" +
                            std::to_string(old_job) + ", 0, NULL, '', '', 0, 0)"),
              "<no row>");
    EXPECT_EQ(QueryText(*store,
                        "INSERT INTO rounds (job_id, round, attempt, status, started_at_ms, bytes_moved, "
                        "global_blob_key, global_sha256, failure_reason) VALUES (" +
                            std::to_string(old_job) + ", 1, 1, 'running', 1, 0, '', '', '')"),
              "<no row>");
    // Version 1 requires a dataset: the row is refused.
    QueryText(*store, insert_job + "NULL, " + std::to_string(m.id) + ", '{}', 'queued', '', 0, 0, 0, 1)");
    EXPECT_EQ(QueryText(*store, "SELECT count(*) FROM jobs WHERE dataset_id IS NULL"), "0");
  }
  auto store = MustOpen(db);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(SqliteMigrations().size()));
  EXPECT_EQ(QueryText(*store, "PRAGMA foreign_keys"), "1");
  EXPECT_EQ(store->GetJob(old_job)->name, "old");
  // Version 6 drew a private seed for the job already stored: 64 hex digits, not a constant.
  const std::string seed = store->GetJob(old_job)->private_seed;
  EXPECT_EQ(seed.size(), 64u) << seed;
  EXPECT_EQ(seed.find_first_not_of("0123456789abcdef"), std::string::npos) << seed;
  EXPECT_NE(seed, std::string(64, '0'));
  ASSERT_EQ(store->ListShards(old_job)->size(), 1u);
  EXPECT_EQ(store->ListShards(old_job)->at(0).label_histogram_json, "");  // version 4's default for older shards
  EXPECT_EQ(store->ListRounds(old_job)->size(), 1u);
  TrainingJob local;
  local.name = "local data";
  local.model_id = store->GetJob(old_job)->model_id;
  StatusOr<TrainingJob> created = store->CreateJob(local);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(store->GetJob(created->id)->dataset_id, 0);
  EXPECT_EQ(QueryText(*store, "SELECT count(*) FROM jobs WHERE dataset_id IS NULL"), "1");
  local.dataset_id = 999;
  EXPECT_EQ(store->CreateJob(local).status().message(), "dataset 999 not found");
}

TEST(SqliteStoreTest, MisnumberedMigrationListIsInternal) {
  const Migration gap[] = {{1, "CREATE TABLE a (x);"}, {3, "CREATE TABLE b (x);"}};
  EXPECT_EQ(SqliteMetadataStore::Open(":memory:", gap).status().code(), StatusCode::kInternal);
}

TEST(SqliteStoreTest, OpenMetadataStoreChoosesByScheme) {
  TempDirForTest dir;
  EXPECT_TRUE(OpenMetadataStore("sqlite://" + (dir.path() / "a.db").string()).ok());
  EXPECT_TRUE(OpenMetadataStore((dir.path() / "b.db").string()).ok());
  EXPECT_TRUE(OpenMetadataStore(":memory:").ok());
  EXPECT_TRUE(fs::exists(dir.path() / "a.db"));
  EXPECT_TRUE(fs::exists(dir.path() / "b.db"));
  auto other = OpenMetadataStore("mysql://localhost/parsyn");
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("scheme 'mysql' is not supported"));
  EXPECT_THAT(other.status().message(), HasSubstr("sqlite:///"));
  EXPECT_THAT(other.status().message(), HasSubstr("postgres://"));
  EXPECT_EQ(OpenMetadataStore("sqlite://").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenMetadataStore((dir.path() / "no/such/dir/c.db").string()).status().code(), StatusCode::kUnavailable);
}

TEST(SqliteStoreTest, CorruptFileIsReportedNotCrashed) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  std::ofstream(db) << std::string(8192, 'z');
  auto store = SqliteMetadataStore::Open(db.string());
  EXPECT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kDataLoss) << store.status().ToString();
}

// A job with round 1 running, in a file store: the starting point of the commit-atomicity tests.
struct RunningRound {
  int64_t job_id = 0;
};

RunningRound SetUpRunningRound(MetadataStore& store) {
  Dataset d;
  d.blob_key = "datasets/1";
  d = *store.CreateDataset(d);
  Model m;
  m = *store.CreateModel(m);
  TrainingJob j;
  j.dataset_id = d.id;
  j.model_id = m.id;
  j = *store.CreateJob(j);
  EXPECT_TRUE(store.SetJobStatus(j.id, JobStatus::kRunning, 1).ok());
  Round r;
  r.job_id = j.id;
  r.round = 1;
  r.attempt = 1;
  EXPECT_TRUE(store.StartRound(r).ok());
  return {j.id};
}

RoundCommit CommitOf(int64_t job_id) {
  RoundCommit c;
  c.job_id = job_id;
  c.round = 1;
  c.attempt = 1;
  c.global_blob_key = "jobs/1/rounds/000001/global.safetensors";
  c.global_sha256 = std::string(64, 'e');
  c.ended_at_ms = 2;
  return c;
}

void ExpectPriorState(MetadataStore& store, int64_t job_id) {
  Round round = *store.GetRound(job_id, 1, 1);
  EXPECT_EQ(round.status, RoundStatus::kRunning);
  EXPECT_EQ(round.global_blob_key, "");
  TrainingJob job = *store.GetJob(job_id);
  EXPECT_EQ(job.committed_round, 0);
  EXPECT_EQ(job.current_round, 1);
}

// The job update is the second statement of CommitRound; making it fail after the round's row was already
// updated shows the two are one transaction.
TEST(SqliteStoreTest, CommitRoundFailingMidTransactionLeavesThePriorState) {
  TempDirForTest dir;
  auto store = MustOpen(dir.path() / "meta.db");
  ASSERT_NE(store, nullptr);
  RunningRound setup = SetUpRunningRound(*store);
  Exec(*store,
       "CREATE TRIGGER fail_commit BEFORE UPDATE OF committed_round ON jobs "
       "BEGIN SELECT RAISE(ABORT, 'injected failure'); END");
  Status s = store->CommitRound(CommitOf(setup.job_id));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("injected failure"));
  ExpectPriorState(*store, setup.job_id);

  Exec(*store, "DROP TRIGGER fail_commit");
  ASSERT_TRUE(store->CommitRound(CommitOf(setup.job_id)).ok());
  EXPECT_EQ(store->GetJob(setup.job_id)->committed_round, 1);
}

// kill -9 in the middle of CommitRound: the process dies inside the transaction, after the round row was written.
// Reopening finds the prior state, and the commit can then be made.
TEST(SqliteStoreTest, CrashInsideCommitRoundLeavesThePriorState) {
  TempDirForTest dir;
  const fs::path db = dir.path() / "meta.db";
  int64_t job_id = 0;
  {
    auto store = MustOpen(db);
    ASSERT_NE(store, nullptr);
    job_id = SetUpRunningRound(*store).job_id;
    Exec(*store,
         "CREATE TRIGGER crash_commit BEFORE UPDATE OF committed_round ON jobs "
         "BEGIN SELECT crash_now(); END");
  }
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = SqliteMetadataStore::Open(db.string());
    if (!store.ok()) ::_exit(2);
    sqlite3_create_function((*store)->handle_for_testing(), "crash_now", 0, SQLITE_UTF8, nullptr,
                            [](sqlite3_context*, int, sqlite3_value**) { ::_exit(0); }, nullptr, nullptr);
    (void)(*store)->CommitRound(CommitOf(job_id));
    ::_exit(3);  // not reached if the trigger fired
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0) << "the child should have died inside the commit";

  auto store = MustOpen(db);
  ASSERT_NE(store, nullptr);
  ExpectPriorState(*store, job_id);
  Exec(*store, "DROP TRIGGER crash_commit");
  ASSERT_TRUE(store->CommitRound(CommitOf(job_id)).ok());
  EXPECT_EQ(store->GetRound(job_id, 1, 1)->status, RoundStatus::kCommitted);
}

TEST(FaultyMetadataStoreTest, FailsTheChosenWriteOnlyAndKeepsThePriorState) {
  auto inner = SqliteMetadataStore::Open(":memory:");
  ASSERT_TRUE(inner.ok());
  FaultyMetadataStore store(std::move(inner).value());
  RunningRound setup = SetUpRunningRound(store);
  const int writes_before = store.writes_passed();

  store.FailNthWrite(2, UnavailableError("disk unplugged (injected)"));
  ASSERT_TRUE(store.AppendJobEvent({0, setup.job_id, "round_aggregating", "{}", 3}).ok());  // write 1 passes
  EXPECT_EQ(store.CommitRound(CommitOf(setup.job_id)), UnavailableError("disk unplugged (injected)"));
  ExpectPriorState(store.inner(), setup.job_id);
  EXPECT_TRUE(store.GetJob(setup.job_id).ok());  // reads are never failed
  EXPECT_EQ(store.writes_passed(), writes_before + 1);

  ASSERT_TRUE(store.CommitRound(CommitOf(setup.job_id)).ok());  // the fault fired once
  EXPECT_EQ(store.inner().GetJob(setup.job_id)->committed_round, 1);
}

TEST(SqliteStoreTest, CallsFromSeveralThreadsAreSerialised) {
  auto store = MustOpen(":memory:");
  ASSERT_NE(store, nullptr);
  RunningRound setup = SetUpRunningRound(*store);
  constexpr int kThreads = 4;
  constexpr int kEventsEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEventsEach; ++i) {
        EXPECT_TRUE(store->AppendJobEvent({0, setup.job_id, "tick", "{}", t * 1000 + i}).ok());
        EXPECT_TRUE(store->GetJob(setup.job_id).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(store->ListJobEvents(setup.job_id, 0, 10'000)->size(), size_t{kThreads * kEventsEach});
}

}  // namespace
}  // namespace parsyn::storage
