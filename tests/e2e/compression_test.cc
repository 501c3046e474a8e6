// Compressed updates end to end (docs/compression.md, "In jobs"): the same federated tabular job (an MLP wide enough
// that tensor data, not safetensors headers, makes up the bytes; 2 workers, 2 rounds, seed 7) with each
// distributed.compression: none, bf16, int8 + delta + zstd (zstd on the globals too), int4 + delta + error feedback.
// Real `parsyn worker` processes encode, the coordinator decodes; every job completes, its updates take the
// expected share of the plain job's bytes on the wire, GET rounds reports the ratio, and the final validation loss
// stays close to the plain job's.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

class CompressionJobTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    // Two hidden layers of 256: ~66k parameters, so tensor data dominates the headers.
    WriteSeparableCsv(tmp_.path() / "points.csv", 400);
    CommandResult init =
        RunParsyn({"model", "init", "--architecture", "mlp", "--data", (tmp_.path() / "points.csv").string(),
                   "--hidden-sizes", "256", "256", "--out", (tmp_.path() / "model").string(), "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.output;
    StartServerWith("points-mlp-wide", "points.csv");
    ASSERT_GT(model_id_, 0);
    ASSERT_GT(dataset_id_, 0);
  }

  struct Outcome {
    int64_t update_wire_bytes = 0;  // Σ size_bytes of the accepted updates of every round
    int64_t bytes_moved = 0;        // Σ rounds' bytes_moved
    std::vector<double> ratios;     // each round's compression_ratio
    double final_loss = NAN;
  };

  Outcome RunJob(const std::vector<int64_t>& workers, const std::string& name, const json& compression) {
    json spec = TabularJobSpec("e2e-compression-" + name, dataset_id_, model_id_, workers, 2, 20);
    if (!compression.is_null()) spec["distributed"]["compression"] = compression;
    const int64_t job_id = CreateJob(*admin_, spec);
    EXPECT_GT(job_id, 0) << name;
    Outcome out;
    if (job_id <= 0) return out;
    const json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
    EXPECT_EQ(job.value("status", ""), "succeeded") << name << ": " << job.dump(2);
    if (!compression.is_null()) {
      EXPECT_EQ(job["spec"]["distributed"]["compression"]["update"], compression["update"]) << job["spec"].dump();
    }
    if (job.contains("final_validation_loss") && job["final_validation_loss"].is_number()) {
      out.final_loss = job["final_validation_loss"].get<double>();
    }
    for (const json& round : Rounds(*admin_, job_id)) {
      EXPECT_EQ(round["outcome"], "committed") << name << ": " << round.dump();
      out.bytes_moved += round["bytes_moved"].get<int64_t>();
      for (const json& u : round["updates"]) {
        EXPECT_EQ(u["status"], "accepted") << name << ": " << u.dump();
        out.update_wire_bytes += u["size_bytes"].get<int64_t>();
      }
      EXPECT_TRUE(round["compression_ratio"].is_number()) << name << ": " << round.dump();
      if (round["compression_ratio"].is_number()) out.ratios.push_back(round["compression_ratio"].get<double>());
    }
    return out;
  }
};

TEST_F(CompressionJobTest, EachCodecCompletesWithFewerBytesAndACloseLoss) {
  const std::vector<int64_t> workers = StartWorkers(2);
  const Outcome none = RunJob(workers, "none", nullptr);
  ASSERT_GT(none.update_wire_bytes, 0);
  ASSERT_TRUE(std::isfinite(none.final_loss));
  for (double r : none.ratios) EXPECT_NEAR(r, 1.0, 0.02) << "plain updates are as large as the global";

  struct Case {
    std::string name;
    json compression;
    double max_share;  // of the plain job's update bytes
  };
  const std::vector<Case> cases = {
      {"bf16", {{"update", "bf16"}}, 0.51},
      {"int8-delta-zstd", {{"update", "int8"}, {"delta", true}, {"zstd_level", 3}}, 0.25},
      {"int4-delta-ef", {{"update", "int4"}, {"delta", true}, {"error_feedback", true}}, 0.15},
  };
  for (const Case& c : cases) {
    const Outcome got = RunJob(workers, c.name, c.compression);
    const double share = static_cast<double>(got.update_wire_bytes) / static_cast<double>(none.update_wire_bytes);
    EXPECT_LE(share, c.max_share) << c.name << ": " << got.update_wire_bytes << " vs " << none.update_wire_bytes;
    // Each round's ratio (plain over wire) at least what the share's bound implies (zstd gains more on later deltas).
    for (double r : got.ratios) EXPECT_GE(r, 0.95 / c.max_share) << c.name;
    EXPECT_LT(got.bytes_moved, none.bytes_moved) << c.name;
    ASSERT_TRUE(std::isfinite(got.final_loss)) << c.name;
    EXPECT_NEAR(got.final_loss, none.final_loss, 0.05 * none.final_loss + 0.02) << c.name;
    std::printf(
        "%-16s update bytes %.3f of none's, round ratios %s, bytes_moved %lld vs %lld, final loss %.5f vs %.5f\n",
        c.name.c_str(), share, json(got.ratios).dump().c_str(), static_cast<long long>(got.bytes_moved),
        static_cast<long long>(none.bytes_moved), got.final_loss, none.final_loss);
  }
}

