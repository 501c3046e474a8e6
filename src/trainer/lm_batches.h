// Language-model examples: JSONL rows tokenized once, then batched with right padding.
//
// Per row (ids from the model's tokenizer):
//   {"text"}:                 Encode(text) with the tokenizer's special tokens (bos when its template adds one), then
//                             eos; every real token is a label (loss on all tokens).
//   {"prompt","completion"}:  Encode(prompt) with special tokens, then Encode(completion) without, then eos; labels are
//                             -100 on the prompt, so the loss (and exact-match) covers completion tokens and eos only.
// eos is appended when the tokenizer (or config.json) names one and the encoding does not already end with it.
// Sequences longer than max_seq_len are cut at the end (the prompt is kept first); a prompt/completion row left with
// no completion token then counts nothing, and LmExamples::num_truncated() says how many rows were cut.
//
// A batch is (B, T) with T the longest row in it: input_ids padded on the right with pad_id, attention_mask 1 on real
// tokens, labels -100 on padding. Labels are aligned with input_ids (the model shifts them, as Hugging Face does).
//
// An LmExamples is immutable after Create: MakeBatch may be called from any one thread at a time.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "trainer/train_loop.h"

namespace parsyn::trainer {

inline constexpr int64_t kIgnoreLabel = -100;

struct LmTokenization {
  int64_t max_seq_len = 512;
  std::optional<int32_t> eos_id;  // appended to every row when set
  int32_t pad_id = 0;             // any id: padded positions are masked and carry no label
};

class LmExamples final : public ExampleSet {
 public:
  // Tokenizes the rows listed in `rows` (in that order). Errors: InvalidArgument naming the 1-based row of the file
  // when the tokenizer cannot encode it, or a row index is out of range.
  static StatusOr<LmExamples> Create(const data::TextDataset& dataset, std::span<const int64_t> rows,
                                     const data::Tokenizer& tokenizer, const LmTokenization& options);
  // From ready token ids (tests, benchmarks): `prompt_lengths[i]` leading tokens of row i carry no label.
  static LmExamples FromIds(std::vector<std::vector<int32_t>> ids, std::vector<int64_t> prompt_lengths, int32_t pad_id);

  int64_t size() const override { return static_cast<int64_t>(ids_.size()); }
  Batch MakeBatch(std::span<const int64_t> indices, torch::Device device) const override;

  int64_t num_truncated() const { return num_truncated_; }
  int64_t total_tokens() const;
  const std::vector<int32_t>& ids(int64_t i) const { return ids_[static_cast<size_t>(i)]; }

 private:
  LmExamples() = default;
  std::vector<std::vector<int32_t>> ids_;
  std::vector<int64_t> prompt_lengths_;
  int32_t pad_id_ = 0;
  int64_t num_truncated_ = 0;
};

}  // namespace parsyn::trainer
