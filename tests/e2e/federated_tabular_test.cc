// A federated tabular job: an MLP on a separable CSV with two real `parsyn worker` processes. The starting model
// folder comes from `parsyn model init --architecture mlp --data CSV` (standardisation and classes from the whole
// file) and is registered as a tabular model; every worker trains that same model on its shard, all weights are
// FedAvg'ed (use_peft false), and the final model, as a user downloads it, classifies held-out rows.
#include <chrono>
#include <cstdint>
#include <fstream>

#include "llama_fixture.h"
#include "weights/sha256.h"

namespace parsyn::e2e {
namespace {

// Rows x1,x2 in [-1, 1) with label x1 + x2 > 0, from a generator other than WriteSeparableCsv's (so none of these
// rows is a training row).
void WriteHeldOutCsv(const fs::path& file, int rows) {
  std::ofstream out(file);
  out << "x1,x2,label\n";
  uint64_t state = 987654321;
  auto next = [&] {
    state = state * 2862933555777941757ULL + 3037000493ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  for (int i = 0; i < rows; ++i) {
    const double x1 = next(), x2 = next();
    out << x1 << "," << x2 << "," << (x1 + x2 > 0 ? 1 : 0) << "\n";
  }
}

// The Llama fixture's server, workers and FedAvg check, with a tabular model and CSV dataset instead.
class TabularJobTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(400, "16"));
    StartServerWith("points-mlp", "points.csv");
    ASSERT_GT(model_id_, 0);
    ASSERT_GT(dataset_id_, 0);
  }

  json MlpSpec(const std::vector<int64_t>& worker_ids, int rounds, int steps) const {
    return {{"name", "e2e-tabular"},
            {"dataset_id", dataset_id_},
            {"model_id", model_id_},
            {"config",
             {{"batch_size", 16},
              {"learning_rate", 0.01},
              {"use_peft", false},
              {"hidden_sizes", {16}},
              {"label_column", "label"},
              {"lr_scheduler", "constant"},
              {"validation_fraction", 0.15},
              {"seed", 7}}},
            {"distributed",
             {{"enabled", true},
              {"num_rounds", rounds},
              {"steps_per_round", steps},
              {"min_workers", static_cast<int>(worker_ids.size())},
              {"max_workers", static_cast<int>(worker_ids.size())},
              {"aggregation_timeout", 120},
              {"fault_tolerance", 1}}},
            {"worker_selection", {{"mode", "own"}, {"worker_ids", worker_ids}}}};
  }
};

TEST_F(TabularJobTest, RegistersTheFolderAsATabularModel) {
  StatusOr<http::ClientResponse> model = admin_->Get("/api/v1/models/" + std::to_string(model_id_));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model->Json())["model_type"], "tabular-mlp") << model->body;
}

TEST_F(TabularJobTest, RefusesAJobPairingTheTabularModelWithTextData) {
  WriteLearnableText(tmp_.path() / "text.jsonl", 20);
  const int64_t text_dataset = UploadDataset(*admin_, tmp_.path() / "text.jsonl");
  json spec = MlpSpec({RegisterWorker(*admin_, "w-text").id}, 1, 5);
  spec["dataset_id"] = text_dataset;
  StatusOr<http::ClientResponse> job = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument) << job.status().ToString();
  EXPECT_NE(job.status().message().find("model " + std::to_string(model_id_) + " is a tabular model but dataset " +
                                        std::to_string(text_dataset) + " is text"),
            std::string::npos)
      << job.status().message();
}

