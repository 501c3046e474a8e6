#include "trainer/model_folder.h"

#include <fstream>
#include <sstream>

#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

StatusOr<std::string> ReadTextFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return UnavailableError("error reading " + path.string());
  return text.str();
}

}  // namespace

std::vector<ParameterSpec> LlamaParameterSpecs(const LlamaConfig& c) {
  const int64_t q_out = c.num_attention_heads * c.head_dim;
  const int64_t kv_out = c.num_key_value_heads * c.head_dim;
  std::vector<ParameterSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "self_attn.q_proj.weight", {q_out, c.hidden_size}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.q_proj.bias", {q_out}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_out, c.hidden_size}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.k_proj.bias", {kv_out}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_out, c.hidden_size}});
    if (c.qkv_bias) specs.push_back({p + "self_attn.v_proj.bias", {kv_out}});
    specs.push_back({p + "self_attn.o_proj.weight", {c.hidden_size, q_out}});
    if (c.o_bias) specs.push_back({p + "self_attn.o_proj.bias", {c.hidden_size}});
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}});
    specs.push_back({p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}});
    specs.push_back({p + "input_layernorm.weight", {c.hidden_size}});
    specs.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}});
  }
  specs.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return specs;
}

const weights::Tensor* ModelFolder::Find(std::string_view name) const {
  for (const weights::WeightSet& shard : shards) {
    if (const weights::Tensor* t = shard.Find(name)) return t;
  }
  return nullptr;
}

StatusOr<ModelFolder> ReadModelFolder(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return NotFoundError("model folder " + dir.string() + " does not exist");
  ModelFolder folder;
  folder.dir = dir;
  PARSYN_ASSIGN_OR_RETURN(folder.config_json, ReadTextFile(dir / "config.json"));
  auto config = ParseLlamaConfig(folder.config_json);
  if (!config.ok()) return config.status().WithContext((dir / "config.json").string());
  folder.config = std::move(config).value();

  const auto single = dir / "model.safetensors";
  const auto index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single, ec)) {
    auto set = weights::ReadSafetensorsFile(single);
    if (!set.ok()) return set.status().WithContext(single.string());
    folder.shards.push_back(std::move(set).value());
    return folder;
  }
  if (!std::filesystem::exists(index_path, ec)) {
    return NotFoundError("model folder " + dir.string() +
                         " has neither model.safetensors nor model.safetensors.index.json");
  }
  PARSYN_ASSIGN_OR_RETURN(std::string index_text, ReadTextFile(index_path));
  auto names_by_file = weights::ParseSafetensorsIndex(index_text);
  if (!names_by_file.ok()) return names_by_file.status().WithContext(index_path.string());
  for (const auto& [file_name, names] : *names_by_file) {
    auto set = weights::ReadSafetensorsFile(dir / file_name);
    if (!set.ok()) return set.status().WithContext((dir / file_name).string());
    for (const std::string& name : names) {
      if (set->Find(name) == nullptr) {
        return InvalidArgumentError(index_path.string() + " places tensor '" + name + "' in " + file_name +
                                    ", which does not contain it");
      }
    }
    folder.shards.push_back(std::move(set).value());
  }
  return folder;
}

}  // namespace parsyn::trainer
