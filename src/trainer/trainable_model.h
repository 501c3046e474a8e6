// The seam between the training loop and the models it trains (Llama-family language models with or without LoRA,
// and tabular MLP/logistic-regression classifiers). The loop knows only this interface.
// A TrainableModel is used from one thread.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

// One batch, already on the model's device.
// Language models: input_ids (B, T) int64, attention_mask (B, T) int64 (1 = real token), labels (B, T) int64 with
//   -100 where no loss is taken (padding, prompt tokens).
// Tabular models: features (B, F) float32, labels (B) int64 class ids.
struct Batch {
  torch::Tensor input_ids;
  torch::Tensor attention_mask;
  torch::Tensor features;
  torch::Tensor labels;
};

// What one forward pass yields for the loop: the mean loss over counted positions (for backward), and counts the
// loop uses for metrics.
struct StepOutput {
  torch::Tensor loss;       // scalar, mean over counted positions/rows
  int64_t num_counted = 0;  // label positions (LM) or rows (tabular) the loss averaged over
  int64_t num_correct = 0;  // argmax == label among them (token accuracy or classification accuracy)
  int64_t num_tokens = 0;   // input tokens processed (LM; for throughput); rows for tabular
  // Rows with at least one counted position, and those among them whose every counted position is argmax-correct.
  // Under teacher forcing, "every completion token is the argmax" is exactly "greedy decoding of the completion's
  // length reproduces it", so the loop reports num_exact_rows / num_rows as exact-match for prompt/completion data.
  // Tabular models: num_rows = rows, num_exact_rows = num_correct.
  int64_t num_rows = 0;
  int64_t num_exact_rows = 0;
};

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;

  // Forward pass; under torch::NoGradGuard for evaluation.
  virtual StepOutput Forward(const Batch& batch) = 0;
  // Parameters the optimizer updates (LoRA adapters only when LoRA is on).
  virtual std::vector<torch::Tensor> TrainableParameters() = 0;
  // Parameter groups that take no weight decay (norms, biases) are those for which this returns false.
  virtual bool UsesWeightDecay(const std::string& parameter_name) const { return true; }
  // Names for TrainableParameters(), in the same order, as they are exchanged with the coordinator
  // (PEFT key names for adapters; Hugging Face names for full weights).
  virtual std::vector<std::string> TrainableNames() const = 0;

  // The trainable weights as a WeightSet in their exchange dtype (what a worker uploads).
  virtual StatusOr<weights::WeightSet> ExportTrainable() = 0;
  // Replaces the trainable weights; InvalidArgument if names, dtypes or shapes differ from ExportTrainable()'s.
  virtual Status ImportTrainable(const weights::WeightSet& set) = 0;

  virtual void Train(bool on) = 0;
  virtual torch::Device device() const = 0;
};

}  // namespace parsyn::trainer
