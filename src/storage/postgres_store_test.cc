#include "storage/postgres_store.h"
#include "base/testing/missing_dependency.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "base/testing/free_port.h"
#include "storage/metadata_store_contract.h"
#include "storage/postgres_database_for_test.h"
#include "storage/postgres_for_test.h"

namespace parsyn::storage {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// The database of a contract test's scratch directory: created on its first open, the same on a reopen.
StatusOr<std::unique_ptr<MetadataStore>> OpenForScratchDir(const fs::path& dir) {
  static std::mutex mu;
  static std::map<fs::path, std::string> url_of;
  std::string url;
  {
    std::lock_guard lock(mu);
    auto it = url_of.find(dir);
    if (it == url_of.end()) {
      PARSYN_ASSIGN_OR_RETURN(PostgresForTest * server, SharedPostgres());
      PARSYN_ASSIGN_OR_RETURN(std::string created, server->NewDatabase());
      it = url_of.emplace(dir, created).first;
    }
    url = it->second;
  }
  return OpenMetadataStore(url);
}

INSTANTIATE_TEST_SUITE_P(Postgres, MetadataStoreContractTest,
                         ::testing::Values(MetadataStoreBackend{"server", OpenForScratchDir, true,
                                                                PostgresUnavailableReason}),
                         MetadataStoreBackendName);

std::unique_ptr<PostgresMetadataStore> MustOpenPostgres(const std::string& url,
                                                        std::span<const Migration> migrations = PostgresMigrations()) {
  auto store = PostgresMetadataStore::Open(url, migrations);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? std::move(store).value() : nullptr;
}

TEST(PostgresStoreTest, MigrationsApplyOnceInOrderAndANewerSchemaIsRefused) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  const Migration v1[] = {{1, "CREATE TABLE things (id BIGINT PRIMARY KEY, name TEXT NOT NULL);"}};
  const Migration v2[] = {v1[0], {2, "ALTER TABLE things ADD COLUMN colour TEXT NOT NULL DEFAULT 'red';"}};
  {
    auto store = MustOpenPostgres(url, v1);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), 1);
  }
  ASSERT_EQ(ExecSql(url, "INSERT INTO things (id, name) VALUES (1, 'kept')"), "");
  {
    auto store = MustOpenPostgres(url, v2);  // applies only v2; v1's CREATE would fail if run again
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->SchemaVersion(), 2);
  }
  EXPECT_EQ(ExecSql(url, "SELECT colour FROM things WHERE name = 'kept'"), "");
  auto older = PostgresMetadataStore::Open(url, v1);
  EXPECT_EQ(older.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(), HasSubstr("schema version 2, newer than this build's 1"));
}

TEST(PostgresStoreTest, AFailedMigrationKeepsNothingAndNamesItsVersion) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  const Migration broken[] = {{1, "CREATE TABLE a (x INTEGER);"},
                              {2, "CREATE TABLE b (x INTEGER); SELECT no_such_column FROM a;"}};
  auto store = PostgresMetadataStore::Open(url, broken);
  EXPECT_EQ(store.status().code(), StatusCode::kInternal);
  EXPECT_THAT(store.status().message(), HasSubstr("applying migration 2"));
  // Version 1 stayed; version 2's table did not.
  EXPECT_EQ(ExecSql(url, "SELECT x FROM a"), "");
  EXPECT_THAT(ExecSql(url, "SELECT x FROM b"), HasSubstr("does not exist"));
  EXPECT_EQ(
      ExecSql(url, "DO $$ BEGIN IF (SELECT version FROM parsyn_schema_version) <> 1 THEN RAISE 'v'; END IF; END $$"),
      "");
  const Migration gap[] = {{1, "SELECT 1;"}, {3, "SELECT 1;"}};
  EXPECT_EQ(PostgresMetadataStore::Open(url, gap).status().code(), StatusCode::kInternal);
}

TEST(PostgresStoreTest, TheSchemaIsThisBuildsLatestVersion) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  auto store = MustOpenPostgres(url);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->SchemaVersion(), static_cast<int>(PostgresMigrations().size()));
  // Two stores opening one database (two coordinators) find it migrated and agree.
  auto second = MustOpenPostgres(url);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(*second->SchemaVersion(), *store->SchemaVersion());
}

