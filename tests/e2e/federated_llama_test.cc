// A federated LoRA job on a tiny Llama model with three real `parsyn worker` processes: it completes its rounds,
// every round's global is the FedAvg of the uploaded updates, training loss falls, and the final adapter loads back
// in the trainer.
#include <chrono>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

TEST_F(LlamaJobTest, ThreeWorkersCompleteALoraJob) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<int64_t> ids = StartWorkers(3);
  const int kRounds = 3;
  const int64_t job_id = CreateJob(*admin_, LoraSpec(ids, kRounds, 8, 3));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(480));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  json rounds = Rounds(*admin_, job_id);
  std::vector<double> train_losses;
  std::vector<double> validation_losses;
  for (const json& r : rounds) {
    if (r["outcome"] != "committed") continue;
    int accepted = 0;
    for (const json& u : r["updates"]) accepted += u["status"] == "accepted";
    EXPECT_EQ(accepted, 3) << r.dump();
    train_losses.push_back(r["train_loss"].get<double>());
    if (r["validation_loss"].is_number()) validation_losses.push_back(r["validation_loss"]);
  }
  ASSERT_EQ(train_losses.size(), static_cast<size_t>(kRounds)) << rounds.dump(2);
  EXPECT_LT(train_losses.back(), train_losses.front()) << rounds.dump(2);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);

  // The final adapter, as a user downloads it, loads back in the trainer (an evaluation-only task).
  const fs::path adapter = tmp_.path() / "adapter";
  fs::create_directories(adapter);
  for (const char* name : {"adapter_model.safetensors", "adapter_config.json"}) {
    StatusOr<uint64_t> got = admin_->DownloadToFile(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/" + name, adapter / name);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
  }
  json result = RunEvaluationTask(
      tmp_.path(),
      {{"model_dir", (tmp_.path() / "model").string()},
       {"initial_weights", (adapter / "adapter_model.safetensors").string()},
       {"data", (tmp_.path() / "train.jsonl").string()},
       {"config", {{"use_peft", true}, {"lora_r", 4}, {"lora_alpha", 8}, {"max_seq_len", 32}, {"batch_size", 8}}}});
  ASSERT_TRUE(result["validation_before"].is_object()) << result.dump();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::string losses;
  for (double l : train_losses) losses += std::to_string(l) + " ";
  std::string vlosses;
  for (double l : validation_losses) vlosses += std::to_string(l) + " ";
  RecordProperty("train_losses", losses);
  std::printf(
      "[figures] rounds %d, train loss per round: %s, validation loss after each round: %s, final adapter "
      "validation loss %.4f, wall %.1f s\n",
      kRounds, losses.c_str(), vlosses.c_str(), result["validation_before"].value("loss", -1.0), seconds);

  // Every worker leaves cleanly on SIGTERM.
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e
