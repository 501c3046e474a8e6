#include "protocol/messages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "protocol/field_reader.h"
#include "protocol/json_fields.h"
#include "protocol/json_text.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr size_t kMaxModelFiles = 10'000;
constexpr size_t kMaxUploadParts = 10'000;  // S3's limit
constexpr size_t kMaxHeaders = 64;
constexpr size_t kMaxMetrics = 16;
constexpr size_t kMaxAbandoned = 10'000;

// A message from the coordinator must be an object before its fields can be read.
Status CheckObject(const json& body, std::string_view what) {
  if (body.is_object()) return Status::Ok();
  return InvalidArgumentError(std::string(what) + " must be a JSON object, got " + body.type_name());
}

// Reads a nested object of a lenient message (its problems go to `outer`); nullopt when absent and not required.
std::optional<JsonFields> Nested(JsonFields& outer, std::string_view name, bool required,
                                 const std::string& prefix = "") {
  std::optional<json> object = outer.Object(name, required);
  if (!object) return std::nullopt;
  return JsonFields::Lenient(std::move(*object), prefix + std::string(name) + ".");
}

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

// A task id names files and log lines on workers: never a path.
bool IsTaskName(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

// A checksum field of a task: required, 64 lowercase hex digits.
std::string Sha256Field(JsonFields& f, std::string_view name, bool required) {
  std::optional<std::string> value = f.String(name, required, 64);
  if (!value) return "";
  if (!IsSha256Hex(*value)) {
    f.AddProblem(f.Quoted(name) + " must be 64 lowercase hex digits (a sha256), got '" + *value + "'");
    return "";
  }
  return *value;
}

HttpHeaders ToHeaders(const std::vector<std::pair<std::string, std::string>>& pairs) {
  return HttpHeaders(pairs.begin(), pairs.end());
}

std::optional<UpdateUpload> ReadUpdateUpload(JsonFields& task) {
  std::optional<JsonFields> f = Nested(task, "update_upload", false);
  if (!f) return std::nullopt;
  UpdateUpload u;
  u.blob_key = f->String("blob_key", true, 1024).value_or("");
  u.max_size_bytes = f->Uint64("max_size_bytes", false).value_or(0);
  u.url = f->String("url", false, kMaxUrlBytes).value_or("");
  if (auto headers = f->StringMap("headers", false, kMaxHeaders)) u.headers = ToHeaders(*headers);
  if (std::optional<JsonFields> m = Nested(*f, "multipart", false, "update_upload.")) {
    UpdateUpload::Multipart multipart;
    multipart.part_size_bytes = m->Uint64("part_size_bytes", true).value_or(0);
    const json parts = m->Array("parts", true, kMaxUploadParts).value_or(json::array());
    for (size_t i = 0; i < parts.size(); ++i) {
      JsonFields p = JsonFields::Lenient(parts[i], "update_upload.multipart.parts[" + std::to_string(i) + "].");
      UploadPart part;
      part.part_number = p.Int("part_number", true, 1, static_cast<int64_t>(kMaxUploadParts)).value_or(0);
      part.url = p.String("url", true, kMaxUrlBytes).value_or("");
      if (auto headers = p.StringMap("headers", false, kMaxHeaders)) part.headers = ToHeaders(*headers);
      m->Absorb(p);
      multipart.parts.push_back(std::move(part));
    }
    f->Absorb(*m);
    u.multipart = std::move(multipart);
  }
  if (u.url.empty() && !u.multipart) f->AddProblem("'update_upload' needs a url or multipart parts");
  task.Absorb(*f);
  return u;
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
  PARSYN_ASSIGN_OR_RETURN(
      JsonFields f, JsonFields::Parse(body.empty() ? "{}" : body, {"device", "version", "local_data", "trainers"}));
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
  PARSYN_RETURN_IF_ERROR(f.status());
  return hello;
}

json HelloToJson(const Hello& hello) {
  json out = json::object();
  if (!hello.device.empty()) out["device"] = hello.device;
  if (!hello.version.empty()) out["version"] = hello.version;
  if (hello.local_data) out["local_data"] = {{"format", hello.local_data->format}, {"rows", hello.local_data->rows}};
  if (!hello.trainers.empty()) out["trainers"] = OfferedTrainersJson(hello.trainers);
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
  PARSYN_RETURN_IF_ERROR(CheckObject(body, "the hello answer"));
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
  PARSYN_RETURN_IF_ERROR(CheckObject(body, "the heartbeat answer"));
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
  PARSYN_RETURN_IF_ERROR(f.status());
  return answer;
}

json HeartbeatAnswerToJson(const HeartbeatAnswer& answer) {
  json abandon = json::array();
  for (const AbandonedTask& t : answer.abandon) {
    abandon.push_back({{"job_id", t.job_id}, {"round", t.round}, {"attempt", t.attempt}});
  }
  return {{"abandon", std::move(abandon)}};
}

// --- task ----------------------------------------------------------------------------------------------------------

std::string_view TaskKindName(TaskKind kind) { return kind == TaskKind::kEvaluate ? "evaluate" : "train"; }

std::string_view DataSourceName(DataSource source) { return source == DataSource::kWorkers ? "workers" : "platform"; }

std::string RoundLabel(int round, int total_rounds) {
  if (total_rounds > 0 && round > total_rounds) return "the final evaluation";
  return "round " + std::to_string(round) + (total_rounds > 0 ? "/" + std::to_string(total_rounds) : "");
}

namespace {

// A task's "global_weights" object (its fields in `g`).
TaskGlobalWeights ReadGlobalWeights(JsonFields& g) {
  TaskGlobalWeights weights;
  weights.url = g.String("url", true, kMaxUrlBytes).value_or("");
  weights.sha256 = Sha256Field(g, "sha256", true);
  weights.size_bytes = g.Uint64("size_bytes", false).value_or(0);
  weights.round = static_cast<int>(g.Int("round", false, 0, kMaxRound).value_or(0));
  if (std::optional<JsonFields> z = Nested(g, "zstd", false, "global_weights.")) {
    TaskZstdCopy copy;
    copy.url = z->String("url", true, kMaxUrlBytes).value_or("");
    copy.sha256 = Sha256Field(*z, "sha256", true);
    copy.size_bytes = z->Uint64("size_bytes", false).value_or(0);
    weights.zstd = std::move(copy);
    g.Absorb(*z);
  }
  return weights;
}

// A task's "data" object: its shard's files (their fields in `d`).
TaskData ReadTaskData(JsonFields& d) {
  TaskData data;
  data.format = d.String("format", false, 16).value_or("");
  data.kind = d.String("kind", false, 64, /*allow_empty=*/true).value_or("");
  data.train_url = d.String("train_url", false, kMaxUrlBytes).value_or("");
  data.train_sha256 = Sha256Field(d, "train_sha256", !data.train_url.empty());
  data.train_rows = d.Int("train_rows", false, 0, kNoUpperBound).value_or(0);
  data.validation_url = d.String("validation_url", false, kMaxUrlBytes).value_or("");
  data.validation_sha256 = Sha256Field(d, "validation_sha256", !data.validation_url.empty());
  data.validation_rows = d.Int("validation_rows", false, 0, kNoUpperBound).value_or(0);
  return data;
}

// A task's "model" object: the model's id, name and files (its fields in `m`).
TaskModel ReadTaskModel(JsonFields& m) {
  TaskModel model;
  model.id = m.Int("id", false, 0, kNoUpperBound).value_or(0);
  model.name = m.String("name", false, 256, /*allow_empty=*/true).value_or("");
  model.model_type = m.String("model_type", false, 64, /*allow_empty=*/true).value_or("");
  const json files = m.Array("files", false, kMaxModelFiles).value_or(json::array());
  for (size_t i = 0; i < files.size(); ++i) {
    JsonFields file = JsonFields::Lenient(files[i], "model.files[" + std::to_string(i) + "].");
    TaskModelFile mf;
    mf.path = file.String("path", true, 1024).value_or("");
    mf.url = file.String("url", true, kMaxUrlBytes).value_or("");
    mf.sha256 = Sha256Field(file, "sha256", true);
    mf.size_bytes = file.Uint64("size_bytes", false).value_or(0);
    m.Absorb(file);
    model.files.push_back(std::move(mf));
  }
  return model;
}

// A task's "compression" object: how the worker encodes its update (its fields in `c`).
UpdateCompression ReadUpdateCompression(JsonFields& c) {
  UpdateCompression compression;
  if (std::optional<std::string> update = c.String("update", false, 16)) {
    if (*update == "none" || *update == "bf16" || *update == "int8" || *update == "int4") {
      compression.update = *update;
    } else {
      c.AddProblem("'compression.update' must be one of none, bf16, int8, int4, got '" + *update + "'");
    }
  }
  compression.delta = c.Bool("delta", false).value_or(false);
  compression.zstd_level = static_cast<int>(c.Int("zstd_level", false, 0, kMaxCompressionZstdLevel).value_or(0));
  compression.error_feedback = c.Bool("error_feedback", false).value_or(false);
  return compression;
}

}  // namespace

StatusOr<Task> ParseTask(const json& body) {
  PARSYN_RETURN_IF_ERROR(CheckObject(body, "a task"));
  JsonFields f = JsonFields::Lenient(body);
  Task t;
  if (std::optional<std::string> id = f.String("task_id", true)) {
    if (IsTaskName(*id)) {
      t.task_id = std::move(*id);
    } else {
      f.AddProblem("'task_id' must be 1..64 letters, digits, '-' or '_'");
    }
  }
  t.job_id = f.Int("job_id", true, 1, kNoUpperBound).value_or(0);
  if (std::optional<std::string> kind = f.String("kind", true, 32)) {
    if (*kind == "train" || *kind == "evaluate") {
      t.kind = *kind == "train" ? TaskKind::kTrain : TaskKind::kEvaluate;
    } else {
      f.AddProblem("'kind' must be one of train, evaluate, got '" + *kind + "'");
    }
  }
  t.round = static_cast<int>(f.Int("round", true, 1, kMaxRound).value_or(0));
  t.attempt = static_cast<int>(f.Int("attempt", true, 1, kMaxRound).value_or(0));
  t.total_rounds = static_cast<int>(f.Int("total_rounds", true, 1, kMaxRound).value_or(0));
  t.shard = static_cast<int>(f.Int("shard", true, 0, kMaxRound).value_or(0));
  t.seed = f.Uint64("seed", true).value_or(0);
  t.steps_per_round = f.Int("steps_per_round", true, 0, kNoUpperBound).value_or(0);
  if (std::optional<json> config = f.Object("config", true)) {
    StatusOr<TrainingConfig> parsed = ParseTrainingConfig(*config);
    if (parsed.ok()) {
      t.config = *parsed;
    } else {
      f.AddProblem(parsed.status().message());
    }
  }
  if (std::optional<double> mu = f.Number("proximal_mu", false)) {
    if (*mu >= 0 && *mu <= kMaxProximalMu) {
      t.proximal_mu = *mu;
    } else {
      f.AddProblem("'proximal_mu' (FedProx's mu) must be in 0.." + FieldReader::FormatNumber(kMaxProximalMu) +
                   ", got " + FieldReader::FormatNumber(*mu));
    }
  }
  t.deadline_unix_ms = f.Int("deadline_unix_ms", false, 0, kNoUpperBound).value_or(0);
  if (std::optional<JsonFields> g = Nested(f, "global_weights", true)) {
    t.global_weights = ReadGlobalWeights(*g);
    f.Absorb(*g);
  }
  if (std::optional<std::string> source = f.String("data_source", false, 32)) {
    if (*source == "platform" || *source == "workers") {
      t.data_source = *source == "workers" ? DataSource::kWorkers : DataSource::kPlatform;
    } else {
      f.AddProblem("'data_source' must be one of platform, workers, got '" + *source + "'");
    }
  }
  if (std::optional<JsonFields> d = Nested(f, "data", true)) {
    t.data = ReadTaskData(*d);
    f.Absorb(*d);
  }
  // A task over the workers' own data has no shard: whatever `data` holds is not read (and not written back).
  if (t.data_source == DataSource::kWorkers) t.data = TaskData{};
  if (std::optional<JsonFields> m = Nested(f, "model", true)) {
    t.model = ReadTaskModel(*m);
    f.Absorb(*m);
  }
  if (std::optional<JsonFields> c = Nested(f, "compression", false)) {
    t.compression = ReadUpdateCompression(*c);
    f.Absorb(*c);
  }
  t.update_upload = ReadUpdateUpload(f);
  if (t.kind == TaskKind::kTrain && !t.update_upload && f.status().ok()) {
    f.AddProblem("a train task needs 'update_upload'");
  }
  PARSYN_RETURN_IF_ERROR(f.status());
  return t;
}

json UpdateCompressionToJson(const UpdateCompression& c) {
  return {{"update", c.update}, {"delta", c.delta}, {"zstd_level", c.zstd_level}, {"error_feedback", c.error_feedback}};
}

namespace {

void WriteUpdateUpload(JsonTextWriter& w, const UpdateUpload& u) {
  w.BeginObject().Field("blob_key", u.blob_key).Field("max_size_bytes", u.max_size_bytes);
  if (!u.url.empty()) w.Field("url", u.url);
  auto write_headers = [](JsonTextWriter& out, const HttpHeaders& headers) {
    out.BeginObject();
    for (const auto& [name, value] : headers) out.Field(name, value);
    out.EndObject();
  };
  if (u.headers) write_headers(w.Key("headers"), *u.headers);
  if (u.multipart) {
    w.Key("multipart").BeginObject().Field("part_size_bytes", u.multipart->part_size_bytes).Key("parts").BeginArray();
    for (const UploadPart& p : u.multipart->parts) {
      w.BeginObject().Field("part_number", p.part_number).Field("url", p.url);
      write_headers(w.Key("headers"), p.headers);
      w.EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndObject();
}

}  // namespace

std::string TaskJsonText(const Task& t, std::string_view config_json) {
  JsonTextWriter w;
  w.Reserve(4096);
  w.BeginObject()
      .Field("task_id", t.task_id)
      .Field("job_id", t.job_id)
      .Field("kind", TaskKindName(t.kind))
      .Field("round", t.round)
      .Field("attempt", t.attempt)
      .Field("total_rounds", t.total_rounds)
      .Field("shard", t.shard)
      .Field("seed", t.seed)
      .Field("steps_per_round", t.steps_per_round);
  w.Key("config");
  if (config_json.empty()) {
    w.Raw(TrainingConfigToJson(t.config).dump());
  } else {
    w.Raw(config_json);
  }
  w.Field("deadline_unix_ms", t.deadline_unix_ms);
  w.Key("global_weights")
      .BeginObject()
      .Field("url", t.global_weights.url)
      .Field("sha256", t.global_weights.sha256)
      .Field("size_bytes", t.global_weights.size_bytes)
      .Field("round", t.global_weights.round);
  if (const std::optional<TaskZstdCopy>& zstd = t.global_weights.zstd) {
    w.Key("zstd").BeginObject().Field("url", zstd->url).Field("sha256", zstd->sha256);
    w.Field("size_bytes", zstd->size_bytes).EndObject();
  }
  w.EndObject();
  w.Field("data_source", DataSourceName(t.data_source));
  w.Key("data").BeginObject();
  if (t.data_source != DataSource::kWorkers) {  // the worker's own file: no URLs, nothing else
    w.Field("kind", t.data.kind).Field("train_rows", t.data.train_rows);
    w.Field("validation_rows", t.data.validation_rows);
    // Absent rather than empty: the reader refuses empty strings there.
    for (const auto& [name, value] : {std::pair<const char*, const std::string&>{"format", t.data.format},
                                      {"train_url", t.data.train_url},
                                      {"train_sha256", t.data.train_sha256},
                                      {"validation_url", t.data.validation_url},
                                      {"validation_sha256", t.data.validation_sha256}}) {
      if (!value.empty()) w.Field(name, value);
    }
  }
  w.EndObject();
  w.Key("model")
      .BeginObject()
      .Field("id", t.model.id)
      .Field("name", t.model.name)
      .Field("model_type", t.model.model_type)
      .Key("files")
      .BeginArray();
  for (const TaskModelFile& f : t.model.files) {
    w.BeginObject().Field("path", f.path).Field("url", f.url).Field("sha256", f.sha256);
    w.Field("size_bytes", f.size_bytes).EndObject();
  }
  w.EndArray().EndObject();
  if (t.update_upload) WriteUpdateUpload(w.Key("update_upload"), *t.update_upload);
  // Absent for FedAvg: older workers read the same task.
  if (t.proximal_mu != 0) w.Key("proximal_mu").Double(t.proximal_mu);
  if (t.compression != UpdateCompression{}) w.Key("compression").Raw(UpdateCompressionToJson(t.compression).dump());
  w.EndObject();
  return w.Take();
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
