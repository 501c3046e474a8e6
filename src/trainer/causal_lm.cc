#include "trainer/causal_lm.h"

namespace parsyn::trainer {

StepOutput NextTokenLoss(const torch::Tensor& logits, const torch::Tensor& labels,
                         const torch::Tensor& attention_mask) {
  const int64_t V = logits.size(-1);
  // logits[:, t] predicts labels[:, t + 1]
  torch::Tensor shifted_logits = logits.slice(1, 0, -1).reshape({-1, V});
  torch::Tensor targets = labels.slice(1, 1).reshape({-1});
  torch::Tensor counted = targets != -100;
  StepOutput out;
  out.num_counted = counted.sum().item<int64_t>();
  out.num_tokens = attention_mask.defined() ? attention_mask.sum().item<int64_t>() : labels.numel();
  if (out.num_counted == 0) {
    out.loss = shifted_logits.sum() * 0.0;
  } else {
    out.loss = torch::nn::functional::cross_entropy(
        shifted_logits, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  }
  torch::NoGradGuard no_grad;
  const int64_t B = labels.size(0), T = labels.size(1);
  torch::Tensor hit = (shifted_logits.argmax(-1) == targets).logical_and(counted).view({B, T - 1});
  torch::Tensor counted_rows = counted.view({B, T - 1});
  out.num_correct = hit.sum().item<int64_t>();
  torch::Tensor row_has_counted = counted_rows.any(1);
  torch::Tensor row_all_correct = (hit == counted_rows).all(1);
  out.num_rows = row_has_counted.sum().item<int64_t>();
  out.num_exact_rows = row_has_counted.logical_and(row_all_correct).sum().item<int64_t>();
  return out;
}

StatusOr<std::unique_ptr<CausalLm>> CausalLm::Load(const std::filesystem::path& model_dir,
                                                   const CausalLmOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Load(model_dir, options.model));
  if (options.lora) PARSYN_RETURN_IF_ERROR(model->AttachLora(*options.lora, options.lora_seed));
  return std::make_unique<CausalLm>(std::move(model), options);
}

CausalLm::CausalLm(std::unique_ptr<LlamaModel> model, const CausalLmOptions& options)
    : model_(std::move(model)), exchange_dtype_(options.exchange_dtype) {
  model_->SetBaseTrainable(!model_->has_lora());
}

StepOutput CausalLm::Forward(const Batch& batch) {
  torch::Tensor logits = model_->Forward(batch.input_ids, batch.attention_mask);
  return NextTokenLoss(logits, batch.labels, batch.attention_mask);
}

std::vector<std::pair<std::string, torch::Tensor>> CausalLm::Trainable() const {
  return model_->has_lora() ? model_->lora_parameters() : model_->named_parameters();
}

std::vector<torch::Tensor> CausalLm::TrainableParameters() {
  std::vector<torch::Tensor> out;
  for (auto& [name, tensor] : Trainable()) out.push_back(tensor);
  return out;
}

std::vector<std::string> CausalLm::TrainableNames() const {
  std::vector<std::string> out;
  for (auto& [name, tensor] : Trainable()) out.push_back(name);
  return out;
}

bool CausalLm::UsesWeightDecay(const std::string& parameter_name) const {
  return !(parameter_name.ends_with("norm.weight") || parameter_name.ends_with(".bias"));
}

StatusOr<weights::WeightSet> CausalLm::ExportTrainable() {
  return model_->has_lora() ? model_->ExportLora(exchange_dtype_) : model_->ExportWeights(exchange_dtype_);
}

Status CausalLm::ImportTrainable(const weights::WeightSet& set) {
  // Dtypes are checked here; names and shapes by the model, which names the offending tensor.
  for (const weights::Tensor& t : set.tensors()) {
    if (t.dtype != exchange_dtype_) {
      return InvalidArgumentError("tensor '" + t.name + "' has dtype " + std::string(weights::DTypeName(t.dtype)) +
                                  ", the exchange dtype is " + std::string(weights::DTypeName(exchange_dtype_)));
    }
  }
  return model_->has_lora() ? model_->ImportLora(set) : model_->ImportWeights(set);
}

}  // namespace parsyn::trainer
