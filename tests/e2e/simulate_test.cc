// `parsyn simulate` end to end: the real parsyn and parsyn-trainer programs, no server. 4 virtual workers train the
// MLP of WriteSeparableCsv over a Dirichlet(0.5) split for 2 rounds with FedAvg, FedAdam (a stateful server
// optimizer) and median (a robust aggregation). Checked: the job succeeds; rounds.csv and rounds.json hold exactly the
// rounds the job's own store (OUT/parsyn.db, read here with the storage layer's SQLite store) recorded, losses to the
// bit; loss.svg is a plot; global.safetensors is the last committed global; and the same seeded job run twice ends
// with the same final weights (sha256), whatever --parallel.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/sha256.h"
#include "e2e_harness.h"
#include "storage/sqlite_store.h"

namespace parsyn::e2e {
namespace {

constexpr int kWorkers = 4;  // each virtual worker's task is a trainer process
constexpr int kRounds = 2;

std::vector<std::vector<std::string>> CsvRows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    std::stringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) fields.push_back(cell);
    if (!line.empty() && line.back() == ',') fields.push_back("");
    rows.push_back(std::move(fields));
  }
  return rows;
}

class SimulateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteSeparableCsv(tmp_.path() / "points.csv", 800);
    CommandResult init =
        RunParsyn({"model", "init", "--architecture", "mlp", "--data", (tmp_.path() / "points.csv").string(),
                   "--hidden-sizes", "8", "--out", (tmp_.path() / "model").string(), "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.output;
  }

  static json Job(const std::string& strategy, json options) {
    json distributed = {{"enabled", true},
                        {"num_rounds", kRounds},
                        {"steps_per_round", 3},
                        {"min_workers", kWorkers},
                        {"aggregation_timeout", 300},
                        {"fault_tolerance", 1},
                        {"strategy", strategy},
                        {"partition", {{"method", "dirichlet"}, {"alpha", 0.5}}}};
    if (!options.is_null()) distributed["strategy_options"] = std::move(options);
    return {{"name", "simulated-" + strategy},
            {"config",
             {{"batch_size", 8},
              {"learning_rate", 0.05},
              {"use_peft", false},
              {"lr_scheduler", "constant"},
              {"validation_fraction", 0.2},
              {"seed", 11}}},
            {"distributed", std::move(distributed)}};
  }

  // Runs `parsyn simulate` on `job` into tmp/<out>; returns its result.
  CommandResult Simulate(const json& job, const std::string& out, int parallel = 2,
                         const std::vector<std::string>& extra = {}) {
    const fs::path job_file = tmp_.path() / (out + ".json");
    std::ofstream(job_file) << job.dump();
    std::vector<std::string> args = {"simulate",
                                     "--job",
                                     job_file.string(),
                                     "--data",
                                     (tmp_.path() / "points.csv").string(),
                                     "--model",
                                     (tmp_.path() / "model").string(),
                                     "--workers",
                                     std::to_string(kWorkers),
                                     "--out",
                                     (tmp_.path() / out).string(),
                                     "--parallel",
                                     std::to_string(parallel)};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunParsyn(args, std::chrono::seconds(600));
  }

  // The job's rounds as its store holds them, against rounds.csv, rounds.json and global.safetensors.
  void ExpectFilesMatchStore(const fs::path& out) {
    StatusOr<std::unique_ptr<storage::SqliteMetadataStore>> store =
        storage::SqliteMetadataStore::Open((out / "parsyn.db").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    StatusOr<std::vector<storage::TrainingJob>> jobs = (*store)->ListJobs();
    ASSERT_TRUE(jobs.ok());
    ASSERT_EQ(jobs->size(), 1u);
    const storage::TrainingJob& job = jobs->front();
    EXPECT_EQ(job.status, storage::JobStatus::kSucceeded) << job.failure_reason;
    EXPECT_EQ(job.committed_round, kRounds);
    StatusOr<std::vector<storage::Round>> rounds = (*store)->ListRounds(job.id);
    ASSERT_TRUE(rounds.ok());
    ASSERT_EQ(rounds->size(), static_cast<size_t>(kRounds));  // no failed attempt
    StatusOr<std::vector<storage::Worker>> listed = (*store)->ListWorkers();
    ASSERT_TRUE(listed.ok());
    EXPECT_EQ(listed->size(), static_cast<size_t>(kWorkers));

    const auto csv = CsvRows(ReadWholeFile(out / "rounds.csv"));
    ASSERT_EQ(csv.size(), rounds->size() + 1) << ReadWholeFile(out / "rounds.csv");
    EXPECT_EQ(csv[0][0], "round");
    const json doc = json::parse(ReadWholeFile(out / "rounds.json"));
    ASSERT_EQ(doc["rounds"].size(), rounds->size());
    EXPECT_EQ(doc["job_id"], job.id);
    EXPECT_EQ(doc["status"], "succeeded");
    ASSERT_TRUE(job.initial_validation_loss.has_value());
    EXPECT_EQ(doc["initial_validation_loss"].get<double>(), *job.initial_validation_loss);
    for (size_t i = 0; i < rounds->size(); ++i) {
      const storage::Round& r = (*rounds)[i];
      const std::vector<std::string>& row = csv[i + 1];
      const json& item = doc["rounds"][i];
      ASSERT_EQ(row.size(), 16u);
      EXPECT_EQ(row[15], "");  // no --speeds: no virtual time
      EXPECT_TRUE(item["virtual_time_s"].is_null());
      EXPECT_EQ(row[0], std::to_string(r.round));
      EXPECT_EQ(row[1], std::to_string(r.attempt));
      EXPECT_EQ(row[2], "committed");
      EXPECT_EQ(row[3], std::to_string(r.participants.size()));
      EXPECT_EQ(r.participants.size(), static_cast<size_t>(kWorkers));
      StatusOr<std::vector<storage::RoundUpdate>> updates = (*store)->ListUpdates(job.id, r.round, r.attempt);
      ASSERT_TRUE(updates.ok());
      EXPECT_EQ(row[4], std::to_string(updates->size()));
      int64_t samples = 0, update_bytes = 0;
      for (const storage::RoundUpdate& u : *updates) {
        samples += u.num_samples;
        update_bytes += u.size_bytes;
      }
      EXPECT_EQ(row[6], std::to_string(samples));
      // Down: each virtual worker read the global (from round 2 on, an aggregated one, of the final one's size; round
      // 1 reads the model's initial file); up: the updates as stored, each counted once; moved: both.
      const auto global_bytes = static_cast<int64_t>(fs::file_size(out / "global.safetensors"));
      if (r.round >= 2) EXPECT_EQ(row[10], std::to_string(kWorkers * global_bytes));
      EXPECT_GT(std::stoll(row[10]), 0);
      EXPECT_EQ(row[11], std::to_string(update_bytes));
      EXPECT_EQ(std::stoll(row[9]), std::stoll(row[10]) + update_bytes);
      EXPECT_EQ(item["bytes_up"], update_bytes);
      ASSERT_TRUE(r.train_loss.has_value());
      ASSERT_TRUE(r.validation_loss.has_value());
      EXPECT_EQ(std::stod(row[7]), *r.train_loss);  // %.17g: the stored double exactly
      EXPECT_EQ(std::stod(row[8]), *r.validation_loss);
      EXPECT_EQ(row[13], r.global_sha256);
      EXPECT_EQ(item["round"], r.round);
      EXPECT_EQ(item["train_loss"].get<double>(), *r.train_loss);
      EXPECT_EQ(item["validation_loss"].get<double>(), *r.validation_loss);
      EXPECT_EQ(item["global_sha256"], r.global_sha256);
    }
    EXPECT_EQ(doc["final_global_sha256"], rounds->back().global_sha256);
    StatusOr<std::string> final_sha = Sha256File(out / "global.safetensors");
    ASSERT_TRUE(final_sha.ok());
    EXPECT_EQ(*final_sha, rounds->back().global_sha256);
    const std::string svg = ReadWholeFile(out / "loss.svg");
    EXPECT_TRUE(svg.starts_with("<svg")) << svg.substr(0, 100);
    EXPECT_NE(svg.find("<polyline"), std::string::npos);
    // The job's progress points, one per task, as workers report them.
    StatusOr<std::vector<storage::MetricPoint>> points = (*store)->ListMetrics(job.id);
    ASSERT_TRUE(points.ok());
    EXPECT_GE(points->size(), static_cast<size_t>(kWorkers * kRounds));
  }

  TempDir tmp_;
};

TEST_F(SimulateTest, FedAvgRoundsMatchTheStoreAndASeededRunRepeatsBitForBit) {
  const json job = Job("federated_averaging", nullptr);
  CommandResult first = Simulate(job, "fedavg-1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("succeeded"), std::string::npos) << first.output;
  ASSERT_NO_FATAL_FAILURE(ExpectFilesMatchStore(tmp_.path() / "fedavg-1"));

  CommandResult second = Simulate(job, "fedavg-2", /*parallel=*/1);  // other timing, the same bits
  ASSERT_EQ(second.exit_code, 0) << second.output;
  StatusOr<std::string> a = Sha256File(tmp_.path() / "fedavg-1" / "global.safetensors");
  StatusOr<std::string> b = Sha256File(tmp_.path() / "fedavg-2" / "global.safetensors");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(json::parse(ReadWholeFile(tmp_.path() / "fedavg-1" / "rounds.json"))["rounds"][1]["train_loss"],
            json::parse(ReadWholeFile(tmp_.path() / "fedavg-2" / "rounds.json"))["rounds"][1]["train_loss"]);

  // The same out again: refused without --force, so an earlier simulation is never mixed into a new one.
  CommandResult again = Simulate(job, "fedavg-1");
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("--force"), std::string::npos) << again.output;
}

TEST_F(SimulateTest, ServerOptimizerAndRobustStrategiesRunTheRealRounds) {
  for (const auto& [strategy, options] :
       std::vector<std::pair<std::string, json>>{{"fedadam", {{"server_learning_rate", 0.05}}}, {"median", nullptr}}) {
    SCOPED_TRACE(strategy);
    json job = Job(strategy, options);
    // The median run's workers send int8 deltas in zstd (distributed.compression): with min_workers = all of them,
    // one update the coordinator could not decode would fail the round, and so the job.
    if (strategy == "median") {
      job["distributed"]["compression"] = {{"update", "int8"}, {"delta", true}, {"zstd_level", 3}};
    }
    CommandResult run = Simulate(job, strategy);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_NO_FATAL_FAILURE(ExpectFilesMatchStore(tmp_.path() / strategy));
    EXPECT_EQ(json::parse(ReadWholeFile(tmp_.path() / strategy / "rounds.json"))["strategy"], strategy);
  }
  // A fedavg-only option is refused before anything runs, naming the field, as the API's 400 does.
  CommandResult bad = Simulate(Job("median", {{"server_learning_rate", 0.05}}), "bad");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("strategy_options.server_learning_rate"), std::string::npos) << bad.output;
}

