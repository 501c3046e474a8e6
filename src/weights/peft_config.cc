#include "weights/peft_config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "weights/lora_layout.h"

namespace parsyn::weights {
namespace {

using Json = nlohmann::json;

// Options PEFT saves that do not change what a trained adapter computes: where it came from, how it was initialised
// (before training), or settings of options that are off.
const std::set<std::string, std::less<>> kIgnoredOptions = {
    "base_model_name_or_path", "revision",          "inference_mode", "auto_mapping", "peft_version", "layers_pattern",
    "megatron_core",           "qalora_group_size", "loftq_config",   "eva_config",   "corda_config", "runtime_config",
    "ensure_weight_tying"};

// Options that must be off (false) or empty (null, {} or []) for our LoRA to compute what PEFT would.
const std::set<std::string, std::less<>> kMustBeOff = {
    "fan_in_fan_out",    "use_rslora",          "use_dora",
    "lora_bias",         "use_qalora",          "rank_pattern",
    "alpha_pattern",     "layers_to_transform", "layer_replication",
    "modules_to_save",   "exclude_modules",     "trainable_token_indices",
    "target_parameters", "megatron_config",     "alora_invocation_tokens",
    "arrow_config"};

bool IsOff(const Json& v) { return v.is_null() || v == false || (v.is_structured() && v.empty()); }

Status Unsupported(const std::string& key, const Json& value, const std::string& why) {
  return InvalidArgumentError("adapter_config.json's " + key + " is not supported (" + value.dump() + "): " + why);
}

StatusOr<PeftLoraConfig> ParseJson(const Json& j) {
  if (!j.is_object()) return InvalidArgumentError("adapter_config.json is not a JSON object");
  const Json peft_type = j.value("peft_type", Json());
  if (peft_type != "LORA") {
    return InvalidArgumentError("adapter peft_type '" +
                                (peft_type.is_string() ? peft_type.get<std::string>() : peft_type.dump()) +
                                "' is not LORA");
  }
  PeftLoraConfig config;
  bool has_r = false, has_alpha = false, has_targets = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "peft_type" || kIgnoredOptions.contains(key)) continue;
    if (key == "task_type") {
      if (!value.is_null() && value != "CAUSAL_LM") {
        return InvalidArgumentError("adapter task_type " + value.dump() + " is not CAUSAL_LM");
      }
    } else if (key == "r") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1) {
        return InvalidArgumentError("adapter_config.json lacks integer 'r' of at least 1, got " + value.dump());
      }
      config.r = value.get<int64_t>();
      has_r = true;
    } else if (key == "lora_alpha") {
      if (!value.is_number()) return InvalidArgumentError("adapter_config.json lacks numeric 'lora_alpha'");
      config.lora_alpha = value.get<double>();
      has_alpha = true;
    } else if (key == "lora_dropout") {
      if (!value.is_number() || value.get<double>() < 0 || value.get<double>() >= 1) {
        return InvalidArgumentError("adapter_config.json's lora_dropout must be a number in [0, 1), got " +
                                    value.dump());
      }
      config.lora_dropout = value.get<double>();
    } else if (key == "target_modules") {
      config.target_modules.clear();
      if (value == "all-linear") {
        config.target_modules = {"all-linear"};
      } else if (value.is_array()) {
        for (const Json& t : value) {
          if (!t.is_string()) {
            return InvalidArgumentError("adapter target_modules has a non-string entry " + t.dump());
          }
          config.target_modules.push_back(t.get<std::string>());
        }
      } else {
        return InvalidArgumentError(
            "adapter target_modules must be a list of module names or \"all-linear\" (regular expressions are not "
            "supported), got " +
            value.dump());
      }
      has_targets = true;
    } else if (key == "bias") {
      if (value != "none") return InvalidArgumentError("adapter bias " + value.dump() + " is not supported (none)");
    } else if (key == "init_lora_weights") {
      // How A and B started; harmless once trained, unless the method also rewrote the base model's weights.
      if (!value.is_boolean() && value != "gaussian" && value != "eva") {
        return Unsupported(key, value,
                           "this initialisation changes the base model's weights, so the adapter does not apply to "
                           "the original base (true, false, \"gaussian\" and \"eva\" are)");
      }
    } else if (kMustBeOff.contains(key)) {
      if (!IsOff(value)) return Unsupported(key, value, "our LoRA does not implement it");
    } else if (!IsOff(value)) {
      return Unsupported(key, value, "an adapter option this version of parsyn does not know");
    }
  }
  if (!has_r) return InvalidArgumentError("adapter_config.json lacks integer 'r'");
  if (!has_alpha) return InvalidArgumentError("adapter_config.json lacks numeric 'lora_alpha'");
  if (!has_targets) {
    return InvalidArgumentError("adapter target_modules must be a list of module names or \"all-linear\", got null");
  }
  PARSYN_ASSIGN_OR_RETURN(config.target_modules, NormalizeLoraTargets(config.target_modules));
  if (auto name = j.find("base_model_name_or_path"); name != j.end() && name->is_string()) {
    config.base_model_name_or_path = name->get<std::string>();
  }
  return config;
}

}  // namespace

std::string PeftBaseModelName(std::string_view config_name_or_path, const std::filesystem::path& model_dir) {
  if (!config_name_or_path.empty()) return std::string(config_name_or_path);
  std::error_code ec;
  std::filesystem::path folder = std::filesystem::absolute(model_dir, ec).lexically_normal();
  if (ec) folder = model_dir.lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "my-model/" ends in an empty part
  return folder.filename().string();
}

std::string PeftAdapterConfigJson(const PeftLoraConfig& config) {
  Json j = Json::object();  // std::map: keys sorted, as PEFT's json.dumps(sort_keys=True)
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = config.base_model_name_or_path;
  j["revision"] = nullptr;
  j["inference_mode"] = true;
  j["auto_mapping"] = nullptr;
  j["r"] = config.r;
  // PEFT's lora_alpha is an int; keep it one when it is whole.
  if (config.lora_alpha == std::floor(config.lora_alpha) && std::abs(config.lora_alpha) < 1e15) {
    j["lora_alpha"] = static_cast<int64_t>(config.lora_alpha);
  } else {
    j["lora_alpha"] = config.lora_alpha;
  }
  j["lora_dropout"] = config.lora_dropout;
  auto targets = NormalizeLoraTargets(config.target_modules);
  j["target_modules"] = targets.ok() ? *targets : config.target_modules;
  j["bias"] = "none";
  j["init_lora_weights"] = true;
  j["loftq_config"] = Json::object();
  j["rank_pattern"] = Json::object();
  j["alpha_pattern"] = Json::object();
  j["megatron_core"] = "megatron.core";
  j["qalora_group_size"] = 16;
  for (const char* off : {"fan_in_fan_out", "use_rslora", "use_dora", "lora_bias", "use_qalora"}) j[off] = false;
  for (const char* none :
       {"modules_to_save", "layers_to_transform", "layers_pattern", "layer_replication", "exclude_modules",
        "trainable_token_indices", "megatron_config", "eva_config", "corda_config"}) {
    j[none] = nullptr;
  }
  return j.dump(2) + "\n";
}

StatusOr<PeftLoraConfig> ParsePeftAdapterConfig(std::string_view json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("adapter_config.json is not valid JSON");
  try {
    return ParseJson(j);
  } catch (const Json::exception& e) {  // a field of an unexpected type
    return InvalidArgumentError(std::string("adapter_config.json: ") + e.what());
  }
}

}  // namespace parsyn::weights
