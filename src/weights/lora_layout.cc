#include "weights/lora_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace parsyn::weights {
namespace {

using Json = nlohmann::json;

StatusOr<int64_t> PositiveInt(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return InvalidArgumentError(std::string("config.json lacks '") + key + "'");
  if (!it->is_number_integer()) {
    return InvalidArgumentError(std::string("config.json's '") + key + "' must be an integer, got " + it->dump());
  }
  int64_t value = it->get<int64_t>();
  if (value <= 0) {
    return InvalidArgumentError(std::string("config.json's '") + key + "' must be positive, got " +
                                std::to_string(value));
  }
  return value;
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// (in_features, out_features) of one projection.
std::pair<int64_t, int64_t> ProjectionShape(const LoraModelDims& d, std::string_view module) {
  const int64_t q_out = d.num_attention_heads * d.head_dim;
  const int64_t kv_out = d.num_key_value_heads * d.head_dim;
  if (module == "q_proj") return {d.hidden_size, q_out};
  if (module == "k_proj" || module == "v_proj") return {d.hidden_size, kv_out};
  if (module == "o_proj") return {q_out, d.hidden_size};
  if (module == "down_proj") return {d.intermediate_size, d.hidden_size};
  return {d.hidden_size, d.intermediate_size};  // gate_proj, up_proj
}

}  // namespace

StatusOr<LoraModelDims> ParseLoraModelDims(std::string_view config_json) {
  Json config = Json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return InvalidArgumentError("config.json is not a JSON object");
  }
  auto type_it = config.find("model_type");
  if (type_it == config.end() || !type_it->is_string()) {
    return InvalidArgumentError("config.json lacks a string 'model_type'");
  }
  const std::string model_type = type_it->get<std::string>();
  if (model_type != "llama" && model_type != "qwen2" && model_type != "mistral") {
    return InvalidArgumentError("model_type '" + model_type + "' is not supported (llama, qwen2, mistral)");
  }
  LoraModelDims d;
  PARSYN_ASSIGN_OR_RETURN(d.hidden_size, PositiveInt(config, "hidden_size"));
  PARSYN_ASSIGN_OR_RETURN(d.intermediate_size, PositiveInt(config, "intermediate_size"));
  PARSYN_ASSIGN_OR_RETURN(d.num_hidden_layers, PositiveInt(config, "num_hidden_layers"));
  PARSYN_ASSIGN_OR_RETURN(d.num_attention_heads, PositiveInt(config, "num_attention_heads"));
  if (config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()) {
    PARSYN_ASSIGN_OR_RETURN(d.num_key_value_heads, PositiveInt(config, "num_key_value_heads"));
  } else {
    d.num_key_value_heads = d.num_attention_heads;
  }
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    PARSYN_ASSIGN_OR_RETURN(d.head_dim, PositiveInt(config, "head_dim"));
  } else {
    if (d.hidden_size % d.num_attention_heads != 0) {
      return InvalidArgumentError("hidden_size " + std::to_string(d.hidden_size) +
                                  " is not divisible by num_attention_heads " + std::to_string(d.num_attention_heads));
    }
    d.head_dim = d.hidden_size / d.num_attention_heads;
  }
  if (d.num_attention_heads % d.num_key_value_heads != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(d.num_attention_heads) +
                                " is not a multiple of num_key_value_heads " + std::to_string(d.num_key_value_heads));
  }
  return d;
}

StatusOr<std::vector<std::string>> NormalizeLoraTargets(const std::vector<std::string>& target_modules) {
  if (target_modules.empty()) return InvalidArgumentError("LoRA target_modules is empty");
  std::vector<std::string> out;
  for (std::string_view module : kLoraModules) {
    bool wanted = false;
    for (const std::string& t : target_modules) {
      if (t == module || t == "all-linear") wanted = true;
    }
    if (wanted) out.emplace_back(module);
  }
  for (const std::string& t : target_modules) {
    if (t == "all-linear") continue;
    if (std::find(std::begin(kLoraModules), std::end(kLoraModules), t) == std::end(kLoraModules)) {
      return InvalidArgumentError("LoRA target module '" + t +
                                  "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                                  "all-linear");
    }
  }
  return out;
}

std::string LoraTensorName(int64_t layer, std::string_view module, std::string_view matrix) {
  const bool attention = module == "q_proj" || module == "k_proj" || module == "v_proj" || module == "o_proj";
  std::string name = "base_model.model.model.layers." + std::to_string(layer) + (attention ? ".self_attn." : ".mlp.");
  name += module;
  name += '.';
  name += matrix;
  name += ".weight";
  return name;
}

StatusOr<std::vector<LoraTensorSpec>> LoraLayout(const LoraModelDims& dims, const LoraLayoutOptions& options) {
  if (options.r < 1) return InvalidArgumentError("LoRA r must be at least 1, got " + std::to_string(options.r));
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 && options.dtype != DType::kF16) {
    return InvalidArgumentError("LoRA adapters' dtype must be F32, BF16 or F16, got " +
                                std::string(DTypeName(options.dtype)));
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<std::string> modules, NormalizeLoraTargets(options.target_modules));
  std::vector<LoraTensorSpec> specs;
  specs.reserve(static_cast<size_t>(dims.num_hidden_layers) * modules.size() * 2);
  for (int64_t layer = 0; layer < dims.num_hidden_layers; ++layer) {
    for (const std::string& module : modules) {
      auto [in, out] = ProjectionShape(dims, module);
      specs.push_back({LoraTensorName(layer, module, "lora_A"), options.dtype, {options.r, in}, in, out, true});
      specs.push_back({LoraTensorName(layer, module, "lora_B"), options.dtype, {out, options.r}, in, out, false});
    }
  }
  return specs;
}

StatusOr<std::vector<LoraTensorSpec>> LoraLayout(std::string_view config_json, const LoraLayoutOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(LoraModelDims dims, ParseLoraModelDims(config_json));
  return LoraLayout(dims, options);
}

StatusOr<WeightSet> InitialLoraAdapters(const LoraModelDims& dims, const LoraLayoutOptions& options, uint64_t seed) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<LoraTensorSpec> specs, LoraLayout(dims, options));
  WeightSet set;
  for (const LoraTensorSpec& spec : specs) {
    PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes, set.AddZeros(spec.name, spec.dtype, spec.shape));
    if (!spec.is_lora_a) continue;  // B stays zero
    uint64_t state = seed ^ Fnv1a64(spec.name);
    state = SplitMix64(state);
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.in_features));
    const size_t n = bytes.size() / DTypeSize(spec.dtype);
    for (size_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
      const float value = static_cast<float>((2.0 * u - 1.0) * bound);
      if (spec.dtype == DType::kF32) {
        std::memcpy(bytes.data() + i * 4, &value, 4);
      } else {
        const uint16_t half = spec.dtype == DType::kBF16 ? FloatToBf16(value) : FloatToF16(value);
        std::memcpy(bytes.data() + i * 2, &half, 2);
      }
    }
  }
  return set;
}

StatusOr<WeightSet> InitialLoraAdapters(std::string_view config_json, const LoraLayoutOptions& options, uint64_t seed) {
  PARSYN_ASSIGN_OR_RETURN(LoraModelDims dims, ParseLoraModelDims(config_json));
  return InitialLoraAdapters(dims, options, seed);
}

}  // namespace parsyn::weights
