#include "trainer/train_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

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
    protocol::TrainingConfig config;
    config.batch_size = c.batch;
    config.gradient_accumulation_steps = c.accumulation;
    config.epochs = c.epochs;
    auto plan = PlanSteps(config, c.examples, c.max_steps);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->steps_per_epoch, c.steps_per_epoch) << c.examples << "/" << c.batch;
    EXPECT_EQ(plan->total_steps, c.total) << c.examples << "/" << c.batch;
  }
  EXPECT_EQ(PlanSteps(protocol::TrainingConfig{}, 0, std::nullopt).status().code(), StatusCode::kInvalidArgument);
}

TEST(LearningRateTest, WarmupThenSchedules) {
  protocol::TrainingConfig config;
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
    auto spec = TabularSpecFor({.training = config_, .model_type = std::nullopt}, dataset_, rows_);
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
  protocol::TrainingConfig config_;
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

// FedProx: with mu = 0 the run is the plain one; a positive mu changes it (so the two runs above can differ).
TEST_F(TrainLoopTest, ProximalMuZeroTrainsExactlyAsWithoutIt) {
  TrainOptions plain;
  plain.config = config_;
  plain.max_steps = 12;
  plain.seed = 9;
  TrainOptions zero = plain;
  zero.proximal_mu = 0;
  TrainOptions small = plain;
  small.proximal_mu = 1e-1;
  auto a = NewModel();
  auto b = NewModel();
  auto c = NewModel();
  ASSERT_TRUE(Train(*a, *examples_, plain).ok());
  ASSERT_TRUE(Train(*b, *examples_, zero).ok());
  ASSERT_TRUE(Train(*c, *examples_, small).ok());
  EXPECT_EQ(Flatten(*a), Flatten(*b));
  EXPECT_NE(Flatten(*a), Flatten(*c));
}

// FedProx keeps the weights near the round's global: with a large mu every trainable parameter (a tabular model
// trains all of them) ends closer to where it started than plain training leaves it, in fp32 and bf16 alike.
TEST_F(TrainLoopTest, LargeProximalMuStaysCloserToTheStartingWeights) {
  for (const MixedPrecision precision : {MixedPrecision::kNo, MixedPrecision::kBf16}) {
    TrainOptions options;
    options.config = config_;
    options.config.mixed_precision = precision;
    options.max_steps = 20;
    options.seed = 3;
    auto distance_after = [&](double mu) {
      auto model = NewModel();
      const std::vector<float> start = Flatten(*model);
      options.proximal_mu = mu;
      auto summary = Train(*model, *examples_, options);
      EXPECT_TRUE(summary.ok()) << summary.status().ToString();
      const std::vector<float> end = Flatten(*model);
      double squared = 0;
      for (size_t i = 0; i < start.size(); ++i) squared += std::pow(double{end[i]} - double{start[i]}, 2);
      return std::sqrt(squared);
    };
    const double plain = distance_after(0);
    const double proximal = distance_after(100);
    EXPECT_GT(plain, 0) << MixedPrecisionName(precision);
    EXPECT_LT(proximal, plain) << MixedPrecisionName(precision);
    EXPECT_LT(proximal, 0.5 * plain) << MixedPrecisionName(precision);
  }
}

// A model with one trainable vector w and the loss sum(c * w): its data gradient is c whatever w is, so a step's
// gradient shows exactly what the proximal term adds to it.
class LinearLossModel : public TrainableModel {
 public:
  LinearLossModel(std::vector<float> start, std::vector<float> c)
      : w_(torch::tensor(start).set_requires_grad(true)), c_(torch::tensor(c)) {}
  StepOutput Forward(const Batch&) override {
    StepOutput out;
    out.loss = (w_ * c_).sum();
    out.num_counted = out.num_rows = 1;
    return out;
  }
  std::vector<torch::Tensor> TrainableParameters() override { return {w_}; }
  std::vector<std::string> TrainableNames() const override { return {"w"}; }
  StatusOr<weights::WeightSet> ExportTrainable() override { return InternalError("not used by Train"); }
  Status ImportTrainable(const weights::WeightSet&) override { return InternalError("not used by Train"); }
  void Train(bool) override {}
  torch::Device device() const override { return torch::kCPU; }

  static std::vector<float> Values(const torch::Tensor& t) {
    auto flat = t.detach().contiguous();
    return {flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel()};
  }
  torch::Tensor& w() { return w_; }

 private:
  torch::Tensor w_;
  torch::Tensor c_;
};

class FourExamples : public ExampleSet {
 public:
  int64_t size() const override { return 4; }
  Batch MakeBatch(std::span<const int64_t>, torch::Device) const override { return {}; }
};

// The proximal term's gradient is exactly mu * (w - w_global), w_global being the weights Train started from: at the
// first step (w = w_global) it adds nothing, at the second it adds mu * (w1 - w0) to the data gradient c. Checked
// against the same arithmetic done here in double (within float rounding) and in float (bit for bit), in fp32 and
// under bf16 autocast (the term is computed in fp32 either way).
TEST(ProximalTermTest, GradientIsMuTimesTheDistanceToTheStartingWeights) {
  const std::vector<float> w0 = {0.5f, -1.25f, 2.0f, 0.0f};
  const std::vector<float> c = {0.3f, -0.7f, 1.1f, -0.05f};
  const double mu = 0.75;
  for (const MixedPrecision precision : {MixedPrecision::kNo, MixedPrecision::kBf16}) {
    LinearLossModel model(w0, c);
    TrainOptions options;
    options.config.batch_size = 4;
    options.config.learning_rate = 0.1;
    options.config.lr_scheduler = LrScheduler::kConstant;
    options.config.max_grad_norm = 0;  // the gradient as computed, unclipped
    options.config.weight_decay = 0;
    options.config.mixed_precision = precision;
    options.max_steps = 2;
    options.proximal_mu = mu;
    std::vector<float> w1, g1, g2;
    options.on_step = [&](const StepProgress& p) {
      if (p.step == 1) {
        w1 = LinearLossModel::Values(model.w());
        g1 = LinearLossModel::Values(model.w().grad());
      } else {
        g2 = LinearLossModel::Values(model.w().grad());
      }
    };
    FourExamples examples;
    auto summary = Train(model, examples, options);
    ASSERT_TRUE(summary.ok()) << summary.status().ToString();
    ASSERT_EQ(g2.size(), w0.size());
    for (size_t i = 0; i < w0.size(); ++i) {
      SCOPED_TRACE(std::string(MixedPrecisionName(precision)) + " w[" + std::to_string(i) + "]");
      EXPECT_EQ(g1[i], c[i]);  // at the global the term's gradient is 0
      // AdamW's first step moves each weight by lr against the sign of its gradient (|g| >> eps).
      EXPECT_NEAR(w1[i], w0[i] - 0.1 * (c[i] > 0 ? 1 : -1), 1e-6);
      const double expected = double{c[i]} + mu * (double{w1[i]} - double{w0[i]});
      EXPECT_NEAR(g2[i], expected, 1e-6 * std::max(1.0, std::abs(expected)));
      const float expected_float = c[i] + static_cast<float>(mu) * (w1[i] - w0[i]);
      EXPECT_EQ(g2[i], expected_float);
    }
  }
}

TEST(ProximalTermTest, ValueIsHalfMuTimesTheSquaredDistance) {
  const torch::Tensor a = torch::tensor({1.0f, 2.0f, -3.0f});
  const torch::Tensor b = torch::tensor({{0.5f, 0.25f}});
  const torch::Tensor anchor_a = torch::tensor({0.0f, 2.5f, -1.0f});
  const torch::Tensor anchor_b = torch::tensor({{-0.5f, 0.25f}});
  const double term = ProximalTerm({a, b}, {anchor_a, anchor_b}, 0.2).item<double>();
  // 0.2 / 2 * (1 + 0.25 + 4 + 1 + 0)
  EXPECT_NEAR(term, 0.1 * 6.25, 1e-7);
}

TEST_F(TrainLoopTest, ProximalMuOutOfRangeIsAClearError) {
  for (const double mu : {-0.1, std::nan(""), 2e6}) {
    TrainOptions options;
    options.config = config_;
    options.max_steps = 1;
    options.proximal_mu = mu;
    auto model = NewModel();
    auto summary = Train(*model, *examples_, options);
    ASSERT_FALSE(summary.ok()) << mu;
    EXPECT_EQ(summary.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(summary.status().message().find("proximal_mu"), std::string::npos) << summary.status().message();
    EXPECT_NE(summary.status().message().find("must be >= 0 and <= 1e+06"), std::string::npos)
        << summary.status().message();
  }
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
