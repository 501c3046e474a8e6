#include "trainer/llama_model.h"
#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/causal_lm.h"
#include "trainer/model_init.h"
#include "trainer/test_checkpoints.h"
#include "trainer/torch_weights.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

using testing::FreshTempDir;
using testing::MaxAbsDiff;
using testing::TinyConfig;
using testing::WriteRandomCheckpoint;

// Three rows of 7: full; right-padded (4 real); left-padded (2 pads).
std::pair<torch::Tensor, torch::Tensor> PaddedBatch(int64_t vocab) {
  torch::Tensor ids = torch::arange(21, torch::kInt64).view({3, 7}).mul(7).remainder(vocab);
  torch::Tensor mask = torch::ones({3, 7}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(4)}, 0);
  mask.index_put_({2, torch::indexing::Slice(0, 2)}, 0);
  ids = ids.masked_fill(mask == 0, 0);
  return {ids, mask};
}

std::filesystem::path ReferenceScript() {
  return std::filesystem::path(test_support::SourcePath("tests/reference/llama_forward.py"));
}

struct ForwardCase {
  std::string name;
  LlamaConfig config;
  weights::DType dtype = weights::DType::kF32;
  int num_shards = 1;
  ConfigJsonForm form = ConfigJsonForm::kTransformers4;
};

TEST(LlamaForwardTest, MatchesIndependentPythonReference) {
  std::vector<ForwardCase> cases;
  cases.push_back({"llama_untied", TinyConfig("llama")});
  cases.push_back({"llama_tied", TinyConfig("llama")});
  cases.back().config.tie_word_embeddings = true;
  cases.push_back({"qwen2_bias_gqa", TinyConfig("qwen2")});
  cases.back().config.num_key_value_heads = 2;
  cases.back().config.tie_word_embeddings = true;
  cases.push_back({"llama3_rope_scaling_gqa", TinyConfig("llama")});
  cases.back().config.num_key_value_heads = 1;
  cases.back().config.rope_theta = 500000.0;
  cases.back().config.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 64};
  cases.push_back(cases.back());  // the same, with its config.json in Transformers 5's form (rope_parameters)
  cases.back().name = "llama3_rope_parameters_v5";
  cases.back().form = ConfigJsonForm::kTransformers5;
  cases.push_back({"mistral_sliding_window", TinyConfig("mistral")});
  cases.back().config.sliding_window = 3;
  cases.push_back({"llama_bf16_sharded", TinyConfig("llama")});
  cases.back().dtype = weights::DType::kBF16;
  cases.back().num_shards = 3;

  const auto root = FreshTempDir("cases");
  auto [ids, mask] = PaddedBatch(50);
  std::string command = "/usr/bin/python3 " + ReferenceScript().string();
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto dir = root / cases[i].name;
    WriteRandomCheckpoint(dir, cases[i].config, 100 + i, cases[i].dtype, cases[i].num_shards);
    if (cases[i].form != ConfigJsonForm::kTransformers4) {
      LlamaConfig written = cases[i].config;
      written.torch_dtype = cases[i].dtype == weights::DType::kBF16 ? "bfloat16" : "float32";
      std::ofstream(dir / "config.json") << LlamaConfigToJson(written, cases[i].form);
    }
    weights::WeightSet inputs;
    ASSERT_TRUE(AppendToWeightSet(inputs, "input_ids", ids, weights::DType::kI64).ok());
    ASSERT_TRUE(AppendToWeightSet(inputs, "attention_mask", mask, weights::DType::kI64).ok());
    ASSERT_TRUE(weights::WriteSafetensorsFile(inputs, dir / "inputs.safetensors").ok());
    command += " " + dir.string() + " " + (dir / "inputs.safetensors").string() + " " +
               (dir / "reference.safetensors").string();
  }
  const auto log = root / "python.log";
  ASSERT_EQ(std::system((command + " > " + log.string() + " 2>&1").c_str()), 0)
      << command << "\n"
      << (std::stringstream() << std::ifstream(log).rdbuf()).str();

  torch::Tensor real = mask.to(torch::kBool);  // padding positions' logits are not meaningful
  for (const ForwardCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto model = LlamaModel::Load(root / c.name);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    torch::Tensor logits;
    {
      torch::NoGradGuard no_grad;
      logits = (*model)->Forward(ids, mask);
    }
    auto reference = weights::ReadSafetensorsFile(root / c.name / "reference.safetensors");
    ASSERT_TRUE(reference.ok()) << reference.status().ToString();
    torch::Tensor expected = ToTorch(*reference->Find("logits"));
    ASSERT_EQ(logits.sizes(), expected.sizes());
    const double diff = MaxAbsDiff(logits.index({real}), expected.index({real}));
    const double scale = expected.index({real}).abs().max().item<double>();
    std::printf("[ forward  ] %-26s max |ours - reference| = %.3g (max |logit| %.3g)\n", c.name.c_str(), diff, scale);
    EXPECT_LE(diff, 1e-4);
  }
}

