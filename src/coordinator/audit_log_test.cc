// AuditLog on its own: a real io_context, SQLite in memory (through FaultyMetadataStore for the failures), and the
// chain checked as `parsyn audit verify` checks it.
#include "coordinator/audit_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "storage/faulty_metadata_store.h"

namespace parsyn::coordinator {
namespace {

using ::testing::HasSubstr;

AuditEntry Entry(int i) {
  return AuditEntry{.time_ms = 1'764'954'191'000 + i,
                    .actor = "admin",
                    .action = "POST /api/v1/datasets",
                    .object = "/api/v1/datasets/" + std::to_string(i),
                    .outcome = "success",
                    .status = 201,
                    .source = "127.0.0.1:5000",
                    .request_id = "r" + std::to_string(i)};
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::make_unique<storage::FaultyMetadataStore>(storage::OpenMetadataStore(":memory:").value());
  }
  std::unique_ptr<AuditLog> Log(int64_t checkpoint_every, Ed25519PrivateKey key) {
    auto log = std::make_unique<AuditLog>(*store_, pool_, io_.get_executor(), clock_, std::move(key),
                                          "coordinator test", checkpoint_every);
    EXPECT_TRUE(log->LoadHead().ok());
    return log;
  }
  // Appends entries [from, to) at once (each waiting for its own write) and runs the loop until all are answered.
  void AppendAll(AuditLog& log, int from, int to) {
    int answered = 0;
    for (int i = from; i < to; ++i) {
      boost::asio::co_spawn(
          io_,
          [&log, &answered, i]() -> http::Awaitable<void> {
            auto append = log.Append(Entry(i));
            co_await std::move(append);
            ++answered;
          },
          boost::asio::detached);
    }
    io_.restart();
    while (answered < to - from) io_.run_one();
  }
  void Run(http::Awaitable<void> work) {
    boost::asio::co_spawn(io_, std::move(work), boost::asio::detached);
    io_.restart();
    io_.run();
  }
  std::vector<std::string> StoredLines() {
    std::vector<std::string> lines;
    const std::vector<storage::AuditRecord> records = store_->ListAuditRecords({.limit = 100000}).value();
    for (const storage::AuditRecord& r : records) {
      lines.push_back(r.record_json);
    }
    return lines;
  }
  static Ed25519PublicKey Public(const AuditLog& log) {
    return Ed25519PublicKey::FromPem(log.public_key_pem()).value();
  }

  boost::asio::io_context io_;
  boost::asio::thread_pool pool_{2};
  FakeClock clock_;
  std::unique_ptr<storage::FaultyMetadataStore> store_;
};

TEST_F(AuditLogTest, EntriesAppendedAtOnceFormOneChainWithACheckpointEveryN) {
  std::unique_ptr<AuditLog> log = Log(4, Ed25519PrivateKey::Generate().value());
  AppendAll(*log, 0, 10);
  const std::vector<std::string> lines = StoredLines();
  // 10 entries and a checkpoint after every 4 records: at 5 (signing 4) and 10 (signing 9).
  ASSERT_EQ(lines.size(), 12u);
  const std::vector<Ed25519PublicKey> keys = {Public(*log)};
  StatusOr<AuditVerification> verified = VerifyAuditLines(lines, keys);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->checkpoints, 2);
  EXPECT_EQ(verified->last_checkpoint_seq, 10);
  EXPECT_EQ(verified->unsigned_tail, 2);
  // Every entry is there once, in the order appended.
  std::vector<std::string> objects;
  for (const std::string& line : lines) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record["action"] != kAuditCheckpointAction) objects.push_back(record["object"]);
  }
  ASSERT_EQ(objects.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(objects[i], "/api/v1/datasets/" + std::to_string(i));
  // The stored filter columns match the records.
  EXPECT_EQ(store_->ListAuditRecords({.action = std::string(kAuditCheckpointAction)})->size(), 2u);

  Run(log->Checkpoint());  // at shutdown: the tail gets its signature
  const std::vector<std::string> signed_lines = StoredLines();
  verified = VerifyAuditLines(signed_lines, keys);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->unsigned_tail, 0);
  EXPECT_EQ(verified->last_seq, 13);
  Run(log->Checkpoint());  // nothing new: no second checkpoint in a row
  EXPECT_EQ(StoredLines().size(), 13u);
}

