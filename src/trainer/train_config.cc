#include "trainer/train_config.h"

#include <nlohmann/json.hpp>

namespace parsyn::trainer {

TrainConfig::TrainConfig(const protocol::TrainerConfig& config) {
  const protocol::TrainingConfig& c = config.training;
  epochs = c.epochs;
  batch_size = c.batch_size;
  gradient_accumulation_steps = c.gradient_accumulation_steps;
  learning_rate = c.learning_rate;
  weight_decay = c.weight_decay;
  warmup_steps = c.warmup_steps;
  lr_scheduler = c.lr_scheduler;
  max_grad_norm = c.max_grad_norm;
  mixed_precision = c.mixed_precision;
  validation_fraction = c.validation_fraction;
  max_seq_len = c.max_seq_len;
  use_peft = c.use_peft;
  lora_r = c.lora_r;
  lora_alpha = c.lora_alpha;
  lora_dropout = c.lora_dropout;
  lora_target_modules = c.lora_target_modules;
  model_type = config.model_type;
  hidden_sizes.assign(c.hidden_sizes.begin(), c.hidden_sizes.end());
  label_column = c.LabelColumn();
}

TabularModelType TrainConfig::TabularType() const {
  return model_type.value_or(hidden_sizes.empty() ? TabularModelType::kLogreg : TabularModelType::kMlp);
}

StatusOr<TrainConfig> ParseTrainConfig(const nlohmann::json& json) {
  PARSYN_ASSIGN_OR_RETURN(const protocol::TrainerConfig config, protocol::ParseTrainerConfig(json));
  return TrainConfig(config);
}

nlohmann::json TrainConfigToJson(const TrainConfig& c) {
  protocol::TrainerConfig out;
  protocol::TrainingConfig& t = out.training;
  t.epochs = static_cast<int>(c.epochs);
  t.batch_size = static_cast<int>(c.batch_size);
  t.gradient_accumulation_steps = static_cast<int>(c.gradient_accumulation_steps);
  t.learning_rate = c.learning_rate;
  t.weight_decay = c.weight_decay;
  t.warmup_steps = c.warmup_steps;
  t.lr_scheduler = c.lr_scheduler;
  t.max_grad_norm = c.max_grad_norm;
  t.mixed_precision = c.mixed_precision;
  t.validation_fraction = c.validation_fraction;
  t.max_seq_len = static_cast<int>(c.max_seq_len);
  t.use_peft = c.use_peft;
  t.lora_r = static_cast<int>(c.lora_r);
  t.lora_alpha = c.lora_alpha;
  t.lora_dropout = c.lora_dropout;
  t.lora_target_modules = c.lora_target_modules;
  t.hidden_sizes.assign(c.hidden_sizes.begin(), c.hidden_sizes.end());
  t.label_column = c.label_column;
  out.model_type = c.model_type;
  return protocol::TrainerConfigToJson(out);
}

}  // namespace parsyn::trainer
