// bench_learning's federations (learning_digits.cc): a tabular dataset split over workers by the project's
// partitioner, local training by the trainer's own loop and evaluation, and scikit-learn's digits; shared by the
// sections in learning.cc and learning_async.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "coordinator/partition.h"
#include "data/dataset.h"
#include "protocol/trainer_task.h"
#include "trainer/tabular_model.h"
#include "trainer/train_loop.h"
#include "weights/weight_set.h"

namespace parsyn::bench {

// The seed of every run of bench_learning: its figures repeat.
inline constexpr uint64_t kLearningSeed = 20260101;

// One dataset, a model spec, each worker's training rows, and evaluation sets.
struct Federation {
  data::TabularDataset dataset;
  trainer::TabularModelSpec spec;
  std::vector<trainer::TabularExamples> workers;  // training examples of each worker
  std::vector<int64_t> worker_sizes;
  std::optional<trainer::TabularExamples> train_all;  // every worker's training rows (the training loss)
  std::optional<trainer::TabularExamples> test;
};

void AddWorkers(Federation& fed, const std::vector<std::vector<int64_t>>& rows_per_worker);

struct Eval {
  double loss = 0;
  double accuracy = 0;
};

Eval Evaluate(trainer::TabularModel& model, const weights::WeightSet& global, const trainer::ExampleSet& examples);

// One worker's local training from `global`: the trainer's loop (AdamW, the config's schedule, FedProx's term when
// mu > 0), `steps` optimizer steps, or config.epochs epochs when unset. Returns the trained weights and the steps run.
std::pair<weights::WeightSet, int64_t> TrainLocal(trainer::TabularModel& model, const weights::WeightSet& global,
                                                  const trainer::ExampleSet& examples,
                                                  const protocol::TrainingConfig& config, std::optional<int64_t> steps,
                                                  double mu, uint64_t seed);

// scikit-learn's digits (bench/digits_csv.py, Debian python3-sklearn): 80% train pool / 20% test rows, seeded.
struct Digits {
  data::TabularDataset dataset;
  std::vector<int64_t> train_pool, test_rows;
};
Digits LoadDigits();

// The train pool split over `workers` by the project's partitioner; the model standardised on the train pool.
Federation DigitsFederation(const Digits& d, int workers, const coordinator::DataPartition& partition,
                            const protocol::TrainerConfig& config);

// An MLP 64 -> 32 -> 10, batch 16, AdamW lr 3e-3 at a constant rate.
protocol::TrainerConfig DigitsConfig();

}  // namespace parsyn::bench