// A round commit is one transaction: when its last write fails, its first ones are not kept either.
TEST(PostgresStoreTest, CommitRoundIsOneTransaction) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  auto store = MustOpenPostgres(url);
  ASSERT_NE(store, nullptr);
  Dataset dataset;
  dataset.blob_key = "datasets/d";
  Model model;
  model.name = "m";
  TrainingJob job;
  job.dataset_id = store->CreateDataset(dataset)->id;
  job.model_id = store->CreateModel(model)->id;
  job = *store->CreateJob(job);
  ASSERT_TRUE(store->SetJobStatus(job.id, JobStatus::kRunning, 1).ok());
  Round round;
  round.job_id = job.id;
  round.round = round.attempt = 1;
  ASSERT_TRUE(store->StartRound(round).ok());
  // The job's update (CommitRound's last statement) fails; the round's (its first) must be rolled back with it.
  ASSERT_EQ(ExecSql(url, R"sql(
    CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$ LANGUAGE plpgsql;
    CREATE TRIGGER refuse_commit BEFORE UPDATE OF committed_round ON jobs FOR EACH ROW EXECUTE FUNCTION refuse();
  )sql"),
            "");
  RoundCommit commit;
  commit.job_id = job.id;
  commit.round = commit.attempt = 1;
  commit.global_blob_key = "jobs/1/rounds/1/global";
  commit.global_sha256 = std::string(64, 'a');
  Status failed = store->CommitRound(commit);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("injected failure"));
  EXPECT_EQ(store->GetRound(job.id, 1, 1)->status, RoundStatus::kRunning);
  EXPECT_EQ(store->GetJob(job.id)->committed_round, 0);

  ASSERT_EQ(ExecSql(url, "DROP TRIGGER refuse_commit ON jobs"), "");
  ASSERT_TRUE(store->CommitRound(commit).ok());
  EXPECT_EQ(store->GetRound(job.id, 1, 1)->status, RoundStatus::kCommitted);
  EXPECT_EQ(store->GetJob(job.id)->committed_round, 1);
}

// Two coordinators on one database: a commit waits for the job's row while another transaction holds it, then sees
// what that one did (here: the same round committed), instead of committing the round a second time.
TEST(PostgresStoreTest, ACommitWaitsForTheJobsRowAndSeesTheOtherWritersCommit) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  auto store = MustOpenPostgres(url);
  ASSERT_NE(store, nullptr);
  Dataset dataset;
  dataset.blob_key = "datasets/d";
  TrainingJob job;
  job.dataset_id = store->CreateDataset(dataset)->id;
  job.model_id = store->CreateModel(Model{})->id;
  job = *store->CreateJob(job);
  ASSERT_TRUE(store->SetJobStatus(job.id, JobStatus::kRunning, 1).ok());
  Round round;
  round.job_id = job.id;
  round.round = round.attempt = 1;
  ASSERT_TRUE(store->StartRound(round).ok());

  // The other writer: holds the job's row, as the store's own transactions take it.
  PGconn* other = PQconnectdb(url.c_str());
  ASSERT_EQ(PQstatus(other), CONNECTION_OK) << PQerrorMessage(other);
  const std::string id = std::to_string(job.id);
  auto exec = [&](const std::string& sql) {
    PGresult* r = PQexec(other, sql.c_str());
    std::string error =
        PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK ? "" : PQresultErrorMessage(r);
    std::string value = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    return error.empty() ? value : "<" + error + ">";
  };
  ASSERT_EQ(exec("BEGIN"), "");
  ASSERT_EQ(exec("SELECT 1 FROM jobs WHERE id = " + id + " FOR UPDATE"), "1");

  RoundCommit commit;
  commit.job_id = job.id;
  commit.round = commit.attempt = 1;
  commit.global_blob_key = "jobs/1/rounds/1/global";
  commit.global_sha256 = std::string(64, 'a');
  Status result = InternalError("not run");
  std::thread committer([&] { result = store->CommitRound(commit); });
  // Bounded wait until the store's commit is queued on the row lock (a store that does not lock never is).
  bool waiting = false;
  for (int i = 0; i < 300 && !waiting; ++i) {
    waiting = exec("SELECT count(*) FROM pg_locks WHERE NOT granted") != "0";
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(waiting) << "CommitRound did not wait for the job's row";
  ASSERT_EQ(
      exec("UPDATE rounds SET status = 'committed', global_blob_key = 'k', global_sha256 = 's' WHERE job_id = " + id),
      "");
  ASSERT_EQ(exec("UPDATE jobs SET committed_round = 1 WHERE id = " + id), "");
  ASSERT_EQ(exec("COMMIT"), "");
  committer.join();
  PQfinish(other);
  EXPECT_EQ(result.code(), StatusCode::kFailedPrecondition) << result.ToString();
  EXPECT_THAT(result.message(), HasSubstr("is already committed"));
  EXPECT_EQ(store->GetRound(job.id, 1, 1)->global_blob_key, "k");
}

