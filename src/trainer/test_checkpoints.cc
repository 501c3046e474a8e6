#include "trainer/test_checkpoints.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer/torch_weights.h"
#include "weights/safetensors.h"

namespace parsyn::trainer::testing {

std::filesystem::path FreshTempDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "no_test";
  auto dir = std::filesystem::temp_directory_path() / "parsyn_trainer_test" / test / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

LlamaConfig TinyConfig(const std::string& model_type) {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.qkv_bias = model_type == "qwen2";
  return c;
}

void WriteRandomCheckpoint(const std::filesystem::path& dir, const LlamaConfig& config, uint64_t seed,
                           weights::DType dtype, int num_shards) {
  std::filesystem::create_directories(dir);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto specs = LlamaParameterSpecs(config);
  std::vector<weights::WeightSet> shards(static_cast<size_t>(num_shards));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParameterSpec& spec = specs[i];
    torch::Tensor value = torch::empty(spec.shape).normal_(0.0, 0.1, generator);
    if (spec.name.ends_with("norm.weight")) value += 1.0;
    const size_t shard = i * static_cast<size_t>(num_shards) / specs.size();
    ASSERT_TRUE(AppendToWeightSet(shards[shard], spec.name, value, dtype).ok());
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05d.safetensors", shard + 1, num_shards);
    weight_map[spec.name] = file;
  }
  if (num_shards == 1) {
    ASSERT_TRUE(weights::WriteSafetensorsFile(shards[0], dir / "model.safetensors").ok());
  } else {
    for (int s = 0; s < num_shards; ++s) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", s + 1, num_shards);
      ASSERT_TRUE(weights::WriteSafetensorsFile(shards[static_cast<size_t>(s)], dir / file).ok());
    }
    std::ofstream(dir / "model.safetensors.index.json")
        << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump(2);
  }
  std::ofstream(dir / "config.json") << LlamaConfigToJson(config);
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace parsyn::trainer::testing
