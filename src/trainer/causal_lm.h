// The causal language model as the training loop sees it: a LlamaModel trained in full or through LoRA adapters,
// behind trainer::TrainableModel. Used from one thread.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/llama_model.h"
#include "trainer/trainable_model.h"

namespace parsyn::trainer {

struct CausalLmOptions {
  ModelOptions model;
  // Set: LoRA fine-tuning (only the adapters train and are exchanged). Unset: full fine-tuning of every weight.
  std::optional<LoraSettings> lora;
  // Seed of the initial adapters (weights::InitialLoraAdapters); round 1's global replaces them anyway.
  uint64_t lora_seed = 0;
  // Dtype of ExportTrainable()'s tensors (what a worker uploads): F32, BF16 or F16.
  weights::DType exchange_dtype = weights::DType::kF32;
};

// Shifted next-token cross-entropy: position t's logits predict labels[t + 1]; positions whose target is -100 do not
// count. logits (B, T, V) fp32, labels (B, T) int64, attention_mask (B, T) (for num_tokens; may be undefined).
// With no counted position the loss is 0 (still attached to the graph, so backward is a no-op).
StepOutput NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& labels, const torch::Tensor& attention_mask);

class CausalLm : public TrainableModel {
 public:
  // Loads the model folder and attaches LoRA when asked. Errors of LlamaModel::Load and AttachLora.
  static StatusOr<std::unique_ptr<CausalLm>> Load(const std::filesystem::path& model_dir,
                                                  const CausalLmOptions& options);
  // Wraps an already built model (its LoRA, if any, decides the mode; options.lora is then ignored).
  CausalLm(std::unique_ptr<LlamaModel> model, const CausalLmOptions& options);

  StepOutput Forward(const Batch& batch) override;
  std::vector<torch::Tensor> TrainableParameters() override;
  // Norm weights and biases take no weight decay (full fine-tuning); adapters all do.
  bool UsesWeightDecay(const std::string& parameter_name) const override;
  std::vector<std::string> TrainableNames() const override;
  StatusOr<weights::WeightSet> ExportTrainable() override;
  // Names, dtypes (the exchange dtype) and shapes must equal ExportTrainable()'s, else InvalidArgument naming the
  // first difference.
  Status ImportTrainable(const weights::WeightSet& set) override;
  void Train(bool on) override { model_->Train(on); }
  torch::Device device() const override { return model_->options().device; }

  LlamaModel& model() { return *model_; }
  bool uses_lora() const { return model_->has_lora(); }

 private:
  std::vector<std::pair<std::string, torch::Tensor>> Trainable() const;

  std::unique_ptr<LlamaModel> model_;
  weights::DType exchange_dtype_;
};

}  // namespace parsyn::trainer
