#include "learning_digits.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/testing/build_paths.h"
#include "bench_support.h"
#include "data/dataset.h"

namespace parsyn::bench {

void AddWorkers(Federation& fed, const std::vector<std::vector<int64_t>>& rows_per_worker) {
  for (const auto& rows : rows_per_worker) {
    fed.workers.push_back(Must(trainer::TabularExamples::Create(fed.dataset, rows, fed.spec), "worker examples"));
    fed.worker_sizes.push_back(static_cast<int64_t>(rows.size()));
  }
}

Eval Evaluate(trainer::TabularModel& model, const weights::WeightSet& global, const trainer::ExampleSet& examples) {
  Check(model.ImportTrainable(global), "importing the global");
  auto m = Must(trainer::Evaluate(model, examples, 4096, trainer::MixedPrecision::kNo), "evaluating");
  return {m.loss, m.accuracy};
}

std::pair<weights::WeightSet, int64_t> TrainLocal(trainer::TabularModel& model, const weights::WeightSet& global,
                                                  const trainer::ExampleSet& examples,
                                                  const protocol::TrainingConfig& config, std::optional<int64_t> steps,
                                                  double mu, uint64_t seed) {
  Check(model.ImportTrainable(global), "importing the global");
  trainer::TrainOptions options;
  options.config = config;
  options.max_steps = steps;
  options.proximal_mu = mu;
  options.seed = seed;
  const trainer::TrainSummary summary = Must(trainer::Train(model, examples, options), "local training");
  return {Must(model.ExportTrainable(), "exporting"), summary.steps};
}

Digits LoadDigits() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench_learning." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path csv = dir / "digits.csv";
  const std::string command =
      std::string("/usr/bin/python3 ") + parsyn::test_support::SourcePath("bench/digits_csv.py") + " " + csv.string();
  if (std::system(command.c_str()) != 0) {
    std::fflush(stdout);
    Die("`" + command + "` failed: it needs Debian's python3-sklearn (./dev setup installs it)");
  }
  Digits d;
  d.dataset = Must(data::LoadTabularFile(csv), "reading " + csv.string());
  std::filesystem::remove_all(dir);
  const std::vector<int64_t> order = data::ShuffledIndices(d.dataset.num_rows(), kLearningSeed);
  const int64_t num_test = d.dataset.num_rows() / 5;
  d.test_rows.assign(order.begin(), order.begin() + num_test);
  d.train_pool.assign(order.begin() + num_test, order.end());
  std::sort(d.test_rows.begin(), d.test_rows.end());
  std::sort(d.train_pool.begin(), d.train_pool.end());
  return d;
}

Federation DigitsFederation(const Digits& d, int workers, const coordinator::DataPartition& partition,
                            const protocol::TrainerConfig& config) {
  Federation fed;
  fed.dataset = d.dataset;
  fed.spec = Must(trainer::TabularSpecFor(config, fed.dataset, d.train_pool), "model spec");
  data::RowLabels labels;
  labels.class_names = fed.dataset.class_names;
  for (int64_t row : d.train_pool) labels.labels.push_back(static_cast<int32_t>(fed.dataset.labels[row]));
  const std::vector<coordinator::Shard> shards =
      Must(coordinator::SplitRowsByLabel(labels, workers, 0.0, partition, kLearningSeed), "partitioning");
  std::vector<std::vector<int64_t>> rows(shards.size());
  for (size_t w = 0; w < shards.size(); ++w) {
    for (int64_t i : shards[w].train_rows) rows[w].push_back(d.train_pool[i]);
  }
  AddWorkers(fed, rows);
  fed.train_all = Must(trainer::TabularExamples::Create(fed.dataset, d.train_pool, fed.spec), "training rows");
  fed.test = Must(trainer::TabularExamples::Create(fed.dataset, d.test_rows, fed.spec), "test rows");
  return fed;
}

protocol::TrainerConfig DigitsConfig() {
  protocol::TrainerConfig config;
  config.model_type = protocol::TabularModelType::kMlp;
  config.training.hidden_sizes = {32};
  config.training.batch_size = 16;
  config.training.learning_rate = 3e-3;
  config.training.lr_scheduler = protocol::LrScheduler::kConstant;
  config.training.warmup_steps = 0;
  config.training.weight_decay = 0;
  config.training.max_grad_norm = 1.0;
  config.training.validation_fraction = 0;
  config.training.label_column = "label";
  return config;
}

}  // namespace parsyn::bench
