#include "trainer/lm_batches.h"

#include <algorithm>
#include <string>

namespace parsyn::trainer {

StatusOr<LmExamples> LmExamples::Create(const data::TextDataset& dataset, std::span<const int64_t> rows,
                                        const data::Tokenizer& tokenizer, const LmTokenization& options) {
  if (options.max_seq_len < 2) return InvalidArgumentError("max_seq_len must be >= 2");
  LmExamples examples;
  examples.pad_id_ = options.pad_id;
  examples.ids_.reserve(rows.size());
  examples.prompt_lengths_.reserve(rows.size());
  const bool prompt_completion = dataset.kind == data::TextKind::kPromptCompletion;
  for (int64_t r : rows) {
    if (r < 0 || r >= static_cast<int64_t>(dataset.rows.size())) {
      return InvalidArgumentError("row index " + std::to_string(r) + " out of range");
    }
    const data::TextRow& row = dataset.rows[static_cast<size_t>(r)];
    // Rows are numbered without blank lines; "row N" is what a person can find with the dataset tools.
    const std::string where = "data row " + std::to_string(r + 1);
    std::vector<int32_t> ids;
    int64_t prompt_length = 0;
    if (prompt_completion) {
      auto prompt = tokenizer.Encode(row.prompt, /*add_special_tokens=*/true);
      if (!prompt.ok()) return prompt.status().WithContext(where + " (prompt)");
      auto completion = tokenizer.Encode(row.completion, /*add_special_tokens=*/false);
      if (!completion.ok()) return completion.status().WithContext(where + " (completion)");
      // A template that appends eos to the prompt would teach "stop after the prompt"; drop it there.
      ids = std::move(prompt).value();
      if (options.eos_id && !ids.empty() && ids.back() == *options.eos_id) ids.pop_back();
      prompt_length = static_cast<int64_t>(ids.size());
      ids.insert(ids.end(), completion->begin(), completion->end());
    } else {
      auto text = tokenizer.Encode(row.text, /*add_special_tokens=*/true);
      if (!text.ok()) return text.status().WithContext(where);
      ids = std::move(text).value();
    }
    if (options.eos_id && (ids.empty() || ids.back() != *options.eos_id)) ids.push_back(*options.eos_id);
    if (static_cast<int64_t>(ids.size()) > options.max_seq_len) {
      ids.resize(static_cast<size_t>(options.max_seq_len));
      ++examples.num_truncated_;
    }
    examples.ids_.push_back(std::move(ids));
    examples.prompt_lengths_.push_back(prompt_length);
  }
  return examples;
}

LmExamples LmExamples::FromIds(std::vector<std::vector<int32_t>> ids, std::vector<int64_t> prompt_lengths,
                               int32_t pad_id) {
  LmExamples examples;
  examples.ids_ = std::move(ids);
  examples.prompt_lengths_ = std::move(prompt_lengths);
  examples.prompt_lengths_.resize(examples.ids_.size(), 0);
  examples.pad_id_ = pad_id;
  return examples;
}

int64_t LmExamples::total_tokens() const {
  int64_t total = 0;
  for (const auto& ids : ids_) total += static_cast<int64_t>(ids.size());
  return total;
}

Batch LmExamples::MakeBatch(std::span<const int64_t> indices, torch::Device device) const {
  const int64_t b = static_cast<int64_t>(indices.size());
  int64_t t = 1;
  for (int64_t i : indices) t = std::max<int64_t>(t, static_cast<int64_t>(ids_[static_cast<size_t>(i)].size()));
  torch::Tensor input_ids = torch::full({b, t}, static_cast<int64_t>(pad_id_), torch::kInt64);
  torch::Tensor attention_mask = torch::zeros({b, t}, torch::kInt64);
  torch::Tensor labels = torch::full({b, t}, kIgnoreLabel, torch::kInt64);
  int64_t* input = input_ids.data_ptr<int64_t>();
  int64_t* mask = attention_mask.data_ptr<int64_t>();
  int64_t* label = labels.data_ptr<int64_t>();
  for (int64_t row = 0; row < b; ++row) {
    const size_t example = static_cast<size_t>(indices[static_cast<size_t>(row)]);
    const std::vector<int32_t>& ids = ids_[example];
    const int64_t prompt_length = prompt_lengths_[example];
    for (int64_t j = 0; j < static_cast<int64_t>(ids.size()); ++j) {
      input[row * t + j] = ids[static_cast<size_t>(j)];
      mask[row * t + j] = 1;
      if (j >= prompt_length) label[row * t + j] = ids[static_cast<size_t>(j)];
    }
  }
  Batch batch;
  batch.input_ids = input_ids.to(device);
  batch.attention_mask = attention_mask.to(device);
  batch.labels = labels.to(device);
  return batch;
}

}  // namespace parsyn::trainer
