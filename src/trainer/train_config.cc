#include "trainer/train_config.h"

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

namespace parsyn::trainer {
namespace {

using nlohmann::json;

Status KeyError(std::string_view key, std::string_view what) {
  return InvalidArgumentError("config." + std::string(key) + ": " + std::string(what));
}

std::string TypeName(const json& value) { return value.type_name(); }

Status ReadInt(const json& value, std::string_view key, int64_t min_value, int64_t& out) {
  // 3.0 is accepted as 3 (JSON writers often emit floats); 3.5 is not.
  if (value.is_number_integer()) {
    out = value.get<int64_t>();
  } else if (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>() &&
             std::abs(value.get<double>()) < 9e15) {
    out = static_cast<int64_t>(value.get<double>());
  } else {
    return KeyError(key, "expected an integer, got " + (value.is_number() ? value.dump() : TypeName(value)));
  }
  if (out < min_value) return KeyError(key, "must be >= " + std::to_string(min_value) + ", got " + value.dump());
  return Status::Ok();
}

Status ReadDouble(const json& value, std::string_view key, double& out) {
  if (!value.is_number()) return KeyError(key, "expected a number, got " + TypeName(value));
  out = value.get<double>();
  if (!std::isfinite(out)) return KeyError(key, "must be finite");
  return Status::Ok();
}

Status ReadBool(const json& value, std::string_view key, bool& out) {
  if (!value.is_boolean()) return KeyError(key, "expected true or false, got " + TypeName(value));
  out = value.get<bool>();
  return Status::Ok();
}

Status ReadString(const json& value, std::string_view key, std::string& out) {
  if (!value.is_string()) return KeyError(key, "expected a string, got " + TypeName(value));
  out = value.get<std::string>();
  return Status::Ok();
}

template <typename Enum>
Status ReadEnum(const json& value, std::string_view key, const std::map<std::string, Enum>& names, Enum& out) {
  std::string text;
  PARSYN_RETURN_IF_ERROR(ReadString(value, key, text));
  auto it = names.find(text);
  if (it == names.end()) {
    std::string choices;
    for (const auto& [name, unused] : names) choices += (choices.empty() ? "" : ", ") + name;
    return KeyError(key, "unknown value \"" + text + "\" (one of: " + choices + ")");
  }
  out = it->second;
  return Status::Ok();
}

}  // namespace

std::string_view MixedPrecisionName(MixedPrecision value) {
  switch (value) {
    case MixedPrecision::kNo: return "no";
    case MixedPrecision::kBf16: return "bf16";
    case MixedPrecision::kFp16: return "fp16";
  }
  return "no";
}

std::string_view LrSchedulerName(LrScheduler value) {
  switch (value) {
    case LrScheduler::kConstant: return "constant";
    case LrScheduler::kLinear: return "linear";
    case LrScheduler::kCosine: return "cosine";
  }
  return "linear";
}

std::string_view TabularModelTypeName(TabularModelType value) {
  return value == TabularModelType::kLogreg ? "logreg" : "mlp";
}

StatusOr<TrainConfig> ParseTrainConfig(const json& config_json) {
  if (!config_json.is_object()) {
    return InvalidArgumentError("config: expected a JSON object, got " + TypeName(config_json));
  }
  TrainConfig c;
  using Reader = std::function<Status(const json&, std::string_view)>;
  const std::map<std::string, Reader> readers = {
      {"epochs", [&](const json& v, auto k) { return ReadInt(v, k, 1, c.epochs); }},
      {"batch_size", [&](const json& v, auto k) { return ReadInt(v, k, 1, c.batch_size); }},
      {"gradient_accumulation_steps",
       [&](const json& v, auto k) { return ReadInt(v, k, 1, c.gradient_accumulation_steps); }},
      {"learning_rate",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadDouble(v, k, c.learning_rate));
         return c.learning_rate > 0 ? Status::Ok() : KeyError(k, "must be > 0");
       }},
      {"weight_decay",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadDouble(v, k, c.weight_decay));
         return c.weight_decay >= 0 ? Status::Ok() : KeyError(k, "must be >= 0");
       }},
      {"warmup_steps", [&](const json& v, auto k) { return ReadInt(v, k, 0, c.warmup_steps); }},
      {"lr_scheduler",
       [&](const json& v, auto k) {
         return ReadEnum<LrScheduler>(
             v, k,
             {{"constant", LrScheduler::kConstant}, {"linear", LrScheduler::kLinear}, {"cosine", LrScheduler::kCosine}},
             c.lr_scheduler);
       }},
      {"max_grad_norm", [&](const json& v, auto k) { return ReadDouble(v, k, c.max_grad_norm); }},
      {"mixed_precision",
       [&](const json& v, auto k) {
         return ReadEnum<MixedPrecision>(v, k,
                                         {{"no", MixedPrecision::kNo},
                                          {"none", MixedPrecision::kNo},
                                          {"fp32", MixedPrecision::kNo},
                                          {"bf16", MixedPrecision::kBf16},
                                          {"fp16", MixedPrecision::kFp16}},
                                         c.mixed_precision);
       }},
      {"validation_fraction",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadDouble(v, k, c.validation_fraction));
         return c.validation_fraction >= 0 && c.validation_fraction < 1 ? Status::Ok()
                                                                        : KeyError(k, "must be in [0, 1)");
       }},
      {"max_seq_len", [&](const json& v, auto k) { return ReadInt(v, k, 2, c.max_seq_len); }},
      {"use_peft", [&](const json& v, auto k) { return ReadBool(v, k, c.use_peft); }},
      {"lora_r", [&](const json& v, auto k) { return ReadInt(v, k, 1, c.lora_r); }},
      {"lora_alpha",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadDouble(v, k, c.lora_alpha));
         return c.lora_alpha > 0 ? Status::Ok() : KeyError(k, "must be > 0");
       }},
      {"lora_dropout",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadDouble(v, k, c.lora_dropout));
         return c.lora_dropout >= 0 && c.lora_dropout < 1 ? Status::Ok() : KeyError(k, "must be in [0, 1)");
       }},
      {"lora_target_modules",
       [&](const json& v, auto k) -> Status {
         if (!v.is_array() || v.empty()) return KeyError(k, "expected a non-empty array of module names");
         c.lora_target_modules.clear();
         for (const json& item : v) {
           if (!item.is_string()) return KeyError(k, "expected strings, got " + TypeName(item));
           c.lora_target_modules.push_back(item.get<std::string>());
         }
         return Status::Ok();
       }},
      {"model_type",
       [&](const json& v, auto k) {
         return ReadEnum<TabularModelType>(
             v, k, {{"mlp", TabularModelType::kMlp}, {"logreg", TabularModelType::kLogreg}}, c.model_type);
       }},
      {"hidden_sizes",
       [&](const json& v, auto k) -> Status {
         if (!v.is_array()) return KeyError(k, "expected an array of layer widths, got " + TypeName(v));
         c.hidden_sizes.clear();
         for (const json& item : v) {
           int64_t width = 0;
           PARSYN_RETURN_IF_ERROR(ReadInt(item, k, 1, width));
           c.hidden_sizes.push_back(width);
         }
         return Status::Ok();
       }},
      {"label_column",
       [&](const json& v, auto k) -> Status {
         PARSYN_RETURN_IF_ERROR(ReadString(v, k, c.label_column));
         return c.label_column.empty() ? KeyError(k, "must not be empty") : Status::Ok();
       }},
  };
  for (const auto& [key, value] : config_json.items()) {
    auto it = readers.find(key);
    if (it == readers.end()) return KeyError(key, "unknown key");
    // A JSON null means "the default", as a form that leaves a field blank would send it.
    if (value.is_null()) continue;
    PARSYN_RETURN_IF_ERROR(it->second(value, key));
  }
  return c;
}

json TrainConfigToJson(const TrainConfig& c) {
  return json{
      {"epochs", c.epochs},
      {"batch_size", c.batch_size},
      {"gradient_accumulation_steps", c.gradient_accumulation_steps},
      {"learning_rate", c.learning_rate},
      {"weight_decay", c.weight_decay},
      {"warmup_steps", c.warmup_steps},
      {"lr_scheduler", LrSchedulerName(c.lr_scheduler)},
      {"max_grad_norm", c.max_grad_norm},
      {"mixed_precision", MixedPrecisionName(c.mixed_precision)},
      {"validation_fraction", c.validation_fraction},
      {"max_seq_len", c.max_seq_len},
      {"use_peft", c.use_peft},
      {"lora_r", c.lora_r},
      {"lora_alpha", c.lora_alpha},
      {"lora_dropout", c.lora_dropout},
      {"lora_target_modules", c.lora_target_modules},
      {"model_type", TabularModelTypeName(c.model_type)},
      {"hidden_sizes", c.hidden_sizes},
      {"label_column", c.label_column},
  };
}

}  // namespace parsyn::trainer
