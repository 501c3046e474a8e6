#include "trainer/task_models.h"

#include "trainer/causal_lm.h"
#include "trainer/model_init.h"
#include "trainer/peft_io.h"
#include "weights/peft_config.h"

namespace parsyn::trainer {

StatusOr<LanguageModelBundle> LoadLanguageModel(const std::filesystem::path& model_dir,
                                                const protocol::TrainingConfig& config, uint64_t seed,
                                                torch::Device device) {
  CausalLmOptions options;
  options.model.device = device;
  switch (config.mixed_precision) {
    case protocol::MixedPrecision::kNo: options.model.compute_dtype = torch::kFloat32; break;
    case protocol::MixedPrecision::kBf16: options.model.compute_dtype = torch::kBFloat16; break;
    case protocol::MixedPrecision::kFp16: options.model.compute_dtype = torch::kHalf; break;
  }
  if (config.use_peft) {
    LoraSettings lora;
    lora.r = config.lora_r;
    lora.alpha = config.lora_alpha;
    lora.dropout = config.lora_dropout;
    lora.target_modules = config.lora_target_modules;
    options.lora = lora;
    options.lora_seed = seed;
  }
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model, CausalLm::Load(model_dir, options));
  auto tokenizer = data::Tokenizer::FromFile(model_dir / "tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status().WithContext((model_dir / "tokenizer.json").string());

  LanguageModelBundle bundle;
  const LlamaConfig& llama = model->model().config();
  // config.json's special ids win over the tokenizer's guesses (tokenizer.h says so).
  bundle.tokenization.max_seq_len = config.max_seq_len;
  if (llama.eos_token_id) {
    bundle.tokenization.eos_id = static_cast<int32_t>(*llama.eos_token_id);
  } else {
    bundle.tokenization.eos_id = tokenizer->eos_id();
  }
  std::optional<int32_t> pad =
      llama.pad_token_id ? std::optional<int32_t>(static_cast<int32_t>(*llama.pad_token_id)) : tokenizer->pad_id();
  bundle.tokenization.pad_id = pad.value_or(bundle.tokenization.eos_id.value_or(0));
  bundle.tokenizer = std::make_unique<data::Tokenizer>(std::move(tokenizer).value());

  CausalLm* lm = model.get();
  const weights::DType checkpoint_dtype = CheckpointDType(llama);
  // config.json's Hub id, else the folder's name (docs/training.md, "Adapters").
  const std::string base_model = weights::PeftBaseModelName(llama.name_or_path, model_dir);
  bundle.save_model_dir = [lm, model_dir, checkpoint_dtype, base_model](const std::filesystem::path& dir) -> Status {
    if (lm->uses_lora()) return SaveAdapter(lm->model(), dir, base_model);
    return WriteModelFolder(lm->model(), dir, checkpoint_dtype, model_dir);
  };
  bundle.model = std::move(model);
  return bundle;
}

}  // namespace parsyn::trainer
