// A Llama-family model's parameters (its config.json is read by data/llama_config.h), and the Hugging Face-style
// model folder it sits in:
//   config.json, model.safetensors (or shards listed in model.safetensors.index.json), tokenizer.json.
// Torch-free. Functions here are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "data/llama_config.h"
#include "weights/weight_set.h"

namespace parsyn::trainer {

using data::BaseModelNameOrPath;
using data::ConfigJsonForm;
using data::Llama3RopeScaling;
using data::LlamaConfig;
using data::LlamaConfigToJson;
using data::ParseLlamaConfig;

// One tensor the network needs: its Hugging Face name and shape.
struct ParameterSpec {
  std::string name;
  std::vector<int64_t> shape;
};
// Every parameter of the network in Hugging Face order (embeddings, layers, final norm, lm_head when untied).
std::vector<ParameterSpec> LlamaParameterSpecs(const LlamaConfig& config);

// A model folder's contents, read but not yet in torch: the config and the checkpoint's tensors (memory-mapped;
// one WeightSet per shard).
struct ModelFolder {
  std::filesystem::path dir;
  std::string config_json;
  LlamaConfig config;
  std::vector<weights::WeightSet> shards;
  // nullptr if no shard has the tensor.
  const weights::Tensor* Find(std::string_view name) const;
};

// Reads config.json and model.safetensors, or model.safetensors.index.json and the shards its weight_map names.
// NotFound when the folder, config.json or every checkpoint file is missing; InvalidArgument for a bad config or
// index (e.g. a tensor the index places in a shard that lacks it); errors of the safetensors reader otherwise.
StatusOr<ModelFolder> ReadModelFolder(const std::filesystem::path& dir);

}  // namespace parsyn::trainer
