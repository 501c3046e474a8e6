// Strategies end to end: a federated tabular job (the MLP of federated_tabular_test.cc) with a server optimizer
// (fedadam) and real `parsyn worker` processes. Its globals are the optimizer's steps (not the FedAvg mean), its
// server state is stored beside each committed global, the loss falls, and a coordinator killed mid-job resumes the
// optimizer bit-identically: the final global has the uninterrupted job's sha256. Client sampling picks, per round,
// the participants the API lists. A median job (robust aggregation) commits, per round, the coordinate-wise median of
// the accepted updates; a dp_fedavg job reports its privacy ε per round, increasing; FedProx's mu reaches the
// trainers, whose updates stay nearer the global than FedAvg's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

class StrategyJobTest : public LlamaJobTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartTabularMlpServer()); }

  json Spec(const std::vector<int64_t>& worker_ids, int rounds, int steps, const std::string& strategy,
            json options) const {
    json spec = TabularJobSpec("e2e-" + strategy, dataset_id_, model_id_, worker_ids, rounds, steps);
    spec["distributed"]["strategy"] = strategy;
    spec["distributed"]["strategy_options"] = std::move(options);
    return spec;
  }

  // The largest |global - FedAvg mean of the round's accepted updates| over the committed rounds' parameters.
  double LargestDistanceFromFedAvg(int64_t job_id) {
    double largest = 0;
    for (const json& round : Rounds(*admin_, job_id)) {
      if (round["outcome"] != "committed" || round["round"].get<int>() < 1) continue;
      const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
      std::map<std::string, std::vector<double>> mean = FedAvgOfRound(job_id, round);
      for (auto& [name, values] : ReadTensors(BlobPath(prefix + "/global.safetensors"))) {
        for (size_t i = 0; i < values.size() && i < mean[name].size(); ++i) {
          largest = std::max(largest, std::abs(values[i] - mean[name][i]));
        }
      }
    }
    return largest;
  }

  // The largest |global - coordinate-wise median of the round's accepted updates| over the committed rounds (an odd
  // number of updates: the median is one of the values, so an exact aggregation gives 0).
  double LargestDistanceFromMedian(int64_t job_id) {
    double largest = 0;
    for (const json& round : Rounds(*admin_, job_id)) {
      if (round["outcome"] != "committed" || round["round"].get<int>() < 1) continue;
      const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
      std::map<std::string, std::vector<std::vector<double>>> values_by_name;
      for (const json& u : round["updates"]) {
        if (u["status"] != "accepted") continue;
        for (auto& [name, values] : UpdateTensors(prefix, u)) {
          values_by_name[name].push_back(values);
        }
      }
      for (auto& [name, values] : ReadTensors(BlobPath(prefix + "/global.safetensors"))) {
        const std::vector<std::vector<double>>& updates = values_by_name[name];
        EXPECT_EQ(updates.size() % 2, 1u) << name;
        for (size_t i = 0; i < values.size(); ++i) {
          std::vector<double> column;
          for (const auto& u : updates) column.push_back(u[i]);
          std::sort(column.begin(), column.end());
          largest = std::max(largest, std::abs(values[i] - column[column.size() / 2]));
        }
      }
    }
    return largest;
  }

  // The largest distance (L2 over all parameters) of round 1's accepted updates from the global they started from:
  // the model's own weights (a tabular job's initial global is the model's model.safetensors).
  double LargestRoundOneUpdateDistance(int64_t job_id) {
    auto start = ReadTensors(tmp_.path() / "model" / "model.safetensors");
    double largest = 0;
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r["outcome"] != "committed" || r["round"] != 1) continue;
      const std::string prefix = AttemptPrefix(job_id, r["round"], r["attempt"]);
      for (const json& u : r["updates"]) {
        if (u["status"] != "accepted") continue;
        double squared = 0;
        for (auto& [name, values] : UpdateTensors(prefix, u)) {
          const std::vector<double>& from = start.at(name);
          for (size_t i = 0; i < values.size() && i < from.size(); ++i) {
            squared += (values[i] - from[i]) * (values[i] - from[i]);
          }
        }
        largest = std::max(largest, std::sqrt(squared));
      }
    }
    return largest;
  }
};

