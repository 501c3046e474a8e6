// bench_learning's section 6: workers of different LoRA ranks (docs/training.md "Workers of different ranks").
// The demo's task — colour questions with a one-word answer ("what color is the zorp?" -> " teal"), scored by exact
// match — on a Llama of hidden 256 (byte vocabulary, 2 layers, LoRA on all seven projections) over 6 workers, each
// holding the questions of its own things (disjoint: the global has to gather what every worker learnt). Three
// federations, each with 3 seeds (model, adapters and data order):
//   svd       ranks {4, 4, 8, 8, 16, 16}, exact factored aggregation (strategy::LoraRanks::kFactored),
//   zero_pad  the same ranks, each worker trains the global's first r ranks, factors padded and averaged,
//   rank 4    every worker at rank 4, plain FedAvg of the factors.
// Every worker has the same lora_alpha, 8, as a job gives it (PEFT's scaling alpha / r at its rank; at alpha 32 and
// this learning rate the rank-4 workers diverged). The code paths
// are the coordinator's: RoundAggregation over strategy::FedAvg weighted by sample count, weights::TruncateLoraRank /
// SliceLoraRank for what a lower rank trains.
#include "learning_lora_ranks.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_support.h"
#include "data/tokenizer.h"
#include "strategy/make_strategy.h"
#include "strategy/round_aggregation.h"
#include "trainer/causal_lm.h"
#include "trainer/lm_batches.h"
#include "trainer/train_loop.h"
#include "weights/lora_rank.h"

