// Securely aggregated jobs (docs/secure-aggregation.md) with real `parsyn worker` processes on a tiny Llama: a round's
// global is the FedAvg of the workers' updates up to quantization (the same job without secure aggregation, whose
// runs are deterministic, gives the reference), the coordinator stores masked inputs, never updates; a worker lost
// after sharing its keys (its trainer crashes) is recovered from the survivors' shares and every round commits; a
// dp_fedavg job's workers clip and add the noise, and its global and epsilon are the plain dp_fedavg job's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

class SecureAggregationTest : public LlamaJobTest {
 protected:
  SecureAggregationTest() { server_flags_.push_back("--keep-updates"); }

  static json Secure(json spec, double clipping_range) {
    spec["distributed"]["secure_aggregation"] = {{"enabled", true}, {"clipping_range", clipping_range}};
    return spec;
  }

  // The committed global of round `round` of the job, by tensor.
  std::map<std::string, std::vector<double>> Global(int64_t job_id, int round) {
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r["outcome"] == "committed" && r["round"] == round) {
        return ReadTensors(BlobPath(AttemptPrefix(job_id, round, r["attempt"]) + "/global.safetensors"));
      }
    }
    ADD_FAILURE() << "job " << job_id << " committed no round " << round;
    return {};
  }

  // Runs `plain`, then the same job securely aggregated with `clipping_range`: round 1 trains the same initial
  // weights on the same shards with the same seeds in both, so the secure global is the plain one up to the
  // quantization of each worker's change (at most one step, 2c / (2^16 - 1), each). The two jobs' ids.
  std::pair<int64_t, int64_t> ExpectSecureRoundIsPlainUpToQuantization(const json& plain, double clipping_range) {
    const int64_t plain_id = CreateJob(*admin_, plain);
    EXPECT_EQ(WaitForJobEnd(*admin_, plain_id, std::chrono::seconds(300)).value("status", ""), "succeeded");
    const int64_t secure_id = CreateJob(*admin_, Secure(plain, clipping_range));
    json job = WaitForJobEnd(*admin_, secure_id, std::chrono::seconds(300));
    EXPECT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
    ExpectEqualUpToQuantization(
        Global(plain_id, 1), Global(secure_id, 1),
        ReadTensors(BlobPath("jobs/" + std::to_string(plain_id) + "/rounds/000000/global.safetensors")),
        2 * clipping_range / 65535.0);
    return {plain_id, secure_id};
  }
};

TEST_F(SecureAggregationTest, TheGlobalIsTheFedAvgOfTheQuantizedUpdatesAndNoUpdateIsStored) {
  const std::vector<int64_t> ids = StartWorkers(3);
  const auto [plain_id, secure_id] = ExpectSecureRoundIsPlainUpToQuantization(LoraSpec(ids, 1, 4, 3), 1.0);
  const auto reference = Global(plain_id, 1);

  // What the coordinator stored of each worker: its masked input (4 bytes per exchanged value and one for the
  // weight), not a safetensors file of its update.
  size_t exchanged = 0;
  for (const auto& [name, values] : reference) exchanged += values.size();
  int masked = 0;
  for (const json& r : Rounds(*admin_, secure_id)) {
    if (r["outcome"] != "committed" || r["round"] != 1) continue;
    for (const json& u : r["updates"]) {
      EXPECT_EQ(u["status"], "accepted") << u.dump();
      const fs::path blob = BlobPath(AttemptPrefix(secure_id, 1, r["attempt"]) + "/updates/w" +
                                     std::to_string(u["worker_id"].get<int64_t>()) + ".safetensors");
      EXPECT_EQ(fs::file_size(blob), 4 * (exchanged + 1)) << blob;
      ++masked;
    }
  }
  EXPECT_EQ(masked, 3);
}

