// Writing Hugging Face-style model folders: a model's weights with its config.json and tokenizer, and
// `parsyn model init` — a new, randomly initialised Llama-family model for tests, the demo and benchmarks.
// Functions here may be called from any thread; two calls must not write the same folder at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "base/status.h"
#include "trainer/llama_model.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

// Writes config.json (torch_dtype set to `dtype`) and model.safetensors (Hugging Face names, `dtype`, metadata
// format "pt" as transformers requires) into `dir`, creating it. When `tokenizer_source_dir` is given, its
// tokenizer.json (required: NotFound if absent) and tokenizer_config.json / special_tokens_map.json /
// generation_config.json (when present) are copied too. Files are written atomically (temporary file, rename).
// InvalidArgument for a non-float dtype; Unavailable on I/O errors.
Status WriteModelFolder(const LlamaModel& model, const std::filesystem::path& dir, weights::DType dtype,
                        const std::optional<std::filesystem::path>& tokenizer_source_dir = std::nullopt);

struct ModelInitOptions {
  std::string architecture = "llama";  // llama | qwen2 (q/k/v bias)
  int64_t hidden_size = 64;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: = num_attention_heads
  int64_t intermediate_size = 0;    // 0: 8/3 * hidden_size rounded up to a multiple of 32 (Llama's proportion)
  // The tokenizer: by default the byte-level one from src/data (259 ids, written as tokenizer.json); or a copy of an
  // existing tokenizer.json.
  std::optional<std::filesystem::path> tokenizer_json;
  int64_t vocab_size = 0;  // 0: the tokenizer's size; larger values pad the embedding table (e.g. to a multiple of 64)
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  uint64_t seed = 0;
  weights::DType dtype = weights::DType::kF32;  // F32, BF16 or F16
};

// Writes config.json, model.safetensors and tokenizer.json (plus tokenizer_config.json for the byte-level tokenizer)
// into `dir`, which may exist but must not already hold a config.json (AlreadyExists). Weights are drawn as
// LlamaModel::RandomInit does: the same options and seed give the same bytes. InvalidArgument naming the bad option
// (unknown architecture, heads not dividing hidden_size or each other, vocab_size below the tokenizer's, ...).
// Returns the written config.
StatusOr<LlamaConfig> InitModelFolder(const std::filesystem::path& dir, const ModelInitOptions& options);

}  // namespace parsyn::trainer