// Transformers 5 moved RoPE into rope_parameters and renamed torch_dtype; the same checkpoint with its config.json in
// either form, or in a mixture of both, is the same model.
TEST(LlamaForwardTest, BothConfigFormsGiveIdenticalLogits) {
  LlamaConfig config = TinyConfig("llama");
  config.num_key_value_heads = 2;
  config.rope_theta = 500000.0;
  config.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 16};
  const auto dir = FreshTempDir("forms");
  WriteRandomCheckpoint(dir, config, 11);
  auto [ids, mask] = PaddedBatch(50);
  auto logits_with = [&](const std::string& config_json) {
    std::ofstream(dir / "config.json", std::ios::trunc) << config_json;
    auto model = LlamaModel::Load(dir);
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    torch::NoGradGuard no_grad;
    return (*model)->Forward(ids, mask);
  };
  const torch::Tensor v4 = logits_with(LlamaConfigToJson(config, ConfigJsonForm::kTransformers4));
  const torch::Tensor v5 = logits_with(LlamaConfigToJson(config, ConfigJsonForm::kTransformers5));
  nlohmann::json mixed = nlohmann::json::parse(LlamaConfigToJson(config, ConfigJsonForm::kTransformers5));
  mixed["rope_theta"] = 500000.0;  // also at the top, as Transformers 4 wrote it: equal, so allowed
  mixed["torch_dtype"] = "float32";
  const torch::Tensor both = logits_with(mixed.dump());
  EXPECT_TRUE(torch::equal(v4, v5));
  EXPECT_TRUE(torch::equal(v4, both));
  // Without its scaling (what reading only the old keys of a Transformers 5 file gave) the model is another one.
  LlamaConfig unscaled = config;
  unscaled.rope_scaling.reset();
  unscaled.rope_theta = 10000.0;
  const torch::Tensor wrong = logits_with(LlamaConfigToJson(unscaled));
  EXPECT_GT(MaxAbsDiff(v4, wrong), 1e-3);
}

TEST(LlamaForwardTest, PaddingDoesNotChangeRealTokensLogits) {
  const auto dir = FreshTempDir("model");
  WriteRandomCheckpoint(dir, TinyConfig(), 1);
  auto model = LlamaModel::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::tensor({5, 9, 13, 2}, torch::kInt64).view({1, 4});
  torch::Tensor alone = (*model)->Forward(ids, torch::Tensor());
  torch::Tensor left = torch::cat({torch::zeros({1, 3}, torch::kInt64), ids}, 1);
  torch::Tensor left_mask = torch::cat({torch::zeros({1, 3}, torch::kInt64), torch::ones({1, 4}, torch::kInt64)}, 1);
  torch::Tensor padded = (*model)->Forward(left, left_mask);
  EXPECT_LE(MaxAbsDiff(alone, padded.slice(1, 3)), 1e-5);
  EXPECT_TRUE(torch::isfinite(padded).all().item<bool>());
}

TEST(LlamaForwardTest, Bf16ComputeStaysCloseToFp32) {
  const auto dir = FreshTempDir("model");
  WriteRandomCheckpoint(dir, TinyConfig(), 2);
  ModelOptions bf16;
  bf16.compute_dtype = torch::kBFloat16;
  auto fp32_model = LlamaModel::Load(dir);
  auto bf16_model = LlamaModel::Load(dir, bf16);
  ASSERT_TRUE(fp32_model.ok() && bf16_model.ok());
  auto [ids, mask] = PaddedBatch(50);
  torch::NoGradGuard no_grad;
  torch::Tensor a = (*fp32_model)->Forward(ids, mask);
  torch::Tensor b = (*bf16_model)->Forward(ids, mask);
  EXPECT_EQ(b.scalar_type(), torch::kFloat32);
  const double diff = MaxAbsDiff(a.index({mask.to(torch::kBool)}), b.index({mask.to(torch::kBool)}));
  std::printf("[ bf16     ] max |bf16 compute - fp32| = %.3g\n", diff);
  EXPECT_LE(diff, 0.1);  // bf16 keeps ~3 significant digits; logits here are O(1)
}