TEST_F(AuditLogTest, ANewLeaderContinuesTheChainWithItsOwnKey) {
  std::unique_ptr<AuditLog> first = Log(100, Ed25519PrivateKey::Generate().value());
  AppendAll(*first, 0, 3);
  Run(first->Checkpoint());
  std::unique_ptr<AuditLog> second = Log(100, Ed25519PrivateKey::Generate().value());
  AppendAll(*second, 3, 5);
  Run(second->Checkpoint());
  const std::vector<std::string> lines = StoredLines();
  ASSERT_EQ(lines.size(), 7u);
  const std::vector<Ed25519PublicKey> both = {Public(*first), Public(*second)};
  StatusOr<AuditVerification> verified = VerifyAuditLines(lines, both);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(verified->checkpoints, 2);
  // Without the second coordinator's key its checkpoint is refused.
  const std::vector<Ed25519PublicKey> first_only = {Public(*first)};
  EXPECT_THAT(VerifyAuditLines(lines, first_only).status().message(), HasSubstr("which no --key gives"));
}

TEST_F(AuditLogTest, AStaleHeadIsReadAgainAndTheEntriesChainedAfterTheNewOne) {
  std::unique_ptr<AuditLog> old_leader = Log(100, Ed25519PrivateKey::Generate().value());
  std::unique_ptr<AuditLog> new_leader = Log(100, Ed25519PrivateKey::Generate().value());
  AppendAll(*new_leader, 0, 2);
  AppendAll(*old_leader, 2, 3);  // its head (empty chain) is stale: seq 1 is taken
  const std::vector<std::string> lines = StoredLines();
  ASSERT_EQ(lines.size(), 3u);
  const std::vector<Ed25519PublicKey> keys = {Public(*old_leader)};
  EXPECT_TRUE(VerifyAuditLines(lines, keys).ok());
}

TEST_F(AuditLogTest, EntriesTheStoreRefusedAreWrittenWithTheNextOnes) {
  std::unique_ptr<AuditLog> log = Log(100, Ed25519PrivateKey::Generate().value());
  store_->FailNextWrites(1, UnavailableError("database is down"));
  AppendAll(*log, 0, 1);
  EXPECT_TRUE(StoredLines().empty());
  AppendAll(*log, 1, 2);
  const std::vector<std::string> lines = StoredLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["object"], "/api/v1/datasets/0");
  const std::vector<Ed25519PublicKey> keys = {Public(*log)};
  EXPECT_TRUE(VerifyAuditLines(lines, keys).ok());
}

TEST(AuditSigningKeyTest, IsMadeOnceInTheDataDirOrReadFromTheFileGiven) {
  test_support::TempDir dir("audit-key");
  const Ed25519PrivateKey made = LoadAuditSigningKey({}, dir.path()).value();
  EXPECT_EQ(LoadAuditSigningKey({}, dir.path()).value().PublicPem(), made.PublicPem());
  EXPECT_EQ(std::filesystem::status(dir.path() / "audit-signing-key.pem").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(LoadAuditSigningKey(dir.path() / "audit-signing-key.pem", "/nonexistent").value().PublicPem(),
            made.PublicPem());
  std::ofstream(dir.path() / "bad.pem") << "not a key";
  StatusOr<Ed25519PrivateKey> bad = LoadAuditSigningKey(dir.path() / "bad.pem", dir.path());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("openssl genpkey -algorithm ed25519"));
}

}  // namespace
}  // namespace parsyn::coordinator
