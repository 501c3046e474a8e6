// LoRA jobs whose workers train different ranks (docs/training.md "Workers of different ranks"), with real `parsyn
// worker` processes on a tiny Llama: a job of ranks 1 and 3 under r_max 4, whose every global's B·A is the best rank-4
// approximation of the FedAvg of the workers' B_i·A_i, each completed with the previous global's ranks beyond its own
// (recomputed here in double from the update blobs), and whose adapter is a PEFT
// adapter at r_max that `parsyn adapter merge` reads; a resumed job ends with the uninterrupted job's adapter;
// zero-padding's globals are the FedAvg of the padded factors;
// "auto" ranks follow what each worker announces; bad ranks are refused with both numbers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

constexpr int64_t kHidden = 32;  // InitTinyLlama's: q_proj and v_proj are 32 x 32

class LoraRanksTest : public LlamaJobTest {
 protected:
  // Each module's B·A (out x in, row-major) of the adapter tensors `t`, by module ("...q_proj"); from `first_rank`
  // on: the product of B's columns and A's rows from there (an adapter's ranks beyond a lower rank's).
  static std::map<std::string, std::vector<double>> Products(const std::map<std::string, std::vector<double>>& t,
                                                             size_t first_rank = 0) {
    std::map<std::string, std::vector<double>> out;
    for (const auto& [name, a] : t) {
      const std::string suffix = ".lora_A.weight";
      if (!name.ends_with(suffix)) continue;
      const std::string module = name.substr(0, name.size() - suffix.size());
      const std::vector<double>& b = t.at(module + ".lora_B.weight");
      const size_t rank = a.size() / kHidden, rows = b.size() / rank;
      std::vector<double>& product = out[module];
      product.assign(rows * kHidden, 0.0);
      for (size_t o = 0; o < rows; ++o) {
        for (size_t k = first_rank; k < rank; ++k) {
          for (size_t i = 0; i < kHidden; ++i) product[o * kHidden + i] += b[o * rank + k] * a[k * kHidden + i];
        }
      }
    }
    return out;
  }

  // Whether `g` is the best approximation of `m` of its rank, by the first-order conditions of a truncated SVD: the
  // residual m - g is orthogonal to g's column and row spaces (g^T (m - g) = 0, (m - g) g^T = 0), each entry within
  // `tolerance` of the largest |g| |m| n it sums. Any other product (another mean, or m itself when it has a higher
  // rank) fails it.
  static void ExpectBestApproximation(const std::vector<double>& g, const std::vector<double>& m, double tolerance,
                                      const std::string& what) {
    const size_t n = kHidden;
    double gm = 0;
    for (size_t i = 0; i < g.size(); ++i) gm = std::max(gm, std::abs(g[i]) * std::abs(m[i]));
    double worst = 0;
    for (size_t x = 0; x < n; ++x) {
      for (size_t y = 0; y < n; ++y) {
        double left = 0, right = 0;  // (g^T r)[x][y] and (r g^T)[x][y]
        for (size_t k = 0; k < n; ++k) {
          left += g[k * n + x] * (m[k * n + y] - g[k * n + y]);
          right += (m[x * n + k] - g[x * n + k]) * g[y * n + k];
        }
        worst = std::max({worst, std::abs(left), std::abs(right)});
      }
    }
    EXPECT_LE(worst, tolerance * gm * n) << what;
    EXPECT_GT(gm, 0) << what;
  }

  // The rank of an adapter's tensors (its first lora_A's rows).
  static size_t RankOf(const std::map<std::string, std::vector<double>>& t) {
    for (const auto& [name, values] : t) {
      if (name.ends_with(".lora_A.weight")) return values.size() / kHidden;
    }
    return 0;
  }

  // The lora_rank of each task_assigned event of the job, by worker.
  std::map<int64_t, int> AssignedRanks(int64_t job_id) {
    std::map<int64_t, int> ranks;
    WaitForEvent(
        *admin_, job_id,
        [&](const std::string& type, const json& d) {
          if (type == "task_assigned" && d.contains("lora_rank")) ranks[d["worker_id"]] = d["lora_rank"];
          return type == "job_status" && d.value("status", "") == "succeeded";
        },
        std::chrono::seconds(60));
    return ranks;
  }
};

