#include "data/llama_config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
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

// Llama 3.1 8B's RoPE in each form config.json is written in today, and mixtures of them.
json Llama3Rope() {
  return {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192}};
}

// The config-form table of docs/training.md ("Model folders"): each form, and what reading it gives.
TEST(LlamaConfigTest, ReadsTransformers4And5FormsAndRejectsConflictsAndUnknownRope) {
  struct Case {
    const char* what;
    std::function<void(json&)> change;
    // Expected on success: rope_theta, whether llama3 scaling is on, dtype.
    double rope_theta = 0;
    bool llama3 = false;
    const char* dtype = "float32";
    const char* error = nullptr;  // a part of the message, when it must fail
  };
  const std::vector<Case> cases = {
      {"no rope settings: transformers' defaults", [](json&) {}, 10000.0, false, "float32"},
      {"transformers 4: rope_theta, rope_scaling, torch_dtype",
       [](json& j) {
         j["rope_theta"] = 500000.0;
         j["rope_scaling"] = Llama3Rope();
         j["torch_dtype"] = "bfloat16";
       },
       500000.0, true, "bfloat16"},
      {"transformers 4 with rope_scaling's old key 'type'",
       [](json& j) {
         j["rope_scaling"] = Llama3Rope();
         j["rope_scaling"].erase("rope_type");
         j["rope_scaling"]["type"] = "llama3";
       },
       10000.0, true, "float32"},
      {"transformers 4 with rope_scaling null", [](json& j) { j["rope_scaling"] = nullptr; }, 10000.0, false},
      {"transformers 5: rope_parameters, dtype",
       [](json& j) {
         j["rope_parameters"] = Llama3Rope();
         j["rope_parameters"]["rope_theta"] = 500000.0;
         j["dtype"] = "bfloat16";
       },
       500000.0, true, "bfloat16"},
      {"transformers 5 default rope",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
       },
       1000000.0, false},
      {"mixed: top-level rope_theta, scaling in rope_parameters, both dtypes equal",
       [](json& j) {
         j["rope_theta"] = 500000.0;
         j["rope_parameters"] = Llama3Rope();
         j["torch_dtype"] = j["dtype"] = "float16";
       },
       500000.0, true, "float16"},
      {"mixed: everything written twice, equal",
       [](json& j) {
         j["rope_theta"] = 500000;  // an integer equal to 500000.0
         j["rope_scaling"] = Llama3Rope();
         j["rope_parameters"] = Llama3Rope();
         j["rope_parameters"]["rope_theta"] = 500000.0;
       },
       500000.0, true},
      {"conflict: rope_theta against rope_parameters.rope_theta",
       [](json& j) {
         j["rope_theta"] = 10000.0;
         j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
       },
       0, false, "", "rope_parameters.rope_theta (500000.0) conflicts with rope_theta (10000.0)"},
      {"conflict: scaling factor in both objects",
       [](json& j) {
         j["rope_scaling"] = Llama3Rope();
         j["rope_parameters"] = Llama3Rope();
         j["rope_parameters"]["factor"] = 32.0;
       },
       0, false, "", "rope_parameters.factor (32.0) conflicts with rope_scaling.factor (8.0)"},
      {"conflict: rope type in both objects",
       [](json& j) {
         j["rope_scaling"] = Llama3Rope();
         j["rope_parameters"] = {{"rope_type", "default"}};
       },
       0, false, "", "rope_parameters.rope_type (\"default\") conflicts with rope_scaling.rope_type (\"llama3\")"},
      {"conflict: torch_dtype against dtype",
       [](json& j) {
         j["torch_dtype"] = "bfloat16";
         j["dtype"] = "float32";
       },
       0, false, "", "dtype (\"float32\") conflicts with torch_dtype (\"bfloat16\")"},
      {"unknown rope type (transformers 5)",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
       },
       0, false, "",
       "rope_parameters.rope_type 'yarn' is not supported: the trainer implements rope types default and"},
      {"unknown rope type (transformers 4)",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
       },
       0, false, "", "rope_scaling.type 'linear' is not supported"},
      {"unknown rope field",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
       },
       0, false, "", "rope_parameters.partial_rotary_factor is not supported with rope type 'default'"},
      {"a llama3 field with the default rope type",
       [](json& j) {
         j["rope_parameters"] = {{"rope_theta", 10000.0}, {"factor", 8.0}};
       },
       0, false, "", "rope_parameters.factor is not supported with rope type 'default'"},
      {"llama3 without one of its fields",
       [](json& j) {
         j["rope_parameters"] = Llama3Rope();
         j["rope_parameters"].erase("low_freq_factor");
       },
       0, false, "", "rope type 'llama3' needs 'low_freq_factor'"},
      {"per-layer-type rope_parameters (Gemma 3's shape)",
       [](json& j) {
         j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
       },
       0, false, "", "rope_parameters.full_attention is not supported"},
      {"rope_parameters not an object", [](json& j) { j["rope_parameters"] = 10000; }, 0, false, "",
       "rope_parameters must be an object or null"},
      {"rope_theta not a number", [](json& j) { j["rope_theta"] = "1e4"; }, 0, false, "",
       "rope_theta must be a positive number"},
      {"unknown dtype", [](json& j) { j["dtype"] = "float8_e4m3fn"; }, 0, false, "",
       "dtype \"float8_e4m3fn\" is not supported (float32, bfloat16, float16)"},
      {"eos not an id", [](json& j) { j["eos_token_id"] = "</s>"; }, 0, false, "",
       "'eos_token_id' must be a token id or a list of token ids"},
      {"sliding layers in a llama",
       [](json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       0, false, "", "'layer_types' entry \"sliding_attention\" is not supported"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json j = TinyConfig();
    c.change(j);
    auto config = ParseLlamaConfig(j.dump());
    if (c.error != nullptr) {
      ASSERT_FALSE(config.ok());
      EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(config.status().message().find(c.error), std::string::npos) << config.status().message();
      continue;
    }
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(config->rope_theta, c.rope_theta);
    EXPECT_EQ(config->rope_scaling.has_value(), c.llama3);
    if (c.llama3) {
      EXPECT_EQ(config->rope_scaling->factor, 8.0);
      EXPECT_EQ(config->rope_scaling->low_freq_factor, 1.0);
      EXPECT_EQ(config->rope_scaling->high_freq_factor, 4.0);
      EXPECT_EQ(config->rope_scaling->original_max_position_embeddings, 8192);
    }
    EXPECT_EQ(config->torch_dtype, c.dtype);
  }
}

