// bench_aggregate's section (g): LoRA adapters of different ranks (docs/training.md "Workers of different ranks").
// Six adapters of a Llama-7B-shaped layout (32 layers, q_proj and v_proj, 4096 x 4096) at ranks {4, 4, 8, 8, 16, 16},
// fp32, r_max 16, aggregated each way in a child process (this program re-executed with --lora MODE):
//   fedavg  the adapters zero-padded to r_max and averaged by weights::WeightedMean (what "zero_pad" does),
//   svd     what "svd" does (strategy::RoundAggregation, LoraRanks::kFactored): each lower-rank adapter scaled by
//           r_max / r and completed with the global's ranks beyond its own (weights::ExtendLoraRank over the global's
//           SVD form, weights::TruncateLoraRank), then weights::FactoredLoraMean, the exact mean of the products.
// Each child prints its peak RSS (VmHWM) and its aggregation's wall time; the section prints them side by side.
#include "aggregate_lora.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "weights/lora_layout.h"
#include "weights/lora_rank.h"
#include "weights/weighted_mean.h"

namespace parsyn::bench {
namespace {

constexpr int kLayers = 32;
constexpr int64_t kDim = 4096;
constexpr int kMaxRank = 16;
const std::vector<int> kRanks = {4, 4, 8, 8, 16, 16};

long VmHwmKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// An adapter at `rank` with values from `seed` (the values do not matter here, only the sizes and the arithmetic).
weights::WeightSet Adapter(int rank, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.01f, 0.01f);
  weights::WeightSet set;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const char* module : {"q_proj", "v_proj"}) {
      for (const char* matrix : {"lora_A", "lora_B"}) {
        const bool a = std::strcmp(matrix, "lora_A") == 0;
        std::vector<int64_t> shape = a ? std::vector<int64_t>{rank, kDim} : std::vector<int64_t>{kDim, rank};
        std::span<std::byte> bytes =
            set.AddZeros(weights::LoraTensorName(layer, module, matrix), weights::DType::kF32, shape).value();
        for (float& v : std::span(reinterpret_cast<float*>(bytes.data()), bytes.size() / sizeof(float))) v = u(rng);
      }
    }
  }
  return set;
}

int Child(const std::string& mode) {
  const weights::WeightSet global = Adapter(kMaxRank, 1);
  std::vector<weights::WeightSet> updates;
  for (size_t i = 0; i < kRanks.size(); ++i) updates.push_back(Adapter(kRanks[i], 100 + i));
  const auto start = std::chrono::steady_clock::now();
  // Both ways bring the lower ranks to r_max first, as the coordinator does when each update arrives.
  const weights::WeightSet svd_global =
      mode == "fedavg" ? weights::WeightSet() : weights::TruncateLoraRank(global, kMaxRank).value();
  for (size_t i = 0; i < updates.size(); ++i) {
    if (kRanks[i] == kMaxRank) continue;
    weights::WeightSet scaled = weights::ScaleLoraProducts(updates[i], double{kMaxRank} / kRanks[i]).value();
    updates[i] = mode == "fedavg" ? weights::ZeroPadLoraRank(scaled, kMaxRank).value()
                                  : weights::ExtendLoraRank(scaled, svd_global).value();
  }
  if (mode == "fedavg") {
    weights::WeightedMean mean(global, {});
    for (size_t i = 0; i < updates.size(); ++i) {
      if (!mean.Accept(updates[i], static_cast<double>(100 + 10 * i)).ok()) return 1;
    }
    if (!std::move(mean).Finish().ok()) return 1;
  } else {
    std::vector<weights::WeightedAdapter> adapters;
    for (size_t i = 0; i < updates.size(); ++i) {
      adapters.push_back({.adapter = &updates[i], .weight = static_cast<double>(100 + 10 * i)});
    }
    if (!weights::FactoredLoraMean(adapters, global).ok()) return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%ld %.3f\n", VmHwmKiB(), seconds);
  return 0;
}

struct Measured {
  double peak_mib = -1;
  double seconds = -1;
};

Measured Measure(const char* self, const char* mode) {
  FILE* pipe = ::popen(("'" + std::string(self) + "' --lora " + mode).c_str(), "r");
  Measured m;
  if (pipe == nullptr) return m;
  long kib = -1;
  if (std::fscanf(pipe, "%ld %lf", &kib, &m.seconds) != 2) kib = -1;
  if (::pclose(pipe) != 0) kib = -1;
  m.peak_mib = kib / 1024.0;
  return m;
}

}  // namespace

int LoraRanksChild(const char* mode) { return Child(mode); }

void LoraRanksSection(const char* self) {
  int64_t inputs = 0;
  for (int r : kRanks) inputs += int64_t{kLayers} * 2 * 2 * kDim * r * 4;
  std::printf(
      "\n(g) LoRA adapters of ranks {4, 4, 8, 8, 16, 16} -> r_max %d, %d layers x q_proj, v_proj at %lld x %lld, fp32 "
      "(%.0f MiB of updates at their ranks), each in a child process\n",
      kMaxRank, kLayers, static_cast<long long>(kDim), static_cast<long long>(kDim), inputs / (1024.0 * 1024.0));
  const Measured fedavg = Measure(self, "fedavg"), svd = Measure(self, "svd");
  std::printf("%-52s %14s %12s\n", "", "peak RSS MiB", "aggregate s");
  std::printf("%-52s %14.0f %12.2f\n", "FedAvg of the adapters zero-padded to r_max", fedavg.peak_mib, fedavg.seconds);
  std::printf("%-52s %14.0f %12.2f\n", "svd: completed to r_max, exact factored mean", svd.peak_mib, svd.seconds);
  std::printf(
      "svd / FedAvg peak RSS: %.2f (no out x in matrix is formed: a dense 4096 x 4096 fp64 delta per module "
      "would be 128 MiB each, 8 GiB for the 64 modules)\n",
      svd.peak_mib / fedavg.peak_mib);
}

}  // namespace parsyn::bench
