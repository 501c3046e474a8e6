// A Llama-family model's config.json (model_type llama, qwen2 or mistral: the same network, with Qwen2's q/k/v bias
// and Mistral's sliding window): the one reader of it, torch-free, so that the coordinator checks a model at
// registration by the rules the trainer builds it with. Functions here are safe to call from several threads at once.
//
// Both forms transformers writes are read (docs/training.md, "Model folders"):
//   Transformers 4: top-level rope_theta, rope_scaling {rope_type (or type), factor, ...}, torch_dtype;
//   Transformers 5: rope_parameters {rope_type, rope_theta, factor, ...}, dtype.
// There is no precedence between them: a setting may be written in either place or in both, and where it is written
// twice the values must be equal, else the error names both places. RoPE types other than default and llama3, and
// RoPE fields those types do not use (partial_rotary_factor, attention_factor, ...), are errors naming them: a
// setting the trainer would ignore would train another model than the one the checkpoint was trained as.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::data {

// Llama 3's rope_scaling (rope_type "llama3"): low frequencies are divided by `factor`, high ones kept, the band
// between interpolated smoothly.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::string model_type = "llama";  // llama | qwen2 | mistral
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // grouped-query attention; = num_attention_heads when absent
  int64_t head_dim = 0;             // = hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  // Bias on q/k/v projections (Qwen2 always; Llama when attention_bias is true, which also puts one on o_proj).
  bool qkv_bias = false;
  bool o_bias = false;
  // Mistral: a query sees at most this many keys (itself included). Absent: unlimited.
  std::optional<int64_t> sliding_window;
  std::string torch_dtype = "float32";  // dtype (or torch_dtype) of config.json: float32 | bfloat16 | float16
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first of eos_token_ids: the one appended to training examples
  std::vector<int64_t> eos_token_ids;   // all of them (Llama 3.1 Instruct lists three)
  std::optional<int64_t> pad_token_id;
  std::string name_or_path;  // _name_or_path (the Hub id it was saved from), empty when absent
};

// The two shapes of config.json above. LlamaConfigToJson writes kTransformers4 by default: transformers 4 and 5,
// vLLM and llama.cpp's converter all read it.
enum class ConfigJsonForm { kTransformers4, kTransformers5 };

// InvalidArgument for malformed JSON, an unsupported model_type or architectures entry (the *ForCausalLM class of a
// supported model_type), RoPE type or field, a RoPE setting or dtype written twice with different values, a dtype
// other than float32/bfloat16/float16, a token id that is neither an integer nor a list of them, hidden_act (must be
// silu), or a missing/invalid dimension, each named.
StatusOr<LlamaConfig> ParseLlamaConfig(std::string_view config_json);
// config.json text that ParseLlamaConfig (and transformers) reads back as `config`, in the given form.
std::string LlamaConfigToJson(const LlamaConfig& config, ConfigJsonForm form = ConfigJsonForm::kTransformers4);

// What an adapter's base_model_name_or_path names (docs/training.md, "Adapters"): config.json's _name_or_path when it
// has one (a Hub id that PEFT and vLLM resolve), else `fallback` (the model folder's path or registered name).
std::string BaseModelNameOrPath(const LlamaConfig& config, std::string_view fallback);

}  // namespace parsyn::data
