#include "data/llama_config.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

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

// Token ids may be an integer, null, or (Llama 3.1's eos) a list of them; the first one is the one we use.
StatusOr<std::vector<int64_t>> GetTokenIds(const Json& j, const char* key) {
  std::vector<int64_t> ids;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  if (it->is_number_integer()) return std::vector<int64_t>{it->get<int64_t>()};
  if (it->is_array()) {
    for (const Json& id : *it) {
      if (!id.is_number_integer()) break;
      ids.push_back(id.get<int64_t>());
    }
    if (ids.size() == it->size()) return ids;
  }
  return InvalidArgumentError(std::string("config.json's '") + key +
                              "' must be a token id or a list of token ids, got " + it->dump());
}

std::optional<int64_t> First(const std::vector<int64_t>& ids) {
  if (ids.empty()) return std::nullopt;
  return ids.front();
}

bool SameValue(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// A setting that config.json may write in two places (rope_theta and rope_parameters.rope_theta, torch_dtype and
// dtype, ...): the value, and where it was read, for messages.
struct Setting {
  Json value;
  std::string place;
};
using Settings = std::map<std::string, Setting>;

Status AddSetting(Settings& settings, const std::string& key, const Json& value, const std::string& place) {
  if (value.is_null()) return Status::Ok();
  auto [it, inserted] = settings.emplace(key, Setting{value, place});
  if (!inserted && !SameValue(it->second.value, value)) {
    return InvalidArgumentError("config.json's " + place + " (" + value.dump() + ") conflicts with " +
                                it->second.place + " (" + it->second.value.dump() +
                                "): a setting written in both forms must have one value");
  }
  return Status::Ok();
}

// The RoPE settings of both forms, keyed by their rope_parameters name ("type" is rope_scaling's old alias of
// "rope_type").
StatusOr<Settings> CollectRopeSettings(const Json& j) {
  Settings settings;
  if (auto theta = j.find("rope_theta"); theta != j.end()) {
    PARSYN_RETURN_IF_ERROR(AddSetting(settings, "rope_theta", *theta, "rope_theta"));
  }
  for (const char* object : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(object);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return InvalidArgumentError(std::string("config.json's ") + object + " must be an object or null, got " +
                                  it->dump());
    }
    for (const auto& [field, value] : it->items()) {
      const std::string key = field == "type" ? "rope_type" : field;
      PARSYN_RETURN_IF_ERROR(AddSetting(settings, key, value, std::string(object) + "." + field));
    }
  }
  return settings;
}

StatusOr<double> RopeNumber(const Settings& settings, const std::string& key, const std::string& rope_type) {
  auto it = settings.find(key);
  if (it == settings.end()) {
    return InvalidArgumentError("config.json's rope type '" + rope_type + "' needs '" + key +
                                "' (in rope_parameters, or rope_scaling)");
  }
  if (!it->second.value.is_number() || !(it->second.value.get<double>() > 0)) {
    return InvalidArgumentError("config.json's " + it->second.place + " must be a positive number, got " +
                                it->second.value.dump());
  }
  return it->second.value.get<double>();
}

