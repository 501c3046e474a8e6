#include "protocol/messages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "protocol/field_reader.h"
#include "protocol/json_fields.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr size_t kMaxMetrics = 16;
constexpr size_t kMaxAbandoned = 10'000;

// A result's metrics (worker/task_translation.cc BuildResult): the trainer's counters, and its validation metrics
// before and after training as flat objects (null: not measured); every value a finite number or null. Anything else is
// refused, so what the coordinator stores and serves back is small and flat.
constexpr std::string_view kResultCounters[] = {"steps", "examples_seen", "tokens_seen", "wall_s"};
constexpr std::string_view kValidationMetrics[] = {"num_examples", "num_counted", "loss",
                                                   "perplexity",   "accuracy",    "exact_match"};

bool Contains(std::span<const std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool IsNumberOrNull(const json& v) {
  return v.is_null() || v.is_number_integer() || v.is_number_unsigned() ||
         (v.is_number_float() && std::isfinite(v.get<double>()));
}

json ReadResultMetrics(JsonFields& f) {
  std::optional<json> metrics = f.Object("metrics", false, kMaxMetrics);
  if (!metrics) return json::object();
  json out = json::object();
  auto unknown = [&](const std::string& name) {
    f.AddProblem("unknown field " + f.Quoted(name.size() > 80 ? name.substr(0, 80) + "..." : name));
  };
  auto not_a_number = [&](const std::string& name, const json& v) {
    f.AddProblem(f.Quoted(name) + " must be a finite number or null, got " + std::string(v.type_name()));
  };
  for (const auto& [key, value] : metrics->items()) {
    const std::string name = "metrics." + key;
    if (key == "validation_before" || key == "validation_after") {
      if (value.is_null()) {
        out[key] = nullptr;
        continue;
      }
      if (!value.is_object() || value.size() > std::size(kValidationMetrics)) {
        f.AddProblem(f.Quoted(name) + " must be an object of at most " + std::to_string(std::size(kValidationMetrics)) +
                     " numbers, got " + (value.is_object() ? "more" : std::string(value.type_name())));
        continue;
      }
      json& validation = out[key] = json::object();
      for (const auto& [metric, number] : value.items()) {
        if (!Contains(kValidationMetrics, metric)) {
          unknown(name + "." + metric);
        } else if (!IsNumberOrNull(number)) {
          not_a_number(name + "." + metric, number);
        } else {
          validation[metric] = number;
        }
      }
    } else if (!Contains(kResultCounters, key)) {
      unknown(name);
    } else if (!IsNumberOrNull(value)) {
      not_a_number(name, value);
    } else {
      out[key] = value;
    }
  }
  return out;
}

// `metrics` cut to the names in `known` whose values are numbers or null.
json KnownNumbers(const json& metrics, std::span<const std::string_view> known) {
  if (!metrics.is_object()) return nullptr;
  json out = json::object();
  for (const auto& [key, value] : metrics.items()) {
    if (Contains(known, key) && IsNumberOrNull(value)) out[key] = value;
  }
  return out;
}

}  // namespace

bool IsSha256Hex(std::string_view text) {
  return text.size() == 64 &&
         std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// --- hello ---------------------------------------------------------------------------------------------------------

namespace {

// One entry of "trainers": {"name": a trainer name, "describe": the trainer's description}.
StatusOr<OfferedTrainer> ParseOfferedTrainer(const json& item) {
  if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("describe")) {
    return InvalidArgumentError("each of 'trainers' must be {\"name\", \"describe\"}");
  }
  OfferedTrainer trainer{.name = item["name"].get<std::string>(), .description = {}};
  if (!IsTrainerName(trainer.name)) {
    return InvalidArgumentError("'trainers' holds an invalid trainer name '" + trainer.name.substr(0, 64) + "'");
  }
  StatusOr<TrainerDescription> description = ParseTrainerDescription(item["describe"]);
  if (!description.ok()) {
    return InvalidArgumentError("trainer '" + trainer.name + "': " + description.status().message());
  }
  trainer.description = std::move(*description);
  return trainer;
}

json OfferedTrainersJson(const std::vector<OfferedTrainer>& trainers) {
  json list = json::array();
  for (const OfferedTrainer& t : trainers) {
    list.push_back({{"name", t.name}, {"describe", TrainerDescriptionToJson(t.description)}});
  }
  return list;
}

}  // namespace

