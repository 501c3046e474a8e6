#include "data/llama_config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace parsyn::data {
namespace {

using nlohmann::json;

json TinyConfig() {
  return {{"model_type", "llama"},  {"architectures", {"LlamaForCausalLM"}},
          {"hidden_size", 16},      {"intermediate_size", 32},
          {"num_hidden_layers", 2}, {"num_attention_heads", 2},
          {"vocab_size", 64},       {"max_position_embeddings", 64}};
}

TEST(LlamaConfigTest, ReadsWhatItWritesForEachModelType) {
  for (const char* type : {"llama", "qwen2", "mistral"}) {
    json j = TinyConfig();
    j["model_type"] = type;
    j.erase("architectures");
    auto config = ParseLlamaConfig(j.dump());
    ASSERT_TRUE(config.ok()) << type << ": " << config.status().ToString();
    auto again = ParseLlamaConfig(LlamaConfigToJson(*config));
    ASSERT_TRUE(again.ok()) << type << ": " << again.status().ToString();
    EXPECT_EQ(again->model_type, type);
    EXPECT_EQ(again->num_key_value_heads, 2);
    EXPECT_EQ(again->head_dim, 8);
  }
}

TEST(LlamaConfigTest, RejectsWhatTheTrainerCannotBuildNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(json&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"unknown model_type", [](json& j) { j["model_type"] = "gpt2"; }, "model_type 'gpt2' is not supported"},
      {"no model_type", [](json& j) { j.erase("model_type"); }, "lacks a string 'model_type'"},
      {"foreign architecture", [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
       "'architectures' entry \"GPT2LMHeadModel\" is not supported for model_type 'llama' (LlamaForCausalLM)"},
      {"architecture of another type", [](json& j) { j["architectures"] = {"Qwen2ForCausalLM"}; },
       "entry \"Qwen2ForCausalLM\" is not supported"},
      {"architectures not a list", [](json& j) { j["architectures"] = "LlamaForCausalLM"; },
       "'architectures' must be a list"},
      {"no hidden_size", [](json& j) { j.erase("hidden_size"); }, "config.json lacks 'hidden_size'"},
      {"no num_hidden_layers", [](json& j) { j.erase("num_hidden_layers"); }, "lacks 'num_hidden_layers'"},
      {"no num_attention_heads", [](json& j) { j.erase("num_attention_heads"); }, "lacks 'num_attention_heads'"},
      {"no vocab_size", [](json& j) { j.erase("vocab_size"); }, "lacks 'vocab_size'"},
      {"zero layers", [](json& j) { j["num_hidden_layers"] = 0; }, "'num_hidden_layers' must be positive, got 0"},
      {"negative vocabulary", [](json& j) { j["vocab_size"] = -5; }, "'vocab_size' must be positive, got -5"},
      {"size as a string", [](json& j) { j["hidden_size"] = "16"; }, "'hidden_size' must be an integer"},
  };
  for (const Case& c : cases) {
    json j = TinyConfig();
    c.change(j);
    auto config = ParseLlamaConfig(j.dump());
    ASSERT_FALSE(config.ok()) << c.what;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << c.what << ": " << config.status().message();
  }
  EXPECT_EQ(ParseLlamaConfig("{not json").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::data
