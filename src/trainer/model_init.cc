#include "trainer/model_init.h"

#include <fstream>

#include "base/atomic_file.h"
#include "data/tokenizer.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

Status CopyFileAtomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  const std::filesystem::path tmp = to.string() + ".tmp";
  std::error_code ec;
  std::filesystem::copy_file(from, tmp, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return UnavailableError("cannot copy " + from.string() + " to " + tmp.string() + ": " + ec.message());
  std::filesystem::rename(tmp, to, ec);
  if (ec) return UnavailableError("cannot rename " + tmp.string() + " to " + to.string() + ": " + ec.message());
  return Status::Ok();
}

std::string TorchDtypeName(weights::DType dtype) {
  switch (dtype) {
    case weights::DType::kBF16: return "bfloat16";
    case weights::DType::kF16: return "float16";
    default: return "float32";
  }
}

}  // namespace

Status WriteModelFolder(const LlamaModel& model, const std::filesystem::path& dir, weights::DType dtype,
                        const std::optional<std::filesystem::path>& tokenizer_source_dir) {
  if (dtype != weights::DType::kF32 && dtype != weights::DType::kBF16 && dtype != weights::DType::kF16) {
    return InvalidArgumentError("a model folder's dtype must be F32, BF16 or F16, not " +
                                std::string(weights::DTypeName(dtype)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create " + dir.string() + ": " + ec.message());
  if (tokenizer_source_dir && !std::filesystem::exists(*tokenizer_source_dir / "tokenizer.json", ec)) {
    return NotFoundError("no tokenizer.json in " + tokenizer_source_dir->string());
  }
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet set, model.ExportWeights(dtype));
  set.metadata()["format"] = "pt";  // transformers refuses safetensors files without it
  PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(set, dir / "model.safetensors"));
  LlamaConfig config = model.config();
  config.torch_dtype = TorchDtypeName(dtype);
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(dir / "config.json", LlamaConfigToJson(config)));
  if (tokenizer_source_dir && !std::filesystem::equivalent(*tokenizer_source_dir, dir, ec)) {
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
      const auto from = *tokenizer_source_dir / name;
      if (std::filesystem::exists(from, ec)) PARSYN_RETURN_IF_ERROR(CopyFileAtomically(from, dir / name));
    }
  }
  return Status::Ok();
}

namespace {

// InvalidArgument for an architecture other than llama and qwen2, or a size or constant out of its range.
Status CheckModelInitOptions(const ModelInitOptions& options) {
  if (options.architecture != "llama" && options.architecture != "qwen2") {
    return InvalidArgumentError("architecture '" + options.architecture + "' is not supported (llama, qwen2)");
  }
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v <= 0) return InvalidArgumentError(std::string(name) + " must be positive, got " + std::to_string(v));
    return Status::Ok();
  };
  PARSYN_RETURN_IF_ERROR(positive(options.hidden_size, "hidden_size"));
  PARSYN_RETURN_IF_ERROR(positive(options.num_hidden_layers, "num_hidden_layers"));
  PARSYN_RETURN_IF_ERROR(positive(options.num_attention_heads, "num_attention_heads"));
  PARSYN_RETURN_IF_ERROR(positive(options.max_position_embeddings, "max_position_embeddings"));
  if (options.num_key_value_heads < 0 || options.intermediate_size < 0 || options.vocab_size < 0) {
    return InvalidArgumentError("num_key_value_heads, intermediate_size and vocab_size must not be negative");
  }
  if (!(options.rope_theta > 0) || !(options.rms_norm_eps > 0)) {
    return InvalidArgumentError("rope_theta and rms_norm_eps must be positive");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<LlamaConfig> InitModelFolder(const std::filesystem::path& dir, const ModelInitOptions& options) {
  PARSYN_RETURN_IF_ERROR(CheckModelInitOptions(options));
  std::error_code ec;
  if (std::filesystem::exists(dir / "config.json", ec)) {
    return AlreadyExistsError(dir.string() + " already holds a model (config.json)");
  }

  // The tokenizer decides the vocabulary and the special ids written to config.json.
  std::string tokenizer_text = data::ByteLevelTokenizerJson();
  if (options.tokenizer_json) {
    std::ifstream in(*options.tokenizer_json, std::ios::binary);
    if (!in) return NotFoundError("cannot open tokenizer " + options.tokenizer_json->string());
    tokenizer_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto tokenizer = data::Tokenizer::FromJson(tokenizer_text);
  if (!tokenizer.ok()) return tokenizer.status().WithContext("tokenizer");

  LlamaConfig config;
  config.model_type = options.architecture;
  config.vocab_size = options.vocab_size == 0 ? tokenizer->vocab_size() : options.vocab_size;
  if (config.vocab_size < tokenizer->vocab_size()) {
    return InvalidArgumentError("vocab_size " + std::to_string(config.vocab_size) + " is below the tokenizer's " +
                                std::to_string(tokenizer->vocab_size()));
  }
  config.hidden_size = options.hidden_size;
  config.num_hidden_layers = options.num_hidden_layers;
  config.num_attention_heads = options.num_attention_heads;
  config.num_key_value_heads =
      options.num_key_value_heads == 0 ? options.num_attention_heads : options.num_key_value_heads;
  if (config.hidden_size % config.num_attention_heads != 0) {
    return InvalidArgumentError("hidden_size " + std::to_string(config.hidden_size) +
                                " is not divisible by num_attention_heads " +
                                std::to_string(config.num_attention_heads));
  }
  config.head_dim = config.hidden_size / config.num_attention_heads;
  if (config.head_dim % 2 != 0) {
    return InvalidArgumentError("head size hidden_size / num_attention_heads = " + std::to_string(config.head_dim) +
                                " must be even for rotary embeddings");
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return InvalidArgumentError("num_attention_heads " + std::to_string(config.num_attention_heads) +
                                " is not a multiple of num_key_value_heads " +
                                std::to_string(config.num_key_value_heads));
  }
  config.intermediate_size = options.intermediate_size;
  if (config.intermediate_size == 0) config.intermediate_size = (config.hidden_size * 8 / 3 + 31) / 32 * 32;
  config.max_position_embeddings = options.max_position_embeddings;
  config.rope_theta = options.rope_theta;
  config.rms_norm_eps = options.rms_norm_eps;
  config.tie_word_embeddings = options.tie_word_embeddings;
  config.qkv_bias = options.architecture == "qwen2";
  if (auto id = tokenizer->bos_id()) config.bos_token_id = *id;
  if (auto id = tokenizer->eos_id()) config.eos_token_id = *id;
  if (auto id = tokenizer->pad_id()) config.pad_token_id = *id;

  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::RandomInit(config, options.seed));
  PARSYN_RETURN_IF_ERROR(WriteModelFolder(*model, dir, options.dtype));
  if (options.tokenizer_json) {
    PARSYN_RETURN_IF_ERROR(WriteFileAtomically(dir / "tokenizer.json", tokenizer_text));
  } else {
    PARSYN_RETURN_IF_ERROR(data::WriteByteLevelTokenizer(dir));
  }
  config.torch_dtype = TorchDtypeName(options.dtype);
  return config;
}

}  // namespace parsyn::trainer