StatusOr<Hello> ParseHello(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields f,
                          JsonFields::Parse(body.empty() ? "{}" : body, {"device", "version", "local_data", "trainers",
                                                                         "device_memory_bytes", "lora_rank"}));
  Hello hello;
  hello.device = f.String("device", false).value_or("");
  hello.version = f.String("version", false).value_or("");
  if (std::optional<json> object = f.Object("local_data", false)) {
    StatusOr<JsonFields> d = JsonFields::Strict(std::move(*object), {"format", "rows"}, "local_data.");
    if (!d.ok()) {
      f.AddProblem(d.status().message());
    } else {
      LocalData local;
      if (std::optional<std::string> format = d->String("format", true, 16)) {
        if (*format == "csv" || *format == "jsonl") {
          local.format = *format;
        } else {
          d->AddProblem("'local_data.format' must be one of csv, jsonl, got '" + *format + "'");
        }
      }
      local.rows = d->Int("rows", true, 1, kMaxLocalRows).value_or(0);
      f.Absorb(*d);
      hello.local_data = local;
    }
  }
  if (std::optional<json> trainers = f.Array("trainers", false, kMaxOfferedTrainers)) {
    for (const json& item : *trainers) {
      StatusOr<OfferedTrainer> trainer = ParseOfferedTrainer(item);
      if (!trainer.ok()) {
        f.AddProblem(trainer.status().message());
        break;
      }
      for (const OfferedTrainer& earlier : hello.trainers) {
        if (earlier.name == trainer->name) f.AddProblem("'trainers' names '" + trainer->name + "' twice");
      }
      hello.trainers.push_back(std::move(*trainer));
    }
  }
  hello.device_memory_bytes = f.Int("device_memory_bytes", false, 1, std::numeric_limits<int64_t>::max());
  if (std::optional<int64_t> rank = f.Int("lora_rank", false, 1, kMaxLoraRank))
    hello.lora_rank = static_cast<int>(*rank);
  PARSYN_RETURN_IF_ERROR(f.status());
  return hello;
}

json HelloToJson(const Hello& hello) {
  json out = json::object();
  if (!hello.device.empty()) out["device"] = hello.device;
  if (!hello.version.empty()) out["version"] = hello.version;
  if (hello.local_data) out["local_data"] = {{"format", hello.local_data->format}, {"rows", hello.local_data->rows}};
  if (!hello.trainers.empty()) out["trainers"] = OfferedTrainersJson(hello.trainers);
  if (hello.device_memory_bytes) out["device_memory_bytes"] = *hello.device_memory_bytes;
  if (hello.lora_rank) out["lora_rank"] = *hello.lora_rank;
  return out;
}

std::string OfferedTrainersToJsonText(const std::vector<OfferedTrainer>& trainers) {
  return OfferedTrainersJson(trainers).dump();
}

std::vector<OfferedTrainer> OfferedTrainersFromJsonText(std::string_view text) {
  const json list = json::parse(text, nullptr, /*allow_exceptions=*/false);
  std::vector<OfferedTrainer> trainers;
  if (list.is_array()) {
    for (const json& item : list) {
      if (StatusOr<OfferedTrainer> trainer = ParseOfferedTrainer(item); trainer.ok()) {
        trainers.push_back(std::move(*trainer));
      }
    }
  }
  if (trainers.empty()) trainers.push_back({.name = std::string(kBuiltinTrainer), .description = {}});
  return trainers;
}

StatusOr<HelloAnswer> ParseHelloAnswer(const json& body) {
  PARSYN_RETURN_IF_ERROR(RequireObject(body, "the hello answer"));
  JsonFields f = JsonFields::Lenient(body);
  HelloAnswer a;
  a.worker_id = f.Int("worker_id", false, 1, kNoUpperBound).value_or(0);
  a.session_id = f.String("session_id", true, 256).value_or("");
  a.heartbeat_interval_ms = f.Int("heartbeat_interval_ms", false, 1, 86'400'000).value_or(a.heartbeat_interval_ms);
  a.heartbeat_timeout_ms = f.Int("heartbeat_timeout_ms", false, 1, 86'400'000).value_or(0);
  a.max_poll_wait_ms = f.Int("max_poll_wait_ms", false, 0, 3'600'000).value_or(a.max_poll_wait_ms);
  a.worker_name = f.String("worker_name", false, 256).value_or("");
  PARSYN_RETURN_IF_ERROR(f.status());
  return a;
}

json HelloAnswerToJson(const HelloAnswer& a) {
  json out = {{"session_id", a.session_id},
              {"heartbeat_interval_ms", a.heartbeat_interval_ms},
              {"max_poll_wait_ms", a.max_poll_wait_ms}};
  // 0: not said (the reader's default); written, it would be refused (fuzz_worker_task found it).
  if (a.worker_id > 0) out["worker_id"] = a.worker_id;
  if (a.heartbeat_timeout_ms > 0) out["heartbeat_timeout_ms"] = a.heartbeat_timeout_ms;
  if (!a.worker_name.empty()) out["worker_name"] = a.worker_name;
  return out;
}

