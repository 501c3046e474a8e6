#include "protocol/training_config.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr int64_t kMaxSeed = int64_t{1} << 53;  // integers a JSON number (a double) holds exactly

constexpr std::pair<std::string_view, MixedPrecision> kMixedPrecisions[] = {
    {"bf16", MixedPrecision::kBf16}, {"fp16", MixedPrecision::kFp16}, {"no", MixedPrecision::kNo}};
constexpr std::pair<std::string_view, LrScheduler> kLrSchedulers[] = {
    {"constant", LrScheduler::kConstant}, {"linear", LrScheduler::kLinear}, {"cosine", LrScheduler::kCosine}};

template <typename Enum, size_t N>
std::string_view NameOf(Enum v, const std::pair<std::string_view, Enum> (&table)[N]) {
  for (const auto& [spelling, value] : table) {
    if (value == v) return spelling;
  }
  return "?";
}

bool IsModuleName(const std::string& s) {
  return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  });
}

// PEFT's name for every linear projection, which weights/lora_layout.h expands (alone in the list).
constexpr std::string_view kAllLinear = "all-linear";

void ReadTargetModules(FieldReader& r, std::vector<std::string>& out) {
  const json* v = r.Get("lora_target_modules");
  if (v == nullptr) return;
  const std::string path = r.Path("lora_target_modules");
  if (!v->is_array() || v->empty() || v->size() > 64) {
    r.Error(path + " must be an array of 1..64 module names");
    return;
  }
  std::vector<std::string> modules;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string item = path + "[" + std::to_string(i) + "]";
    if (!m.is_string()) {
      r.Error(item + " must be a string, got " + m.type_name());
    } else if (!IsModuleName(m.get<std::string>()) && m.get<std::string>() != kAllLinear) {
      r.Error(item + " (" + FieldReader::Quoted(m.get<std::string>()) + ") must be 1..128 characters of [A-Za-z0-9_.]");
    } else if (std::find(modules.begin(), modules.end(), m.get<std::string>()) != modules.end()) {
      r.Error(path + " lists " + FieldReader::Quoted(m.get<std::string>()) + " twice");
    } else {
      modules.push_back(m.get<std::string>());
    }
  }
  if (modules.size() == v->size()) out = std::move(modules);
}

}  // namespace

std::string_view MixedPrecisionName(MixedPrecision v) { return NameOf(v, kMixedPrecisions); }
std::string_view LrSchedulerName(LrScheduler v) { return NameOf(v, kLrSchedulers); }

bool IsTrainerName(std::string_view name) {
  if (name.empty() || name.size() > 64 || !std::isalnum(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-';
  });
}

void ReadTrainingConfigFields(FieldReader& r, TrainingConfig& c) {
  r.Integer("epochs", c.epochs, 1, 1000);
  r.Integer("batch_size", c.batch_size, 1, 65536);
  r.Number("learning_rate", c.learning_rate, 0, 10, /*min_exclusive=*/true);
  r.Choice("mixed_precision", c.mixed_precision, kMixedPrecisions);
  r.Boolean("use_peft", c.use_peft);
  r.Integer("lora_r", c.lora_r, 1, 1024);
  r.Number("lora_alpha", c.lora_alpha, 0, 65536, /*min_exclusive=*/true);
  r.Number("lora_dropout", c.lora_dropout, 0, 1, /*min_exclusive=*/false, /*max_exclusive=*/true);
  ReadTargetModules(r, c.lora_target_modules);
  r.Integer("max_seq_len", c.max_seq_len, 8, 131072);
  r.Number("weight_decay", c.weight_decay, 0, 10);
  r.Integer("warmup_steps", c.warmup_steps, 0, 1'000'000'000);
  r.Choice("lr_scheduler", c.lr_scheduler, kLrSchedulers);
  r.Integer("gradient_accumulation_steps", c.gradient_accumulation_steps, 1, 1024);
  r.Number("max_grad_norm", c.max_grad_norm, 0, 1e6);
  r.Integer("seed", c.seed, 0, kMaxSeed);
  r.Number("validation_fraction", c.validation_fraction, 0, 0.5);
  r.String("label_column", c.label_column, 0, 128);
  if (auto sizes = r.IntegerList("hidden_sizes", 16, 1, 65536)) c.hidden_sizes.assign(sizes->begin(), sizes->end());
  if (const json* trainer = r.Get("trainer")) {
    if (trainer->is_string() && IsTrainerName(trainer->get_ref<const std::string&>())) {
      c.trainer = trainer->get<std::string>();
    } else {
      r.Error(r.Path("trainer") +
              " must be a trainer name (1..64 letters, digits, '_', '.' or '-', starting with a letter or digit) "
              "that the job's workers offer (parsyn worker --trainer NAME=COMMAND), got " +
              trainer->dump().substr(0, 80));
    }
  }
}

StatusOr<TrainingConfig> ParseTrainingConfig(const json& object) {
  if (!object.is_object())
    return InvalidArgumentError(std::string("config must be an object, got ") + object.type_name());
  std::vector<std::string> errors;
  TrainingConfig config;
  FieldReader r(object, "config.", errors);
  ReadTrainingConfigFields(r, config);
  r.RejectUnknown();
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return config;
}

json TrainingConfigToJson(const TrainingConfig& c) {
  return json{
      {"epochs", c.epochs},
      {"batch_size", c.batch_size},
      {"learning_rate", c.learning_rate},
      {"mixed_precision", MixedPrecisionName(c.mixed_precision)},
      {"use_peft", c.use_peft},
      {"lora_r", c.lora_r},
      {"lora_alpha", c.lora_alpha},
      {"lora_dropout", c.lora_dropout},
      {"lora_target_modules", c.lora_target_modules},
      {"max_seq_len", c.max_seq_len},
      {"weight_decay", c.weight_decay},
      {"warmup_steps", c.warmup_steps},
      {"lr_scheduler", LrSchedulerName(c.lr_scheduler)},
      {"gradient_accumulation_steps", c.gradient_accumulation_steps},
      {"max_grad_norm", c.max_grad_norm},
      {"seed", c.seed},
      {"validation_fraction", c.validation_fraction},
      {"label_column", c.label_column},
      {"hidden_sizes", c.hidden_sizes},
      {"trainer", c.trainer},
  };
}

}  // namespace parsyn::protocol