TEST_F(TabularJobTest, TwoWorkersTrainAnMlpThatClassifiesHeldOutRows) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  const int64_t job_id = CreateJob(*admin_, MlpSpec(ids, kRounds, 30));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  int committed = 0;
  std::string losses;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    int accepted = 0;
    for (const json& u : r["updates"]) accepted += u["status"] == "accepted";
    EXPECT_EQ(accepted, 2) << r.dump();
    if (r["train_loss"].is_number()) losses += std::to_string(r["train_loss"].get<double>()) + " ";
  }
  EXPECT_EQ(committed, kRounds);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);

  // The final model as a user assembles it: the registered folder's tabular_model.json with the job's weights.
  const fs::path final_model = tmp_.path() / "final-model";
  fs::create_directories(final_model);
  fs::copy_file(tmp_.path() / "model" / "tabular_model.json", final_model / "tabular_model.json");
  StatusOr<uint64_t> got =
      admin_->DownloadToFile("/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/model.safetensors",
                             final_model / "model.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();

  // An evaluation-only task on rows none of the workers saw: half of them form its validation slice.
  WriteHeldOutCsv(tmp_.path() / "held-out.csv", 200);
  json result = RunEvaluationTask(
      tmp_.path(), {{"model_dir", final_model.string()},
                    {"data", (tmp_.path() / "held-out.csv").string()},
                    {"config", {{"use_peft", false}, {"validation_fraction", 0.5}, {"batch_size", 50}}}});
  ASSERT_TRUE(result["validation_before"].is_object()) << result.dump();
  const double accuracy = result["validation_before"].value("accuracy", 0.0);
  EXPECT_GE(result["validation_before"].value("num_examples", 0), 100) << result.dump();
  EXPECT_GE(accuracy, 0.9) << result.dump();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("[figures] tabular mlp: rounds %d, train loss per round: %s, held-out accuracy %.3f, wall %.1f s\n",
              committed, losses.c_str(), accuracy, seconds);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// The product spec's example numbers: 3 selected workers, min_workers 2, max_workers 5. Every round must train all
// three: the last reporter of a round is still busy when the next round could start with the other two, and the
// round waits for it (the join window) instead of leaving a third of the workers idle.
TEST_F(TabularJobTest, SpecExampleThreeWorkersWithMinTwoTrainInEveryRound) {
  std::vector<int64_t> ids = StartWorkers(3);
  const int kRounds = 4;
  json spec = MlpSpec(ids, kRounds, 10);
  spec["distributed"]["min_workers"] = 2;
  spec["distributed"]["max_workers"] = 5;
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  std::string per_round;
  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    int accepted = 0;
    for (const json& u : r["updates"]) accepted += u["status"] == "accepted";
    EXPECT_EQ(accepted, 3) << "round " << r["round"] << " did not train every selected worker: " << r.dump();
    per_round += std::to_string(accepted) + " ";
  }
  EXPECT_EQ(committed, kRounds);
  std::printf("[figures] 3 workers, min_workers 2: participants per round: %s\n", per_round.c_str());
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

// Early stopping that triggers: with a learning rate too small to move the loss by min_delta, patience 2 ends the
// job after round 3 of 6 (global 2's loss, the second without improvement on the starting weights', arrives with
// round 3's results), succeeded, with the reason; the best/ artifact is the global of best_round, byte for byte.
TEST_F(TabularJobTest, EarlyStoppingEndsTheJobAndKeepsTheBestGlobal) {
  std::vector<int64_t> ids = StartWorkers(2);
  json spec = MlpSpec(ids, 6, 5);
  spec["config"]["learning_rate"] = 1e-9;
  spec["distributed"]["early_stopping"] = {{"patience", 2}, {"min_delta", 0.01}};
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(job["committed_round"], 3) << job.dump(2);
  EXPECT_NE(job.value("status_reason", "").find("stopped early after round 3 of 6"), std::string::npos) << job.dump(2);
  ASSERT_TRUE(job["initial_validation_loss"].is_number()) << job.dump(2);
  ASSERT_TRUE(job["final_validation_loss"].is_number()) << job.dump(2);
  ASSERT_TRUE(job["best_round"].is_number()) << job.dump(2);
  const int best_round = job["best_round"];

  std::string best_sha;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed") continue;
    EXPECT_TRUE(r["validation_loss"].is_number()) << "round " << r["round"] << ": " << r.dump();
    if (r["round"] == best_round) {
      best_sha = r["global_sha256"];
      EXPECT_EQ(r["validation_loss"], job["best_validation_loss"]) << r.dump();
    }
  }
  ASSERT_FALSE(best_sha.empty()) << "no committed round " << best_round;
  StatusOr<http::ClientResponse> best =
      admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/best/model.safetensors");
  ASSERT_TRUE(best.ok()) << best.status().ToString();
  EXPECT_EQ(weights::Sha256Hex(best->body), best_sha);
  std::printf("[figures] early stopping: %s\n", job["status_reason"].get<std::string>().c_str());
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e