Status ReadRope(const Json& j, LlamaConfig& c) {
  PARSYN_ASSIGN_OR_RETURN(Settings settings, CollectRopeSettings(j));
  std::string rope_type = "default";
  if (auto it = settings.find("rope_type"); it != settings.end()) {
    if (!it->second.value.is_string()) {
      return InvalidArgumentError("config.json's " + it->second.place + " must be a string, got " +
                                  it->second.value.dump());
    }
    rope_type = it->second.value.get<std::string>();
    if (rope_type != "default" && rope_type != "llama3") {
      return InvalidArgumentError("config.json's " + it->second.place + " '" + rope_type +
                                  "' is not supported: the trainer implements rope types default and llama3");
    }
  }
  std::set<std::string> known = {"rope_type", "rope_theta"};
  if (rope_type == "llama3") {
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  }
  for (const auto& [key, setting] : settings) {
    if (!known.contains(key)) {
      return InvalidArgumentError("config.json's " + setting.place + " is not supported with rope type '" + rope_type +
                                  "': the trainer would ignore it (it uses " +
                                  (rope_type == "llama3" ? "rope_theta, factor, low_freq_factor, high_freq_factor, "
                                                           "original_max_position_embeddings"
                                                         : "rope_theta") +
                                  ")");
    }
  }
  c.rope_theta = 10000.0;  // transformers' default for llama, qwen2 and mistral
  if (settings.contains("rope_theta")) {
    PARSYN_ASSIGN_OR_RETURN(c.rope_theta, RopeNumber(settings, "rope_theta", rope_type));
  }
  if (rope_type != "llama3") return Status::Ok();
  Llama3RopeScaling s;
  PARSYN_ASSIGN_OR_RETURN(s.factor, RopeNumber(settings, "factor", rope_type));
  PARSYN_ASSIGN_OR_RETURN(s.low_freq_factor, RopeNumber(settings, "low_freq_factor", rope_type));
  PARSYN_ASSIGN_OR_RETURN(s.high_freq_factor, RopeNumber(settings, "high_freq_factor", rope_type));
  PARSYN_ASSIGN_OR_RETURN(const double original, RopeNumber(settings, "original_max_position_embeddings", rope_type));
  const Setting& original_setting = settings.at("original_max_position_embeddings");
  if (!original_setting.value.is_number_integer()) {
    return InvalidArgumentError("config.json's " + original_setting.place + " must be an integer, got " +
                                original_setting.value.dump());
  }
  s.original_max_position_embeddings = static_cast<int64_t>(original);
  if (s.high_freq_factor <= s.low_freq_factor) {
    return InvalidArgumentError("config.json's llama3 rope needs high_freq_factor > low_freq_factor, got " +
                                std::to_string(s.high_freq_factor) + " and " + std::to_string(s.low_freq_factor));
  }
  c.rope_scaling = s;
  return Status::Ok();
}

// torch_dtype (Transformers 4) and dtype (Transformers 5): the same setting.
Status ReadDtype(const Json& j, LlamaConfig& c) {
  Settings settings;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (auto it = j.find(key); it != j.end()) PARSYN_RETURN_IF_ERROR(AddSetting(settings, "dtype", *it, key));
  }
  auto it = settings.find("dtype");
  if (it == settings.end()) return Status::Ok();  // float32, transformers' default
  const Json& value = it->second.value;
  if (value != "float32" && value != "bfloat16" && value != "float16") {
    return InvalidArgumentError("config.json's " + it->second.place + " " + value.dump() +
                                " is not supported (float32, bfloat16, float16)");
  }
  c.torch_dtype = value.get<std::string>();
  return Status::Ok();
}

// The transformers class that holds each supported model_type's causal language model.
std::string CausalLmArchitecture(std::string_view model_type) {
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  return "LlamaForCausalLM";
}

// Checks config.json's "architectures" (absent, null, or only the class transformers uses for `model_type`).
Status CheckArchitectures(const Json& j, const std::string& model_type) {
  // Absent or empty: transformers picks the class from model_type, as we do.
  if (auto architectures = j.find("architectures"); architectures != j.end() && !architectures->is_null()) {
    if (!architectures->is_array()) {
      return InvalidArgumentError("config.json's 'architectures' must be a list of class names, got " +
                                  architectures->dump());
    }
    const std::string expected = CausalLmArchitecture(model_type);
    for (const Json& name : *architectures) {
      if (name != expected) {
        return InvalidArgumentError("config.json's 'architectures' entry " + name.dump() +
                                    " is not supported for model_type '" + model_type + "' (" + expected + ")");
      }
    }
  }
  return Status::Ok();
}

// Reads the model's sizes: vocabulary, hidden and MLP widths, layers, attention and key/value heads, head_dim.
Status ReadShape(const Json& j, LlamaConfig& c) {
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
  return Status::Ok();
}

