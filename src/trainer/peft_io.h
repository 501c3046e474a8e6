// LoRA adapters on disk in PEFT's layout, so Python's `peft` loads ours and we load its:
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "lora_dropout", "target_modules",
//                               "base_model_name_or_path", "task_type": "CAUSAL_LM", "bias": "none", ...}
//   adapter_model.safetensors  base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (r, in), ...lora_B
//   (out, r)
// and merging adapters into the base model to export a plain model folder.
// Functions here may be called from any thread, but a LlamaModel is used by one thread at a time.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "base/status.h"
#include "trainer/llama_model.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

struct AdapterConfig {
  LoraSettings lora;
  std::string base_model_name_or_path;
};

// adapter_config.json text for `config`, with PEFT's other fields at the values our adapters mean
// (bias "none", fan_in_fan_out false, use_rslora false, use_dora false, inference_mode true, ...).
std::string AdapterConfigJson(const AdapterConfig& config);
// InvalidArgument for malformed JSON, peft_type other than LORA, task_type other than CAUSAL_LM, a missing r or
// lora_alpha, target_modules that is neither a list of known modules nor "all-linear", and for options our LoRA does
// not implement (named): bias other than "none", fan_in_fan_out, use_rslora, use_dora, rank_pattern/alpha_pattern,
// layers_to_transform, modules_to_save.
StatusOr<AdapterConfig> ParseAdapterConfig(std::string_view json);

// Writes adapter_config.json and adapter_model.safetensors (tensors in `dtype`) into `dir`, creating it.
// FailedPrecondition if the model has no LoRA; Unavailable on I/O errors.
Status SaveAdapter(const LlamaModel& model, const std::filesystem::path& dir,
                   const std::string& base_model_name_or_path, weights::DType dtype = weights::DType::kF32);

struct LoadedAdapter {
  AdapterConfig config;
  weights::WeightSet weights;  // as stored (any float dtype)
};
// NotFound if either file is missing; errors of ParseAdapterConfig and the safetensors reader otherwise.
StatusOr<LoadedAdapter> ReadAdapter(const std::filesystem::path& dir);

// ReadAdapter, then attaches LoRA with the adapter's settings to `model` (which must have none:
// FailedPrecondition) and imports its tensors (InvalidArgument naming a tensor whose name or shape does not fit;
// the model then keeps freshly initialised adapters and should be discarded).
Status LoadAdapterInto(LlamaModel& model, const std::filesystem::path& dir);

// Merges the model's adapters into its base weights (LlamaModel::MergeLora; the model is changed) and writes the
// result as a model folder (WriteModelFolder), copying the tokenizer files from `tokenizer_source_dir`.
Status ExportMergedModel(LlamaModel& model, const std::filesystem::path& dir, weights::DType dtype,
                         const std::filesystem::path& tokenizer_source_dir);

}  // namespace parsyn::trainer
