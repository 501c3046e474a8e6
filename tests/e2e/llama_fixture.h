// A coordinator with a tiny Llama model, a learnable text dataset and registered workers, for the federated
// end-to-end tests; plus the independent FedAvg check of a job's rounds.
#pragma once

#include <gtest/gtest.h>
#include <fstream>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "e2e_harness.h"

namespace parsyn::e2e {

class LlamaJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitTinyLlama(tmp_.path() / "model");
    WriteLearnableText(tmp_.path() / "train.jsonl", 96);
    StartServerWith("tiny-llama", "train.jsonl");
  }

  // Starts the server (with server_flags_) on a free port and uploads tmp/model as `model_name` and tmp/`dataset`.
  void StartServerWith(const std::string& model_name, const std::string& dataset) {
    port_ = FreePort();
    server_ = std::make_unique<Server>(tmp_.path() / "server", port_, server_flags_);
    server_->Start();
    admin_ = server_->Admin();
    model_id_ = UploadModel(*admin_, tmp_.path() / "model", model_name);
    dataset_id_ = UploadDataset(*admin_, tmp_.path() / dataset);
  }

  // For tabular jobs: tmp/points.csv with `rows` rows of WriteSeparableCsv, and tmp/model, the MLP that
  // `parsyn model init --architecture mlp --hidden-sizes <hidden_sizes>` makes from it.
  void InitTabularMlp(int rows, const std::string& hidden_sizes) {
    WriteSeparableCsv(tmp_.path() / "points.csv", rows);
    CommandResult init =
        RunParsyn({"model", "init", "--architecture", "mlp", "--data", (tmp_.path() / "points.csv").string(),
                   "--hidden-sizes", hidden_sizes, "--out", (tmp_.path() / "model").string(), "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.output;
    ASSERT_TRUE(fs::exists(tmp_.path() / "model" / "tabular_model.json")) << init.output;
  }

  // The tabular jobs' server: InitTabularMlp(400, "16"), then the server with that model and points.csv registered.
  void StartTabularMlpServer() {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(400, "16"));
    StartServerWith("points-mlp", "points.csv");
    ASSERT_GT(model_id_, 0);
    ASSERT_GT(dataset_id_, 0);
  }

  // The stdout of `parsyn job watch` of an ended job: its events replayed as lines for people (stderr is inherited
  // here, so only stdout is read; --output json is what moves them to stderr). Fails the test if it does not exit 0.
  std::string WatchEndedJob(int64_t job_id) {
    StatusOr<Subprocess> watch = Subprocess::Start(
        test_support::BuildPath("parsyn"),
        {"job", "watch", std::to_string(job_id), "--server", server_->url(), "--api-key", server_->admin_key()}, {});
    EXPECT_TRUE(watch.ok()) << watch.status().ToString();
    if (!watch.ok()) return "";
    std::string watched;
    while (std::optional<std::string> line = watch->ReadLine()) watched += *line + "\n";
    EXPECT_EQ(watch->Wait(), 0) << watched;
    return watched;
  }

  void TearDown() override {
    if (HasFailure()) {
      for (auto& w : workers_) std::fprintf(stderr, "---- %s ----\n%s\n", w->name().c_str(), w->log().c_str());
    }
    workers_.clear();
  }

  // Registers and starts `n` workers; returns their ids.
  std::vector<int64_t> StartWorkers(int n, std::vector<std::string> extra = {}) {
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) {
      const std::string name = "w" + std::to_string(workers_.size());
      Registered r = RegisterWorker(*admin_, name);
      tokens_.push_back(r.token);
      ids.push_back(r.id);
      workers_.push_back(
          std::make_unique<Worker>(server_->url(), r.token, name, tmp_.path() / ("cache-" + name), extra));
      workers_.back()->Start();
    }
    EXPECT_TRUE(WaitOnline(ids)) << "workers did not say hello in time";
    return ids;
  }

  // A trainer of the contract that dies at once (SIGSEGV after an error event), as a crash or out-of-memory would:
  // for a worker started with {"--trainer", "builtin=" + the path}.
  fs::path WriteCrashingTrainer() {
    const fs::path crashing = tmp_.path() / "crashing-trainer.sh";
    std::ofstream(crashing) << "#!/bin/sh\nif [ \"$1\" = --describe ]; then echo '{\"contract_versions\": [1], "
                               "\"task_kinds\": [\"train\", \"evaluate\"], \"model_kinds\": [\"*\"]}'; exit 0; fi\n"
                               "echo '{\"event\": \"error\", \"code\": \"internal\", \"message\": "
                               "\"simulated crash\"}'\nkill -SEGV $$\n";
    fs::permissions(crashing, fs::perms::owner_all);
    return crashing;
  }

  // Runs `spec` to its end, then again with the server killed after round 1 and started again: the second job
  // resumes and its last global is the first's, bit for bit.
  void ExpectAResumedJobEndsWithTheUninterruptedWeights(const json& spec) {
    const int rounds = spec["distributed"]["num_rounds"].get<int>();
    const int64_t reference_id = CreateJob(*admin_, spec);
    json reference = WaitForJobEnd(*admin_, reference_id, std::chrono::seconds(300));
    ASSERT_EQ(reference.value("status", ""), "succeeded") << reference.dump(2);

    const int64_t job_id = CreateJob(*admin_, spec);
    ASSERT_TRUE(WaitForEvent(
        *admin_, job_id,
        [&](const std::string& type, const json& d) { return type == "round_committed" && d.value("round", 0) == 1; },
        std::chrono::seconds(300)));
    server_->Kill();
    server_->Start();  // same data directory, same port: the workers reconnect on their own
    json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
    ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
    EXPECT_TRUE(WaitForEvent(
        *admin_, job_id,
        [&](const std::string& type, const json& d) {
          return type == "job_resumed" && d.value("committed_round", 0) >= 1 && d.value("committed_round", 0) < rounds;
        },
        std::chrono::seconds(10)));
    EXPECT_FALSE(FinalSha(reference_id, rounds).empty());
    EXPECT_EQ(FinalSha(job_id, rounds), FinalSha(reference_id, rounds));
  }

  std::string FinalSha(int64_t job_id, int round) {
    std::string sha;
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r["outcome"] == "committed" && r["round"] == round) sha = r.value("global_sha256", "");
    }
    return sha;
  }

  // Whether every worker in `ids` has a session (status online or busy), checked until a bounded deadline: a hello
  // happens in another process, with nothing here to wait on but its effect.
  bool WaitOnline(const std::vector<int64_t>& ids) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      StatusOr<http::ClientResponse> res = admin_->Get("/api/v1/workers");
      size_t online = 0;
      StatusOr<json> body = res.ok() ? res->Json() : StatusOr<json>(res.status());
      if (body.ok()) {
        for (const json& w : (*body)["workers"]) {
          if (std::find(ids.begin(), ids.end(), w["id"].get<int64_t>()) != ids.end() && w["status"] != "offline") {
            online++;
          }
        }
      }
      if (online == ids.size()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  json LoraSpec(const std::vector<int64_t>& worker_ids, int rounds, int steps, int min_workers,
                double aggregation_timeout_s = 120) const {
    return {{"name", "e2e-lora"},
            {"dataset_id", dataset_id_},
            {"model_id", model_id_},
            {"config",
             {{"batch_size", 4},
              {"learning_rate", 3e-3},
              {"use_peft", true},
              {"lora_r", 4},
              {"lora_alpha", 8},
              {"lora_dropout", 0.0},
              {"max_seq_len", 32},
              {"lr_scheduler", "constant"},
              {"validation_fraction", 0.15},
              {"seed", 7}}},
            {"distributed",
             {{"enabled", true},
              {"num_rounds", rounds},
              {"steps_per_round", steps},
              {"min_workers", min_workers},
              {"max_workers", static_cast<int>(worker_ids.size())},
              {"aggregation_timeout", aggregation_timeout_s},
              {"fault_tolerance", 2}}},
            {"worker_selection", {{"mode", "own"}, {"worker_ids", worker_ids}}}};
  }

  // A local file with the blob's bytes (the S3 fixture downloads it).
  virtual fs::path BlobPath(const std::string& key) { return server_->data_dir() / "blobs" / key; }

  // The tensors of the update a worker sent in a round attempt (`update`: an entry of the round's "updates").
  std::map<std::string, std::vector<double>> UpdateTensors(const std::string& prefix, const json& update) {
    return ReadTensors(
        BlobPath(prefix + "/updates/w" + std::to_string(update["worker_id"].get<int64_t>()) + ".safetensors"));
  }

  // Σ n_i w_i / Σ n_i over a round's accepted updates, in double, from the update blobs (`round`: an entry of
  // GET .../rounds).
  std::map<std::string, std::vector<double>> FedAvgOfRound(int64_t job_id, const json& round) {
    const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
    std::vector<std::pair<fs::path, double>> updates;
    for (const json& u : round["updates"]) {
      if (u["status"] != "accepted") continue;
      updates.emplace_back(
          BlobPath(prefix + "/updates/w" + std::to_string(u["worker_id"].get<int64_t>()) + ".safetensors"),
          u["num_samples"].get<double>());
    }
    return SampleWeightedMean(updates);
  }

  // Every committed round's global equals Σ n_i w_i / Σ n_i over its accepted updates, recomputed here in double
  // from the update blobs; returns how many rounds were checked.
  int ExpectGlobalsAreFedAvg(int64_t job_id) {
    int checked = 0;
    for (const json& round : Rounds(*admin_, job_id)) {
      if (round["outcome"] != "committed" || round["round"].get<int>() < 1) continue;
      const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
      std::map<std::string, std::vector<double>> mean = FedAvgOfRound(job_id, round);
      auto global = ReadTensors(BlobPath(prefix + "/global.safetensors"));
      EXPECT_EQ(global.size(), mean.size()) << prefix;
      for (auto& [name, values] : global) {
        if (mean[name].size() != values.size()) {
          ADD_FAILURE() << prefix << ": " << name << " is missing from the updates or has another size";
          continue;
        }
        for (size_t i = 0; i < values.size(); ++i) {
          const double expected = mean[name][i];
          if (std::abs(values[i] - expected) > 1e-6 + 1e-5 * std::abs(expected)) {
            ADD_FAILURE() << prefix << " " << name << "[" << i << "] = " << values[i] << ", FedAvg gives " << expected;
            break;
          }
        }
      }
      checked++;
    }
    return checked;
  }

  TempDir tmp_;
  // More `parsyn server` flags, set before SetUp (add to them). --keep-updates: ExpectGlobalsAreFedAvg recomputes each
  // round's global from its updates, which the server otherwise deletes once the round is committed.
  std::vector<std::string> server_flags_ = {"--keep-updates"};
  int port_ = 0;
  std::unique_ptr<Server> server_;
  std::unique_ptr<http::Client> admin_;
  int64_t model_id_ = 0, dataset_id_ = 0;
  std::vector<std::string> tokens_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace parsyn::e2e
