#include "protocol/trainer_events.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "protocol/field_reader.h"
#include "protocol/messages.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr int64_t kMaxCount = int64_t{1} << 53;  // exact in a double: what any JSON reader keeps
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxMessageBytes = 64 * 1024;
constexpr size_t kMaxListItems = 256;

// A list of strings under `key` (absent: empty); each 1..kMaxNameBytes bytes.
std::vector<std::string> StringList(FieldReader& r, std::string_view key, bool required) {
  std::vector<std::string> out;
  if (required && !r.Required(key)) return out;
  const json* v = r.Get(key);
  if (v == nullptr) return out;
  if (!v->is_array() || v->size() > kMaxListItems) {
    r.Error(r.Path(key) + " must be an array of at most " + std::to_string(kMaxListItems) + " strings");
    return out;
  }
  for (const json& item : *v) {
    if (!item.is_string() || item.get_ref<const std::string&>().empty() ||
        item.get_ref<const std::string&>().size() > kMaxNameBytes) {
      r.Error(r.Path(key) + " must hold non-empty strings, got " + item.dump().substr(0, 80));
      return {};
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

// A metrics object: finite numbers by name, "loss" required when `loss_required`. Null stays null.
json MetricsObject(FieldReader& r, std::string_view key, bool loss_required) {
  const json* v = r.Get(key);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) {
    r.Error(r.Path(key) + " must be an object of numbers or null, got " + std::string(v->type_name()));
    return nullptr;
  }
  for (const auto& [name, value] : v->items()) {
    if (value.is_null()) continue;
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      r.Error(r.Path(key) + "." + name + " must be a finite number, got " + value.dump().substr(0, 80));
      return nullptr;
    }
  }
  if (loss_required && (!v->contains("loss") || !(*v)["loss"].is_number())) {
    r.Error(r.Path(key) + ".loss is required (the loss on the validation rows)");
    return nullptr;
  }
  return *v;
}

std::optional<double> OptionalNumber(FieldReader& r, std::string_view key, double min) {
  const json* v = r.Get(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number() || !std::isfinite(v->get<double>())) {
    r.Error(r.Path(key) + " must be a finite number, got " + v->dump().substr(0, 80));
    return std::nullopt;
  }
  const double value = v->get<double>();
  if (value < min) {
    r.Error(r.Path(key) + " must be at least " + FieldReader::FormatNumber(min) + ", got " +
            FieldReader::FormatNumber(value));
    return std::nullopt;
  }
  return value;
}

void ReadResultFields(FieldReader& r, TrainerResult& result) {
  if (r.Required("num_samples")) r.Integer("num_samples", result.num_samples, 0, kMaxCount);
  r.Integer("num_validation", result.num_validation, 0, kMaxCount);
  result.train_loss = OptionalNumber(r, "train_loss", -std::numeric_limits<double>::infinity());
  result.validation_before = MetricsObject(r, "validation_before", /*loss_required=*/true);
  result.validation_after = MetricsObject(r, "validation_after", /*loss_required=*/true);
  json metrics = MetricsObject(r, "metrics", /*loss_required=*/false);
  result.metrics = metrics.is_object() ? std::move(metrics) : json::object();
}

}  // namespace

bool TrainerDescription::ReadsContract(int v) const {
  return std::find(contract_versions.begin(), contract_versions.end(), v) != contract_versions.end();
}

bool TrainerDescription::RunsTaskKind(std::string_view kind) const {
  return std::find(task_kinds.begin(), task_kinds.end(), kind) != task_kinds.end();
}

bool TrainerDescription::TrainsModelKind(std::string_view kind) const {
  return std::any_of(model_kinds.begin(), model_kinds.end(),
                     [&](const std::string& k) { return k == kind || k == kAnyModelKind; });
}

StatusOr<TrainerDescription> ParseTrainerDescription(const json& object) {
  if (!object.is_object()) {
    return InvalidArgumentError(std::string("describe: expected a JSON object, got ") + object.type_name());
  }
  std::vector<std::string> errors;
  FieldReader r(object, "describe.", errors);
  TrainerDescription d;
  if (r.Required("contract_versions")) {
    const json* v = r.Get("contract_versions");
    if (!v->is_array() || v->empty() || v->size() > kMaxListItems ||
        !std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_number_integer(); })) {
      r.Error("describe.contract_versions must be a non-empty array of integers");
    } else {
      for (const json& x : *v) d.contract_versions.push_back(x.get<int>());
      if (!d.ReadsContract(kTrainerContractVersion)) {
        r.Error("describe.contract_versions must list " + std::to_string(kTrainerContractVersion) + ", got " +
                v->dump());
      }
    }
  }
  d.task_kinds = StringList(r, "task_kinds", /*required=*/true);
  for (const std::string& kind : d.task_kinds) {
    if (kind != "train" && kind != "evaluate") {
      r.Error("describe.task_kinds may hold \"train\" and \"evaluate\", got " + FieldReader::Quoted(kind));
    }
  }
  if (errors.empty() && d.task_kinds.empty()) r.Error("describe.task_kinds must not be empty");
  d.model_kinds = StringList(r, "model_kinds", /*required=*/true);
  if (errors.empty() && d.model_kinds.empty()) r.Error("describe.model_kinds must not be empty");
  r.String("name", d.name, 0, kMaxNameBytes);
  r.String("version", d.version, 0, kMaxNameBytes);
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return d;
}