// Rewrites model.safetensors of a tiny llama with one change, and returns Load's status.
Status LoadWithEdit(const std::string& name,
                    const std::function<void(weights::WeightSet&, const weights::Tensor&)>& edit) {
  const auto dir = FreshTempDir(name);
  WriteRandomCheckpoint(dir, TinyConfig(), 3);
  auto original = weights::ReadSafetensorsFile(dir / "model.safetensors");
  EXPECT_TRUE(original.ok());
  weights::WeightSet edited;
  for (const weights::Tensor& t : original->tensors()) edit(edited, t);
  EXPECT_TRUE(weights::WriteSafetensorsFile(edited, dir / "model.safetensors").ok());
  auto model = LlamaModel::Load(dir);
  return model.ok() ? Status::Ok() : model.status();
}

TEST(LlamaLoadTest, NamesMissingExtraAndMisshapenTensors) {
  Status missing = LoadWithEdit("missing", [](weights::WeightSet& set, const weights::Tensor& t) {
    if (t.name != "model.layers.1.mlp.up_proj.weight") {
      ASSERT_TRUE(set.Add(t.name, t.dtype, t.shape, t.data).ok());
    }
  });
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("lacks tensor 'model.layers.1.mlp.up_proj.weight' (expected shape [48, 32])"),
            std::string::npos)
      << missing.message();

  Status extra = LoadWithEdit("extra", [](weights::WeightSet& set, const weights::Tensor& t) {
    ASSERT_TRUE(set.Add(t.name, t.dtype, t.shape, t.data).ok());
    if (t.name == "model.norm.weight") {
      ASSERT_TRUE(set.Add("model.layers.0.self_attn.q_proj.bias", t.dtype, t.shape, t.data).ok());
    }
  });
  EXPECT_EQ(extra.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(extra.message().find("has tensor 'model.layers.0.self_attn.q_proj.bias', which a llama model"),
            std::string::npos)
      << extra.message();

  Status misshapen = LoadWithEdit("misshapen", [](weights::WeightSet& set, const weights::Tensor& t) {
    if (t.name == "model.layers.0.self_attn.k_proj.weight") {
      ASSERT_TRUE(set.Add(t.name, t.dtype, {16, 64}, t.data).ok());
    } else {
      ASSERT_TRUE(set.Add(t.name, t.dtype, t.shape, t.data).ok());
    }
  });
  EXPECT_EQ(misshapen.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misshapen.message().find("'model.layers.0.self_attn.k_proj.weight' has shape [16, 64], config.json "
                                     "implies [32, 32]"),
            std::string::npos)
      << misshapen.message();

  Status inv_freq_skipped = LoadWithEdit("inv_freq", [](weights::WeightSet& set, const weights::Tensor& t) {
    ASSERT_TRUE(set.Add(t.name, t.dtype, t.shape, t.data).ok());
    if (t.name == "model.norm.weight") {
      ASSERT_TRUE(set.Add("model.layers.0.self_attn.rotary_emb.inv_freq", t.dtype, {4}, t.data.subspan(0, 16)).ok());
    }
  });
  EXPECT_TRUE(inv_freq_skipped.ok()) << inv_freq_skipped.ToString();
}

TEST(LlamaLoadTest, ShardIndexMustMatchTheShards) {
  const auto dir = FreshTempDir("model");
  WriteRandomCheckpoint(dir, TinyConfig(), 5, weights::DType::kF16, 2);
  ASSERT_TRUE(LlamaModel::Load(dir).ok());  // fp16 shards load as they are
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})";
  auto misplaced = ReadModelFolder(dir);
  EXPECT_EQ(misplaced.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misplaced.status().message().find("places tensor 'model.norm.weight' in model-00001-of-00002.safetensors"),
            std::string::npos)
      << misplaced.status().message();
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "../model-00002-of-00002.safetensors"}})";
  EXPECT_EQ(ReadModelFolder(dir).status().code(), StatusCode::kInvalidArgument);
}

TEST(LlamaLoadTest, MissingFolderAndBadConfigAreNamed) {
  auto absent = LlamaModel::Load("/nonexistent/parsyn/model");
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);

  auto bad_type = ParseLlamaConfig(R"({"model_type": "gpt_neox", "vocab_size": 5})");
  EXPECT_EQ(bad_type.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_type.status().message().find("model_type 'gpt_neox' is not supported"), std::string::npos);

  LlamaConfig c = TinyConfig();
  std::string text = LlamaConfigToJson(c);
  auto round_trip = ParseLlamaConfig(text);
  ASSERT_TRUE(round_trip.ok());
  EXPECT_EQ(round_trip->head_dim, 8);
  const std::string yarn = R"({"model_type": "llama", "vocab_size": 5, "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4}})";
  auto unsupported = ParseLlamaConfig(yarn);
  EXPECT_EQ(unsupported.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unsupported.status().message().find("rope_scaling.rope_type 'yarn' is not supported"), std::string::npos);
}

