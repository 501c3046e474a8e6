// The audit log end to end: a real `parsyn server` records what admins and workers did and the credentials it refused,
// signs checkpoints (also at SIGTERM), continues its chain after a restart; `parsyn audit export/key/verify` check it
// offline and name an edited, deleted or reordered record or a forged checkpoint, in an exported file and in the
// database itself.
#include <sqlite3.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <thread>

#include "base/ed25519.h"
#include "base/strings.h"
#include "coordinator/audit_chain.h"
#include "e2e_harness.h"

namespace parsyn::e2e {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> ReadLines(const fs::path& file) {
  std::vector<std::string> lines;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void WriteLines(const fs::path& file, const std::vector<std::string>& lines) {
  std::ofstream out(file);
  for (const std::string& line : lines) out << line << "\n";
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = tmp_.path() / "data";
    server_ = std::make_unique<Server>(data_, FreePort(), std::vector<std::string>{"--audit-checkpoint-every", "5"});
    server_->Start();
    admin_ = server_->Admin();
  }
  std::vector<std::string> Remote() const { return {"--server", server_->url(), "--api-key", server_->admin_key()}; }
  // `parsyn audit ARGS... --server ... --api-key ...`
  CommandResult Audit(std::vector<std::string> args) const {
    args.insert(args.begin(), "audit");
    for (const std::string& a : Remote()) args.push_back(a);
    return RunParsyn(args);
  }
  CommandResult Verify(const fs::path& file) const {
    return RunParsyn({"audit", "verify", file.string(), "--key", key_file().string()});
  }
  fs::path key_file() const { return tmp_.path() / "audit.pub"; }
  // The records GET /api/v1/audit gives for `query`, waiting (bounded) until there are at least `at_least`.
  std::vector<json> Records(const std::string& query, size_t at_least = 1) const {
    std::vector<json> records;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      StatusOr<http::ClientResponse> page = admin_->Get("/api/v1/audit?limit=1000&" + query);
      EXPECT_TRUE(page.ok()) << page.status().ToString();
      if (!page.ok()) return {};
      records = (*page->Json())["records"].get<std::vector<json>>();
      if (records.size() >= at_least) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return records;
  }