TEST_F(StrategyJobTest, FedAdamJobStepsTheGlobalStoresItsStateAndTheLossFalls) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 4;
  const int64_t job_id = CreateJob(*admin_, Spec(ids, kRounds, 20, "fedadam", {{"server_learning_rate", 0.05}}));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  // The stored spec names the strategy with every option filled in.
  StatusOr<http::ClientResponse> got = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const json stored = *got->Json();
  const json options = stored["spec"]["distributed"]["strategy_options"];
  EXPECT_EQ(stored["spec"]["distributed"]["strategy"], "fedadam") << stored.dump();
  EXPECT_EQ(options, json({{"server_learning_rate", 0.05}, {"beta1", 0.9}, {"beta2", 0.99}, {"tau", 1e-9}}))
      << stored.dump();

  std::vector<double> losses;
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    ++committed;
    const std::string prefix = AttemptPrefix(job_id, r["round"], r["attempt"]);
    EXPECT_TRUE(fs::exists(BlobPath(prefix + "/server_state.safetensors"))) << prefix;
    EXPECT_EQ(std::set<int64_t>(r["participants"].begin(), r["participants"].end()),
              std::set<int64_t>(ids.begin(), ids.end()))
        << r.dump();
    if (r["train_loss"].is_number()) losses.push_back(r["train_loss"].get<double>());
  }
  EXPECT_EQ(committed, kRounds);
  // The globals are the optimizer's steps from the mean, not the mean itself.
  EXPECT_GT(LargestDistanceFromFedAvg(job_id), 1e-4);
  ASSERT_GE(losses.size(), 2u);
  EXPECT_LT(losses.back(), losses.front()) << "train losses did not fall";
  ASSERT_TRUE(job["final_validation_loss"].is_number()) << job.dump(2);
  std::printf("[figures] fedadam tabular: train loss round 1 %.4f -> round %d %.4f, final validation loss %.4f\n",
              losses.front(), kRounds, losses.back(), job["final_validation_loss"].get<double>());
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

