#include "coordinator/audit_chain.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/strings.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

AuditEntry Entry(std::string actor, std::string action, int status) {
  return AuditEntry{.time_ms = 1'764'954'191'000,
                    .actor = std::move(actor),
                    .action = std::move(action),
                    .object = "/api/v1/training-jobs/3",
                    .outcome = AuditOutcome(status),
                    .status = status,
                    .source = "127.0.0.1:5000",
                    .request_id = "r1"};
}

class AuditChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = Ed25519PrivateKey::Generate().value();
    pub_.push_back(Ed25519PublicKey::FromPem(key_.PublicPem()).value());
    // Records 1-3, a checkpoint (4) signing record 3, records 5-6, a checkpoint (7) signing record 6.
    Add(ChainAuditRecord(Entry("admin", "POST /api/v1/datasets", 201), 1, kAuditGenesisHash));
    Add(ChainAuditRecord(Entry("anonymous", "GET /api/v1/models", 401), 2, Hash(0)));
    Add(ChainAuditRecord(Entry("worker 7", "POST /api/v1/worker/result", 200), 3, Hash(1)));
    Add(ChainAuditCheckpoint(4, 1'764'954'192'000, "coordinator c1", 3, Hash(2), key_));
    Add(ChainAuditRecord(Entry("admin", "POST /api/v1/training-jobs/{id}/cancel", 200), 5, Hash(3)));
    Add(ChainAuditRecord(Entry("admin", "DELETE /api/v1/models/{id}", 409), 6, Hash(4)));
    Add(ChainAuditCheckpoint(7, 1'764'954'193'000, "coordinator c1", 6, Hash(5), key_));
  }
  void Add(json record) { records_.push_back(std::move(record)); }
  std::string Hash(size_t i) const { return records_.at(i)["hash"].get<std::string>(); }
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    for (const json& r : records_) lines.push_back(r.dump());
    return lines;
  }
  // The error VerifyAuditLines gives for the records as they are now.
  std::string Broken() const {
    const std::vector<std::string> lines = Lines();
    StatusOr<AuditVerification> result = VerifyAuditLines(lines, pub_);
    EXPECT_FALSE(result.ok());
    if (result.ok()) return "";
    EXPECT_EQ(result.status().code(), StatusCode::kDataLoss) << result.status().ToString();
    return result.status().message();
  }
  // Recomputes the hashes and links from record index `from` on, as someone editing the store would.
  void Rechain(size_t from) {
    for (size_t i = from; i < records_.size(); ++i) {
      if (i > 0) records_[i]["prev_hash"] = Hash(i - 1);
      records_[i]["hash"] = AuditRecordHash(records_[i]);
    }
  }

  Ed25519PrivateKey key_ = Ed25519PrivateKey::Generate().value();
  std::vector<Ed25519PublicKey> pub_;
  std::vector<json> records_;
};

TEST_F(AuditChainTest, AnIntactChainVerifiesWithItsCheckpoints) {
  const std::vector<std::string> lines = Lines();
  StatusOr<AuditVerification> result = VerifyAuditLines(lines, pub_);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->first_seq, 1);
  EXPECT_EQ(result->last_seq, 7);
  EXPECT_EQ(result->records, 7);
  EXPECT_EQ(result->checkpoints, 2);
  EXPECT_EQ(result->last_checkpoint_seq, 7);
  EXPECT_EQ(result->unsigned_tail, 0);
  EXPECT_EQ(records_[0]["prev_hash"], kAuditGenesisHash);
  EXPECT_EQ(records_[1]["outcome"], "denied");
  EXPECT_EQ(records_[5]["outcome"], "failure");
  EXPECT_EQ(records_[0]["time"], "2025-12-05T17:03:11.000Z");
}

TEST_F(AuditChainTest, AnExportStartingLaterAndEndingUnsignedVerifiesFromItsFirstRecord) {
  records_.erase(records_.begin(), records_.begin() + 2);
  records_.pop_back();
  const std::vector<std::string> lines = Lines();
  StatusOr<AuditVerification> result = VerifyAuditLines(lines, pub_);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->first_seq, 3);
  EXPECT_EQ(result->checkpoints, 1);
  EXPECT_EQ(result->unsigned_tail, 2);  // records 5 and 6
}

TEST_F(AuditChainTest, AnEditedRecordIsNamed) {
  records_[1]["actor"] = "admin";
  EXPECT_THAT(Broken(), HasSubstr("record 2 (line 2) was edited"));
}

TEST_F(AuditChainTest, AnEditedRecordWithItsHashRecomputedIsNamedByTheNextLink) {
  records_[1]["outcome"] = "success";
  records_[1]["hash"] = AuditRecordHash(records_[1]);
  EXPECT_THAT(Broken(), HasSubstr("record 3 (line 3)'s prev_hash is not the hash of record 2"));
}

TEST_F(AuditChainTest, AChainRewrittenFromAnEditedRecordOnFailsAtTheNextCheckpoint) {
  records_[4]["actor"] = "someone else";
  Rechain(4);
  EXPECT_THAT(Broken(), HasSubstr("checkpoint record 7 (line 7) signs record 6"));
}

TEST_F(AuditChainTest, ADeletedRecordIsNamed) {
  records_.erase(records_.begin() + 4);
  EXPECT_THAT(Broken(), HasSubstr("record 5 deleted"));
  records_.erase(records_.begin() + 1, records_.begin() + 3);
  EXPECT_THAT(Broken(), HasSubstr("record 2 to 3 deleted"));
}

TEST_F(AuditChainTest, ReorderedRecordsAreNamed) {
  std::swap(records_[1], records_[2]);
  EXPECT_THAT(Broken(), HasSubstr("record 3 (line 2) comes before record 2: the records were reordered"));
}

TEST_F(AuditChainTest, AForgedCheckpointIsNamed) {
  // Signed by another key that claims to be the coordinator's.
  const Ed25519PrivateKey forger = Ed25519PrivateKey::Generate().value();
  records_[3]["checkpoint"]["signature"] =
      HexEncode(forger.Sign(AuditCheckpointMessage(3, records_[3]["checkpoint"]["hash"].get<std::string>())));
  Rechain(3);
  EXPECT_THAT(Broken(), HasSubstr("checkpoint record 4 (line 4) is forged"));
}

TEST_F(AuditChainTest, ACheckpointByAKeyNotGivenIsRefused) {
  pub_ = {Ed25519PublicKey::FromPem(Ed25519PrivateKey::Generate().value().PublicPem()).value()};
  EXPECT_THAT(Broken(), HasSubstr("which no --key gives"));
}

TEST_F(AuditChainTest, WhatIsNoRecordIsInvalidArgument) {
  const std::vector<std::string> lines = {records_[0].dump(), "{\"seq\": 2}"};
  EXPECT_EQ(VerifyAuditLines(lines, pub_).status().code(), StatusCode::kInvalidArgument);
  const std::vector<std::string> none;
  EXPECT_EQ(VerifyAuditLines(none, pub_).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifyAuditLines(Lines(), {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(AuditChainRecordTest, BytesThatAreNotUtf8AreHashedAsTheyAreStored) {
  AuditEntry entry = Entry("admin", "POST /x", 400);
  entry.object = std::string("/api/v1/models/\xff\xfe");
  const json record = ChainAuditRecord(entry, 1, kAuditGenesisHash);
  const json again = json::parse(record.dump());
  EXPECT_EQ(AuditRecordHash(again), again["hash"].get<std::string>());
}

}  // namespace
}  // namespace parsyn::coordinator