TEST(ModelInitTest, WritesALoadableDeterministicFolder) {
  ModelInitOptions options;
  options.architecture = "qwen2";
  options.hidden_size = 32;
  options.num_hidden_layers = 1;
  options.num_attention_heads = 4;
  options.num_key_value_heads = 2;
  options.tie_word_embeddings = true;
  options.seed = 9;
  const auto a = FreshTempDir("a");
  const auto b = FreshTempDir("b");
  auto config = InitModelFolder(a, options);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_TRUE(InitModelFolder(b, options).ok());
  EXPECT_EQ(config->vocab_size, 259);  // the byte-level tokenizer
  EXPECT_EQ(config->intermediate_size, 96);
  EXPECT_EQ(config->bos_token_id, 257);
  EXPECT_TRUE(std::filesystem::exists(a / "tokenizer.json"));
  auto bytes = [](const std::filesystem::path& p) {
    return (std::stringstream() << std::ifstream(p, std::ios::binary).rdbuf()).str();
  };
  EXPECT_EQ(bytes(a / "model.safetensors"), bytes(b / "model.safetensors"));

  auto model = LlamaModel::Load(a);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->config().model_type, "qwen2");
  EXPECT_TRUE((*model)->config().qkv_bias);

  auto again = InitModelFolder(a, options);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  options.num_key_value_heads = 3;
  auto bad = InitModelFolder(FreshTempDir("c"), options);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not a multiple of num_key_value_heads 3"), std::string::npos);
}

TEST(NextTokenLossTest, ShiftsCountsAndIgnoresMinus100) {
  // V = 3. Row 0 targets positions 1, 2; row 1 has no counted position.
  torch::Tensor logits = torch::zeros({2, 3, 3});
  logits.index_put_({0, 0, 1}, 5.0);  // predicts 1 for position 1: correct
  logits.index_put_({0, 1, 0}, 5.0);  // predicts 0 for position 2 whose label is 2: wrong
  torch::Tensor labels = torch::tensor({7, 1, 2, -100, -100, -100}, torch::kInt64).view({2, 3});
  torch::Tensor mask = torch::tensor({1, 1, 1, 1, 1, 0}, torch::kInt64).view({2, 3});
  StepOutput out = NextTokenLoss(logits, labels, mask);
  EXPECT_EQ(out.num_counted, 2);
  EXPECT_EQ(out.num_correct, 1);
  EXPECT_EQ(out.num_tokens, 5);
  EXPECT_EQ(out.num_rows, 1);
  EXPECT_EQ(out.num_exact_rows, 0);
  const double z = std::log(std::exp(5.0) + 2.0);
  EXPECT_NEAR(out.loss.item<double>(), ((z - 5.0) + z) / 2, 1e-5);

  // One token per row predicts nothing: no counted position, a zero loss.
  StepOutput single = NextTokenLoss(torch::zeros({2, 1, 3}), torch::zeros({2, 1}, torch::kInt64), torch::Tensor());
  EXPECT_EQ(single.num_counted, 0);
  EXPECT_EQ(single.num_rows, 0);
  EXPECT_EQ(single.loss.item<double>(), 0.0);
}

TEST(CausalLmTest, FullFineTuningExportsAndImportsHuggingFaceNames) {
  const auto dir = FreshTempDir("model");
  LlamaConfig config = TinyConfig();
  config.tie_word_embeddings = true;
  WriteRandomCheckpoint(dir, config, 4);
  CausalLmOptions options;
  options.exchange_dtype = weights::DType::kBF16;
  auto lm = CausalLm::Load(dir, options);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  auto names = (*lm)->TrainableNames();
  ASSERT_EQ(names.size(), LlamaParameterSpecs(config).size());
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_FALSE((*lm)->UsesWeightDecay("model.norm.weight"));
  EXPECT_TRUE((*lm)->UsesWeightDecay("model.layers.0.mlp.up_proj.weight"));
  auto exported = (*lm)->ExportTrainable();
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ((*exported)[0].dtype, weights::DType::kBF16);
  EXPECT_TRUE((*lm)->ImportTrainable(*exported).ok());

  auto fp32 = (*lm)->model().ExportWeights(weights::DType::kF32);
  ASSERT_TRUE(fp32.ok());
  Status wrong_dtype = (*lm)->ImportTrainable(*fp32);
  EXPECT_EQ(wrong_dtype.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_dtype.message().find("has dtype F32, the exchange dtype is BF16"), std::string::npos);

  auto [ids, mask] = PaddedBatch(50);
  Batch batch{ids, mask, {}, ids.masked_fill(mask == 0, -100)};
  StepOutput out = (*lm)->Forward(batch);
  out.loss.backward();
  for (const torch::Tensor& p : (*lm)->TrainableParameters()) EXPECT_TRUE(p.grad().defined());
}

}  // namespace
}  // namespace parsyn::trainer