TEST_F(StrategyJobTest, FedAdamServerKilledMidJobFinishesWithTheUninterruptedWeights) {
  std::vector<int64_t> ids = StartWorkers(2);
  ExpectAResumedJobEndsWithTheUninterruptedWeights(Spec(ids, 3, 10, "fedadam", json::object()));
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// With the globals sent as deltas, the coordinator's downlink residual is stored with each global: the job resumed
// after the kill goes on from it, and its globals are the uninterrupted job's, bit for bit.
TEST_F(StrategyJobTest, GlobalDeltasServerKilledMidJobFinishesWithTheUninterruptedWeights) {
  std::vector<int64_t> ids = StartWorkers(2);
  json spec = Spec(ids, 3, 10, "federated_averaging", json::object());
  spec["distributed"]["compression"] = {{"global", "delta_int4"}};
  ExpectAResumedJobEndsWithTheUninterruptedWeights(spec);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

TEST_F(StrategyJobTest, SampleCountTrainsTheSeededChoiceOfWorkersEachRound) {
  std::vector<int64_t> ids = StartWorkers(3);
  json spec = Spec(ids, 3, 5, "federated_averaging", {{"sample_count", 2}});
  spec["distributed"]["min_workers"] = 2;
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  std::set<int64_t> trained;
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    ++committed;
    EXPECT_EQ(r["participants"].size(), 2u) << r.dump();
    for (const json& w : r["participants"]) trained.insert(w.get<int64_t>());
  }
  EXPECT_EQ(committed, 3);
  EXPECT_GE(trained.size(), 2u);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// FedProx: mu reaches the workers' trainers with their tasks, whose proximal term keeps each update nearer the global
// it started from than the same job's FedAvg updates (same data, seeds and steps).
TEST_F(StrategyJobTest, FedProxKeepsTheWorkersUpdatesNearerTheGlobalThanFedAvg) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int64_t fedavg_job = CreateJob(*admin_, Spec(ids, 1, 20, "federated_averaging", json::object()));
  ASSERT_GT(fedavg_job, 0);
  json job = WaitForJobEnd(*admin_, fedavg_job, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  const int64_t fedprox_job = CreateJob(*admin_, Spec(ids, 1, 20, "fedprox", {{"mu", 50.0}}));
  ASSERT_GT(fedprox_job, 0);
  job = WaitForJobEnd(*admin_, fedprox_job, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(job["spec"]["distributed"]["strategy_options"]["mu"], 50.0) << job.dump(2);

  const double fedavg_distance = LargestRoundOneUpdateDistance(fedavg_job);
  const double fedprox_distance = LargestRoundOneUpdateDistance(fedprox_job);
  EXPECT_GT(fedavg_distance, 0);
  EXPECT_LT(fedprox_distance, fedavg_distance);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

TEST_F(StrategyJobTest, MedianJobCommitsTheCoordinateWiseMedianOfTheUpdates) {
  std::vector<int64_t> ids = StartWorkers(3);
  const int kRounds = 3;
  json spec = Spec(ids, kRounds, 10, "median", json::object());
  spec["distributed"]["min_workers"] = 3;
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    ++committed;
    EXPECT_EQ(r["participants"].size(), 3u) << r.dump();
    EXPECT_FALSE(r.contains("privacy")) << r.dump();
  }
  EXPECT_EQ(committed, kRounds);
  EXPECT_EQ(LargestDistanceFromMedian(job_id), 0.0);
  EXPECT_GT(LargestDistanceFromFedAvg(job_id), 1e-6) << "the median is not the mean";
  ASSERT_TRUE(job["final_validation_loss"].is_number()) << job.dump(2);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

TEST_F(StrategyJobTest, DpFedAvgJobReportsItsPrivacySpentPerRound) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  const int64_t job_id = CreateJob(
      *admin_, Spec(ids, kRounds, 10, "dp_fedavg", {{"clip_norm", 0.5}, {"noise_multiplier", 0.8}, {"delta", 1e-5}}));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  std::vector<double> epsilons;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    ASSERT_TRUE(r.contains("privacy")) << r.dump();
    const json& p = r["privacy"];
    ASSERT_TRUE(p["epsilon"].is_number()) << r.dump();
    epsilons.push_back(p["epsilon"].get<double>());
    EXPECT_EQ(p["delta"], 1e-5);
    EXPECT_EQ(p["participants"], 2);
    EXPECT_EQ(p["sampling_rate"], 1.0);  // two shards, both train every round
    EXPECT_DOUBLE_EQ(p["noise_stddev"].get<double>(), 0.8 * 0.5 / 2);
    EXPECT_GE(p["clipped"].get<int>(), 0);
    EXPECT_LE(p["clipped"].get<int>(), 2);
  }
  ASSERT_EQ(epsilons.size(), static_cast<size_t>(kRounds));
  EXPECT_GT(epsilons[0], 0);
  for (size_t i = 1; i < epsilons.size(); ++i) EXPECT_GT(epsilons[i], epsilons[i - 1]) << "round " << i + 1;
  // The round_committed events carry the same report.
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        return type == "round_committed" && d.value("round", 0) == kRounds && d.contains("privacy") &&
               d["privacy"]["epsilon"] == epsilons.back();
      },
      std::chrono::seconds(10)));
  // The rounds query reads each report from the job's stored round_committed events, not from a blob per round: with
  // the rounds' accounting state gone from the blob store, every report is still there.
  int removed = 0;
  for (const auto& entry : fs::recursive_directory_iterator(server_->data_dir() / "blobs" / "jobs")) {
    if (entry.path().filename() == "server_state.safetensors") removed += fs::remove(entry.path()) ? 1 : 0;
  }
  EXPECT_GE(removed, kRounds);
  std::vector<double> reread;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] == "committed" && r["round"].get<int>() >= 1 && r.contains("privacy")) {
      reread.push_back(r["privacy"]["epsilon"].get<double>());
    }
  }
  EXPECT_EQ(reread, epsilons);
  std::printf("[figures] dp_fedavg tabular: epsilon after rounds 1..%d: %.3f %.3f %.3f (delta 1e-5)\n", kRounds,
              epsilons[0], epsilons[1], epsilons[2]);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e
