#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/causal_lm.h"
#include "trainer/llama_model.h"
#include "trainer/peft_io.h"
#include "trainer/test_checkpoints.h"
#include "trainer/torch_weights.h"
#include "weights/lora_layout.h"

namespace parsyn::trainer {
namespace {

using testing::FreshTempDir;
using testing::MaxAbsDiff;
using testing::TinyConfig;
using testing::WriteRandomCheckpoint;

std::unique_ptr<LlamaModel> TinyModel(const std::filesystem::path& dir, const LlamaConfig& config) {
  WriteRandomCheckpoint(dir, config, 11);
  auto model = LlamaModel::Load(dir);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

torch::Tensor Ids() { return torch::tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, torch::kInt64).view({2, 6}); }

// Gives every adapter (B included) random values, so the adapters change the output.
void RandomizeAdapters(LlamaModel& model, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : model.lora_parameters()) {
    torch::Tensor t = tensor;
    t.normal_(0.0, 0.1, generator);
  }
}

bool SameBytes(const weights::WeightSet& a, const weights::WeightSet& b) {
  if (!a.CheckSameLayout(b).ok()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size()) != 0) return false;
  }
  return true;
}

LoraSettings AllLinear() {
  LoraSettings s;
  s.r = 4;
  s.alpha = 8;
  s.target_modules = {"all-linear"};
  return s;
}

