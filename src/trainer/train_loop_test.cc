#include "trainer/train_loop.h"

#include <gtest/gtest.h>

#include <cmath>

#include "data/dataset.h"
#include "trainer/tabular_model.h"
#include "trainer/tabular_test_data.h"

namespace parsyn::trainer {
namespace {

TEST(PlanStepsTest, EpochsAndBudgetCombine) {
  struct Case {
    int64_t examples, batch, accumulation, epochs;
    std::optional<int64_t> max_steps;
    int64_t steps_per_epoch, total;
  };
  const Case cases[] = {
      {100, 10, 1, 3, std::nullopt, 10, 30},  // epochs x steps per epoch
      {101, 10, 1, 1, std::nullopt, 11, 11},  // a short last micro-batch is a step of its own
      {100, 10, 4, 2, std::nullopt, 3, 6},    // 10 micro-batches in steps of 4: 4 + 4 + 2
      {100, 10, 1, 3, 7, 10, 7},              // a step budget wins over epochs
      {5, 10, 1, 1, 12, 1, 12},               // ... and may run many epochs
      {100, 10, 1, 3, 0, 10, 0},              // 0 steps: evaluation only
  };
  for (const Case& c : cases) {
    TrainConfig config;
    config.batch_size = c.batch;
    config.gradient_accumulation_steps = c.accumulation;
    config.epochs = c.epochs;
    auto plan = PlanSteps(config, c.examples, c.max_steps);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->steps_per_epoch, c.steps_per_epoch) << c.examples << "/" << c.batch;
    EXPECT_EQ(plan->total_steps, c.total) << c.examples << "/" << c.batch;
  }
  EXPECT_EQ(PlanSteps(TrainConfig{}, 0, std::nullopt).status().code(), StatusCode::kInvalidArgument);
}

TEST(LearningRateTest, WarmupThenSchedules) {
  TrainConfig config;
  config.learning_rate = 1.0;
  config.warmup_steps = 4;
  config.lr_scheduler = LrScheduler::kLinear;
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 4, 14), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 9, 14), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 14, 14), 0.0);
  config.lr_scheduler = LrScheduler::kCosine;
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 4, 14), 1.0);
  EXPECT_NEAR(LearningRateAt(config, 9, 14), 0.5, 1e-12);
  EXPECT_NEAR(LearningRateAt(config, 14, 14), 0.0, 1e-12);
  config.lr_scheduler = LrScheduler::kConstant;
  EXPECT_DOUBLE_EQ(LearningRateAt(config, 13, 14), 1.0);
}

TEST(ParseDeviceTest, SpellingsAndAvailability) {
  EXPECT_TRUE(ParseDevice("cpu").ok());
  EXPECT_EQ(ParseDevice("gpu").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDevice("cuda:x").status().code(), StatusCode::kInvalidArgument);
  if (!torch::cuda::is_available()) {
    auto cuda = ParseDevice("cuda:0");
    EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("CUDA is not available"), std::string::npos);
  } else {
    EXPECT_EQ(ParseDevice("cuda:999").status().code(), StatusCode::kFailedPrecondition);
  }
}

// A small tabular problem: the loop's behaviour is the same for every model.
class TrainLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dataset = data::ParseTabular(testing::SeparableCsv(64, 2));
    ASSERT_TRUE(dataset.ok());
    dataset_ = std::move(dataset).value();
    for (int64_t i = 0; i < dataset_.num_rows(); ++i) rows_.push_back(i);
    config_.hidden_sizes = {8};
    config_.batch_size = 8;
    config_.learning_rate = 1e-2;
    config_.lr_scheduler = LrScheduler::kConstant;
    auto spec = TabularSpecFor(config_, dataset_, rows_);
    ASSERT_TRUE(spec.ok());
    spec_ = *spec;
    auto examples = TabularExamples::Create(dataset_, rows_, spec_);
    ASSERT_TRUE(examples.ok());
    examples_ = std::make_unique<TabularExamples>(std::move(examples).value());
  }

  std::unique_ptr<TabularModel> NewModel() {
    auto model = TabularModel::Create(spec_, 1, torch::kCPU);
    EXPECT_TRUE(model.ok());
    return std::move(model).value();
  }

  static std::vector<float> Flatten(TabularModel& model) {
    std::vector<float> out;
    for (const auto& p : model.TrainableParameters()) {
      auto flat = p.detach().contiguous().view(-1);
      out.insert(out.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
    }
    return out;
  }

  data::TabularDataset dataset_;
  std::vector<int64_t> rows_;
  TrainConfig config_;
  TabularModelSpec spec_;
  std::unique_ptr<TabularExamples> examples_;
};