json TrainerDescriptionToJson(const TrainerDescription& d) {
  json out{{"contract_versions", d.contract_versions}, {"task_kinds", d.task_kinds}, {"model_kinds", d.model_kinds}};
  if (!d.name.empty()) out["name"] = d.name;
  if (!d.version.empty()) out["version"] = d.version;
  return out;
}

std::optional<double> TrainerResult::ValidationLossBefore() const {
  if (!validation_before.is_object()) return std::nullopt;
  auto it = validation_before.find("loss");
  if (it == validation_before.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

StatusOr<TrainerResult> ParseTrainerResult(const json& object) {
  if (!object.is_object()) {
    return InvalidArgumentError(std::string("result: expected a JSON object, got ") + object.type_name());
  }
  std::vector<std::string> errors;
  FieldReader r(object, "result.", errors);
  TrainerResult result;
  ReadResultFields(r, result);
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return result;
}

json TrainerResultToJson(const TrainerResult& result) {
  json out{{"num_samples", result.num_samples},
           {"num_validation", result.num_validation},
           {"train_loss", result.train_loss ? json(*result.train_loss) : json(nullptr)},
           {"validation_before", result.validation_before},
           {"validation_after", result.validation_after},
           {"metrics", result.metrics}};
  return out;
}

std::optional<json> ParseEventObject(std::string_view line) {
  json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return std::nullopt;
  auto it = object.find("event");
  if (it == object.end() || !it->is_string()) return std::nullopt;
  return object;
}

StatusOr<TrainerEvent> ParseTrainerEvent(const json& object) {
  const std::string name = object.value("event", "");
  std::vector<std::string> errors;
  FieldReader r(object, name + ".", errors);
  TrainerEvent event;
  if (name == "progress") {
    TrainerProgress p;
    if (r.Required("step")) r.Integer("step", p.step, 0, kMaxCount);
    if (r.Required("total_steps")) r.Integer("total_steps", p.total_steps, 0, kMaxCount);
    p.loss = OptionalNumber(r, "loss", -std::numeric_limits<double>::infinity());
    p.throughput = OptionalNumber(r, "throughput", 0);
    if (const json* unit = r.Get("throughput_unit")) {
      if (!unit->is_string() || (*unit != kSamplesPerSecond && *unit != kTokensPerSecond)) {
        r.Error("progress.throughput_unit must be \"samples/s\" or \"tokens/s\", got " + unit->dump().substr(0, 80));
      } else {
        p.throughput_unit = unit->get<std::string>();
      }
    }
    // A unit goes with a throughput: samples/s when not said, and nothing without one.
    if (p.throughput && p.throughput_unit.empty()) p.throughput_unit = std::string(kSamplesPerSecond);
    if (!p.throughput) p.throughput_unit.clear();
    event = p;
  } else if (name == "done") {
    TrainerDone d;
    ReadResultFields(r, d.result);
    event = d;
  } else if (name == "error") {
    TrainerError e;
    if (r.Required("code")) r.String("code", e.code, 1, kMaxNameBytes);
    // Any text (a Python traceback spans lines), cut to kMaxMessageBytes.
    if (r.Required("message")) {
      const json* message = r.Get("message");
      if (!message->is_string()) {
        r.Error("error.message must be a string, got " + std::string(message->type_name()));
      } else {
        e.message = message->get<std::string>().substr(0, kMaxMessageBytes);
      }
    }
    event = e;
  } else {
    event = TrainerOtherEvent{.name = name};
  }
  PARSYN_RETURN_IF_ERROR(ErrorsToStatus(errors));
  return event;
}

json TrainerProgressToJson(const TrainerProgress& p) {
  json out{{"event", "progress"}, {"step", p.step}, {"total_steps", p.total_steps}};
  if (p.loss) out["loss"] = *p.loss;
  if (p.throughput) {
    out["throughput"] = *p.throughput;
    out["throughput_unit"] = p.throughput_unit;
  }
  return out;
}

json TrainerDoneToJson(const TrainerDone& done) {
  json out{{"event", "done"}};
  const json result = TrainerResultToJson(done.result);  // named: a temporary would die before the loop's body
  for (const auto& [key, value] : result.items()) out[key] = value;
  return out;
}

json TrainerErrorToJson(const TrainerError& error) {
  return json{{"event", "error"}, {"code", error.code}, {"message", error.message}};
}

}  // namespace parsyn::protocol
