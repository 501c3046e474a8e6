// Coordinator failover with real processes: two `parsyn server`s on one PostgreSQL database and one shared blob
// directory, two `parsyn worker`s given both URLs. The leader is SIGKILLed mid-round; the standby takes the lease,
// resumes the job at its last committed round, the workers follow it, and the job ends with the weights of an
// uninterrupted run, with no round committed twice (read from the database itself).
#include <gmock/gmock.h>

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "base/ed25519.h"

#include "base/testing/missing_dependency.h"
#include "http/status_codes.h"
#include "llama_fixture.h"
#include "storage/postgres_for_test.h"
#include "storage/postgres_store.h"

namespace parsyn::e2e {
namespace {

using ::testing::HasSubstr;

class FailoverTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    if (std::optional<std::string> why = storage::PostgresUnavailableReason()) PARSYN_SKIP_FOR_MISSING_DEPENDENCY(*why);
    StatusOr<storage::PostgresForTest*> pg = storage::SharedPostgres();
    ASSERT_TRUE(pg.ok()) << pg.status().ToString();
    StatusOr<std::string> url = (*pg)->NewDatabase();
    ASSERT_TRUE(url.ok()) << url.status().ToString();
    metadata_url_ = *url;
    fs::create_directories(blobs_dir());
    // A short lease keeps the test quick; the takeover logic is the same at the default 10 s.
    // Audit checkpoints every 10 records: both leaders sign some within the test.
    server_flags_.insert(server_flags_.end(), {"--metadata", metadata_url_, "--blobs", blobs_dir().string(),
                                               "--leader-lease-ms", "1500", "--audit-checkpoint-every", "10"});
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(400, "16"));
    // The first server takes the lease before the second starts, so which one leads is known.
    port_ = FreePort();
    server_ = std::make_unique<Server>(tmp_.path() / "server-a", port_, server_flags_);
    server_->Start();
    ASSERT_EQ(WaitForRole(server_->url(), "leader"), "leader");
    admin_ = server_->Admin();
    model_id_ = UploadModel(*admin_, tmp_.path() / "model", "points-mlp");
    dataset_id_ = UploadDataset(*admin_, tmp_.path() / "points.csv");
    standby_ = std::make_unique<Server>(tmp_.path() / "server-b", FreePort(), server_flags_);
    standby_->Start();
    ASSERT_EQ(WaitForRole(standby_->url(), "standby"), "standby");
  }

  fs::path blobs_dir() const { return tmp_.path() / "shared-blobs"; }
  fs::path BlobPath(const std::string& key) override { return blobs_dir() / key; }

  // /readyz's role at `url`, polled (bounded) until it is `want`: the last one seen ("" if it never answered).
  std::string WaitForRole(const std::string& url, const std::string& want) {
    http::Client probe(http::ClientOptions{.base_url = url, .max_attempts = 1});
    std::string role;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      StatusOr<http::ClientResponse> res = probe.Get("/readyz");
      StatusOr<json> body = res.ok() ? res->Json() : StatusOr<json>(res.status());
      if (body.ok()) role = body->value("role", "");
      if (role == want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return role;
  }

  json MlpSpec(const std::vector<int64_t>& worker_ids, int rounds, int steps) const {
    json spec = TabularJobSpec("e2e-failover", dataset_id_, model_id_, worker_ids, rounds, steps);
    spec["config"]["hidden_sizes"] = {16};
    return spec;
  }

  // The audit log, exported from the leader of `servers`, is one unbroken chain: the new leader went on from the
  // record the killed one stored last, and each signed checkpoints with its own key (in its data directory).
  void ExpectOneAuditChainSignedByBothLeaders(const std::string& servers) {
    const fs::path exported = tmp_.path() / "audit.jsonl";
    CommandResult got = RunParsyn(
        {"audit", "export", "--out", exported.string(), "--server", servers, "--api-key", server_->admin_key()});
    ASSERT_EQ(got.exit_code, 0) << got.output;
    std::vector<std::string> verify = {"audit", "verify", exported.string()};
    for (const char* dir : {"server-a", "server-b"}) {
      const fs::path pub = tmp_.path() / (std::string(dir) + ".pub");
      std::ofstream(pub)
          << Ed25519PrivateKey::FromPem(ReadWholeFile(tmp_.path() / dir / "audit-signing-key.pem")).value().PublicPem();
      verify.insert(verify.end(), {"--key", pub.string()});
    }
    CommandResult verified = RunParsyn(verify);
    EXPECT_EQ(verified.exit_code, 0) << verified.output;
    EXPECT_THAT(verified.output, HasSubstr("form one unbroken chain"));
    std::set<std::string> signers;
    std::ifstream in(exported);
    for (std::string line; std::getline(in, line);) {
      const json record = json::parse(line);
      if (record["action"] == "audit.checkpoint") signers.insert(record["actor"].get<std::string>());
    }
    EXPECT_EQ(signers.size(), 2u) << "checkpoints of both leaders";
  }

  std::string metadata_url_;
  std::unique_ptr<Server> standby_;
};

