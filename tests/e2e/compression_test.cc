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
#include <map>
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

}  // namespace
}  // namespace parsyn::e2e