// A securely aggregated job: the virtual workers run the protocol's phases in process (one trainer at a time is
// enough), and round 1's global is the plain job's up to quantization. With --dropout, virtual workers drop out in
// random phases: an attempt that keeps enough shares commits with the survivors, one that does not fails and the
// round runs again; the same seed drops the same workers. --dropout without secure aggregation is refused.
TEST_F(SimulateTest, ASecurelyAggregatedJobRunsAndItsVirtualWorkersDropOutInRandomPhases) {
  const json plain = Job("federated_averaging", nullptr);
  ASSERT_EQ(Simulate(plain, "plain").exit_code, 0);
  json secure = plain;
  secure["distributed"]["min_workers"] = 2;
  secure["distributed"]["aggregation_timeout"] = 5;  // how long an attempt missing shares waits before it fails
  secure["distributed"]["fault_tolerance"] = 10;
  secure["distributed"]["secure_aggregation"] = {{"enabled", true}, {"threshold", 2}, {"clipping_range", 1.0}};
  CommandResult run = Simulate(secure, "secure", 1);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // 2 of 4 is below a majority of each secret's holders, which unmasking needs: the job says so.
  EXPECT_NE(run.output.find("set threshold to 3 or more"), std::string::npos) << run.output;
  const auto reference = ReadTensors(tmp_.path() / "plain/blobs" / (AttemptPrefix(1, 1, 1) + "/global.safetensors"));
  const auto global = ReadTensors(tmp_.path() / "secure/blobs" / (AttemptPrefix(1, 1, 1) + "/global.safetensors"));
  ASSERT_FALSE(reference.empty());
  for (const auto& [name, values] : reference) {
    ASSERT_EQ(global.at(name).size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(global.at(name)[i], values[i], 3 * 2.0 / 65535) << name;
  }

  // Who took part in each phase of each attempt, from the job's secure_aggregation events.
  auto attempts = [&](const std::string& out) {
    StatusOr<std::unique_ptr<storage::SqliteMetadataStore>> store =
        storage::SqliteMetadataStore::Open((tmp_.path() / out / "parsyn.db").string());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    std::vector<json> found;
    if (!store.ok()) return found;
    EXPECT_TRUE(storage::ForEachJobEventOfType(**store, 1, "secure_aggregation", [&](const storage::JobEvent& e) {
                  found.push_back(json::parse(e.payload_json));
                }).ok());
    return found;
  };
  for (const json& a : attempts("secure")) EXPECT_EQ(a["masked"].size(), static_cast<size_t>(kWorkers)) << a.dump();

  run = Simulate(secure, "dropout", 1, {"--dropout", "0.3"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  int recovered = 0, failed = 0;
  for (const json& a : attempts("dropout")) {
    if (a["phase"] == "failed") ++failed;
    const bool someone_dropped = a["shared"].size() < a["participants"].size() ||
                                 a["masked"].size() < a["shared"].size() || a["revealed"].size() < a["masked"].size();
    if (a["phase"] == "unmasked" && someone_dropped) ++recovered;
  }
  EXPECT_GT(recovered, 0) << "an attempt with a dropout committed with the survivors";
  EXPECT_GT(failed, 0) << "an attempt that lost too many shares failed and ran again";
  EXPECT_NE(run.output.find("dropped out of the secure aggregation after"), std::string::npos) << run.output;
  CommandResult again = Simulate(secure, "dropout-again", 1, {"--dropout", "0.3"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  // The same attempts with the same outcomes and counts (round, attempt, status, participants, accepted updates); the
  // weights differ in their stochastic rounding, drawn fresh by each worker.
  auto outcomes = [&](const std::string& out) {
    std::vector<std::vector<std::string>> rows = CsvRows(ReadWholeFile(tmp_.path() / out / "rounds.csv"));
    for (auto& row : rows) row.resize(5);
    return rows;
  };
  EXPECT_EQ(outcomes("dropout"), outcomes("dropout-again"));

  CommandResult refused = Simulate(plain, "refused", 1, {"--dropout", "0.3"});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("distributed.secure_aggregation"), std::string::npos) << refused.output;
}

// --speeds gives virtual workers unequal step times: each attempt ends, in virtual time, when its slowest worker would
// have finished steps_per_round steps (synchronous rounds wait for it), one attempt after the other. lognormal:SIGMA
// draws the times from the job's seed (lognormal:0: every step 1 s); a file lists them. Bad input exits 2.
TEST_F(SimulateTest, WithSpeedsEachAttemptEndsWhenItsSlowestWorkerWould) {
  const json job = Job("federated_averaging", nullptr);
  const fs::path speeds = tmp_.path() / "speeds.txt";
  std::ofstream(speeds) << "0.5\n# the slow one\n2\n1\n0.25\n";
  auto virtual_ends = [&](const std::string& out) {
    std::vector<double> ends;
    const std::vector<std::vector<std::string>> rows = CsvRows(ReadWholeFile(tmp_.path() / out / "rounds.csv"));
    EXPECT_EQ(rows.at(0).back(), "virtual_time_s");
    for (size_t i = 1; i < rows.size(); ++i) ends.push_back(std::stod(rows[i].back()));
    return ends;
  };
  ASSERT_EQ(Simulate(job, "from-file", 2, {"--speeds", speeds.string()}).exit_code, 0);
  EXPECT_EQ(virtual_ends("from-file"), (std::vector<double>{3 * 2.0, 2 * 3 * 2.0}));  // 3 steps of the 2 s worker
  ASSERT_EQ(Simulate(job, "equal", 2, {"--speeds", "lognormal:0"}).exit_code, 0);
  EXPECT_EQ(virtual_ends("equal"), (std::vector<double>{3.0, 6.0}));
  ASSERT_EQ(Simulate(job, "lognormal", 2, {"--speeds", "lognormal:1"}).exit_code, 0);
  ASSERT_EQ(Simulate(job, "lognormal-again", 2, {"--speeds", "lognormal:1"}).exit_code, 0);
  const std::vector<double> drawn = virtual_ends("lognormal");
  EXPECT_EQ(drawn, virtual_ends("lognormal-again"));  // the same seed, the same speeds
  ASSERT_EQ(drawn.size(), 2u);
  EXPECT_DOUBLE_EQ(drawn[1], 2 * drawn[0]);  // every worker takes part in both rounds
  EXPECT_NE(drawn[0], 3.0);
  // Without --speeds the column is there and empty.
  ASSERT_EQ(Simulate(job, "no-speeds").exit_code, 0);
  EXPECT_EQ(CsvRows(ReadWholeFile(tmp_.path() / "no-speeds" / "rounds.csv")).at(1).back(), "");

  std::ofstream(tmp_.path() / "short.txt") << "1\n2\n";
  CommandResult short_file = Simulate(job, "short", 2, {"--speeds", (tmp_.path() / "short.txt").string()});
  EXPECT_EQ(short_file.exit_code, 2) << short_file.output;
  EXPECT_NE(short_file.output.find("one per virtual worker (4)"), std::string::npos) << short_file.output;
  CommandResult bad_sigma = Simulate(job, "bad-sigma", 2, {"--speeds", "lognormal:-1"});
  EXPECT_EQ(bad_sigma.exit_code, 2) << bad_sigma.output;
  EXPECT_NE(bad_sigma.output.find("SIGMA must be a number in [0, 10]"), std::string::npos) << bad_sigma.output;
}

// An asynchronous job runs on the virtual workers as on real ones: num_rounds versions of buffer_size updates each.
// With --speeds its results reach the runner in virtual-time order, and each version ends when its last update would
// have arrived: sooner than the synchronous rounds, which wait for the slowest worker.
TEST_F(SimulateTest, AnAsynchronousJobCommitsVersionsOfBufferSizeUpdates) {
  json job = Job("federated_averaging", nullptr);
  job["distributed"]["aggregation"] = "async";
  job["distributed"]["async"] = {{"buffer_size", 2}, {"max_staleness", 5}};
  CommandResult run = Simulate(job, "async");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::vector<std::vector<std::string>> rows = CsvRows(ReadWholeFile(tmp_.path() / "async" / "rounds.csv"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(kRounds + 1));
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i][2], "committed");
    EXPECT_EQ(rows[i][4], "2");  // accepted_updates: the buffer
  }

  // Step times 0.5, 2, 1 and 0.25 s, 3 steps a task: tasks of 1.5, 6, 3 and 0.75 s. Version 1: worker 4's update
  // (0.75) and worker 1's (1.5). Worker 4, idle since, and worker 1 start version 2's tasks at 1.5, ending at 2.25 and
  // 3.0; at 3.0 worker 1's comes before worker 3's (started at 0; a tie goes to the lower id): version 2 at 3.0. The
  // synchronous rounds of the same job take 6 s each (the speeds test above).
  const fs::path speeds = tmp_.path() / "async-speeds.txt";
  std::ofstream(speeds) << "0.5\n2\n1\n0.25\n";
  for (const std::string out : {"async-timed", "async-timed-again"}) {
    CommandResult timed = Simulate(job, out, 2, {"--speeds", speeds.string()});
    ASSERT_EQ(timed.exit_code, 0) << timed.output;
    const std::vector<std::vector<std::string>> timed_rows = CsvRows(ReadWholeFile(tmp_.path() / out / "rounds.csv"));
    ASSERT_EQ(timed_rows.size(), 3u) << out;
    EXPECT_EQ(std::stod(timed_rows[1].back()), 1.5) << out;
    EXPECT_EQ(std::stod(timed_rows[2].back()), 3.0) << out;
  }
}

// With distributed.compression.global each virtual worker counts, from round 2 on, the delta of the global it read
// the round before (stored beside the global) instead of the whole global.
TEST_F(SimulateTest, WithGlobalDeltasAVirtualWorkerCountsTheDeltaItWouldDownload) {
  json job = Job("federated_averaging", nullptr);
  job["distributed"]["compression"] = {{"global", "delta_int8"}};
  CommandResult run = Simulate(job, "deltas");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const json doc = json::parse(ReadWholeFile(tmp_.path() / "deltas" / "rounds.json"));
  ASSERT_EQ(doc["rounds"].size(), static_cast<size_t>(kRounds));
  for (int r = 2; r <= kRounds; ++r) {
    char folder[64];
    std::snprintf(folder, sizeof folder, "jobs/%lld/rounds/%06d-a1",
                  static_cast<long long>(doc["job_id"].get<int64_t>()), r - 1);
    const fs::path delta = tmp_.path() / "deltas" / "blobs" / folder / "global.delta";
    ASSERT_TRUE(fs::exists(delta)) << delta;
    EXPECT_EQ(doc["rounds"][r - 1]["bytes_down"], kWorkers * static_cast<int64_t>(fs::file_size(delta))) << r;
  }
}

}  // namespace
}  // namespace parsyn::e2e