// Both coordinators take their admin key from one operator's file (a mounted Secret), re-read every 300 ms, and
// accept worker bootstraps.
class KeyedFailoverTest : public FailoverTest {
 protected:
  void SetUp() override {
    // The fixture's clients read each server's <data-dir>/admin-key: the same key goes there and in the shared file.
    for (const char* dir : {"server-a", "server-b"}) {
      fs::create_directories(tmp_.path() / dir);
      WriteKey(tmp_.path() / dir / "admin-key", kFirstKey);
    }
    WriteKey(admin_key_file(), kFirstKey);
    WriteKey(bootstrap_key_file(), kBootstrapKey);
    server_flags_ = {"--admin-key-file",
                     admin_key_file().string(),
                     "--worker-bootstrap-key-file",
                     bootstrap_key_file().string(),
                     "--admin-key-refresh-ms",
                     "300"};
    FailoverTest::SetUp();
  }
  static void WriteKey(const fs::path& path, std::string_view key) {
    std::ofstream(path) << key << "\n";
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  }
  fs::path admin_key_file() const { return tmp_.path() / "admin-key-secret"; }
  fs::path bootstrap_key_file() const { return tmp_.path() / "bootstrap-key-secret"; }
  // The status of GET /api/v1/workers at `url` with `key`, polled (up to 10 s) until it is `want`.
  int ListWorkersStatus(const std::string& url, const std::string& key, int want) {
    http::Client client(http::ClientOptions{.base_url = url, .bearer_token = key, .max_attempts = 1});
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      StatusOr<http::ClientResponse> res = client.Get("/api/v1/workers");
      status = res.ok() ? res->status : http::HttpStatusFor(res.status().code());
      if (status == want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return status;
  }

  static constexpr std::string_view kFirstKey = "first-admin-key-0123456789abcdef0123456789abcdef";
  static constexpr std::string_view kRotatedKey = "rotated-admin-key-0123456789abcdef0123456789abcdef";
  static constexpr std::string_view kBootstrapKey = "bootstrap-key-0123456789abcdef0123456789abcdef";
};

// A standby refuses a worker pod's bootstrap (503 naming the leader: the pod retries there) and so writes no worker;
// a rotated admin key file is in force on the leader without a restart, and on the standby from its takeover on; a
// standby that cannot load the key at takeover gives the lease back rather than lead with a stale one.
TEST_F(KeyedFailoverTest, TheStandbyRefusesBootstrapsAndARotatedAdminKeyReachesEveryLeader) {
  http::Client standby_pod(
      http::ClientOptions{.base_url = standby_->url(), .bearer_token = std::string(kBootstrapKey), .max_attempts = 1});
  StatusOr<http::ClientResponse> refused = standby_pod.PostJson("/api/v1/workers/bootstrap", {{"name", "pod-0"}});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("standby; the leader is " + server_->url()));
  http::Client leader_pod(
      http::ClientOptions{.base_url = server_->url(), .bearer_token = std::string(kBootstrapKey), .max_attempts = 1});
  StatusOr<http::ClientResponse> registered = leader_pod.PostJson("/api/v1/workers/bootstrap", {{"name", "pod-0"}});
  ASSERT_TRUE(registered.ok()) << registered.status().ToString();
  StatusOr<http::ClientResponse> listing = admin_->Get("/api/v1/workers");
  StatusOr<json> workers = listing.ok() ? listing->Json() : StatusOr<json>(listing.status());
  ASSERT_TRUE(workers.ok()) << workers.status().ToString();
  EXPECT_EQ((*workers)["workers"].size(), 1u) << workers->dump() << ": the standby wrote a worker";

