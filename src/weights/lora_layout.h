// The layout of LoRA adapters for a Llama-family model (llama, qwen2, mistral), computed from the model's
// config.json alone, without torch — so the coordinator (which creates round 1's adapters) and the trainer (which
// trains and exports them) cannot disagree about names, dtypes or shapes (docs/architecture.md §4).
//
// Names are PEFT's keys for a causal LM, ordered as PEFT saves them: by layer, then q, k, v, o, gate, up, down (the
// modules targeted), lora_A before lora_B:
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   (r, in_features)
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   (out_features, r)
//   base_model.model.model.layers.{i}.mlp.gate_proj.lora_A.weight      ...
// Functions here are pure and safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

// The projections LoRA may target, in PEFT's save order.
inline constexpr std::string_view kLoraModules[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

// What of config.json the layout depends on. head_dim defaults to hidden_size / num_attention_heads and
// num_key_value_heads to num_attention_heads, as in transformers.
struct LoraModelDims {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
};

// InvalidArgument for malformed JSON, an unsupported model_type (not llama/qwen2/mistral), or a missing, non-integer
// or non-positive dimension (named), or heads that do not divide as grouped-query attention needs.
StatusOr<LoraModelDims> ParseLoraModelDims(std::string_view config_json);

struct LoraLayoutOptions {
  int64_t r = 8;
  // Any of kLoraModules, or the single entry "all-linear" (all seven). Order and duplicates do not matter.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  DType dtype = DType::kF32;  // the exchange dtype: F32, BF16 or F16
};

struct LoraTensorSpec {
  std::string name;  // PEFT key
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // lora_A: (r, in_features); lora_B: (out_features, r)
  int64_t in_features = 0;     // of the adapted projection (fan-in of lora_A)
  int64_t out_features = 0;
  bool is_lora_a = false;
};

// The target modules, validated and put in kLoraModules order ("all-linear" expanded). InvalidArgument naming an
// unknown module, or for an empty list.
StatusOr<std::vector<std::string>> NormalizeLoraTargets(const std::vector<std::string>& target_modules);

// The adapters' specs in PEFT order. InvalidArgument for r < 1, a bad target module, or a non-float dtype.
StatusOr<std::vector<LoraTensorSpec>> LoraLayout(const LoraModelDims& dims, const LoraLayoutOptions& options);
StatusOr<std::vector<LoraTensorSpec>> LoraLayout(std::string_view config_json, const LoraLayoutOptions& options);

// PEFT's key for one adapter matrix: module is one of kLoraModules, matrix "lora_A" or "lora_B".
std::string LoraTensorName(int64_t layer, std::string_view module, std::string_view matrix);

// Round-1 adapters, created deterministically from `seed` without torch: B is zero (so the adapted model starts equal
// to the base, as PEFT's does) and A is uniform in [-1/sqrt(in_features), 1/sqrt(in_features)) — the distribution
// PEFT's kaiming_uniform_(a=sqrt(5)) draws from. The values come from splitmix64: each tensor has its own stream
// seeded with splitmix64(seed ^ fnv1a64(name)), and each element takes the top 53 bits of the next output as
// u in [0, 1) and becomes (2u - 1) * bound, computed in double and rounded to the dtype. So a tensor's values depend
// only on (seed, name, shape), not on which other modules are targeted. Same errors as LoraLayout.
StatusOr<WeightSet> InitialLoraAdapters(const LoraModelDims& dims, const LoraLayoutOptions& options, uint64_t seed);
StatusOr<WeightSet> InitialLoraAdapters(std::string_view config_json, const LoraLayoutOptions& options, uint64_t seed);

}  // namespace parsyn::weights