TEST(PostgresStoreTest, ConnectionRefusedNamesHostAndPortButNotThePassword) {
  // No server needed: nothing listens on a port just found free.
  StatusOr<int> port = test_support::FreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  const std::string where = "127.0.0.1:" + std::to_string(*port);
  auto store = OpenMetadataStore("postgres://parsyn:s3cret-pw@" + where + "/parsyn");
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("cannot connect to the PostgreSQL metadata store at " + where));
  EXPECT_THAT(store.status().message(), Not(HasSubstr("s3cret-pw")));
}

TEST(PostgresStoreTest, MalformedUrlsAreInvalidArgumentWithoutThePassword) {
  for (const std::string url : {"postgres://u:s3cret-pw@localhost:5432/db?no_such_option=1",
                                "postgresql://u:s3cret-pw@localhost:5432", "postgres://u:s3cret-pw@[::1/db"}) {
    auto store = OpenMetadataStore(url);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << url << ": " << store.status().ToString();
    EXPECT_THAT(store.status().message(), HasSubstr("postgres://USER:PASSWORD@HOST:PORT/DATABASE")) << url;
    EXPECT_THAT(store.status().message(), Not(HasSubstr("s3cret-pw"))) << url;
  }
  EXPECT_EQ(RedactPostgresUri("postgres://u:pw@h:1/db"), "postgres://u:***@h:1/db");
  EXPECT_EQ(RedactPostgresUri("postgres://u@h/db"), "postgres://u@h/db");
  // libpq also takes the password as a query parameter: that one is redacted too, wherever it stands.
  EXPECT_EQ(RedactPostgresUri("postgres://u@h/db?password=pw"), "postgres://u@h/db?password=***");
  EXPECT_EQ(RedactPostgresUri("postgres://u:a@h/db?sslmode=disable&password=b&x=1"),
            "postgres://u:***@h/db?sslmode=disable&password=***&x=1");
  auto queried = OpenMetadataStore("postgres://u@localhost:5432/db?password=s3cret-pw&no_such_option=1");
  EXPECT_EQ(queried.status().code(), StatusCode::kInvalidArgument) << queried.status().ToString();
  EXPECT_THAT(queried.status().message(), Not(HasSubstr("s3cret-pw")));
  EXPECT_TRUE(IsPostgresUri("postgresql://h/db"));
  EXPECT_FALSE(IsPostgresUri("sqlite:///x.db"));
}

// A connection the server dropped (a restart, a failover, an idle timeout) is replaced at the next call.
TEST(PostgresStoreTest, ADroppedConnectionIsReestablished) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  auto store = MustOpenPostgres(url);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->SetAdminKeyHash("h1").ok());
  ASSERT_EQ(ExecSql(url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"),
            "");
  // The first call may find the connection dead (Unavailable, nothing changed); the next one reconnects.
  StatusOr<std::string> first = store->GetAdminKeyHash();
  if (!first.ok()) {
    EXPECT_EQ(first.status().code(), StatusCode::kUnavailable) << first.status().ToString();
  }
  EXPECT_EQ(*store->GetAdminKeyHash(), "h1");
  ASSERT_TRUE(store->SetAdminKeyHash("h2").ok());
  EXPECT_EQ(*store->GetAdminKeyHash(), "h2");
}