namespace parsyn::bench {
namespace {

void Check(const Status& status, const std::string& what) {
  if (!status.ok()) Die(what + ": " + status.ToString());
}

constexpr int kWorkers = 6;
constexpr int kThingsPerWorker = 8;
constexpr double kAlpha = 8;  // every worker's lora_alpha: scaling 2 at rank 4, 0.5 at rank 16
const std::vector<std::string> kColors = {" red", " green", " blue", " white", " black", " teal", " pink", " gold"};

// A pronounceable made-up word per thing ("zorp"), distinct, from `rng`.
std::vector<std::string> Things(std::mt19937& rng, int count) {
  const std::string consonants = "bdfgklmnprstvz", vowels = "aeiou";
  std::vector<std::string> things;
  while (static_cast<int>(things.size()) < count) {
    std::string word;
    for (int i = 0; i < 2; ++i) {
      word += consonants[rng() % consonants.size()];
      word += vowels[rng() % vowels.size()];
    }
    word += consonants[rng() % consonants.size()];
    if (std::find(things.begin(), things.end(), word) == things.end()) things.push_back(word);
  }
  return things;
}

struct Question {
  std::string prompt;
  std::string completion;
};

// Byte-level ids: <bos> prompt completion <eos>, the loss on the completion and <eos> only.
trainer::LmExamples Examples(const std::vector<Question>& questions) {
  std::vector<std::vector<int32_t>> ids;
  std::vector<int64_t> prompt_lengths;
  for (const Question& q : questions) {
    std::vector<int32_t> row = {data::kByteLevelBosId};
    for (unsigned char c : q.prompt) row.push_back(c);
    prompt_lengths.push_back(static_cast<int64_t>(row.size()));
    for (unsigned char c : q.completion) row.push_back(c);
    row.push_back(data::kByteLevelEosId);
    ids.push_back(std::move(row));
  }
  return trainer::LmExamples::FromIds(std::move(ids), std::move(prompt_lengths), data::kByteLevelPadId);
}

trainer::LlamaConfig Hidden256() {
  trainer::LlamaConfig c;
  c.vocab_size = data::kByteLevelVocabSize;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 64;
  return c;
}

// A model at `rank` over the seed's base weights (the same base for every rank).
std::unique_ptr<trainer::CausalLm> ModelAt(int rank, uint64_t seed) {
  auto llama = Must(trainer::LlamaModel::RandomInit(Hidden256(), seed, {}), "the base model");
  trainer::LoraSettings lora{.r = rank, .alpha = kAlpha, .dropout = 0, .target_modules = {"all-linear"}};
  Check(llama->AttachLora(lora, seed + 1), "LoRA");
  return std::make_unique<trainer::CausalLm>(std::move(llama), trainer::CausalLmOptions{});
}

struct Federation {
  const char* name;
  std::vector<int> ranks;  // by worker
  strategy::LoraRanks mixed;
};

struct Outcome {
  double loss = 0;
  double exact_match = 0;
};

Outcome RunFederation(const Federation& f, uint64_t seed, int rounds, int steps,
                      const std::vector<trainer::LmExamples>& shards, const trainer::LmExamples& validation) {
  const int r_max = *std::max_element(f.ranks.begin(), f.ranks.end());
  std::map<int, std::unique_ptr<trainer::CausalLm>> models;
  for (int r : f.ranks) {
    if (!models.count(r)) models[r] = ModelAt(r, seed);
  }
  weights::WeightSet global = Must(models[r_max]->ExportTrainable(), "the initial adapters");
  auto fed_avg =
      Must(strategy::MakeStrategy(strategy::StrategyKind::kFederatedAveraging, {}, weights::SecretKey{}), "FedAvg");
  strategy::RoundAggregation round(*fed_avg, f.mixed);
  for (int r = 1; r <= rounds; ++r) {
    Check(round.Begin(r, global), "round begin");
    for (int w = 0; w < kWorkers; ++w) {
      const int rank = f.ranks[w];
      trainer::CausalLm& model = *models[rank];
      // What the coordinator sends a worker of a lower rank (job_runner_ranks.cc): the global's top ranks, B scaled
      // by r / r_max for PEFT's scaling alpha / r.
      StatusOr<weights::WeightSet> top = rank == r_max ? StatusOr<weights::WeightSet>(global.Clone())
                                         : f.mixed == strategy::LoraRanks::kFactored
                                             ? weights::TruncateLoraRank(global, rank)
                                             : weights::SliceLoraRank(global, rank);
      StatusOr<weights::WeightSet> start =
          weights::ScaleLoraProducts(Must(std::move(top), "the worker's global"), static_cast<double>(rank) / r_max);
      Check(model.ImportTrainable(Must(std::move(start), "the worker's global")), "import");
      trainer::TrainOptions train;
      train.config.batch_size = kThingsPerWorker;
      train.config.learning_rate = 5e-3;
      train.config.lr_scheduler = protocol::LrScheduler::kConstant;
      train.config.max_grad_norm = 1.0;
      train.max_steps = steps;
      train.seed = seed * 1000 + static_cast<uint64_t>(r * kWorkers + w);
      train.language_model = true;
      Must(trainer::Train(model, shards[w], train), "local training");
      Check(round.Accept(Must(model.ExportTrainable(), "export"), shards[w].size()), "the update");
    }
    global = Must(round.Finish(), "aggregation");
  }
  trainer::CausalLm& top = *models[r_max];
  Check(top.ImportTrainable(global), "the final global");
  const trainer::EvalMetrics m = Must(trainer::Evaluate(top, validation, 16, protocol::MixedPrecision::kNo), "eval");
  return {.loss = m.loss, .exact_match = m.exact_match};
}

}  // namespace

void MixedLoraRanks(bool quick) {
  const int rounds = quick ? 2 : 12, steps = quick ? 2 : 10, seeds = 3;
  std::printf(
      "\n== 6. Workers of different LoRA ranks: colour questions over %d workers (%d things each, disjoint), Llama "
      "hidden 256, %d rounds x %d steps, %d seeds ==\n",
      kWorkers, kThingsPerWorker, rounds, steps, seeds);
  const std::vector<Federation> federations = {
      {"svd", {4, 4, 8, 8, 16, 16}, strategy::LoraRanks::kFactored},
      {"zero_pad", {4, 4, 8, 8, 16, 16}, strategy::LoraRanks::kZeroPadded},
      {"rank 4", {4, 4, 4, 4, 4, 4}, strategy::LoraRanks::kSame},
  };
  std::vector<std::vector<Outcome>> outcomes(federations.size());
  for (int s = 0; s < seeds; ++s) {
    std::mt19937 rng(1000 + s);
    const std::vector<std::string> things = Things(rng, kWorkers * kThingsPerWorker);
    std::vector<trainer::LmExamples> shards;
    std::vector<Question> all;
    for (int w = 0; w < kWorkers; ++w) {
      std::vector<Question> own;
      for (int i = 0; i < kThingsPerWorker; ++i) {
        own.push_back({"what color is the " + things[w * kThingsPerWorker + i] + "?", kColors[rng() % kColors.size()]});
      }
      all.insert(all.end(), own.begin(), own.end());
      shards.push_back(Examples(own));
    }
    const trainer::LmExamples validation = Examples(all);
    for (size_t f = 0; f < federations.size(); ++f) {
      outcomes[f].push_back(RunFederation(federations[f], 7 + s, rounds, steps, shards, validation));
      std::printf("  seed %d %-9s validation loss %.4f, exact match %5.1f%%\n", s, federations[f].name,
                  outcomes[f].back().loss, 100 * outcomes[f].back().exact_match);
      std::fflush(stdout);
    }
  }
  std::printf("%-10s %28s %30s\n", "", "validation loss: mean [min, max]", "exact match: mean [min, max]");
  std::vector<double> mean_em(federations.size());
  for (size_t f = 0; f < federations.size(); ++f) {
    auto stats = [&](double Outcome::*field) {
      double sum = 0, lo = 1e300, hi = -1e300;
      for (const Outcome& o : outcomes[f]) {
        sum += o.*field;
        lo = std::min(lo, o.*field);
        hi = std::max(hi, o.*field);
      }
      return std::array<double, 3>{sum / outcomes[f].size(), lo, hi};
    };
    const auto loss = stats(&Outcome::loss), em = stats(&Outcome::exact_match);
    mean_em[f] = em[0];
    std::printf("%-10s %12.4f [%.4f, %.4f] %13.1f%% [%.1f%%, %.1f%%]\n", federations[f].name, loss[0], loss[1], loss[2],
                100 * em[0], 100 * em[1], 100 * em[2]);
  }
  // Paired by seed (the same things, base model and data order): how often, and by how much, svd is ahead.
  std::printf("svd - zero_pad by seed:");
  for (int s = 0; s < seeds; ++s)
    std::printf(" %+.1f", 100 * (outcomes[0][s].exact_match - outcomes[1][s].exact_match));
  std::printf(" points; svd - rank 4 by seed:");
  for (int s = 0; s < seeds; ++s)
    std::printf(" %+.1f", 100 * (outcomes[0][s].exact_match - outcomes[2][s].exact_match));
  std::printf(" points\n");
  const double over_pad = 100 * (mean_em[0] - mean_em[1]), over_rank4 = 100 * (mean_em[0] - mean_em[2]);
  std::printf("target: svd exact match >= zero_pad + 3 points (%+.1f): %s\n", over_pad,
              over_pad >= 3 ? "PASS" : "MISS");
  std::printf("target: svd exact match >= every worker at rank 4 (%+.1f): %s\n", over_rank4,
              over_rank4 >= 0 ? "PASS" : "MISS");
}

}  // namespace parsyn::bench