  TempDir tmp_;
  fs::path data_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<http::Client> admin_;
};

TEST_F(AuditLogTest, RecordsWhoDidWhatAndTheRefusedCredentialsAndAnExportVerifies) {
  const Registered worker = RegisterWorker(*admin_, "w1");
  // A job the coordinator refuses (400), and a credential it refuses, with the client's own request id.
  EXPECT_FALSE(admin_->PostJson("/api/v1/training-jobs", json{{"name", "bad"}}).ok());
  http::Client stranger(http::ClientOptions{.base_url = server_->url(), .bearer_token = "psk_not-the-key"});
  EXPECT_FALSE(stranger.Get("/api/v1/workers", {.headers = {{"X-Request-Id", "probe-1"}}}).ok());
  // A worker's hello: its actor is the worker.
  http::Client as_worker(http::ClientOptions{.base_url = server_->url(), .bearer_token = worker.token});
  StatusOr<http::ClientResponse> said_hello =
      as_worker.PostJson("/api/v1/worker/hello", json{{"device", "cpu (test)"}});
  ASSERT_TRUE(said_hello.ok()) << said_hello.status().ToString();

  const std::vector<json> registered = Records("action=" + http::PercentEncode("POST /api/v1/workers"));
  ASSERT_EQ(registered.size(), 1u);
  EXPECT_EQ(registered[0]["actor"], "admin");
  EXPECT_EQ(registered[0]["object"], "/api/v1/workers/" + std::to_string(worker.id));
  EXPECT_EQ(registered[0]["outcome"], "success");
  EXPECT_EQ(registered[0]["status"], 201);
  EXPECT_THAT(registered[0]["source"].get<std::string>(), HasSubstr("127.0.0.1:"));
  EXPECT_EQ(registered[0]["request_id"].get<std::string>().size(), 16u);
  // Timed when it was answered (UTC, RFC 3339): this minute, not the epoch.
  const auto now_s =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
  std::tm utc{};
  const std::time_t t = now_s.count();
  gmtime_r(&t, &utc);
  char today[16];
  std::strftime(today, sizeof(today), "%Y-%m-%dT", &utc);
  EXPECT_EQ(registered[0]["time"].get<std::string>().substr(0, 11), today);

  const std::vector<json> refused = Records("outcome=denied");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0]["actor"], "anonymous");
  EXPECT_EQ(refused[0]["action"], "GET /api/v1/workers");
  EXPECT_EQ(refused[0]["status"], 401);
  EXPECT_EQ(refused[0]["request_id"], "probe-1");
  EXPECT_THAT(refused[0]["detail"].get<std::string>(), HasSubstr("invalid API key"));

  const std::vector<json> failed = Records("outcome=failure");
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]["action"], "POST /api/v1/training-jobs");
  EXPECT_EQ(failed[0]["status"], 400);
  EXPECT_FALSE(failed[0]["detail"].get<std::string>().empty());

  const std::vector<json> hello = Records("actor=" + http::PercentEncode("worker " + std::to_string(worker.id)));
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(hello[0]["action"], "POST /api/v1/worker/hello");
  // Reads are not recorded.
  EXPECT_TRUE(Records("action=" + http::PercentEncode("GET /api/v1/workers") + "&outcome=success", 0).empty());
  // Newest first, one page at a time: the cursor goes on before the page's last record.
  StatusOr<http::ClientResponse> first = admin_->Get("/api/v1/audit?order=desc&limit=2");
  ASSERT_TRUE(first.ok());
  const json page = *first->Json();
  ASSERT_EQ(page["records"].size(), 2u);
  EXPECT_GT(page["records"][0]["seq"], page["records"][1]["seq"]);
  StatusOr<http::ClientResponse> second =
      admin_->Get("/api/v1/audit?order=desc&limit=2&cursor=" + page["next_cursor"].get<std::string>());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second->Json())["records"][0]["seq"], page["records"][1]["seq"].get<int64_t>() - 1);
  EXPECT_EQ(admin_->Get("/api/v1/audit?outcome=maybe").status().code(), StatusCode::kInvalidArgument);

  CommandResult key = Audit({"key", "--out", key_file().string()});
  ASSERT_EQ(key.exit_code, 0) << key.output;
  const fs::path exported = tmp_.path() / "audit.jsonl";
  CommandResult exp = Audit({"export", "--out", exported.string()});
  ASSERT_EQ(exp.exit_code, 0) << exp.output;
  CommandResult verified = Verify(exported);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("form one unbroken chain"));
  EXPECT_THAT(verified.output, HasSubstr("checkpoint(s) verified"));
}

TEST_F(AuditLogTest, TheChainIsSignedAtShutdownAndContinuedAfterARestart) {
  for (int i = 0; i < 3; ++i) RegisterWorker(*admin_, "w" + std::to_string(i));
  ASSERT_EQ(Audit({"key", "--out", key_file().string()}).exit_code, 0);
  EXPECT_EQ(server_->Terminate(), 0);
  server_->Start();
  admin_ = server_->Admin();
  RegisterWorker(*admin_, "after-restart");
  const fs::path exported = tmp_.path() / "audit.jsonl";
  ASSERT_EQ(Audit({"export", "--out", exported.string()}).exit_code, 0);
  const std::vector<std::string> lines = ReadLines(exported);
  // 3 registrations, the shutdown's checkpoint (record 4, signing record 3), then the new registration.
  ASSERT_GE(lines.size(), 5u);
  const json checkpoint = json::parse(lines[3]);
  EXPECT_EQ(checkpoint["action"], "audit.checkpoint");
  EXPECT_EQ(checkpoint["checkpoint"]["seq"], 3);
  EXPECT_EQ(json::parse(lines[4])["object"], "/api/v1/workers/4");
  CommandResult verified = Verify(exported);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
}