TEST_F(LoraRanksTest, TwoRanksAggregateToTheTruncatedMeanOfTheirCompletedProductsAndTheAdapterMerges) {
  std::vector<int64_t> ids = StartWorkers(2);
  const int kRounds = 3;
  json spec = LoraSpec(ids, kRounds, 4, 2);
  // r_max 4 (lora_r): the workers train ranks 1 and 3.
  spec["config"]["lora_ranks"] = {{std::to_string(ids[0]), 1}, {std::to_string(ids[1]), 3}};
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(480));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(AssignedRanks(job_id), (std::map<int64_t, int>{{ids[0], 1}, {ids[1], 3}}));

  // Each round's global is the best rank-4 approximation of the weighted mean of the workers' products (in rank-4
  // units), each completed with the previous global's ranks beyond the worker's own (round 1's global before it has
  // B = 0).
  int checked = 0;
  std::map<std::string, std::vector<double>> previous;  // the previous global's tensors, in its SVD form
  for (const json& round : Rounds(*admin_, job_id)) {
    if (round["outcome"] != "committed" || round["round"].get<int>() < 1) continue;
    const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
    std::map<std::string, std::vector<double>> mean;
    double total = 0;
    for (const json& u : round["updates"]) {
      ASSERT_EQ(u["status"], "accepted") << u.dump();
      const auto tensors = UpdateTensors(prefix, u);
      const size_t rank = RankOf(tensors);
      EXPECT_EQ(rank, u["worker_id"] == ids[0] ? 1u : 3u) << u.dump();
      const double n = u["num_samples"].get<double>();
      total += n;
      const auto tails = previous.empty() ? std::map<std::string, std::vector<double>>{} : Products(previous, rank);
      for (auto& [module, product] : Products(tensors)) {
        std::vector<double>& m = mean[module];
        m.resize(product.size(), 0.0);
        const std::vector<double>* tail = tails.count(module) ? &tails.at(module) : nullptr;
        // PEFT's scaling alpha / r: a rank-r product adds 4 / r times what it would at rank 4.
        const double scale = 4.0 / static_cast<double>(rank);
        for (size_t i = 0; i < product.size(); ++i) m[i] += n * (scale * product[i] + (tail ? (*tail)[i] : 0.0));
      }
    }
    const auto global = ReadTensors(BlobPath(prefix + "/global.safetensors"));
    EXPECT_EQ(RankOf(global), 4u);
    for (auto& [module, product] : Products(global)) {
      for (double& v : mean[module]) v /= total;
      // float32 factors: each entry's rounding is ~1e-7 of its terms.
      ExpectBestApproximation(product, mean[module], 1e-5, prefix + " " + module);
    }
    previous = global;
    ++checked;
  }
  EXPECT_EQ(checked, kRounds);

  // The artifact is a PEFT adapter at r_max, which `parsyn adapter merge` merges into the base model.
  const fs::path adapter = tmp_.path() / "adapter";
  fs::create_directories(adapter);
  for (const char* name : {"adapter_model.safetensors", "adapter_config.json"}) {
    StatusOr<uint64_t> got = admin_->DownloadToFile(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/" + name, adapter / name);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
  }
  EXPECT_EQ(json::parse(ReadWholeFile(adapter / "adapter_config.json"))["r"], 4);
  CommandResult merged = RunParsyn({"adapter", "merge", "--model", (tmp_.path() / "model").string(), "--adapter",
                                    adapter.string(), "--out", (tmp_.path() / "merged").string()});
  EXPECT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_TRUE(fs::exists(tmp_.path() / "merged" / "model.safetensors")) << merged.output;
}

// The factored mean stacks the updates in an order of their contents, not of their arrival: a job whose server is
// killed after round 1 ends with the uninterrupted job's adapter, bit for bit.
TEST_F(LoraRanksTest, AResumedJobOfMixedRanksEndsWithTheUninterruptedAdapter) {
  std::vector<int64_t> ids = StartWorkers(2);
  json spec = LoraSpec(ids, 3, 3, 2);
  spec["config"]["lora_ranks"] = {{std::to_string(ids[0]), 2}, {"default", 4}};
  ExpectAResumedJobEndsWithTheUninterruptedWeights(spec);
}

