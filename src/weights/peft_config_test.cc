#include "weights/peft_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace parsyn::weights {
namespace {

using nlohmann::json;

TEST(PeftAdapterConfigTest, WritesPeftsFieldsAndReadsThemBack) {
  PeftLoraConfig config;
  config.r = 4;
  config.lora_alpha = 8;
  config.lora_dropout = 0.05;
  config.target_modules = {"v_proj", "q_proj", "down_proj"};
  config.base_model_name_or_path = "meta-llama/Llama-3.2-1B";
  const std::string text = PeftAdapterConfigJson(config);
  const json j = json::parse(text);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());  // PEFT's type
  EXPECT_EQ(j["lora_alpha"], 8);
  EXPECT_EQ(j["lora_dropout"], 0.05);
  EXPECT_EQ(j["target_modules"], json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["inference_mode"], true);
  EXPECT_EQ(j["use_rslora"], false);
  EXPECT_EQ(j["use_dora"], false);
  EXPECT_TRUE(j["modules_to_save"].is_null());
  EXPECT_EQ(j["base_model_name_or_path"], "meta-llama/Llama-3.2-1B");
  EXPECT_TRUE(text.starts_with("{\n  \"alpha_pattern\": {},\n  \"auto_mapping\": null,\n")) << text;  // sorted

  auto back = ParsePeftAdapterConfig(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->r, 4);
  EXPECT_EQ(back->lora_alpha, 8);
  EXPECT_EQ(back->lora_dropout, 0.05);
  EXPECT_EQ(back->target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(back->base_model_name_or_path, "meta-llama/Llama-3.2-1B");
  EXPECT_EQ(PeftAdapterConfigJson(*back), text);
}

TEST(PeftAdapterConfigTest, ReadsWhatPeftWritesAndRejectsOptionsWeDoNotImplementNamingThem) {
  // adapter_config.json as PEFT 0.17 saves a plain LoRA (every key it writes).
  const json peft = json::parse(R"({"alora_invocation_tokens": null, "alpha_pattern": {}, "arrow_config": null,
    "auto_mapping": null, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B", "bias": "none", "corda_config": null,
    "ensure_weight_tying": false, "eva_config": null, "exclude_modules": null, "fan_in_fan_out": false,
    "inference_mode": true, "init_lora_weights": true, "layer_replication": null, "layers_pattern": null,
    "layers_to_transform": null, "loftq_config": {}, "lora_alpha": 32, "lora_bias": false, "lora_dropout": 0.05,
    "megatron_config": null, "megatron_core": "megatron.core", "modules_to_save": null, "peft_type": "LORA",
    "peft_version": "0.17.1", "qalora_group_size": 16, "r": 16, "rank_pattern": {}, "revision": null,
    "target_modules": ["v_proj", "k_proj", "o_proj", "q_proj"], "target_parameters": null, "task_type": "CAUSAL_LM",
    "trainable_token_indices": null, "use_dora": false, "use_qalora": false, "use_rslora": false})");
  auto read = ParsePeftAdapterConfig(peft.dump());
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->r, 16);
  EXPECT_EQ(read->target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));

  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"use_dora", true, "use_dora is not supported (true): our LoRA does not implement it"},
      {"use_rslora", true, "use_rslora is not supported (true)"},
      {"bias", "lora_only", "bias \"lora_only\" is not supported (none)"},
      {"modules_to_save", {"lm_head"}, "modules_to_save is not supported ([\"lm_head\"])"},
      {"layer_replication", {{0, 2}, {1, 2}}, "layer_replication is not supported"},
      {"rank_pattern", {{"q_proj", 4}}, "rank_pattern is not supported"},
      {"alpha_pattern", {{"q_proj", 4}}, "alpha_pattern is not supported"},
      {"layers_to_transform", {0}, "layers_to_transform is not supported"},
      {"fan_in_fan_out", true, "fan_in_fan_out is not supported"},
      {"lora_bias", true, "lora_bias is not supported"},
      {"trainable_token_indices", {1, 2}, "trainable_token_indices is not supported"},
      {"init_lora_weights", "pissa", "init_lora_weights is not supported (\"pissa\"): this initialisation changes"},
      {"some_future_option", 3, "some_future_option is not supported (3): an adapter option this version"},
      {"target_modules", ".*proj", "regular expressions are not supported"},
      {"task_type", "SEQ_CLS", "task_type \"SEQ_CLS\" is not CAUSAL_LM"},
      {"peft_type", "IA3", "peft_type 'IA3' is not LORA"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    json j = peft;
    j[c.key] = c.value;
    auto parsed = ParsePeftAdapterConfig(j.dump());
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos) << parsed.status().message();
  }
  // Unknown options that are off are what a newer PEFT writes by default: accepted.
  json newer = peft;
  newer["some_future_flag"] = false;
  newer["some_future_list"] = nullptr;
  EXPECT_TRUE(ParsePeftAdapterConfig(newer.dump()).ok());
}

// base_model_name_or_path: the Hub id config.json names, else the folder's name, never a path of this machine.
TEST(PeftAdapterConfigTest, BaseModelNameIsTheHubIdElseTheFolderName) {
  EXPECT_EQ(PeftBaseModelName("meta-llama/Llama-3.2-1B", "/models/llama"), "meta-llama/Llama-3.2-1B");
  EXPECT_EQ(PeftBaseModelName("", "/home/u/models/my-model"), "my-model");
  EXPECT_EQ(PeftBaseModelName("", "models/my-model/"), "my-model");
  EXPECT_EQ(PeftBaseModelName("", "./my-model/."), "my-model");
}

}  // namespace
}  // namespace parsyn::weights