TEST_F(AuditLogTest, VerifyNamesAnEditedDeletedOrReorderedRecordAndAForgedCheckpoint) {
  for (int i = 0; i < 6; ++i) RegisterWorker(*admin_, "w" + std::to_string(i));
  ASSERT_EQ(Audit({"key", "--out", key_file().string()}).exit_code, 0);
  const fs::path exported = tmp_.path() / "audit.jsonl";
  ASSERT_EQ(Audit({"export", "--out", exported.string()}).exit_code, 0);
  const std::vector<std::string> lines = ReadLines(exported);
  ASSERT_GE(lines.size(), 7u);  // 6 records and the checkpoint after the 5th
  ASSERT_EQ(Verify(exported).exit_code, 0);
  const fs::path tampered = tmp_.path() / "tampered.jsonl";
  auto expect_broken = [&](const std::vector<std::string>& changed, const std::string& named) {
    WriteLines(tampered, changed);
    CommandResult r = Verify(tampered);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr(named));
  };
  std::vector<std::string> edited = lines;
  json record = json::parse(edited[2]);
  record["actor"] = "someone else";
  edited[2] = record.dump();
  expect_broken(edited, "record 3 (line 3) was edited");

  std::vector<std::string> deleted = lines;
  deleted.erase(deleted.begin() + 1);
  expect_broken(deleted, "record 2 deleted");

  std::vector<std::string> reordered = lines;
  std::swap(reordered[1], reordered[2]);
  expect_broken(reordered, "the records were reordered");

  // A checkpoint signed by another key under the coordinator's key id, its hash recomputed.
  std::vector<std::string> forged = lines;
  json cp = json::parse(forged[5]);
  ASSERT_EQ(cp["action"], "audit.checkpoint");
  const Ed25519PrivateKey forger = Ed25519PrivateKey::Generate().value();
  cp["checkpoint"]["signature"] = HexEncode(forger.Sign(
      coordinator::AuditCheckpointMessage(cp["checkpoint"]["seq"], cp["checkpoint"]["hash"].get<std::string>())));
  cp["hash"] = coordinator::AuditRecordHash(cp);
  forged[5] = cp.dump();
  json after = json::parse(forged[6]);
  after["prev_hash"] = cp["hash"];
  after["hash"] = coordinator::AuditRecordHash(after);
  forged[6] = after.dump();
  expect_broken(forged, "checkpoint record 6 (line 6) is forged");
}

TEST_F(AuditLogTest, AChainRewrittenInTheDatabaseFailsAtItsCheckpoint) {
  for (int i = 0; i < 6; ++i) RegisterWorker(*admin_, "w" + std::to_string(i));
  ASSERT_EQ(Audit({"key", "--out", key_file().string()}).exit_code, 0);
  EXPECT_EQ(server_->Terminate(), 0);
  // Someone with the database rewrites record 2's actor and every hash and link after it, as the coordinator would.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((data_ / "metadata.db").c_str(), &db), SQLITE_OK);
  std::vector<json> records;
  sqlite3_stmt* read = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT record_json FROM audit_records ORDER BY seq", -1, &read, nullptr),
            SQLITE_OK);
  while (sqlite3_step(read) == SQLITE_ROW) {
    records.push_back(json::parse(reinterpret_cast<const char*>(sqlite3_column_text(read, 0))));
  }
  sqlite3_finalize(read);
  ASSERT_GE(records.size(), 8u);  // 6, the checkpoint after 5, the one at shutdown
  records[1]["actor"] = "someone else";
  for (size_t i = 1; i < records.size(); ++i) {
    records[i]["prev_hash"] = records[i - 1]["hash"];
    records[i]["hash"] = coordinator::AuditRecordHash(records[i]);
    sqlite3_stmt* write = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE audit_records SET record_json = ?1 WHERE seq = ?2", -1, &write, nullptr),
              SQLITE_OK);
    const std::string text = records[i].dump();
    sqlite3_bind_text(write, 1, text.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(write, 2, records[i]["seq"].get<int64_t>());
    ASSERT_EQ(sqlite3_step(write), SQLITE_DONE);
    sqlite3_finalize(write);
  }
  sqlite3_close(db);
  server_->Start();
  admin_ = server_->Admin();
  const fs::path exported = tmp_.path() / "audit.jsonl";
  ASSERT_EQ(Audit({"export", "--out", exported.string()}).exit_code, 0);
  CommandResult r = Verify(exported);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkpoint record 6 (line 6) signs record 5"));
}

}  // namespace
}  // namespace parsyn::e2e