// --- heartbeat -----------------------------------------------------------------------------------------------------

StatusOr<Heartbeat> ParseHeartbeat(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields f, JsonFields::Parse(body, {"session_id"}));
  Heartbeat heartbeat;
  heartbeat.session_id = f.String("session_id", true).value_or("");
  PARSYN_RETURN_IF_ERROR(f.status());
  return heartbeat;
}

json HeartbeatToJson(const Heartbeat& heartbeat) { return {{"session_id", heartbeat.session_id}}; }

StatusOr<HeartbeatAnswer> ParseHeartbeatAnswer(const json& body) {
  PARSYN_RETURN_IF_ERROR(RequireObject(body, "the heartbeat answer"));
  JsonFields f = JsonFields::Lenient(body);
  HeartbeatAnswer answer;
  const json abandon = f.Array("abandon", false, kMaxAbandoned).value_or(json::array());
  for (size_t i = 0; i < abandon.size(); ++i) {
    JsonFields a = JsonFields::Lenient(abandon[i], "abandon[" + std::to_string(i) + "].");
    AbandonedTask task;
    task.job_id = a.Int("job_id", true, 1, kNoUpperBound).value_or(0);
    task.round = static_cast<int>(a.Int("round", true, 1, kMaxRound).value_or(0));
    task.attempt = static_cast<int>(a.Int("attempt", true, 1, kMaxRound).value_or(0));
    f.Absorb(a);
    answer.abandon.push_back(task);
  }
  const json ended = f.Array("ended_jobs", false, kMaxAbandoned).value_or(json::array());
  for (const json& id : ended) {
    if (!id.is_number_integer() || id.get<int64_t>() < 1) {
      f.AddProblem("'ended_jobs' must hold job ids (integers >= 1)");
      break;
    }
    answer.ended_jobs.push_back(id.get<int64_t>());
  }
  PARSYN_RETURN_IF_ERROR(f.status());
  return answer;
}

json HeartbeatAnswerToJson(const HeartbeatAnswer& answer) {
  json abandon = json::array();
  for (const AbandonedTask& t : answer.abandon) {
    abandon.push_back({{"job_id", t.job_id}, {"round", t.round}, {"attempt", t.attempt}});
  }
  json out = {{"abandon", std::move(abandon)}};
  if (!answer.ended_jobs.empty()) out["ended_jobs"] = answer.ended_jobs;
  return out;
}

// --- progress, result, failure -------------------------------------------------------------------------------------

StatusOr<Progress> ParseProgress(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(
      JsonFields f, JsonFields::Parse(body, {"session_id", "job_id", "round", "attempt", "step", "total_steps", "loss",
                                             "throughput", "throughput_unit", "utilization", "utilization_device",
                                             "device_memory_used_bytes", "device_memory_total_bytes"}));
  Progress p;
  p.session_id = f.String("session_id", false).value_or("");
  p.job_id = f.Int("job_id", true, 1, kNoUpperBound).value_or(0);
  p.round = static_cast<int>(f.Int("round", true, 1, kMaxRound).value_or(0));
  if (auto attempt = f.Int("attempt", false, 1, kMaxRound)) p.attempt = static_cast<int>(*attempt);
  p.step = f.Int("step", true, 0, kNoUpperBound).value_or(0);
  p.total_steps = f.Int("total_steps", false, 0, kNoUpperBound);
  p.loss = f.Number("loss", false);
  p.throughput = f.Number("throughput", false);
  p.throughput_unit = f.String("throughput_unit", false).value_or("");
  if (!p.throughput_unit.empty() && p.throughput_unit != kTokensPerSecond && p.throughput_unit != kSamplesPerSecond) {
    f.AddProblem("'throughput_unit' must be \"tokens/s\" or \"samples/s\", got \"" + p.throughput_unit + "\"");
  }
  p.utilization = f.Number("utilization", false);
  if (p.utilization && (*p.utilization < 0 || *p.utilization > 1)) f.AddProblem("'utilization' must be in 0..1");
  p.utilization_device = f.String("utilization_device", false).value_or("");
  if (!p.utilization_device.empty() && p.utilization_device != kUtilizationGpu &&
      p.utilization_device != kUtilizationHostCpu) {
    f.AddProblem("'utilization_device' must be \"gpu\" or \"host_cpu\", got \"" + p.utilization_device + "\"");
  }
  p.device_memory_used_bytes = f.Int("device_memory_used_bytes", false, 0, kNoUpperBound);
  p.device_memory_total_bytes = f.Int("device_memory_total_bytes", false, 1, kNoUpperBound);
  PARSYN_RETURN_IF_ERROR(f.status());
  return p;
}