TEST_F(LoraRanksTest, ZeroPaddingAveragesThePaddedFactors) {
  std::vector<int64_t> ids = StartWorkers(2);
  json spec = LoraSpec(ids, 2, 4, 2);
  spec["config"]["lora_ranks"] = {{std::to_string(ids[0]), 2}, {"default", 4}};
  spec["config"]["lora_aggregation"] = "zero_pad";
  const int64_t job_id = CreateJob(*admin_, spec);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(480));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  for (const json& round : Rounds(*admin_, job_id)) {
    if (round["outcome"] != "committed" || round["round"].get<int>() < 1) continue;
    const std::string prefix = AttemptPrefix(job_id, round["round"], round["attempt"]);
    std::map<std::string, std::vector<double>> sum;
    double total = 0;
    for (const json& u : round["updates"]) {
      const double n = u["num_samples"].get<double>();
      total += n;
      for (auto& [name, values] : UpdateTensors(prefix, u)) {
        // Padded to rank 4: lora_A (r x 32) gains zero rows at its end, lora_B (32 x r) zero columns, after B is
        // scaled by 4 / r into rank 4's units (PEFT's scaling alpha / r).
        const size_t rank = values.size() / kHidden;
        const bool a = name.ends_with(".lora_A.weight");
        std::vector<double> padded(4 * kHidden, 0.0);
        for (size_t i = 0; i < values.size(); ++i) {
          padded[a ? i : (i / rank) * 4 + i % rank] = a ? values[i] : values[i] * 4.0 / static_cast<double>(rank);
        }
        std::vector<double>& s = sum[name];
        s.resize(padded.size(), 0.0);
        for (size_t i = 0; i < padded.size(); ++i) s[i] += n * padded[i];
      }
    }
    for (auto& [name, values] : ReadTensors(BlobPath(prefix + "/global.safetensors"))) {
      ASSERT_EQ(values.size(), sum[name].size()) << name;
      for (size_t i = 0; i < values.size(); ++i) {
        EXPECT_NEAR(values[i], sum[name][i] / total, 1e-6 + 1e-6 * std::abs(values[i])) << prefix << " " << name;
      }
    }
  }
}

TEST_F(LoraRanksTest, AutoRanksFollowWhatEachWorkerAnnounces) {
  // A worker announcing ~1 KiB of memory (less than twice the model) trains r_max / 8, at least 1; one started with
  // --lora-rank 2 trains at most 2.
  std::vector<int64_t> small = StartWorkers(1, {"--device-memory", "0.000001"});
  std::vector<int64_t> capped = StartWorkers(1, {"--lora-rank", "2"});
  json spec = LoraSpec({small[0], capped[0]}, 1, 2, 2);
  spec["config"]["lora_r"] = "auto";
  spec["config"]["lora_r_max"] = 8;
  const int64_t job_id = CreateJob(*admin_, spec);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(480));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(AssignedRanks(job_id), (std::map<int64_t, int>{{small[0], 1}, {capped[0], 2}}));
  EXPECT_EQ(job["spec"]["config"]["lora_r"], "auto") << job.dump(2);
}

TEST_F(LoraRanksTest, RanksAWorkerCannotTakeAreRefusedNamingBothNumbers) {
  std::vector<int64_t> ids = StartWorkers(1, {"--lora-rank", "2"});
  // A key naming a worker outside the job, or one that does not exist: 400.
  json outside = LoraSpec(ids, 1, 2, 1);
  outside["config"]["lora_ranks"] = {{"999", 4}};
  StatusOr<http::ClientResponse> refused = admin_->PostJson("/api/v1/training-jobs", outside);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("config.lora_ranks names worker 999, which is not in this job's "
                                            "worker_selection"),
            std::string::npos)
      << refused.status().message();
  json unknown = outside;
  unknown["worker_selection"] = {{"mode", "auto"}};
  refused = admin_->PostJson("/api/v1/training-jobs", unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("config.lora_ranks names worker 999, which does not exist"),
            std::string::npos)
      << refused.status().message();

  // The job gives rank 4 to a worker that trains up to 2: its task is refused, and the job says why.
  json spec = LoraSpec(ids, 1, 2, 1, 20);
  spec["distributed"]["fault_tolerance"] = 1;
  const int64_t job_id = CreateJob(*admin_, spec);
  std::string reason;
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        if (type == "worker_dropped" && d.value("worker_id", int64_t{0}) == ids[0]) reason = d.value("reason", "");
        return !reason.empty();
      },
      std::chrono::seconds(120)));
  EXPECT_NE(reason.find("worker " + std::to_string(ids[0]) +
                        " announces it trains LoRA ranks up to 2 (parsyn worker --lora-rank), and this job gives it "
                        "rank 4"),
            std::string::npos)
      << reason;
}

}  // namespace
}  // namespace parsyn::e2e
