// Tabular classifiers for CSV data: `mlp` (Linear -> ReLU per hidden size, then Linear to the classes) and `logreg`
// (one Linear: multinomial logistic regression), trained with cross-entropy on class ids.
//
// A tabular model folder holds two files:
//   tabular_model.json   {"format": "parsyn-tabular", "model_type": "mlp", "hidden_sizes": [64], "label_column":
//                         "label", "feature_names": [...], "class_names": [...],
//                         "standardizer": {"mean": [...], "std": [...]}}
//   model.safetensors    the weights, F32, named "layers.{i}.weight" (out, in) and "layers.{i}.bias" (out) for the
//                        i-th Linear, i = 0 .. len(hidden_sizes).
// Features are standardised with the statistics stored in the model (computed from the training rows when the model
// is created), so every worker and every later prediction scales inputs alike.
//
// A TabularModel is used from one thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "data/dataset.h"
#include "protocol/trainer_task.h"
#include "trainer/train_loop.h"
#include "trainer/trainable_model.h"

namespace parsyn::trainer {

using protocol::TabularModelType;
using protocol::TabularModelTypeName;

inline constexpr char kTabularModelFile[] = "tabular_model.json";
inline constexpr char kTabularWeightsFile[] = "model.safetensors";

struct TabularModelSpec {
  TabularModelType model_type = TabularModelType::kMlp;
  std::vector<int64_t> hidden_sizes;  // empty for logreg
  std::string label_column = "label";
  std::vector<std::string> feature_names;
  std::vector<std::string> class_names;
  data::Standardizer standardizer;
};

// The spec a new model for `dataset` gets from `config`: feature and class names from the data, standardisation fitted
// on `train_rows`. InvalidArgument when the data has fewer than 2 classes or no features.
StatusOr<TabularModelSpec> TabularSpecFor(const protocol::TrainerConfig& config, const data::TabularDataset& dataset,
                                          std::span<const int64_t> train_rows);

class TabularModel final : public TrainableModel {
 public:
  // A new model with weights initialised as torch.nn.Linear does, drawn from torch's generator seeded with `seed`.
  // InvalidArgument for an inconsistent spec (no features, < 2 classes, standardizer size differs).
  static StatusOr<std::unique_ptr<TabularModel>> Create(TabularModelSpec spec, uint64_t seed, torch::Device device);
  // Reads a folder written by Save(). NotFound when a file is missing; InvalidArgument (naming the file and field)
  // when the JSON is malformed or the weights do not match it.
  static StatusOr<std::unique_ptr<TabularModel>> Load(const std::filesystem::path& dir, torch::Device device);
  // Writes tabular_model.json and model.safetensors into `dir` (created if missing), each atomically.
  Status Save(const std::filesystem::path& dir);

  const TabularModelSpec& spec() const { return spec_; }

  StepOutput Forward(const Batch& batch) override;
  std::vector<torch::Tensor> TrainableParameters() override;
  bool UsesWeightDecay(const std::string& parameter_name) const override;
  std::vector<std::string> TrainableNames() const override;
  StatusOr<weights::WeightSet> ExportTrainable() override;
  Status ImportTrainable(const weights::WeightSet& set) override;
  void Train(bool on) override;
  torch::Device device() const override { return device_; }

 private:
  TabularModel(TabularModelSpec spec, torch::Device device);

  TabularModelSpec spec_;
  torch::Device device_;
  std::vector<torch::nn::Linear> layers_;
  std::vector<std::string> names_;  // layers.{i}.weight, layers.{i}.bias, ...
};

// Rows of a TabularDataset, standardised with the model's statistics, as an ExampleSet.
class TabularExamples final : public ExampleSet {
 public:
  // Copies and standardises the rows listed in `rows` (in that order). InvalidArgument when the dataset's feature
  // names or class names differ from the spec's, or a row index is out of range.
  static StatusOr<TabularExamples> Create(const data::TabularDataset& dataset, std::span<const int64_t> rows,
                                          const TabularModelSpec& spec);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Batch MakeBatch(std::span<const int64_t> indices, torch::Device device) const override;

 private:
  TabularExamples() = default;
  int64_t num_features_ = 0;
  std::vector<float> features_;  // row-major, standardised
  std::vector<int64_t> labels_;
};

}  // namespace parsyn::trainer
