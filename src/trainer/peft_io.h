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

// adapter_config.json text for `config`: weights::PeftAdapterConfigJson, the one writer (weights/peft_config.h).
std::string AdapterConfigJson(const AdapterConfig& config);
// weights::ParsePeftAdapterConfig: InvalidArgument naming any PEFT option our LoRA does not implement.
StatusOr<AdapterConfig> ParseAdapterConfig(std::string_view json);

// Writes adapter_config.json and adapter_model.safetensors (tensors in `dtype`) into `dir`, creating it.
// `base_model_name_or_path`: data::BaseModelNameOrPath of the base model.
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

// `parsyn adapter merge`: loads the model folder `model_dir` (fp32), applies the PEFT adapter in `adapter_dir`, merges
// it and writes a model folder to `out_dir` in the base checkpoint's dtype (config.json's dtype), with its tokenizer
// files. AlreadyExists if `out_dir` holds a config.json; errors of ReadModelFolder, LoadAdapterInto (an adapter
// option we do not implement, a tensor that does not fit the model) and WriteModelFolder otherwise.
Status MergeAdapterFolder(const std::filesystem::path& model_dir, const std::filesystem::path& adapter_dir,
                          const std::filesystem::path& out_dir);
// The weights::DType of a config.json dtype name (float32, bfloat16, float16).
weights::DType CheckpointDType(const LlamaConfig& config);

}  // namespace parsyn::trainer