  // The Secret is rotated: the leader takes the new key within its refresh interval and refuses the old one.
  WriteKey(admin_key_file(), kRotatedKey);
  EXPECT_EQ(ListWorkersStatus(server_->url(), std::string(kRotatedKey), 200), 200);
  EXPECT_EQ(ListWorkersStatus(server_->url(), std::string(kFirstKey), 401), 401);

  // The leader dies while the key file cannot be read (a Secret mount gone): the standby cannot load the admin key,
  // so it does not lead with a stale one; it gives the lease back and stays a standby until the file is back.
  fs::rename(admin_key_file(), tmp_.path() / "admin-key-away");
  server_->Kill();
  http::Client probe(http::ClientOptions{.base_url = standby_->url(), .max_attempts = 1});
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
    StatusOr<http::ClientResponse> ready = probe.Get("/readyz");
    StatusOr<json> body = ready.ok() ? ready->Json() : StatusOr<json>(ready.status());
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    ASSERT_EQ(body->value("role", ""), "standby") << "took over without being able to read the admin key";
  }
  fs::rename(tmp_.path() / "admin-key-away", admin_key_file());
  // The standby started with the first key; once it leads, only the rotated one works there.
  ASSERT_EQ(WaitForRole(standby_->url(), "leader"), "leader");
  http::Client old_key(
      http::ClientOptions{.base_url = standby_->url(), .bearer_token = std::string(kFirstKey), .max_attempts = 1});
  StatusOr<http::ClientResponse> stale = old_key.Get("/api/v1/workers");
  EXPECT_EQ(stale.status().code(), StatusCode::kUnauthenticated) << stale.status().ToString();
  http::Client new_key(
      http::ClientOptions{.base_url = standby_->url(), .bearer_token = std::string(kRotatedKey), .max_attempts = 1});
  StatusOr<http::ClientResponse> answer = new_key.Get("/api/v1/workers");
  StatusOr<json> listed = answer.ok() ? answer->Json() : StatusOr<json>(answer.status());
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ((*listed)["workers"].size(), 1u) << listed->dump();
}

