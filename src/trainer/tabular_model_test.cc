#include "trainer/tabular_model.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "data/dataset.h"
#include "trainer/tabular_test_data.h"
#include "trainer/train_loop.h"

namespace parsyn::trainer {
namespace {

struct Prepared {
  std::unique_ptr<TabularModel> model;
  std::unique_ptr<TabularExamples> train;
  std::unique_ptr<TabularExamples> validation;
};

Prepared Prepare(const protocol::TrainerConfig& config, int64_t rows, uint64_t seed) {
  auto dataset = data::ParseTabular(testing::SeparableCsv(rows, seed));
  EXPECT_TRUE(dataset.ok()) << dataset.status().ToString();
  auto split = data::SplitTrainValidation(dataset->num_rows(), 0.25, seed);
  EXPECT_TRUE(split.ok());
  auto spec = TabularSpecFor(config, *dataset, split->train);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto model = TabularModel::Create(*spec, seed, torch::kCPU);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  auto train = TabularExamples::Create(*dataset, split->train, *spec);
  auto validation = TabularExamples::Create(*dataset, split->validation, *spec);
  EXPECT_TRUE(train.ok() && validation.ok());
  return {std::move(model).value(), std::make_unique<TabularExamples>(std::move(train).value()),
          std::make_unique<TabularExamples>(std::move(validation).value())};
}

double TrainAndScore(protocol::TrainerConfig config) {
  Prepared p = Prepare(config, 300, 11);
  TrainOptions options;
  options.config = config.training;
  options.seed = 5;
  auto summary = Train(*p.model, *p.train, options);
  EXPECT_TRUE(summary.ok()) << summary.status().ToString();
  auto metrics = Evaluate(*p.model, *p.validation, 64, MixedPrecision::kNo);
  EXPECT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_EQ(metrics->num_examples, 75);
  return metrics->accuracy;
}

TEST(TabularModelTest, MlpLearnsSeparableClasses) {
  protocol::TrainerConfig config;
  config.model_type = TabularModelType::kMlp;
  config.training.hidden_sizes = {32, 16};
  config.training.learning_rate = 1e-2;
  config.training.epochs = 10;
  config.training.batch_size = 16;
  EXPECT_GE(TrainAndScore(config), 0.95);
}

TEST(TabularModelTest, LogregLearnsSeparableClasses) {
  protocol::TrainerConfig config;
  config.model_type = TabularModelType::kLogreg;
  config.training.hidden_sizes = {};
  config.training.learning_rate = 5e-2;
  config.training.epochs = 10;
  config.training.batch_size = 16;
  EXPECT_GE(TrainAndScore(config), 0.95);
}

TEST(TabularModelTest, MlpLearnsUnderBf16Autocast) {
  protocol::TrainerConfig config;
  config.training.hidden_sizes = {32};
  config.training.learning_rate = 1e-2;
  config.training.epochs = 10;
  config.training.batch_size = 16;
  config.training.mixed_precision = MixedPrecision::kBf16;
  EXPECT_GE(TrainAndScore(config), 0.95);
}

TEST(TabularModelTest, SaveAndLoadRoundTrip) {
  protocol::TrainerConfig config;
  config.training.hidden_sizes = {8};
  Prepared p = Prepare(config, 30, 3);
  const auto dir = std::filesystem::path(::testing::TempDir()) / "tabular_roundtrip";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(p.model->Save(dir).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / kTabularModelFile));
  auto loaded = TabularModel::Load(dir, torch::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->spec().class_names, p.model->spec().class_names);
  EXPECT_EQ((*loaded)->spec().standardizer.mean, p.model->spec().standardizer.mean);
  auto a = p.model->ExportTrainable();
  auto b = (*loaded)->ExportTrainable();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].name, (*b)[i].name);
    EXPECT_TRUE(std::equal((*a)[i].data.begin(), (*a)[i].data.end(), (*b)[i].data.begin()));
  }
}

TEST(TabularModelTest, ExportNamesAndShapes) {
  protocol::TrainerConfig config;
  config.training.hidden_sizes = {8};
  Prepared p = Prepare(config, 30, 3);
  auto set = p.model->ExportTrainable();
  ASSERT_TRUE(set.ok());
  ASSERT_EQ(set->size(), 4u);
  EXPECT_EQ((*set)[0].name, "layers.0.weight");
  EXPECT_EQ((*set)[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ((*set)[3].name, "layers.1.bias");
  EXPECT_EQ((*set)[3].shape, (std::vector<int64_t>{3}));
  EXPECT_FALSE(p.model->UsesWeightDecay("layers.0.bias"));
  EXPECT_TRUE(p.model->UsesWeightDecay("layers.0.weight"));
}

TEST(TabularModelTest, ImportRejectsAnotherLayout) {
  protocol::TrainerConfig config;
  config.training.hidden_sizes = {8};
  Prepared small = Prepare(config, 30, 3);
  config.training.hidden_sizes = {16};
  Prepared large = Prepare(config, 30, 3);
  auto set = large.model->ExportTrainable();
  ASSERT_TRUE(set.ok());
  Status s = small.model->ImportTrainable(*set);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers.0.weight"), std::string::npos) << s.message();
}

TEST(TabularModelTest, ExamplesRejectOtherFeatures) {
  protocol::TrainerConfig config;
  Prepared p = Prepare(config, 30, 3);
  auto other = data::ParseTabular("x0,x1,label\n1,2,north\n3,4,south_east\n");
  ASSERT_TRUE(other.ok());
  const std::vector<int64_t> rows = {0, 1};
  auto examples = TabularExamples::Create(*other, rows, p.model->spec());
  ASSERT_FALSE(examples.ok());
  EXPECT_EQ(examples.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(examples.status().message().find("feature columns [x0, x1]"), std::string::npos)
      << examples.status().message();
}

TEST(TabularModelTest, LoadMissingFolderIsNotFound) {
  auto model = TabularModel::Load("/nonexistent/parsyn/model", torch::kCPU);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kNotFound);
}

TEST(TabularModelTest, SpecNeedsTwoClasses) {
  auto dataset = data::ParseTabular("x,label\n1,a\n2,a\n");
  ASSERT_TRUE(dataset.ok());
  auto spec = TabularSpecFor(protocol::TrainerConfig{}, *dataset, std::vector<int64_t>{0, 1});
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("at least 2 classes"), std::string::npos);
}

}  // namespace
}  // namespace parsyn::trainer
