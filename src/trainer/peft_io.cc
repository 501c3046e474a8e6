#include "trainer/peft_io.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/atomic_file.h"
#include "trainer/model_init.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

using Json = nlohmann::json;

constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";

bool IsEmptyOrNull(const Json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_structured() && it->empty());
}

StatusOr<AdapterConfig> ParseAdapterJson(const Json& j) {
  if (!j.is_object()) return InvalidArgumentError("adapter_config.json is not a JSON object");
  const std::string peft_type = j.value("peft_type", std::string());
  if (peft_type != "LORA") return InvalidArgumentError("adapter peft_type '" + peft_type + "' is not LORA");
  if (j.contains("task_type") && !j["task_type"].is_null() && j["task_type"] != "CAUSAL_LM") {
    return InvalidArgumentError("adapter task_type " + j["task_type"].dump() + " is not CAUSAL_LM");
  }
  if (j.value("bias", std::string("none")) != "none") {
    return InvalidArgumentError("adapter bias " + j["bias"].dump() + " is not supported (none)");
  }
  for (const char* flag : {"fan_in_fan_out", "use_rslora", "use_dora"}) {
    if (j.value(flag, false)) return InvalidArgumentError(std::string("adapter option ") + flag + " is not supported");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save"}) {
    if (!IsEmptyOrNull(j, key)) {
      return InvalidArgumentError(std::string("adapter option ") + key + " is not supported");
    }
  }
  AdapterConfig config;
  if (!j.contains("r") || !j["r"].is_number_integer())
    return InvalidArgumentError("adapter_config.json lacks integer 'r'");
  config.lora.r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) {
    return InvalidArgumentError("adapter_config.json lacks numeric 'lora_alpha'");
  }
  config.lora.alpha = j["lora_alpha"].get<double>();
  config.lora.dropout = j.value("lora_dropout", 0.0);
  const Json& targets = j.contains("target_modules") ? j["target_modules"] : Json();
  config.lora.target_modules.clear();
  if (targets.is_string() && targets == "all-linear") {
    config.lora.target_modules = {"all-linear"};
  } else if (targets.is_array()) {
    for (const Json& t : targets) {
      if (!t.is_string()) return InvalidArgumentError("adapter target_modules has a non-string entry " + t.dump());
      config.lora.target_modules.push_back(t.get<std::string>());
    }
  } else {
    return InvalidArgumentError("adapter target_modules must be a list of module names or \"all-linear\", got " +
                                targets.dump());
  }
  PARSYN_ASSIGN_OR_RETURN(std::vector<std::string> normalised,
                          weights::NormalizeLoraTargets(config.lora.target_modules));
  config.lora.target_modules = std::move(normalised);
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string()) {
    config.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  }
  return config;
}

}  // namespace

std::string AdapterConfigJson(const AdapterConfig& config) {
  Json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = config.base_model_name_or_path;
  j["r"] = config.lora.r;
  j["lora_alpha"] = config.lora.alpha;
  j["lora_dropout"] = config.lora.dropout;
  auto targets = weights::NormalizeLoraTargets(config.lora.target_modules);
  j["target_modules"] = targets.ok() ? *targets : config.lora.target_modules;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["rank_pattern"] = Json::object();
  j["alpha_pattern"] = Json::object();
  j["revision"] = nullptr;
  return j.dump(2) + "\n";
}

StatusOr<AdapterConfig> ParseAdapterConfig(std::string_view json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("adapter_config.json is not valid JSON");
  try {
    return ParseAdapterJson(j);
  } catch (const Json::exception& e) {  // a field of an unexpected type read with value()
    return InvalidArgumentError(std::string("adapter_config.json: ") + e.what());
  }
}

Status SaveAdapter(const LlamaModel& model, const std::filesystem::path& dir,
                   const std::string& base_model_name_or_path, weights::DType dtype) {
  if (!model.has_lora()) return FailedPreconditionError("the model has no LoRA adapters to save");
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet set, model.ExportLora(dtype));
  set.metadata()["format"] = "pt";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir.string() + ": " + ec.message());
  PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(set, dir / kWeightsFile));
  return WriteFileAtomically(dir / kConfigFile, AdapterConfigJson({model.lora_settings(), base_model_name_or_path}));
}

StatusOr<LoadedAdapter> ReadAdapter(const std::filesystem::path& dir) {
  std::ifstream in(dir / kConfigFile, std::ios::binary);
  if (!in) return NotFoundError("no " + std::string(kConfigFile) + " in " + dir.string());
  std::ostringstream text;
  text << in.rdbuf();
  LoadedAdapter adapter;
  auto config = ParseAdapterConfig(text.str());
  if (!config.ok()) return config.status().WithContext((dir / kConfigFile).string());
  adapter.config = std::move(config).value();
  std::error_code ec;
  if (!std::filesystem::exists(dir / kWeightsFile, ec)) {
    return NotFoundError("no " + std::string(kWeightsFile) + " in " + dir.string());
  }
  auto set = weights::ReadSafetensorsFile(dir / kWeightsFile);
  if (!set.ok()) return set.status().WithContext((dir / kWeightsFile).string());
  adapter.weights = std::move(set).value();
  return adapter;
}

Status LoadAdapterInto(LlamaModel& model, const std::filesystem::path& dir) {
  if (model.has_lora()) return FailedPreconditionError("the model already has LoRA adapters");
  PARSYN_ASSIGN_OR_RETURN(LoadedAdapter adapter, ReadAdapter(dir));
  // The seed only fills values that ImportLora overwrites at once.
  PARSYN_RETURN_IF_ERROR(model.AttachLora(adapter.config.lora, /*seed=*/0));
  Status imported = model.ImportLora(adapter.weights);
  if (!imported.ok()) return imported.WithContext((dir / kWeightsFile).string());
  return Status::Ok();
}

Status ExportMergedModel(LlamaModel& model, const std::filesystem::path& dir, weights::DType dtype,
                         const std::filesystem::path& tokenizer_source_dir) {
  PARSYN_RETURN_IF_ERROR(model.MergeLora());
  return WriteModelFolder(model, dir, dtype, tokenizer_source_dir);
}

}  // namespace parsyn::trainer