// Failover's fencing: two coordinators' stores on one database; one holds the lease, the other's job writes are
// refused; once the lease passes on (expired, then taken), the deposed leader's late writes are refused by the
// database, in the write's own transaction, and nothing of them is kept.
TEST(PostgresStoreTest, OneLeaderAtATimeAndADeposedLeadersWritesAreRefused) {
  PARSYN_NEW_DATABASE_OR_SKIP(url);
  auto a = MustOpenPostgres(url);
  auto b = MustOpenPostgres(url);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_TRUE(a->SharedByCoordinators());
  const int64_t model_id = a->CreateModel(Model{.name = "m", .model_type = "llama", .config_json = "{}"})->id;
  const int64_t job_id = a->CreateJob(TrainingJob{.name = "j", .model_id = model_id, .spec_json = "{}"})->id;

  StatusOr<LeaderLease> lease = a->AcquireLeaderLease("coordinator-a", "http://a:8080", std::chrono::minutes(1));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(lease->held);
  EXPECT_EQ(lease->epoch, 1);
  StatusOr<LeaderLease> other = b->AcquireLeaderLease("coordinator-b", "http://b:8080", std::chrono::minutes(1));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->held);
  EXPECT_EQ(other->holder, "coordinator-a");
  EXPECT_EQ(other->holder_url, "http://a:8080");
  EXPECT_EQ(other->epoch, 1);
  // A standby's store writes nothing of a job.
  Status standby_write = b->SetJobStatus(job_id, JobStatus::kRunning, 1).status();
  EXPECT_EQ(standby_write.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(standby_write.message(), HasSubstr("fenced: this coordinator is not the leader"));

  // Nor any other write: each refused, none kept.
  const int64_t worker_id = a->CreateWorker(Worker{.name = "w", .token_sha256 = "t0"})->id;
  std::vector<std::pair<std::string, Status>> standby_writes = {
      {"CreateJob", b->CreateJob(TrainingJob{.name = "j2", .model_id = model_id, .spec_json = "{}"}).status()},
      {"CreateWorker", b->CreateWorker(Worker{.name = "orphan", .token_sha256 = "t1"}).status()},
      {"UpdateWorker", b->UpdateWorker(Worker{.id = worker_id, .name = "w", .revoked = true})},
      {"RecordWorkersSeen", b->RecordWorkersSeen(std::vector<WorkerSeen>{{worker_id, 99}})},
      {"SetAdminKeyHash", b->SetAdminKeyHash(std::string(64, 'b'))},
      {"AppendMetrics", b->AppendMetrics(std::vector<MetricPoint>{{.job_id = job_id, .worker_id = worker_id}})},
      {"AppendJobEvent", b->AppendJobEvent(JobEvent{.job_id = job_id, .type = "x", .payload_json = "{}"}).status()},
      {"CreateDataset", b->CreateDataset(Dataset{.name = "d", .blob_key = "datasets/x"}).status()},
      {"CreateModel", b->CreateModel(Model{.name = "m2", .model_type = "llama", .config_json = "{}"}).status()},
      {"DeleteModel", b->DeleteModel(model_id)},
      {"AppendAuditRecords", b->AppendAuditRecords(std::vector<AuditRecord>{{.seq = 1, .record_json = "{}"}})},
      {"CreateUser", b->CreateUser(User{.name = "mallory"}).status()},
      {"CreateApiKey", b->CreateApiKey(ApiKey{.user_id = 1, .key_sha256 = "k"}).status()},
      {"RevokeApiKey", b->RevokeApiKey(1, 1).status()},
  };
  for (const auto& [call, status] : standby_writes) {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << call << ": " << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("fenced")) << call;
  }
  EXPECT_EQ(a->ListJobs()->size(), 1u);
  EXPECT_EQ(a->ListWorkers()->size(), 1u);
  EXPECT_FALSE(a->GetWorker(worker_id)->revoked);
  EXPECT_EQ(a->GetWorker(worker_id)->last_heartbeat_at_ms, std::nullopt);
  EXPECT_EQ(a->GetAdminKeyHash().status().code(), StatusCode::kNotFound);  // never set
  EXPECT_TRUE(a->ListMetrics(job_id)->empty());
  EXPECT_TRUE(a->ListJobEvents(job_id, 0)->empty());
  EXPECT_TRUE(a->ListDatasets()->empty());
  EXPECT_EQ(a->ListModels()->size(), 1u);
  EXPECT_TRUE(a->ListAuditRecords({})->empty());
  EXPECT_EQ(a->ListUsers()->size(), 1u);
  EXPECT_TRUE(a->ListApiKeys()->empty());
  // The leader's own writes go through.
  ASSERT_TRUE(a->UpdateWorker(Worker{.id = worker_id, .name = "w", .revoked = true}).ok());
  ASSERT_TRUE(a->SetJobStatus(job_id, JobStatus::kRunning, 1).ok());
  ASSERT_TRUE(a->StartRound(Round{.job_id = job_id, .round = 1, .attempt = 1, .started_at_ms = 2}).ok());
  // A renewal keeps the epoch; this one lasts a millisecond, then b takes over (polled: the expiry is the database's).
  lease = a->AcquireLeaderLease("coordinator-a", "http://a:8080", std::chrono::milliseconds(1));
  ASSERT_TRUE(lease.ok() && lease->held);
  EXPECT_EQ(lease->epoch, 1);
  for (int i = 0; i < 2000 && !(other.ok() && other->held); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    other = b->AcquireLeaderLease("coordinator-b", "http://b:8080", std::chrono::minutes(1));
  }
  ASSERT_TRUE(other.ok() && other->held) << "the expired lease was never taken over";
  EXPECT_EQ(other->epoch, 2);

  // The deposed leader's late writes: refused, none kept.
  const RoundCommit commit{
      .job_id = job_id, .round = 1, .attempt = 1, .global_blob_key = "g", .global_sha256 = "s", .ended_at_ms = 3};
  Status late = a->CommitRound(commit);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
  EXPECT_THAT(late.message(), HasSubstr("fenced: this coordinator's leadership (epoch 1) has passed on"));
  EXPECT_THAT(late.message(), HasSubstr("coordinator-b"));
  EXPECT_EQ(a->RecordUpdate(RoundUpdate{.job_id = job_id, .round = 1, .attempt = 1, .worker_id = 0}).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->SetJobStatus(job_id, JobStatus::kFailed, 3, "late").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->GetRound(job_id, 1, 1)->status, RoundStatus::kRunning);
  EXPECT_EQ(b->GetJob(job_id)->committed_round, 0);
  EXPECT_EQ(b->GetJob(job_id)->status, JobStatus::kRunning);
  // Nor can it take the lease back while b holds it.
  lease = a->AcquireLeaderLease("coordinator-a", "http://a:8080", std::chrono::minutes(1));
  ASSERT_TRUE(lease.ok());
  EXPECT_FALSE(lease->held);
  EXPECT_EQ(lease->holder, "coordinator-b");

  // The new leader resumes the round: the interrupted attempt fails (not counted), the next one commits, once.
  ASSERT_TRUE(b->FailRound(RoundFailure{.job_id = job_id,
                                        .round = 1,
                                        .attempt = 1,
                                        .reason = "the coordinator changed",
                                        .ended_at_ms = 4,
                                        .counts_toward_fault_tolerance = false})
                  .ok());
  ASSERT_TRUE(b->StartRound(Round{.job_id = job_id, .round = 1, .attempt = 2, .started_at_ms = 5}).ok());
  RoundCommit second = commit;
  second.attempt = 2;
  ASSERT_TRUE(b->CommitRound(second).ok());
  EXPECT_EQ(b->GetJob(job_id)->committed_round, 1);
  // A released lease is taken at once, with the next epoch.
  ASSERT_TRUE(b->ReleaseLeaderLease("coordinator-b").ok());
  lease = a->AcquireLeaderLease("coordinator-a", "http://a:8080", std::chrono::minutes(1));
  ASSERT_TRUE(lease.ok() && lease->held);
  EXPECT_EQ(lease->epoch, 3);
}

}  // namespace
}  // namespace parsyn::storage