TEST_F(TrainLoopTest, SameSeedGivesIdenticalWeights) {
  TrainOptions options;
  options.config = config_;
  options.config.lora_dropout = 0;
  options.max_steps = 12;
  options.seed = 9;
  auto a = NewModel();
  auto b = NewModel();
  auto c = NewModel();
  ASSERT_TRUE(Train(*a, *examples_, options).ok());
  ASSERT_TRUE(Train(*b, *examples_, options).ok());
  options.seed = 10;
  ASSERT_TRUE(Train(*c, *examples_, options).ok());
  EXPECT_EQ(Flatten(*a), Flatten(*b));
  EXPECT_NE(Flatten(*a), Flatten(*c));
}

TEST_F(TrainLoopTest, AccumulationEqualsTheLargerBatch) {
  // One step over the same 16 examples: batch 16, or 2 micro-batches of 8 accumulated. AdamW's first step is
  // sign-like, so compare after clipping off and with a constant rate; gradients must agree to float rounding.
  TrainOptions big;
  big.config = config_;
  big.config.batch_size = 16;
  big.config.max_grad_norm = 0;
  big.max_steps = 1;
  TrainOptions accumulated = big;
  accumulated.config.batch_size = 8;
  accumulated.config.gradient_accumulation_steps = 2;
  auto a = NewModel();
  auto b = NewModel();
  ASSERT_TRUE(Train(*a, *examples_, big).ok());
  ASSERT_TRUE(Train(*b, *examples_, accumulated).ok());
  const auto fa = Flatten(*a);
  const auto fb = Flatten(*b);
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_NEAR(fa[i], fb[i], 1e-5) << i;
}

TEST_F(TrainLoopTest, BudgetRunsAcrossEpochsAndReportsEachStep) {
  TrainOptions options;
  options.config = config_;
  options.config.batch_size = 32;  // 2 steps per epoch
  options.config.warmup_steps = 2;
  options.config.lr_scheduler = LrScheduler::kLinear;
  options.max_steps = 5;
  std::vector<StepProgress> seen;
  options.on_step = [&](const StepProgress& p) { seen.push_back(p); };
  auto model = NewModel();
  auto summary = Train(*model, *examples_, options);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->steps, 5);
  EXPECT_EQ(summary->examples_seen, 5 * 32);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].step, 1);
  EXPECT_EQ(seen[4].epoch, 2);
  EXPECT_EQ(seen[4].total_steps, 5);
  EXPECT_DOUBLE_EQ(seen[0].learning_rate, 0.5e-2);  // warmup 1/2
  EXPECT_DOUBLE_EQ(seen[1].learning_rate, 1e-2);
  EXPECT_GT(seen[0].samples_per_s, 0);
  for (const auto& p : seen) EXPECT_TRUE(std::isfinite(p.loss));
}

TEST_F(TrainLoopTest, StopRequestEndsWithCancelled) {
  std::stop_source stop;
  TrainOptions options;
  options.config = config_;
  options.max_steps = 100;
  options.stop = stop.get_token();
  int64_t steps = 0;
  options.on_step = [&](const StepProgress& p) {
    steps = p.step;
    if (p.step == 2) stop.request_stop();
  };
  auto model = NewModel();
  auto summary = Train(*model, *examples_, options);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kCancelled);
  EXPECT_NE(summary.status().message().find("at step 3"), std::string::npos) << summary.status().message();
  EXPECT_EQ(steps, 2);
}

TEST_F(TrainLoopTest, Fp16OnCpuIsAClearError) {
  TrainOptions options;
  options.config = config_;
  options.config.mixed_precision = MixedPrecision::kFp16;
  auto model = NewModel();
  auto summary = Train(*model, *examples_, options);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(summary.status().message().find("fp16 needs a CUDA device"), std::string::npos);
}

TEST_F(TrainLoopTest, DivergenceIsReported) {
  TrainOptions options;
  options.config = config_;
  options.config.learning_rate = 1e30;
  options.config.max_grad_norm = 0;
  options.max_steps = 50;
  auto model = NewModel();
  auto summary = Train(*model, *examples_, options);
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(summary.status().message().find("training loss became"), std::string::npos) << summary.status().message();
}

TEST_F(TrainLoopTest, EvaluateCountsEveryExample) {
  auto model = NewModel();
  auto metrics = Evaluate(*model, *examples_, 10, MixedPrecision::kNo);
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ(metrics->num_examples, 64);
  EXPECT_EQ(metrics->num_counted, 64);
  EXPECT_NEAR(metrics->perplexity, std::exp(metrics->loss), 1e-9);
  EXPECT_DOUBLE_EQ(metrics->accuracy, metrics->exact_match);
}

}  // namespace
}  // namespace parsyn::trainer
