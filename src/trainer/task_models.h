// Builds the language model a task trains — CausalLm from the task's model folder, LoRA attached when the config asks,
// the tokenizer and how rows are tokenized — so task.cc stays about the task's flow.
// Used from one thread.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <memory>

#include "base/status.h"
#include "data/tokenizer.h"
#include "protocol/training_config.h"
#include "trainer/lm_batches.h"
#include "trainer/trainable_model.h"

namespace parsyn::trainer {

struct LanguageModelBundle {
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<data::Tokenizer> tokenizer;
  LmTokenization tokenization;
  // bf16/fp16 are run by the model itself (its compute dtype: weights cast on the fly, norms and softmax in fp32),
  // so the loop must not autocast on top.
  bool model_handles_precision = true;
  // Writes the loadable result: a PEFT adapter folder under LoRA, else a full model folder (checkpoint dtype, with
  // the source folder's tokenizer files).
  std::function<Status(const std::filesystem::path&)> save_model_dir;
};

// Errors: those of CausalLm::Load (NotFound for a missing folder or file, InvalidArgument for a bad config or
// checkpoint) and of data::Tokenizer::FromFile for model_dir/tokenizer.json.
StatusOr<LanguageModelBundle> LoadLanguageModel(const std::filesystem::path& model_dir,
                                                const protocol::TrainingConfig& config, uint64_t seed,
                                                torch::Device device);

}  // namespace parsyn::trainer
