#include "trainer/lm_batches.h"

#include <gtest/gtest.h>

namespace parsyn::trainer {
namespace {

using data::kByteLevelBosId;
using data::kByteLevelEosId;
using data::kByteLevelPadId;

class LmBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = data::Tokenizer::FromJson(data::ByteLevelTokenizerJson());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    tokenizer_ = std::make_unique<data::Tokenizer>(std::move(tokenizer).value());
    options_.max_seq_len = 16;
    options_.eos_id = kByteLevelEosId;
    options_.pad_id = kByteLevelPadId;
  }

  static std::vector<int64_t> Row(const torch::Tensor& t, int64_t r) {
    auto row = t[r].contiguous();
    return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }

  std::unique_ptr<data::Tokenizer> tokenizer_;
  LmTokenization options_;
};

TEST_F(LmBatchesTest, TextRowsTakeLossOnEveryTokenAndPadRight) {
  auto dataset = data::ParseText("{\"text\": \"hi\"}\n{\"text\": \"a\"}\n");
  ASSERT_TRUE(dataset.ok());
  auto examples = LmExamples::Create(*dataset, std::vector<int64_t>{0, 1}, *tokenizer_, options_);
  ASSERT_TRUE(examples.ok()) << examples.status().ToString();
  const Batch batch = examples->MakeBatch(std::vector<int64_t>{0, 1}, torch::kCPU);
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(Row(batch.input_ids, 0), (std::vector<int64_t>{kByteLevelBosId, 'h', 'i', kByteLevelEosId}));
  EXPECT_EQ(Row(batch.input_ids, 1), (std::vector<int64_t>{kByteLevelBosId, 'a', kByteLevelEosId, kByteLevelPadId}));
  EXPECT_EQ(Row(batch.attention_mask, 1), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(Row(batch.labels, 0), (std::vector<int64_t>{kByteLevelBosId, 'h', 'i', kByteLevelEosId}));
  EXPECT_EQ(Row(batch.labels, 1), (std::vector<int64_t>{kByteLevelBosId, 'a', kByteLevelEosId, kIgnoreLabel}));
}

TEST_F(LmBatchesTest, PromptTokensCarryNoLabel) {
  auto dataset = data::ParseText("{\"prompt\": \"ab\", \"completion\": \"c\"}\n");
  ASSERT_TRUE(dataset.ok());
  auto examples = LmExamples::Create(*dataset, std::vector<int64_t>{0}, *tokenizer_, options_);
  ASSERT_TRUE(examples.ok());
  const Batch batch = examples->MakeBatch(std::vector<int64_t>{0}, torch::kCPU);
  EXPECT_EQ(Row(batch.input_ids, 0), (std::vector<int64_t>{kByteLevelBosId, 'a', 'b', 'c', kByteLevelEosId}));
  EXPECT_EQ(Row(batch.labels, 0),
            (std::vector<int64_t>{kIgnoreLabel, kIgnoreLabel, kIgnoreLabel, 'c', kByteLevelEosId}));
}

TEST_F(LmBatchesTest, LongRowsAreTruncatedAtTheEnd) {
  auto dataset = data::ParseText("{\"text\": \"abcdefgh\"}\n{\"text\": \"ab\"}\n");
  ASSERT_TRUE(dataset.ok());
  options_.max_seq_len = 4;
  auto examples = LmExamples::Create(*dataset, std::vector<int64_t>{0, 1}, *tokenizer_, options_);
  ASSERT_TRUE(examples.ok());
  EXPECT_EQ(examples->num_truncated(), 1);
  EXPECT_EQ(examples->ids(0), (std::vector<int32_t>{kByteLevelBosId, 'a', 'b', 'c'}));
  EXPECT_EQ(examples->ids(1), (std::vector<int32_t>{kByteLevelBosId, 'a', 'b', kByteLevelEosId}));
  EXPECT_EQ(examples->total_tokens(), 8);
}

TEST_F(LmBatchesTest, RowsAreTakenInTheGivenOrder) {
  auto dataset = data::ParseText("{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": \"c\"}\n");
  ASSERT_TRUE(dataset.ok());
  auto examples = LmExamples::Create(*dataset, std::vector<int64_t>{2, 0}, *tokenizer_, options_);
  ASSERT_TRUE(examples.ok());
  ASSERT_EQ(examples->size(), 2);
  EXPECT_EQ(examples->ids(0)[1], 'c');
  EXPECT_EQ(examples->ids(1)[1], 'a');
  auto bad = LmExamples::Create(*dataset, std::vector<int64_t>{3}, *tokenizer_, options_);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::trainer
