// Learning tests: a tiny Llama (byte vocabulary, hidden 64, 2 layers) learns a deterministic synthetic task through
// the real loop, with full fine-tuning and with LoRA, in fp32 and bf16.
//
// The task: after <bos> and a letter, continue the alphabet for 8 letters, wrapping z -> a ("k" -> "lmnopqrs").
// Loss and accuracy count the 8 continuation tokens only (the letter is the prompt). All 26 rows are trained and
// evaluated: the point is that loop + model + LoRA + precision actually fit a function, not generalisation.
#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "trainer/causal_lm.h"
#include "trainer/lm_batches.h"
#include "trainer/train_loop.h"

namespace parsyn::trainer {
namespace {

constexpr int kContinuation = 8;

LmExamples AlphabetTask() {
  std::vector<std::vector<int32_t>> ids;
  std::vector<int64_t> prompt_lengths;
  for (int start = 0; start < 26; ++start) {
    std::vector<int32_t> row = {data::kByteLevelBosId, 'a' + start};
    for (int k = 1; k <= kContinuation; ++k) row.push_back('a' + (start + k) % 26);
    ids.push_back(std::move(row));
    prompt_lengths.push_back(2);
  }
  return LmExamples::FromIds(std::move(ids), std::move(prompt_lengths), data::kByteLevelPadId);
}

LlamaConfig TinyByteLlama() {
  LlamaConfig config;
  config.vocab_size = data::kByteLevelVocabSize;
  config.hidden_size = 64;
  config.intermediate_size = 128;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 16;
  config.max_position_embeddings = 64;
  return config;
}

struct LearningRun {
  double accuracy = 0;
  double exact_match = 0;
  double first_loss = 0;
  double final_loss = 0;
};

LearningRun TrainAlphabet(bool lora, MixedPrecision precision) {
  ModelOptions model_options;
  model_options.compute_dtype = precision == MixedPrecision::kBf16 ? torch::kBFloat16 : torch::kFloat32;
  auto llama = LlamaModel::RandomInit(TinyByteLlama(), 7, model_options);
  EXPECT_TRUE(llama.ok()) << llama.status().ToString();
  CausalLmOptions options;
  options.model = model_options;
  if (lora) {
    LoraSettings settings;
    settings.r = 8;
    settings.alpha = 16;
    settings.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    EXPECT_TRUE((*llama)->AttachLora(settings, 7).ok());
  }
  CausalLm model(std::move(llama).value(), options);
  EXPECT_EQ(model.uses_lora(), lora);

  const LmExamples examples = AlphabetTask();
  TrainOptions train;
  train.config.batch_size = 26;
  train.config.learning_rate = lora ? 1e-2 : 3e-3;
  train.config.warmup_steps = 10;
  train.config.lr_scheduler = LrScheduler::kConstant;
  train.config.mixed_precision = precision;
  train.max_steps = lora ? 150 : 120;
  train.seed = 3;
  train.language_model = true;
  train.autocast = false;  // CausalLm runs bf16 itself (compute dtype)
  LearningRun run;
  train.on_step = [&](const StepProgress& p) {
    if (p.step == 1) run.first_loss = p.loss;
    run.final_loss = p.loss;
  };
  auto summary = Train(model, examples, train);
  EXPECT_TRUE(summary.ok()) << summary.status().ToString();
  auto metrics = Evaluate(model, examples, 26, MixedPrecision::kNo);
  EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(metrics->num_counted, 26 * kContinuation);
  run.accuracy = metrics->accuracy;
  run.exact_match = metrics->exact_match;
  return run;
}

TEST(LmLearningTest, FullFineTuningFp32) {
  const LearningRun run = TrainAlphabet(/*lora=*/false, MixedPrecision::kNo);
  EXPECT_LT(run.final_loss, run.first_loss);
  EXPECT_GE(run.accuracy, 0.95) << "loss " << run.first_loss << " -> " << run.final_loss;
}

TEST(LmLearningTest, FullFineTuningBf16) {
  const LearningRun run = TrainAlphabet(/*lora=*/false, MixedPrecision::kBf16);
  EXPECT_GE(run.accuracy, 0.95) << "loss " << run.first_loss << " -> " << run.final_loss;
}

TEST(LmLearningTest, LoraFp32) {
  const LearningRun run = TrainAlphabet(/*lora=*/true, MixedPrecision::kNo);
  EXPECT_GE(run.accuracy, 0.95) << "loss " << run.first_loss << " -> " << run.final_loss;
}

TEST(LmLearningTest, LoraBf16) {
  const LearningRun run = TrainAlphabet(/*lora=*/true, MixedPrecision::kBf16);
  EXPECT_GE(run.accuracy, 0.95) << "loss " << run.first_loss << " -> " << run.final_loss;
}

}  // namespace
}  // namespace parsyn::trainer