TEST(LoraTest, AdaptersMatchTheTorchFreeLayoutAndInitialValues) {
  LlamaConfig config = TinyConfig("qwen2");
  config.num_key_value_heads = 2;
  auto model = TinyModel(FreshTempDir("model"), config);
  LoraSettings settings;
  settings.r = 4;
  settings.target_modules = {"v_proj", "q_proj", "down_proj"};
  ASSERT_TRUE(model->AttachLora(settings, 77).ok());
  auto ours = model->ExportLora(weights::DType::kF32);
  ASSERT_TRUE(ours.ok());
  weights::LoraLayoutOptions layout;
  layout.r = 4;
  layout.target_modules = settings.target_modules;
  auto coordinator = weights::InitialLoraAdapters(LlamaConfigToJson(config), layout, 77);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  EXPECT_TRUE(ours->CheckSameLayout(*coordinator).ok()) << ours->CheckSameLayout(*coordinator).ToString();
  EXPECT_TRUE(SameBytes(*ours, *coordinator));
  EXPECT_EQ((*ours)[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
}

TEST(LoraTest, ZeroBLeavesTheBaseOutputAndOnlyAdaptersTrain) {
  auto model = TinyModel(FreshTempDir("model"), TinyConfig());
  torch::Tensor before;
  {
    torch::NoGradGuard no_grad;
    before = model->Forward(Ids(), torch::Tensor());
  }
  CausalLmOptions options;
  options.lora = AllLinear();
  ASSERT_TRUE(model->AttachLora(*options.lora, 1).ok());
  CausalLm lm(std::move(model), options);
  Batch batch{Ids(), torch::ones({2, 6}, torch::kInt64), {}, Ids()};
  StepOutput out = lm.Forward(batch);
  {
    torch::NoGradGuard no_grad;
    EXPECT_LE(MaxAbsDiff(before, lm.model().Forward(Ids(), torch::Tensor())), 1e-6);
  }
  out.loss.backward();
  const auto names = lm.TrainableNames();
  ASSERT_EQ(names.size(), 2u * 7u * 2u);
  EXPECT_EQ(names[1], "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  for (const torch::Tensor& p : lm.TrainableParameters()) EXPECT_TRUE(p.grad().defined());
  for (const auto& [name, p] : lm.model().named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
}

TEST(LoraTest, Fp32AdaptersTrainOverABf16Base) {
  const auto dir = FreshTempDir("model");
  WriteRandomCheckpoint(dir, TinyConfig(), 12, weights::DType::kBF16);
  CausalLmOptions options;
  options.model.param_dtype = torch::kBFloat16;
  options.model.compute_dtype = torch::kBFloat16;
  options.lora = AllLinear();
  auto lm = CausalLm::Load(dir, options);
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  RandomizeAdapters((*lm)->model(), 13);
  Batch batch{Ids(), torch::ones({2, 6}, torch::kInt64), {}, Ids()};
  StepOutput out = (*lm)->Forward(batch);
  EXPECT_EQ(out.loss.scalar_type(), torch::kFloat32);
  out.loss.backward();
  for (const torch::Tensor& p : (*lm)->TrainableParameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat32);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  }
  // Merging into bf16 weights rounds W + scale * B A once to bf16: the merged model stays within bf16 noise.
  torch::NoGradGuard no_grad;
  torch::Tensor unmerged = (*lm)->model().Forward(Ids(), torch::Tensor());
  ASSERT_TRUE((*lm)->model().MergeLora().ok());
  EXPECT_LE(MaxAbsDiff(unmerged, (*lm)->model().Forward(Ids(), torch::Tensor())), 0.1);
}

TEST(LoraTest, MergedForwardEqualsUnmergedForward) {
  const auto dir = FreshTempDir("model");
  auto model = TinyModel(dir, TinyConfig());
  ASSERT_TRUE(model->AttachLora(AllLinear(), 2).ok());
  RandomizeAdapters(*model, 3);
  torch::NoGradGuard no_grad;
  torch::Tensor unmerged = model->Forward(Ids(), torch::Tensor());
  ASSERT_TRUE(model->MergeLora().ok());
  EXPECT_FALSE(model->has_lora());
  torch::Tensor merged = model->Forward(Ids(), torch::Tensor());
  const double diff = MaxAbsDiff(unmerged, merged);
  std::printf("[ lora     ] max |merged - unmerged| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-5);  // fp32: only the order of the additions differs
  EXPECT_GT(MaxAbsDiff(unmerged, TinyModel(FreshTempDir("base"), TinyConfig())->Forward(Ids(), torch::Tensor())),
            1e-2);  // the adapters did change the output
  EXPECT_EQ(model->MergeLora().code(), StatusCode::kFailedPrecondition);
}

TEST(LoraTest, MergedModelFolderLoadsAndReproducesTheAdaptedModel) {
  const auto dir = FreshTempDir("model");
  auto model = TinyModel(dir, TinyConfig());
  std::ofstream(dir / "tokenizer.json") << "{}";
  ASSERT_TRUE(model->AttachLora(AllLinear(), 2).ok());
  RandomizeAdapters(*model, 4);
  torch::NoGradGuard no_grad;
  torch::Tensor adapted = model->Forward(Ids(), torch::Tensor());
  const auto merged_dir = FreshTempDir("merged");
  ASSERT_TRUE(ExportMergedModel(*model, merged_dir, weights::DType::kF32, dir).ok());
  EXPECT_TRUE(std::filesystem::exists(merged_dir / "tokenizer.json"));
  auto merged = LlamaModel::Load(merged_dir);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_LE(MaxAbsDiff(adapted, (*merged)->Forward(Ids(), torch::Tensor())), 1e-5);
}

// What `parsyn adapter merge` runs: base folder + adapter folder -> merged folder, whose logits are the base's with
// the adapter applied.
TEST(LoraTest, MergeAdapterFolderEqualsBasePlusAdapter) {
  const auto dir = FreshTempDir("model");
  LlamaConfig config = TinyConfig("qwen2");  // q/k/v bias: the merge leaves biases as they are
  config.num_key_value_heads = 2;
  auto model = TinyModel(dir, config);
  std::ofstream(dir / "tokenizer.json") << "{}";
  ASSERT_TRUE(model->AttachLora(AllLinear(), 3).ok());
  RandomizeAdapters(*model, 7);
  const auto adapter_dir = FreshTempDir("adapter");
  ASSERT_TRUE(SaveAdapter(*model, adapter_dir, "Qwen/Qwen2.5-0.5B").ok());
  const auto merged_dir = FreshTempDir("merged");
  ASSERT_TRUE(MergeAdapterFolder(dir, adapter_dir, merged_dir).ok());

  auto base_plus_adapter = LlamaModel::Load(dir);
  ASSERT_TRUE(base_plus_adapter.ok());
  ASSERT_TRUE(LoadAdapterInto(**base_plus_adapter, adapter_dir).ok());
  auto merged = LlamaModel::Load(merged_dir);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_FALSE((*merged)->has_lora());
  EXPECT_EQ((*merged)->config().model_type, "qwen2");
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = (*base_plus_adapter)->Forward(Ids(), torch::Tensor());
  const double diff = MaxAbsDiff(expected, (*merged)->Forward(Ids(), torch::Tensor()));
  std::printf("[ merge    ] max |merged folder - base + adapter| = %.3g\n", diff);
  EXPECT_LE(diff, 1e-5);
  auto base = LlamaModel::Load(dir);
  ASSERT_TRUE(base.ok());
  EXPECT_GT(MaxAbsDiff(expected, (*base)->Forward(Ids(), torch::Tensor())), 1e-2);  // the adapter changes the output
  EXPECT_EQ(MergeAdapterFolder(dir, adapter_dir, merged_dir).code(), StatusCode::kAlreadyExists);
}

TEST(LoraTest, PeftSaveLoadRoundTripIsExact) {
  const auto dir = FreshTempDir("model");
  auto model = TinyModel(dir, TinyConfig());
  LoraSettings settings;
  settings.r = 2;
  settings.alpha = 5;
  settings.dropout = 0.1;
  settings.target_modules = {"q_proj", "v_proj", "up_proj"};
  ASSERT_TRUE(model->AttachLora(settings, 5).ok());
  RandomizeAdapters(*model, 6);
  const auto adapter_dir = FreshTempDir("adapter");
  ASSERT_TRUE(SaveAdapter(*model, adapter_dir, "tiny-llama").ok());

  std::ifstream config_file(adapter_dir / "adapter_config.json");
  nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "CAUSAL_LM");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 5.0);
  EXPECT_EQ(config["lora_dropout"], 0.1);
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj", "up_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "tiny-llama");
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["fan_in_fan_out"], false);

  auto fresh = LlamaModel::Load(dir);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(LoadAdapterInto(**fresh, adapter_dir).ok());
  EXPECT_EQ((*fresh)->lora_settings().alpha, 5.0);
  auto saved = model->ExportLora(weights::DType::kF32);
  auto loaded = (*fresh)->ExportLora(weights::DType::kF32);
  ASSERT_TRUE(saved.ok() && loaded.ok());
  EXPECT_TRUE(SameBytes(*saved, *loaded));
  torch::NoGradGuard no_grad;
  EXPECT_EQ(MaxAbsDiff(model->Forward(Ids(), torch::Tensor()), (*fresh)->Forward(Ids(), torch::Tensor())), 0.0);
}

