// Federated jobs over the workers' own data (`"data": {"source": "workers"}`, `parsyn worker --data FILE`): three
// real workers with CSVs of very different sizes train the registered tabular model with no dataset on the server.
// Each worker splits its file with the job's seed, reports its training split's size, and FedAvg weighs it by that;
// nothing of the files reaches the server. A worker without data is never given a task of such a job, and a worker
// whose CSV does not fit the model fails its task saying so.
#include <gmock/gmock.h>

#include <fstream>
#include <map>
#include <sstream>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

using ::testing::HasSubstr;

// The tabular fixture's model (standardizer and classes fitted on all of points.csv), but only the model goes to the
// server: the data stays in the workers' files, cut from points.csv.
class LocalDataJobTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(1200, "16"));
    port_ = FreePort();
    server_ = std::make_unique<Server>(tmp_.path() / "server", port_, server_flags_);
    server_->Start();
    admin_ = server_->Admin();
    model_id_ = UploadModel(*admin_, tmp_.path() / "model", "points-mlp");
    ASSERT_GT(model_id_, 0);
    std::ifstream in(tmp_.path() / "points.csv");
    std::getline(in, header_);
    for (std::string line; std::getline(in, line);) rows_.push_back(line);
    ASSERT_EQ(rows_.size(), 1200u);
  }

  // tmp/<name>: the header and `count` rows of points.csv from `first` on.
  fs::path WriteLocalCsv(const std::string& name, size_t first, size_t count) {
    const fs::path file = tmp_.path() / name;
    std::ofstream out(file);
    out << header_ << "\n";
    for (size_t i = first; i < first + count; ++i) out << rows_.at(i) << "\n";
    return file;
  }

  // Registers and starts a worker (with `--data file` unless empty); returns its id.
  int64_t StartWorker(const fs::path& data) {
    const std::string name = "w" + std::to_string(workers_.size());
    Registered r = RegisterWorker(*admin_, name);
    std::vector<std::string> extra;
    if (!data.empty()) extra = {"--data", data.string()};
    workers_.push_back(std::make_unique<Worker>(server_->url(), r.token, name, tmp_.path() / ("cache-" + name), extra));
    workers_.back()->Start();
    EXPECT_TRUE(WaitOnline({r.id})) << name << " did not say hello in time";
    return r.id;
  }

  json LocalSpec(int rounds, int workers, int64_t max_samples) const {
    return {{"name", "e2e-local-data"},
            {"model_id", model_id_},
            {"data", {{"source", "workers"}, {"max_samples_per_worker", max_samples}}},
            {"config",
             {{"batch_size", 16},
              {"learning_rate", 0.01},
              {"use_peft", false},
              {"label_column", "label"},
              {"lr_scheduler", "constant"},
              {"seed", 7}}},  // validation_fraction: the platform default, 0.1
            {"distributed",
             {{"enabled", true},
              {"num_rounds", rounds},
              {"steps_per_round", 10},
              {"min_workers", workers},
              {"max_workers", workers},
              {"aggregation_timeout", 120},
              {"fault_tolerance", 1}}}};
  }

  std::string header_;
  std::vector<std::string> rows_;
};

// Whether any file under `dir` contains `needle`.
bool AnyFileContains(const fs::path& dir, const std::string& needle) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    if (bytes.str().find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST_F(LocalDataJobTest, WorkersOfDifferentSizesAreWeightedByTheirOwnSamples) {
  // A worker without data comes first (auto mode, first come first served): it must not take a slot or a task.
  const int64_t no_data = StartWorker({});
  const std::vector<fs::path> files = {WriteLocalCsv("small.csv", 0, 150), WriteLocalCsv("medium.csv", 150, 350),
                                       WriteLocalCsv("large.csv", 500, 700)};
  std::map<int64_t, int64_t> expected_train, expected_validation;  // by worker: 10% held out, seeded by the job
  const int64_t sizes[] = {150, 350, 700};
  for (size_t i = 0; i < files.size(); ++i) {
    const int64_t id = StartWorker(files[i]);
    expected_validation[id] = sizes[i] / 10;
    expected_train[id] = sizes[i] - sizes[i] / 10;  // 135, 315, 630
  }
  const int kRounds = 3;
  const int64_t job_id = CreateJob(*admin_, LocalSpec(kRounds, 3, 1000));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_TRUE(job["dataset_id"].is_null()) << job.dump(2);

  int committed = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    committed++;
    std::map<int64_t, int64_t> train, validation;
    for (const json& u : r["updates"]) {
      EXPECT_EQ(u["status"], "accepted") << u.dump();
      const int64_t worker = u["worker_id"].get<int64_t>();
      train[worker] = u["num_samples"].get<int64_t>();
      validation[worker] = u["metrics"]["validation_before"].value("num_examples", int64_t{-1});
    }
    EXPECT_EQ(train, expected_train) << r.dump();
    EXPECT_EQ(validation, expected_validation) << r.dump();
    // Each committed global was evaluated on the workers' validation slices (the last one by the final evaluation).
    EXPECT_TRUE(r["validation_loss"].is_number()) << r.dump();
  }
  EXPECT_EQ(committed, kRounds);
  // The globals are Σ nᵢ·wᵢ / Σ nᵢ with those counts.
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);

  // 630 / 135 > 4: the job says that the large file dominates.
  std::string warning;
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& data) {
        if (type == "warning" && data.value("message", "").find("differ in size") != std::string::npos) {
          warning = data["message"];
          return true;
        }
        return false;
      },
      std::chrono::seconds(30)));
  EXPECT_THAT(warning, HasSubstr("630 training samples"));

  // Nothing of the files is on the server: no dataset, and no byte of its store holds one of their rows.
  StatusOr<http::ClientResponse> datasets = admin_->Get("/api/v1/datasets");
  ASSERT_TRUE(datasets.ok()) << datasets.status().ToString();
  EXPECT_TRUE((*datasets->Json())["datasets"].empty()) << datasets->body;
  for (size_t i : {0, 149, 150, 499, 500, 1199}) {
    EXPECT_FALSE(AnyFileContains(server_->data_dir(), rows_[i])) << "row " << i << " (" << rows_[i] << ")";
  }
  // The worker without data stayed out.
  for (const json& r : Rounds(*admin_, job_id)) {
    for (const json& p : r["participants"]) EXPECT_NE(p.get<int64_t>(), no_data) << r.dump();
  }
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

TEST_F(LocalDataJobTest, ACsvThatDoesNotFitTheModelFailsTheTaskSayingWhy) {
  const fs::path other = tmp_.path() / "other.csv";
  {
    std::ofstream out(other);
    out << "a,b,label\n";
    for (int i = 0; i < 40; ++i) out << i << "," << -i << "," << (i % 2) << "\n";
  }
  StartWorker(other);
  const int64_t job_id = CreateJob(*admin_, LocalSpec(1, 1, 1000));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(180));
  ASSERT_EQ(job.value("status", ""), "failed") << job.dump(2);
  EXPECT_THAT(job.value("failure_reason", ""), HasSubstr("the data's feature columns [a, b] differ from the model's"));
}

}  // namespace
}  // namespace parsyn::e2e
