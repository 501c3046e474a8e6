#include "weights/lora_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace parsyn::weights {
namespace {

constexpr char kGqaConfig[] = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 300})";

TEST(LoraLayoutTest, NamesShapesAndOrderFollowPeft) {
  LoraLayoutOptions options;
  options.r = 4;
  options.target_modules = {"v_proj", "down_proj", "q_proj"};  // order in the request does not matter
  auto specs = LoraLayout(kGqaConfig, options);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  ASSERT_EQ(specs->size(), 2u * 3u * 2u);
  const auto& s = *specs;
  EXPECT_EQ(s[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(s[0].shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(s[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(s[1].shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(s[2].name, "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");
  EXPECT_EQ(s[3].shape, (std::vector<int64_t>{16, 4}));  // 2 kv heads * head_dim 8
  EXPECT_EQ(s[4].name, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(s[4].shape, (std::vector<int64_t>{4, 96}));
  EXPECT_EQ(s[5].shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(s[6].name, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  for (const auto& spec : s) EXPECT_EQ(spec.dtype, DType::kF32);
}

TEST(LoraLayoutTest, AllLinearExpandsToSevenModules) {
  auto targets = NormalizeLoraTargets({"all-linear"});
  ASSERT_TRUE(targets.ok());
  EXPECT_EQ(*targets,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
}

TEST(LoraLayoutTest, ExplicitHeadDimIsHonoured) {
  auto dims = ParseLoraModelDims(R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 40,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})");
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  EXPECT_EQ(dims->head_dim, 16);
  LoraLayoutOptions options;
  options.r = 2;
  options.target_modules = {"o_proj"};
  auto specs = LoraLayout(*dims, options);
  ASSERT_TRUE(specs.ok());
  EXPECT_EQ((*specs)[0].shape, (std::vector<int64_t>{2, 64}));  // o_proj in = 4 heads * 16
}

TEST(LoraLayoutTest, RejectsBadInputsWithNamedReasons) {
  struct Case {
    std::string config;
    LoraLayoutOptions options;
    std::string message_part;
  };
  LoraLayoutOptions bad_module;
  bad_module.target_modules = {"q_proj", "qkv_proj"};
  LoraLayoutOptions bad_r;
  bad_r.r = 0;
  LoraLayoutOptions bad_dtype;
  bad_dtype.dtype = DType::kI32;
  const Case cases[] = {
      {"not json", {}, "not a JSON object"},
      {R"({"model_type": "gpt2"})", {}, "model_type 'gpt2' is not supported"},
      {R"({"model_type": "llama", "hidden_size": 64})", {}, "lacks 'intermediate_size'"},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
           "num_attention_heads": 8, "num_key_value_heads": 3})",
       {},
       "not a multiple of num_key_value_heads"},
      {R"({"model_type": "llama", "hidden_size": -1})", {}, "'hidden_size' must be positive"},
      {kGqaConfig, bad_module, "'qkv_proj' is not one of"},
      {kGqaConfig, bad_r, "r must be at least 1"},
      {kGqaConfig, bad_dtype, "F32, BF16 or F16"},
  };
  for (const Case& c : cases) {
    auto specs = LoraLayout(c.config, c.options);
    ASSERT_FALSE(specs.ok()) << c.config;
    EXPECT_EQ(specs.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(specs.status().message().find(c.message_part), std::string::npos) << specs.status().message();
  }
}

TEST(LoraLayoutTest, InitialAdaptersAreDeterministicBoundedAndBZero) {
  LoraLayoutOptions options;
  options.r = 4;
  auto a = InitialLoraAdapters(kGqaConfig, options, 42);
  auto b = InitialLoraAdapters(kGqaConfig, options, 42);
  auto c = InitialLoraAdapters(kGqaConfig, options, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(a->CheckSameLayout(*b).ok());
  bool any_differs_from_other_seed = false;
  for (size_t i = 0; i < a->size(); ++i) {
    const Tensor& t = (*a)[i];
    auto values = t.as<float>();
    auto same_seed = (*b)[i].as<float>();
    auto other_seed = (*c)[i].as<float>();
    const bool is_a = t.name.find("lora_A") != std::string::npos;
    const double bound = 1.0 / std::sqrt(64.0);  // every adapted module here (q, v) has in_features 64
    double max_abs = 0;
    for (size_t k = 0; k < values.size(); ++k) {
      EXPECT_EQ(values[k], same_seed[k]);
      if (values[k] != other_seed[k]) any_differs_from_other_seed = true;
      max_abs = std::max(max_abs, std::abs(static_cast<double>(values[k])));
    }
    if (is_a) {
      EXPECT_LE(max_abs, bound) << t.name;
      EXPECT_GT(max_abs, 0.8 * bound) << t.name;  // 256 draws spread over the whole range
    } else {
      EXPECT_EQ(max_abs, 0.0) << t.name;
    }
  }
  EXPECT_TRUE(any_differs_from_other_seed);
}

TEST(LoraLayoutTest, ValuesOfATensorDoNotDependOnOtherTargets) {
  LoraLayoutOptions qv;
  qv.r = 2;
  LoraLayoutOptions v_only = qv;
  v_only.target_modules = {"v_proj"};
  auto with_q = InitialLoraAdapters(kGqaConfig, qv, 7);
  auto without_q = InitialLoraAdapters(kGqaConfig, v_only, 7);
  ASSERT_TRUE(with_q.ok() && without_q.ok());
  const std::string name = LoraTensorName(1, "v_proj", "lora_A");
  const Tensor* x = with_q->Find(name);
  const Tensor* y = without_q->Find(name);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  ASSERT_EQ(x->data.size(), y->data.size());
  EXPECT_EQ(0, std::memcmp(x->data.data(), y->data.data(), x->data.size()));
}

TEST(LoraLayoutTest, Bf16AdaptersRoundTheSameDraws) {
  LoraLayoutOptions f32;
  f32.r = 2;
  LoraLayoutOptions bf16 = f32;
  bf16.dtype = DType::kBF16;
  auto x = InitialLoraAdapters(kGqaConfig, f32, 5);
  auto y = InitialLoraAdapters(kGqaConfig, bf16, 5);
  ASSERT_TRUE(x.ok() && y.ok());
  auto full = (*x)[0].as<float>();
  auto half = (*y)[0].as<uint16_t>();
  ASSERT_EQ(full.size(), half.size());
  for (size_t k = 0; k < full.size(); ++k) EXPECT_EQ(half[k], FloatToBf16(full[k]));
}

}  // namespace
}  // namespace parsyn::weights