// How often `needle` occurs in `text`.
size_t Occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The downlink (docs/compression.md, "Downlink"): per distributed.compression.global codec, a 4-round job of 2
// workers. From round 2 on each worker rebuilds the round's global from its delta: it says so only once the file it
// wrote has the task's sha256, which is the stored global's, so every worker trained from the stored global. In each
// job worker 0 is killed after round 2 and started again with an empty cache: it holds no base, says so, downloads
// the whole global and rebuilds the next ones from their deltas again. Every job completes with every update
// accepted, and rounds 2..4 download a share of what the plain job's do, plus what the restarted worker fetched anew
// (a whole global and its shard).
TEST_F(CompressionJobTest, GlobalDeltasRebuildTheStoredGlobalAndARestartedWorkerTakesItWhole) {
  const std::vector<int64_t> workers = StartWorkers(2);
  const int kRounds = 4;
  // Rounds 2.. of a job: the bytes their workers downloaded, and each one's global sha256.
  auto later_downloads = [&](int64_t job_id, std::vector<std::string>* shas, int64_t* first_round = nullptr) {
    int64_t bytes = 0;
    for (const json& round : Rounds(*admin_, job_id)) {
      if (round["outcome"] == "failed") continue;  // the attempt the restart cut short
      EXPECT_EQ(round["outcome"], "committed") << round.dump();
      for (const json& u : round["updates"]) EXPECT_EQ(u["status"], "accepted") << u.dump();
      (round["round"].get<int>() >= 2 ? bytes : *first_round) += round["bytes_down"].get<int64_t>();
      if (shas) shas->push_back(round["global_sha256"]);
    }
    return bytes;
  };
  auto run = [&](const std::string& name, const std::string& global, const std::function<void(int64_t)>& during) {
    json spec = TabularJobSpec("e2e-downlink-" + name, dataset_id_, model_id_, workers, kRounds, 10);
    spec["distributed"]["fault_tolerance"] = 3;  // the restart may fail the round in flight
    if (!global.empty()) spec["distributed"]["compression"] = {{"global", global}};
    const int64_t job_id = CreateJob(*admin_, spec);
    EXPECT_GT(job_id, 0) << name;
    if (during) during(job_id);
    const json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
    EXPECT_EQ(job.value("status", ""), "succeeded") << name << ": " << job.dump(2);
    return job_id;
  };
  int64_t plain_first_round = 0;
  const int64_t plain_bytes = later_downloads(run("none", "", nullptr), nullptr, &plain_first_round);
  ASSERT_GT(plain_bytes, 0);

  struct Case {
    std::string global;
    double max_share;  // of the plain job's downloads in rounds 2..
  };
  std::vector<int64_t> job_ids;
  for (const Case& c : {Case{"delta_bf16", 0.55}, Case{"delta_int8", 0.3}, Case{"delta_int4", 0.17}}) {
    std::vector<size_t> rebuilt_before;
    for (auto& w : workers_) rebuilt_before.push_back(Occurrences(w->log(), "rebuilt from its"));
    size_t lacked_before = Occurrences(workers_[0]->log(), "which this worker does not hold");
    const int64_t job_id = run(c.global, c.global, [&](int64_t id) {
      ASSERT_TRUE(WaitForEvent(
          *admin_, id,
          [](const std::string& type, const json& data) {
            return type == "round_committed" && data.value("round", 0) >= 2;
          },
          std::chrono::seconds(120)));
      workers_[0]->Kill();
      fs::remove_all(tmp_.path() / "cache-w0");
      workers_[0]->Start();
    });
    job_ids.push_back(job_id);
    std::vector<std::string> shas;
    int64_t first_round = 0;
    const int64_t bytes = later_downloads(job_id, &shas, &first_round);
    // One whole global (the plain job's rounds 2.. are 2 x 3 of them) and one worker's round-1 shard download.
    const double restart_allowance =
        static_cast<double>(plain_bytes) / (2 * (kRounds - 1)) + static_cast<double>(plain_first_round) / 2;
    EXPECT_LE(static_cast<double>(bytes), c.max_share * static_cast<double>(plain_bytes) + restart_allowance)
        << c.global << ": " << bytes << " vs " << plain_bytes;
    // A global per round, each one new.
    EXPECT_EQ(std::set<std::string>(shas.begin(), shas.end()).size(), shas.size()) << c.global;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const size_t rebuilt = Occurrences(workers_[i]->log(), "rebuilt from its") - rebuilt_before[i];
      // Rounds 2..4 and the final evaluation, from the held bases; the restarted worker from its next base on.
      EXPECT_GE(rebuilt, i == 0 ? 1u : 3u) << c.global << " worker " << i << "\n" << workers_[i]->log();
    }
    EXPECT_GT(Occurrences(workers_[0]->log(), "which this worker does not hold"), lacked_before) << workers_[0]->log();
    std::printf("%-10s rounds 2..%d downloaded %lld bytes, %.3f of the plain job's %lld (+ %.0f for the restart)\n",
                c.global.c_str(), kRounds, static_cast<long long>(bytes),
                static_cast<double>(bytes) / static_cast<double>(plain_bytes), static_cast<long long>(plain_bytes),
                restart_allowance);
  }
  // Worker 1 heartbeated during the later jobs' tasks: the coordinator named the earlier jobs as ended, and the
  // worker dropped the global it held for each (the last job's may stay until its next heartbeat).
  const fs::path state = tmp_.path() / "cache-w1" / "state" / ("w" + std::to_string(workers[1]));
  EXPECT_TRUE(fs::is_directory(state)) << state;
  for (size_t j = 0; j + 1 < job_ids.size(); ++j) {
    EXPECT_FALSE(fs::exists(state / ("job-" + std::to_string(job_ids[j]) + "-global.safetensors"))) << job_ids[j];
  }
}

}  // namespace
}  // namespace parsyn::e2e
