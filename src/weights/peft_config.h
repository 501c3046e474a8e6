// adapter_config.json, PEFT's description of a LoRA adapter: the one writer of it (`parsyn train` through the trainer,
// and a federated job's artifacts through the coordinator, which has no torch) and the one reader. Torch-free; the
// functions are pure and safe to call from several threads at once.
//
// We write what PEFT's LoraConfig saves (its keys, sorted, with the values our LoRA means: bias "none", no DoRA, no
// rsLoRA, ...), so `PeftModel.from_pretrained`, vLLM and llama.cpp's convert_lora_to_gguf.py take it as PEFT's own.
// Reading, a PEFT option that would change what the adapter computes and that our LoRA does not implement is an error
// naming it, never ignored (docs/training.md, "Adapters").
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::weights {

struct PeftLoraConfig {
  int64_t r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0;
  // Any of kLoraModules (lora_layout.h) or "all-linear"; written and read back in kLoraModules order, expanded.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  // What a user resolves the base model by: its config.json's _name_or_path (a Hub id) when it has one, else the
  // model folder's name (`parsyn train`: PeftBaseModelName) or the model's registered name (federated jobs, whose
  // default is the folder's name too; data::BaseModelNameOrPath).
  std::string base_model_name_or_path;
};

// base_model_name_or_path for the base model in folder `model_dir` (docs/training.md, "Adapters"): its config.json's
// `_name_or_path` when it has one (a Hub id PEFT, vLLM and AutoPeftModel resolve), else the folder's name (its last
// path part, "my-model" for "./my-model/"), which names the model on any machine rather than a path on this one.
std::string PeftBaseModelName(std::string_view config_name_or_path, const std::filesystem::path& model_dir);

// adapter_config.json text (indented, keys sorted as PEFT writes them, newline-terminated).
std::string PeftAdapterConfigJson(const PeftLoraConfig& config);

// InvalidArgument for malformed JSON; peft_type other than LORA; task_type other than CAUSAL_LM; a missing or bad r,
// lora_alpha or lora_dropout; target_modules that is neither a list of known modules nor "all-linear"; and, naming
// it, any option our LoRA does not implement: bias other than "none", fan_in_fan_out, use_rslora, use_dora,
// lora_bias, use_qalora, rank_pattern/alpha_pattern, layers_to_transform, layer_replication, modules_to_save,
// exclude_modules, trainable_token_indices, target_parameters, megatron_config, an init_lora_weights that rewrites the
// base model (pissa, olora, corda, loftq), or an option this reader does not know set to anything but null, false or
// empty.
StatusOr<PeftLoraConfig> ParsePeftAdapterConfig(std::string_view json);

}  // namespace parsyn::weights
