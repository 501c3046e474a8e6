#include "protocol/trainer_task.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "protocol/field_reader.h"
#include "protocol/trainer_events.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr size_t kMaxPathBytes = 4096;

constexpr std::pair<std::string_view, TabularModelType> kTabularModelTypes[] = {{"mlp", TabularModelType::kMlp},
                                                                                {"logreg", TabularModelType::kLogreg}};
enum class DataFormat { kJsonl, kCsv };
constexpr std::pair<std::string_view, DataFormat> kDataFormats[] = {{"jsonl", DataFormat::kJsonl},
                                                                    {"csv", DataFormat::kCsv}};
constexpr std::pair<std::string_view, TaskKind> kTaskKinds[] = {{"train", TaskKind::kTrain},
                                                                {"evaluate", TaskKind::kEvaluate}};

void ReadTrainerConfig(const json& object, TrainerConfig& config, std::vector<std::string>& errors) {
  FieldReader r(object, "config.", errors);
  TabularModelType type = TabularModelType::kMlp;
  if (r.Get("model_type") != nullptr && r.Choice("model_type", type, kTabularModelTypes)) config.model_type = type;
  ReadTrainingConfigFields(r, config.training);
  r.RejectUnknown();
}

void Path(FieldReader& r, std::string_view key, std::string& out, bool required) {
  if (required && !r.Required(key)) return;
  r.String(key, out, 1, kMaxPathBytes);
}

}  // namespace

std::string_view TabularModelTypeName(TabularModelType v) { return v == TabularModelType::kLogreg ? "logreg" : "mlp"; }

StatusOr<TrainerConfig> ParseTrainerConfig(const json& object) {
  if (!object.is_object())
    return InvalidArgumentError(std::string("config must be an object, got ") + object.type_name());
  std::vector<std::string> errors;
  TrainerConfig config;
  ReadTrainerConfig(object, config, errors);
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return config;
}

json TrainerConfigToJson(const TrainerConfig& config) {
  json out = TrainingConfigToJson(config.training);
  if (config.model_type) out["model_type"] = TabularModelTypeName(*config.model_type);
  return out;
}

Status CheckTrainerContractVersion(const json& object) {
  if (!object.is_object()) return Status::Ok();  // ParseTrainerTask says what is wrong
  auto it = object.find("contract_version");
  if (it == object.end() || *it == kTrainerContractVersion) return Status::Ok();
  return InvalidArgumentError("task.contract_version " + it->dump().substr(0, 40) +
                              " is not supported: this trainer reads version " +
                              std::to_string(kTrainerContractVersion));
}

StatusOr<TrainerTask> ParseTrainerTask(const json& object) {
  if (!object.is_object())
    return InvalidArgumentError(std::string("task must be an object, got ") + object.type_name());
  PARSYN_RETURN_IF_ERROR(CheckTrainerContractVersion(object));
  std::vector<std::string> errors;
  TrainerTask t;
  FieldReader r(object, "task.", errors);
  r.Get("contract_version");  // checked above
  const bool kind_given = r.Get("kind") != nullptr;
  r.Choice("kind", t.kind, kTaskKinds);
  r.String("model_kind", t.model_kind, 1, 64);
  Path(r, "model_dir", t.model_dir, false);
  Path(r, "initial_weights", t.initial_weights, false);
  Path(r, "data", t.data, true);
  Path(r, "validation_data", t.validation_data, false);
  DataFormat format = DataFormat::kJsonl;
  if (r.Get("data_format") != nullptr && r.Choice("data_format", format, kDataFormats)) {
    t.data_format = format == DataFormat::kCsv ? "csv" : "jsonl";
  }
  if (const json* config = r.Object("config")) ReadTrainerConfig(*config, t.config, errors);
  if (r.Get("validation_fraction") != nullptr) {
    double fraction = 0;
    const size_t before = errors.size();
    r.Number("validation_fraction", fraction, 0, 1, /*min_exclusive=*/false, /*max_exclusive=*/true);
    if (errors.size() == before) t.validation_fraction = fraction;
  }
  if (r.Get("steps") != nullptr) {
    int64_t steps = -1;
    r.Integer("steps", steps, 0, kNoUpperBound);
    if (steps >= 0) t.steps = steps;
  }
  r.Integer("seed", t.seed, 0, kNoUpperBound);
  r.Integer("split_seed", t.split_seed, 0, kNoUpperBound);
  if (const json* schedule = r.Object("schedule")) {
    FieldReader s(*schedule, "task.schedule.", errors);
    TrainerSchedule parsed;
    s.Integer("start_step", parsed.start_step, 0, kNoUpperBound);
    if (s.Get("total_steps") != nullptr) {
      int64_t total = 0;
      s.Integer("total_steps", total, 1, kNoUpperBound);
      if (total >= 1) parsed.total_steps = total;
    }
    s.RejectUnknown();
    t.schedule = parsed;
  }
  r.Number("proximal_mu", t.proximal_mu, 0, kMaxProximalMu);
  r.String("device", t.device, 1, 64);
  r.Integer("threads", t.threads, 0, 4096);
  if (r.Required("output")) {
    if (const json* output = r.Object("output")) {
      FieldReader o(*output, "task.output.", errors);
      Path(o, "weights", t.output_weights, true);
      Path(o, "result", t.output_result, true);
      Path(o, "model_dir", t.output_model_dir, false);
      o.RejectUnknown();
    }
  }
  r.RejectUnknown();
  if (!kind_given && t.steps == 0) t.kind = TaskKind::kEvaluate;
  if (t.kind == TaskKind::kEvaluate && t.steps.value_or(0) != 0) {
    errors.push_back("task.steps must be 0 (or absent) for an evaluate task, got " + std::to_string(*t.steps));
  }
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return t;
}

json TrainerTaskToJson(const TrainerTask& t) {
  json out = {
      {"contract_version", kTrainerContractVersion},
      {"kind", TaskKindName(t.kind)},
      {"data", t.data},
      {"config", TrainerConfigToJson(t.config)},
      {"seed", t.seed},
      {"split_seed", t.split_seed},
      {"device", t.device},
      {"threads", t.threads},
      {"output", {{"weights", t.output_weights}, {"result", t.output_result}}},
  };
  if (!t.model_kind.empty()) out["model_kind"] = t.model_kind;
  if (!t.model_dir.empty()) out["model_dir"] = t.model_dir;
  if (!t.validation_data.empty()) out["validation_data"] = t.validation_data;
  if (!t.initial_weights.empty()) out["initial_weights"] = t.initial_weights;
  if (!t.data_format.empty()) out["data_format"] = t.data_format;
  if (t.validation_fraction) out["validation_fraction"] = *t.validation_fraction;
  if (t.steps) out["steps"] = *t.steps;
  if (t.schedule) {
    out["schedule"] = {{"start_step", t.schedule->start_step}};
    if (t.schedule->total_steps) out["schedule"]["total_steps"] = *t.schedule->total_steps;
  }
  if (t.proximal_mu != 0) out["proximal_mu"] = t.proximal_mu;
  if (!t.output_model_dir.empty()) out["output"]["model_dir"] = t.output_model_dir;
  return out;
}

}  // namespace parsyn::protocol