TEST_F(SecureAggregationTest, AWorkerLostAfterSharingItsKeysIsRecoveredFromTheSurvivorsShares) {
  // The third worker's trainer dies at once: it joins each round's key exchanges, then fails before its masked
  // input, so the coordinator removes its pair masks from the survivors' sum with its rebuilt masking key.
  const fs::path crashing = WriteCrashingTrainer();
  std::vector<int64_t> ids = StartWorkers(2);
  const std::vector<int64_t> crash_ids = StartWorkers(1, {"--trainer", "builtin=" + crashing.string()});
  ids.push_back(crash_ids[0]);
  const int64_t job_id = CreateJob(*admin_, Secure(LoraSpec(ids, 2, 4, 2, 60), 1.0));
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  const std::vector<json> committed = CommittedRounds(*admin_, job_id);
  for (const json& r : committed) {
    std::vector<int64_t> accepted;
    for (const json& u : r["updates"]) {
      if (u["status"] == "accepted") accepted.push_back(u["worker_id"].get<int64_t>());
    }
    std::sort(accepted.begin(), accepted.end());
    EXPECT_EQ(accepted, (std::vector<int64_t>{ids[0], ids[1]})) << r.dump();
  }
  EXPECT_EQ(committed.size(), 2u);
  EXPECT_NE(workers_[2]->log().find("simulated crash"), std::string::npos) << workers_[2]->log();
  // Each round's "secure_aggregation" event says who took part in each phase: all three shared their keys, the two
  // survivors' inputs were summed and their shares revealed.
  int events = 0;
  WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        if (type != "secure_aggregation") return false;
        EXPECT_EQ(d["phase"], "unmasked") << d.dump();
        EXPECT_EQ(d["shared"].size(), 3u) << d.dump();
        EXPECT_EQ(d["masked"], json({ids[0], ids[1]})) << d.dump();
        EXPECT_EQ(d["revealed"], json({ids[0], ids[1]})) << d.dump();
        return ++events == 2;
      },
      std::chrono::seconds(10));
  EXPECT_EQ(events, 2);
}

// dp_fedavg under secure aggregation: each worker clips its change and adds its share of the noise, the coordinator
// adds none and accounts the round as central dp_fedavg would. With a clip norm that clips every update and noise too
// small to matter, the global is the plain dp_fedavg job's (the unweighted mean of the clipped changes) up to
// quantization, and both jobs report the same epsilon.
TEST_F(SecureAggregationTest, DpFedAvgClipsAndNoisesOnTheWorkersAndIsAccountedAsCentralDpFedAvg) {
  const std::vector<int64_t> ids = StartWorkers(3);
  json plain = LoraSpec(ids, 1, 4, 3);
  plain["distributed"]["strategy"] = "dp_fedavg";
  plain["distributed"]["strategy_options"] = {{"clip_norm", 1e-3}, {"noise_multiplier", 1e-6}};
  const auto [plain_id, secure_id] = ExpectSecureRoundIsPlainUpToQuantization(plain, 0.01);
  std::map<std::string, json> privacy;
  for (const auto& [name, id] : {std::pair<std::string, int64_t>{"plain", plain_id}, {"secure", secure_id}}) {
    for (const json& r : Rounds(*admin_, id)) {
      if (r["outcome"] == "committed" && r["round"] == 1) privacy[name] = r.value("privacy", json());
    }
  }
  ASSERT_TRUE(privacy["plain"].is_object() && privacy["secure"].is_object()) << json(privacy).dump();
  EXPECT_EQ(privacy["plain"]["clipped"], 3) << "every update is clipped, so the clipping is what is compared";
  EXPECT_EQ(privacy["secure"]["participants"], 3);
  EXPECT_EQ(privacy["secure"]["epsilon"], privacy["plain"]["epsilon"]);
}

// The coordinator killed (SIGKILL) while a secure attempt runs its phases keeps nothing of it: after the restart the
// attempt is over, the workers' messages for it are refused, and the round runs again as a new attempt with fresh
// keys; the job ends with every round committed and summed over all three workers.
TEST_F(SecureAggregationTest, ACoordinatorKilledDuringASecureAttemptRetriesTheRoundWithFreshKeys) {
  const std::vector<int64_t> ids = StartWorkers(3);
  const int64_t job_id = CreateJob(*admin_, Secure(LoraSpec(ids, 2, 4, 3, 60), 1.0));
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) { return type == "round_started" && d.value("round", 0) == 1; },
      std::chrono::seconds(120)));
  server_->Kill();
  server_->Start();  // same data directory, same port: the workers reconnect on their own
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  const std::vector<json> committed = CommittedRounds(*admin_, job_id);
  for (const json& r : committed) {
    ASSERT_TRUE(r.contains("secure_aggregation")) << r.dump();
    EXPECT_EQ(r["secure_aggregation"]["masked"], json(ids)) << r.dump();
    if (r["round"] == 1) EXPECT_GT(r["attempt"].get<int>(), 1) << "round 1 ran again after the restart: " << r.dump();
  }
  EXPECT_EQ(committed.size(), 2u);
}

TEST_F(SecureAggregationTest, AStrategyThatNeedsSingleUpdatesIsRefused) {
  const std::vector<int64_t> ids = StartWorkers(2);
  json spec = Secure(LoraSpec(ids, 1, 4, 2), 1.0);
  spec["distributed"]["strategy"] = "median";
  StatusOr<http::ClientResponse> res = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("needs each worker's update"), std::string::npos) << res.status().ToString();
}

}  // namespace
}  // namespace parsyn::e2e
