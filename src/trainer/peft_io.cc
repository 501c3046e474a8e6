#include "trainer/peft_io.h"

#include <fstream>
#include <sstream>

#include "base/atomic_file.h"
#include "trainer/model_init.h"
#include "weights/peft_config.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";

weights::PeftLoraConfig ToPeft(const AdapterConfig& config) {
  return {.r = config.lora.r,
          .lora_alpha = config.lora.alpha,
          .lora_dropout = config.lora.dropout,
          .target_modules = config.lora.target_modules,
          .base_model_name_or_path = config.base_model_name_or_path};
}

}  // namespace

std::string AdapterConfigJson(const AdapterConfig& config) { return weights::PeftAdapterConfigJson(ToPeft(config)); }

StatusOr<AdapterConfig> ParseAdapterConfig(std::string_view json) {
  PARSYN_ASSIGN_OR_RETURN(weights::PeftLoraConfig peft, weights::ParsePeftAdapterConfig(json));
  AdapterConfig config;
  config.lora.r = peft.r;
  config.lora.alpha = peft.lora_alpha;
  config.lora.dropout = peft.lora_dropout;
  config.lora.target_modules = std::move(peft.target_modules);
  config.base_model_name_or_path = std::move(peft.base_model_name_or_path);
  return config;
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

weights::DType CheckpointDType(const LlamaConfig& config) {
  if (config.torch_dtype == "bfloat16") return weights::DType::kBF16;
  if (config.torch_dtype == "float16") return weights::DType::kF16;
  return weights::DType::kF32;
}

Status MergeAdapterFolder(const std::filesystem::path& model_dir, const std::filesystem::path& adapter_dir,
                          const std::filesystem::path& out_dir) {
  std::error_code ec;
  if (std::filesystem::exists(out_dir / "config.json", ec)) {
    return AlreadyExistsError(out_dir.string() + " already holds a model (config.json); choose another --out");
  }
  // fp32 masters: the merge W + (alpha / r) B A is computed in fp32 and rounded once, to the checkpoint's dtype.
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::Load(model_dir));
  PARSYN_RETURN_IF_ERROR(LoadAdapterInto(*model, adapter_dir));
  return ExportMergedModel(*model, out_dir, CheckpointDType(model->config()), model_dir);
}

}  // namespace parsyn::trainer
