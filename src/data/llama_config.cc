#include "data/llama_config.h"

#include <nlohmann/json.hpp>
#include <string>

namespace parsyn::data {
namespace {

using Json = nlohmann::json;

StatusOr<int64_t> GetInt(const Json& j, const char* key, std::optional<int64_t> fallback, bool positive = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return InvalidArgumentError(std::string("config.json lacks '") + key + "'");
  }
  if (!it->is_number_integer()) {
    return InvalidArgumentError(std::string("config.json's '") + key + "' must be an integer, got " + it->dump());
  }
  const int64_t v = it->get<int64_t>();
  if (positive && v <= 0) {
    return InvalidArgumentError(std::string("config.json's '") + key + "' must be positive, got " + std::to_string(v));
  }
  return v;
}

StatusOr<double> GetDouble(const Json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return InvalidArgumentError(std::string("config.json's '") + key + "' must be a number, got " + it->dump());
  }
  return it->get<double>();
}

// Token ids may be an integer or (Llama 3.1's eos) a list of them; the first one is the one we use.
std::optional<int64_t> GetTokenId(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
  return std::nullopt;
}

// The transformers class that holds each supported model_type's causal language model.
std::string CausalLmArchitecture(std::string_view model_type) {
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  return "LlamaForCausalLM";
}

StatusOr<LlamaConfig> ParseJson(const Json& j) {
  if (!j.is_object()) return InvalidArgumentError("config.json is not a JSON object");
  LlamaConfig c;
  auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) return InvalidArgumentError("config.json lacks a string 'model_type'");
  c.model_type = type->get<std::string>();
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral") {
    return InvalidArgumentError("model_type '" + c.model_type + "' is not supported (llama, qwen2, mistral)");
  }
  // Absent or empty: transformers picks the class from model_type, as we do.
  if (auto architectures = j.find("architectures"); architectures != j.end() && !architectures->is_null()) {
    if (!architectures->is_array()) {
      return InvalidArgumentError("config.json's 'architectures' must be a list of class names, got " +
                                  architectures->dump());
    }
    const std::string expected = CausalLmArchitecture(c.model_type);
    for (const Json& name : *architectures) {
      if (name != expected) {
        return InvalidArgumentError("config.json's 'architectures' entry " + name.dump() +
                                    " is not supported for model_type '" + c.model_type + "' (" + expected + ")");
      }
    }
  }
  if (auto act = j.find("hidden_act"); act != j.end() && *act != "silu") {
    return InvalidArgumentError("hidden_act " + act->dump() + " is not supported (silu)");
  }
  PARSYN_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", std::nullopt));
  PARSYN_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", std::nullopt));
  PARSYN_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", std::nullopt));
  PARSYN_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", std::nullopt));
  PARSYN_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", std::nullopt));
  PARSYN_ASSIGN_OR_RETURN(c.num_key_value_heads, GetInt(j, "num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(c.num_attention_heads) +
                                " is not a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads));
  }
  if (!j.contains("head_dim") && c.hidden_size % c.num_attention_heads != 0) {
    return InvalidArgumentError("hidden_size " + std::to_string(c.hidden_size) +
                                " is not divisible by num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  PARSYN_ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", c.hidden_size / c.num_attention_heads));
  if (c.head_dim % 2 != 0) {
    return InvalidArgumentError("head_dim " + std::to_string(c.head_dim) + " must be even for rotary embeddings");
  }
  PARSYN_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 2048));
  PARSYN_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  PARSYN_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta", 10000.0));
  if (c.rms_norm_eps <= 0 || c.rope_theta <= 0) {
    return InvalidArgumentError("config.json's rms_norm_eps and rope_theta must be positive");
  }
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);  // transformers' default for all three
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
    if (j.value("use_sliding_window", false)) {
      return InvalidArgumentError("qwen2 with use_sliding_window true is not supported");
    }
  } else if (j.value("attention_bias", false)) {
    c.qkv_bias = c.o_bias = true;
  }
  if (j.value("mlp_bias", false)) return InvalidArgumentError("mlp_bias true is not supported");
  if (c.model_type == "mistral") {
    auto window = j.find("sliding_window");
    if (window != j.end() && !window->is_null()) {
      PARSYN_ASSIGN_OR_RETURN(int64_t w, GetInt(j, "sliding_window", std::nullopt));
      c.sliding_window = w;
    }
  }
  if (auto scaling = j.find("rope_scaling"); scaling != j.end() && !scaling->is_null()) {
    if (!scaling->is_object()) return InvalidArgumentError("config.json's rope_scaling must be an object or null");
    const std::string type_name = scaling->value("rope_type", scaling->value("type", std::string("default")));
    if (type_name != "default") {
      if (type_name != "llama3") {
        return InvalidArgumentError("rope_scaling type '" + type_name + "' is not supported (llama3)");
      }
      Llama3RopeScaling s;
      PARSYN_ASSIGN_OR_RETURN(s.factor, GetDouble(*scaling, "factor", 0));
      PARSYN_ASSIGN_OR_RETURN(s.low_freq_factor, GetDouble(*scaling, "low_freq_factor", 0));
      PARSYN_ASSIGN_OR_RETURN(s.high_freq_factor, GetDouble(*scaling, "high_freq_factor", 0));
      PARSYN_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                              GetInt(*scaling, "original_max_position_embeddings", std::nullopt));
      if (s.factor <= 0 || s.low_freq_factor <= 0 || s.high_freq_factor <= s.low_freq_factor) {
        return InvalidArgumentError(
            "llama3 rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0, got " + scaling->dump());
      }
      c.rope_scaling = s;
    }
  }
  if (auto dtype = j.find("torch_dtype"); dtype != j.end() && dtype->is_string()) c.torch_dtype = *dtype;
  c.bos_token_id = GetTokenId(j, "bos_token_id");
  c.eos_token_id = GetTokenId(j, "eos_token_id");
  c.pad_token_id = GetTokenId(j, "pad_token_id");
  return c;
}

}  // namespace

StatusOr<LlamaConfig> ParseLlamaConfig(std::string_view config_json) {
  Json j = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("config.json is not valid JSON");
  try {
    return ParseJson(j);
  } catch (const Json::exception& e) {  // a field of the wrong type read with value()
    return InvalidArgumentError(std::string("config.json: ") + e.what());
  }
}

std::string LlamaConfigToJson(const LlamaConfig& c) {
  Json j;
  j["architectures"] = {CausalLmArchitecture(c.model_type)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = c.torch_dtype;
  j["initializer_range"] = 0.02;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.o_bias;
    j["mlp_bias"] = false;
  }
  if (c.model_type == "qwen2") j["use_sliding_window"] = false;
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window ? Json(*c.sliding_window) : Json(nullptr);
  }
  if (c.rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling->factor},
                         {"low_freq_factor", c.rope_scaling->low_freq_factor},
                         {"high_freq_factor", c.rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id) j["eos_token_id"] = *c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace parsyn::data