TEST(LoraTest, ImportRejectsAdaptersOfAnotherRankOrTarget) {
  auto model = TinyModel(FreshTempDir("model"), TinyConfig());
  ASSERT_TRUE(model->AttachLora(LoraSettings{}, 1).ok());  // r 8, q and v
  weights::LoraLayoutOptions r4;
  r4.r = 4;
  auto other_rank = weights::InitialLoraAdapters(LlamaConfigToJson(TinyConfig()), r4, 1);
  ASSERT_TRUE(other_rank.ok());
  Status rank = model->ImportLora(*other_rank);
  EXPECT_EQ(rank.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank.message().find("'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [4, 32], "
                                "the model's is [8, 32]"),
            std::string::npos)
      << rank.message();

  weights::LoraLayoutOptions qkv;
  qkv.target_modules = {"q_proj", "k_proj", "v_proj"};
  auto other_targets = weights::InitialLoraAdapters(LlamaConfigToJson(TinyConfig()), qkv, 1);
  ASSERT_TRUE(other_targets.ok());
  Status targets = model->ImportLora(*other_targets);
  EXPECT_EQ(targets.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(targets.message().find("k_proj.lora_A.weight', which this model's LoRA does not"), std::string::npos)
      << targets.message();
  EXPECT_EQ(model->AttachLora(LoraSettings{}, 1).code(), StatusCode::kFailedPrecondition);
}

TEST(PeftConfigTest, RejectsWhatOurLoraDoesNotImplement) {
  struct Case {
    std::string json;
    std::string message_part;
  };
  const Case cases[] = {
      {R"({"peft_type": "IA3", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]})", "peft_type 'IA3'"},
      {R"({"peft_type": "LORA", "lora_alpha": 16, "target_modules": ["q_proj"]})", "lacks integer 'r'"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "use_dora": true})",
       "use_dora is not supported"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "all"})",
       "bias \"all\" is not supported"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
           "rank_pattern": {"q_proj": 4}})",
       "rank_pattern is not supported"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["wq"]})", "'wq' is not one of"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ".*proj"})",
       "must be a list of module names"},
      {R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "task_type": "SEQ_CLS"})",
       "task_type \"SEQ_CLS\" is not CAUSAL_LM"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseAdapterConfig(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message_part), std::string::npos) << parsed.status().message();
  }
  // What PEFT itself writes parses, including its null and empty fields.
  auto peft = ParseAdapterConfig(R"({"alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "m",
    "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
    "layers_pattern": null, "layers_to_transform": null, "lora_alpha": 32, "lora_dropout": 0.05,
    "modules_to_save": null, "peft_type": "LORA", "r": 16, "rank_pattern": {}, "revision": null,
    "target_modules": ["v_proj", "q_proj"], "task_type": "CAUSAL_LM", "use_dora": false, "use_rslora": false})");
  ASSERT_TRUE(peft.ok()) << peft.status().ToString();
  EXPECT_EQ(peft->lora.r, 16);
  EXPECT_EQ(peft->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
}

}  // namespace
}  // namespace parsyn::trainer