json ProgressToJson(const Progress& p) {
  json out = {{"job_id", p.job_id}, {"round", p.round}, {"step", p.step}};
  if (!p.session_id.empty()) out["session_id"] = p.session_id;
  if (p.attempt) out["attempt"] = *p.attempt;
  if (p.total_steps) out["total_steps"] = *p.total_steps;
  if (p.loss) out["loss"] = *p.loss;
  if (p.throughput) out["throughput"] = *p.throughput;
  if (!p.throughput_unit.empty()) out["throughput_unit"] = p.throughput_unit;
  if (p.utilization) out["utilization"] = *p.utilization;
  if (!p.utilization_device.empty()) out["utilization_device"] = p.utilization_device;
  if (p.device_memory_used_bytes) out["device_memory_used_bytes"] = *p.device_memory_used_bytes;
  if (p.device_memory_total_bytes) out["device_memory_total_bytes"] = *p.device_memory_total_bytes;
  return out;
}

json ResultMetricsFrom(const TrainerResult& result) {
  json out = KnownNumbers(result.metrics, kResultCounters);
  out["validation_before"] = KnownNumbers(result.validation_before, kValidationMetrics);
  out["validation_after"] = KnownNumbers(result.validation_after, kValidationMetrics);
  return out;
}

StatusOr<Result> ParseResult(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields f, JsonFields::Parse(body, {"session_id", "job_id", "round", "attempt", "blob_key",
                                                                 "sha256", "sample_count", "train_loss",
                                                                 "validation_loss", "validation_samples", "metrics"}));
  Result r;
  r.session_id = f.String("session_id", false).value_or("");
  r.job_id = f.Int("job_id", true, 1, kNoUpperBound).value_or(0);
  r.round = static_cast<int>(f.Int("round", true, 1, kMaxRound).value_or(0));
  r.attempt = static_cast<int>(f.Int("attempt", true, 1, kMaxRound).value_or(0));
  r.blob_key = f.String("blob_key", false, 512).value_or("");
  r.sha256 = f.String("sha256", false, 64).value_or("");
  r.sample_count = f.Int("sample_count", false, 0, kNoUpperBound).value_or(0);
  r.train_loss = f.Number("train_loss", false);
  r.validation_loss = f.Number("validation_loss", false);
  r.validation_samples = f.Int("validation_samples", false, 0, kNoUpperBound).value_or(0);
  r.metrics = ReadResultMetrics(f);
  PARSYN_RETURN_IF_ERROR(f.status());
  return r;
}

json ResultToJson(const Result& r) {
  json out = {{"job_id", r.job_id},
              {"round", r.round},
              {"attempt", r.attempt},
              {"sample_count", r.sample_count},
              {"validation_samples", r.validation_samples},
              {"metrics", r.metrics}};
  if (!r.session_id.empty()) out["session_id"] = r.session_id;
  if (r.train_loss) out["train_loss"] = *r.train_loss;
  if (r.validation_loss) out["validation_loss"] = *r.validation_loss;
  // Each only when said: an empty one would be refused (fuzz_route_bodies found "sha256": "" written back).
  if (!r.blob_key.empty()) out["blob_key"] = r.blob_key;
  if (!r.sha256.empty()) out["sha256"] = r.sha256;
  return out;
}

StatusOr<Failure> ParseFailure(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields f,
                          JsonFields::Parse(body, {"session_id", "job_id", "round", "attempt", "reason"}));
  Failure failure;
  failure.session_id = f.String("session_id", false).value_or("");
  failure.job_id = f.Int("job_id", true, 1, kNoUpperBound).value_or(0);
  failure.round = static_cast<int>(f.Int("round", true, 1, kMaxRound).value_or(0));
  failure.attempt = static_cast<int>(f.Int("attempt", true, 1, kMaxRound).value_or(0));
  failure.reason = f.String("reason", true, kMaxReasonBytes).value_or("");
  PARSYN_RETURN_IF_ERROR(f.status());
  return failure;
}

json FailureToJson(const Failure& failure) {
  json out = {
      {"job_id", failure.job_id}, {"round", failure.round}, {"attempt", failure.attempt}, {"reason", failure.reason}};
  if (!failure.session_id.empty()) out["session_id"] = failure.session_id;
  return out;
}

}  // namespace parsyn::protocol