// Reads what sets each model_type's layers apart: q/k/v and output biases (an MLP bias is refused), the sliding
// window, and transformers 5's per-layer attention types (which must all be ours).
Status ReadAttentionVariant(const Json& j, LlamaConfig& c) {
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
  // Transformers 5 spells out each layer's attention; ours is the same for every layer.
  if (auto layer_types = j.find("layer_types"); layer_types != j.end() && !layer_types->is_null()) {
    const std::string expected = c.sliding_window ? "sliding_attention" : "full_attention";
    if (!layer_types->is_array()) {
      return InvalidArgumentError("config.json's 'layer_types' must be a list, got " + layer_types->dump());
    }
    for (const Json& type : *layer_types) {
      if (type != expected) {
        return InvalidArgumentError("config.json's 'layer_types' entry " + type.dump() + " is not supported for " +
                                    c.model_type + " here: every layer must be \"" + expected + "\"");
      }
    }
  }
  return Status::Ok();
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
  PARSYN_RETURN_IF_ERROR(CheckArchitectures(j, c.model_type));
  if (auto act = j.find("hidden_act"); act != j.end() && *act != "silu") {
    return InvalidArgumentError("hidden_act " + act->dump() + " is not supported (silu)");
  }
  PARSYN_RETURN_IF_ERROR(ReadShape(j, c));
  PARSYN_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 2048));
  PARSYN_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  if (c.rms_norm_eps <= 0) return InvalidArgumentError("config.json's rms_norm_eps must be positive");
  PARSYN_RETURN_IF_ERROR(ReadRope(j, c));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);  // transformers' default for all three
  PARSYN_RETURN_IF_ERROR(ReadAttentionVariant(j, c));
  PARSYN_RETURN_IF_ERROR(ReadDtype(j, c));
  PARSYN_ASSIGN_OR_RETURN(const std::vector<int64_t> bos, GetTokenIds(j, "bos_token_id"));
  PARSYN_ASSIGN_OR_RETURN(c.eos_token_ids, GetTokenIds(j, "eos_token_id"));
  PARSYN_ASSIGN_OR_RETURN(const std::vector<int64_t> pad, GetTokenIds(j, "pad_token_id"));
  c.bos_token_id = First(bos);
  c.eos_token_id = First(c.eos_token_ids);
  c.pad_token_id = First(pad);
  if (auto name = j.find("_name_or_path"); name != j.end() && name->is_string()) c.name_or_path = *name;
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

std::string LlamaConfigToJson(const LlamaConfig& c, ConfigJsonForm form) {
  const bool v5 = form == ConfigJsonForm::kTransformers5;
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
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j[v5 ? "dtype" : "torch_dtype"] = c.torch_dtype;
  j["initializer_range"] = 0.02;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.o_bias;
    j["mlp_bias"] = false;
  }
  if (c.model_type == "qwen2") j["use_sliding_window"] = false;
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window ? Json(*c.sliding_window) : Json(nullptr);
  }
  Json rope = {{"rope_type", c.rope_scaling ? "llama3" : "default"}};
  if (c.rope_scaling) {
    rope["factor"] = c.rope_scaling->factor;
    rope["low_freq_factor"] = c.rope_scaling->low_freq_factor;
    rope["high_freq_factor"] = c.rope_scaling->high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_scaling->original_max_position_embeddings;
  }
  if (v5) {
    rope["rope_theta"] = c.rope_theta;
    j["rope_parameters"] = rope;
  } else {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = c.rope_scaling ? rope : Json(nullptr);
  }
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() > 1) {
    j["eos_token_id"] = c.eos_token_ids;
  } else if (c.eos_token_id) {
    j["eos_token_id"] = *c.eos_token_id;
  }
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  if (!c.name_or_path.empty()) j["_name_or_path"] = c.name_or_path;
  return j.dump(2) + "\n";
}

std::string BaseModelNameOrPath(const LlamaConfig& config, std::string_view fallback) {
  return config.name_or_path.empty() ? std::string(fallback) : config.name_or_path;
}

}  // namespace parsyn::data