TEST_F(FailoverTest, LeaderKilledMidRoundTheStandbyFinishesTheJobWithTheUninterruptedWeights) {
  // Workers given both coordinators (`parsyn worker --server A,B`).
  const std::string both = server_->url() + "," + standby_->url();
  std::vector<int64_t> ids;
  for (int i = 0; i < 2; ++i) {
    const std::string name = "w" + std::to_string(i);
    Registered r = RegisterWorker(*admin_, name);
    ids.push_back(r.id);
    workers_.push_back(std::make_unique<Worker>(both, r.token, name, tmp_.path() / ("cache-" + name)));
    workers_.back()->Start();
  }
  ASSERT_TRUE(WaitOnline(ids)) << "workers did not say hello to the leader in time";

  // The standby answers API calls 503, naming the leader.
  http::Client standby_admin(
      http::ClientOptions{.base_url = standby_->url(), .bearer_token = server_->admin_key(), .max_attempts = 1});
  StatusOr<http::ClientResponse> refused = standby_admin.Get("/api/v1/training-jobs");
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr("standby; the leader is " + server_->url()));

  // The CLI given both URLs, the standby's first, uses the leader.
  CommandResult listed = RunParsyn({"job", "list", "--server", standby_->url() + "," + server_->url(), "--api-key",
                                    server_->admin_key(), "--output", "json"});
  EXPECT_EQ(listed.exit_code, 0) << listed.output;

  const int kRounds = 4;
  const int64_t reference_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 10));
  json reference = WaitForJobEnd(*admin_, reference_id, std::chrono::seconds(300));
  ASSERT_EQ(reference.value("status", ""), "succeeded") << reference.dump(2);

  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 10));
  // Mid-round: round 1 committed and round 2's tasks handed out.
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [](const std::string& type, const json& d) { return type == "round_started" && d.value("round", 0) == 2; },
      std::chrono::seconds(300)));
  // A user and key made on the leader while the standby runs: the standby learns them when it takes over.
  StatusOr<http::ClientResponse> user = admin_->PostJson("/api/v1/users", {{"name", "ops"}, {"platform_admin", true}});
  ASSERT_TRUE(user.ok()) << user.status().ToString();
  StatusOr<http::ClientResponse> key =
      admin_->PostJson("/api/v1/keys", {{"name", "pager"}, {"user_id", (*user->Json())["id"]}});
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  server_->Kill();

  ASSERT_EQ(WaitForRole(standby_->url(), "leader"), "leader");
  http::Client as_ops({.base_url = standby_->url(), .bearer_token = (*key->Json())["key"], .max_attempts = 1});
  StatusOr<http::ClientResponse> ops_reads = as_ops.Get("/api/v1/workers");
  EXPECT_TRUE(ops_reads.ok()) << "a key made on the previous leader: " << ops_reads.status().ToString();
  // From here on the fixture's admin client (ExpectGlobalsAreFedAvg's too) talks to the new leader.
  admin_ = std::make_unique<http::Client>(
      http::ClientOptions{.base_url = standby_->url(), .bearer_token = server_->admin_key()});
  http::Client& new_admin = *admin_;
  json job = WaitForJobEnd(new_admin, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  // The new leader resumed the job after its last committed round.
  EXPECT_TRUE(WaitForEvent(
      new_admin, job_id,
      [](const std::string& type, const json& d) {
        return type == "job_resumed" && d.value("committed_round", 0) >= 1 && d.value("committed_round", 0) < kRounds;
      },
      std::chrono::seconds(10)));

  // Now the former standby is the leader, and the CLI finds it past the dead one.
  CommandResult got = RunParsyn(
      {"job", "get", std::to_string(job_id), "--server", both, "--api-key", server_->admin_key(), "--output", "json"});
  EXPECT_EQ(got.exit_code, 0) << got.output;
  EXPECT_THAT(got.output, HasSubstr("\"succeeded\""));

  auto final_sha = [](http::Client& admin, int64_t id) {
    std::string sha;
    for (const json& r : Rounds(admin, id)) {
      if (r["outcome"] == "committed" && r["round"] == kRounds) sha = r.value("global_sha256", "");
    }
    return sha;
  };
  EXPECT_FALSE(final_sha(new_admin, reference_id).empty());
  EXPECT_EQ(final_sha(new_admin, job_id), final_sha(new_admin, reference_id));

  // No round committed twice, as the database holds it: one committed attempt and one round_committed event per round.
  StatusOr<std::unique_ptr<storage::PostgresMetadataStore>> store = storage::PostgresMetadataStore::Open(metadata_url_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::map<int, int> committed_attempts, committed_events;
  StatusOr<std::vector<storage::Round>> rounds = (*store)->ListRounds(job_id);
  StatusOr<std::vector<storage::JobEvent>> events = (*store)->ListJobEvents(job_id, 0, 100000);
  ASSERT_TRUE(rounds.ok() && events.ok()) << rounds.status().ToString() << events.status().ToString();
  for (const storage::Round& r : *rounds) {
    if (r.status == storage::RoundStatus::kCommitted) committed_attempts[r.round]++;
  }
  for (const storage::JobEvent& e : *events) {
    if (e.type != "round_committed") continue;
    json payload = json::parse(e.payload_json, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(payload.is_object()) << e.payload_json;
    if (payload.is_object()) committed_events[payload.value("round", 0)]++;
  }
  for (int round = 1; round <= kRounds; ++round) {
    EXPECT_EQ(committed_attempts[round], 1) << "round " << round;
    EXPECT_EQ(committed_events[round], 1) << "round " << round;
  }
  EXPECT_EQ(committed_attempts.size(), static_cast<size_t>(kRounds));
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
  ExpectOneAuditChainSignedByBothLeaders(both);
}

}  // namespace
}  // namespace parsyn::e2e