TEST(LlamaConfigTest, WritesEitherFormAndReadsBothBackAlike) {
  json j = TinyConfig();
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = Llama3Rope();
  j["torch_dtype"] = "bfloat16";
  j["eos_token_id"] = {128001, 128008, 128009};
  j["_name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct";
  auto config = ParseLlamaConfig(j.dump());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const json v4 = json::parse(LlamaConfigToJson(*config, ConfigJsonForm::kTransformers4));
  const json v5 = json::parse(LlamaConfigToJson(*config, ConfigJsonForm::kTransformers5));
  EXPECT_EQ(v4["rope_theta"], 500000.0);
  EXPECT_EQ(v4["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(v4["torch_dtype"], "bfloat16");
  EXPECT_FALSE(v4.contains("rope_parameters") || v4.contains("dtype"));
  EXPECT_EQ(v5["rope_parameters"]["rope_theta"], 500000.0);
  EXPECT_EQ(v5["rope_parameters"]["factor"], 8.0);
  EXPECT_EQ(v5["dtype"], "bfloat16");
  EXPECT_FALSE(v5.contains("rope_theta") || v5.contains("rope_scaling") || v5.contains("torch_dtype"));
  for (const json& written : {v4, v5}) {
    auto again = ParseLlamaConfig(written.dump());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->rope_theta, 500000.0);
    ASSERT_TRUE(again->rope_scaling.has_value());
    EXPECT_EQ(again->rope_scaling->factor, 8.0);
    EXPECT_EQ(again->torch_dtype, "bfloat16");
    EXPECT_EQ(again->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
    EXPECT_EQ(again->eos_token_id, 128001);
    EXPECT_EQ(BaseModelNameOrPath(*again, "/models/x"), "meta-llama/Llama-3.1-8B-Instruct");
  }
  config->name_or_path.clear();
  EXPECT_EQ(BaseModelNameOrPath(*config, "/models/x"), "/models/x");
}

// config.json as published on the Hub (values copied from the models' pages), in the form each was written in, and
// the same in the Transformers 5 form.
TEST(LlamaConfigTest, ReadsPublishedConfigsOfLlama3QwenAndMistral) {
  const json llama31_8b_instruct = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})");
  const json llama32_1b = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
  const json qwen25_05b = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  const json mistral_7b_v03 = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768})");
  const json mistral_7b_v01 = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})");

  // The Transformers 5 form of a Transformers 4 config: RoPE into rope_parameters, torch_dtype renamed to dtype,
  // and layer_types spelled out as Transformers 5 writes them for Qwen2.
  auto to_v5 = [](json j) {
    json rope = j.contains("rope_scaling") && j["rope_scaling"].is_object() ? j["rope_scaling"]
                                                                            : json{{"rope_type", "default"}};
    rope["rope_theta"] = j["rope_theta"];
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["rope_parameters"] = rope;
    j["dtype"] = j["torch_dtype"];
    j.erase("torch_dtype");
    if (j["model_type"] == "qwen2") j["layer_types"] = json(j["num_hidden_layers"].get<int>(), "full_attention");
    return j;
  };
  struct Expected {
    const char* name;
    json config;
    double rope_theta;
    std::optional<double> llama3_factor;
    bool tied, qkv_bias;
    std::optional<int64_t> sliding_window;
    std::vector<int64_t> eos;
    int64_t head_dim;
  };
  const std::vector<Expected> models = {
      {"Llama 3.1 8B Instruct",
       llama31_8b_instruct,
       500000.0,
       8.0,
       false,
       false,
       std::nullopt,
       {128001, 128008, 128009},
       128},
      {"Llama 3.2 1B", llama32_1b, 500000.0, 32.0, true, false, std::nullopt, {128001}, 64},
      {"Qwen2.5 0.5B", qwen25_05b, 1000000.0, std::nullopt, true, true, std::nullopt, {151643}, 64},
      {"Mistral 7B v0.3", mistral_7b_v03, 1000000.0, std::nullopt, false, false, std::nullopt, {2}, 128},
      {"Mistral 7B v0.1", mistral_7b_v01, 10000.0, std::nullopt, false, false, 4096, {2}, 128},
  };
  for (const Expected& m : models) {
    for (const json& form : {m.config, to_v5(m.config)}) {
      SCOPED_TRACE(std::string(m.name) + (form.contains("rope_parameters") ? " (transformers 5)" : ""));
      auto c = ParseLlamaConfig(form.dump());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(c->rope_theta, m.rope_theta);
      EXPECT_EQ(c->rope_scaling.has_value(), m.llama3_factor.has_value());
      if (m.llama3_factor) {
        EXPECT_EQ(c->rope_scaling->factor, *m.llama3_factor);
      }
      EXPECT_EQ(c->tie_word_embeddings, m.tied);
      EXPECT_EQ(c->qkv_bias, m.qkv_bias);
      EXPECT_FALSE(c->o_bias);
      EXPECT_EQ(c->sliding_window, m.sliding_window);
      EXPECT_EQ(c->eos_token_ids, m.eos);
      EXPECT_EQ(c->head_dim, m.head_dim);
      EXPECT_EQ(c->torch_dtype, "bfloat16");
    }
  }
  // Qwen2.5 with its sliding window switched on is a different network from ours: refused, naming the field.
  json sliding = qwen25_05b;
  sliding["use_sliding_window"] = true;
  EXPECT_NE(ParseLlamaConfig(sliding.dump()).status().message().find("use_sliding_window"), std::string::npos);
}

}  // namespace
}  // namespace parsyn::data
