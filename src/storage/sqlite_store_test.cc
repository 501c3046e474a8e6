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
