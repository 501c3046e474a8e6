// The task message of the worker protocol (messages.h): ParseTask reads what a worker polls; TaskJsonText writes it
// for the coordinator, once per worker per round, straight to text (json_text.h). The other messages are messages.cc.
#include <algorithm>

#include "protocol/json_fields.h"
#include "protocol/json_text.h"
#include "protocol/messages.h"

namespace parsyn::protocol {
namespace {

using nlohmann::json;

constexpr size_t kMaxModelFiles = 10'000;
constexpr size_t kMaxUploadParts = 10'000;  // S3's limit
constexpr size_t kMaxHeaders = 64;

// Reads a nested object of a lenient message (its problems go to `outer`); nullopt when absent and not required.
std::optional<JsonFields> Nested(JsonFields& outer, std::string_view name, bool required,
                                 const std::string& prefix = "") {
  std::optional<json> object = outer.Object(name, required);
  if (!object) return std::nullopt;
  return JsonFields::Lenient(std::move(*object), prefix + std::string(name) + ".");
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
  if (std::optional<JsonFields> d = Nested(g, "delta", false, "global_weights.")) {
    TaskGlobalDelta delta;
    delta.url = d->String("url", true, kMaxUrlBytes).value_or("");
    delta.sha256 = Sha256Field(*d, "sha256", true);
    delta.size_bytes = d->Uint64("size_bytes", false).value_or(0);
    delta.base_sha256 = Sha256Field(*d, "base_sha256", true);
    if (std::optional<std::string> codec = d->String("codec", true, 16)) {
      if (*codec == "bf16" || *codec == "int8" || *codec == "int4") {
        delta.codec = *codec;
      } else {
        d->AddProblem("'global_weights.delta.codec' must be one of bf16, int8, int4, got '" + *codec + "'");
      }
    }
    delta.zstd = d->Bool("zstd", false).value_or(false);
    delta.metadata = d->StringMap("metadata", false, 64).value_or(std::vector<std::pair<std::string, std::string>>{});
    weights.delta = std::move(delta);
    g.Absorb(*d);
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
  if (std::optional<std::string> global = c.String("global", false, 16)) {
    if (*global == "none" || !GlobalDeltaCodec(*global).empty()) {
      compression.global = *global;
    } else {
      c.AddProblem("'compression.global' must be one of none, delta_bf16, delta_int8, delta_int4, got '" + *global +
                   "'");
    }
  }
  return compression;
}

}  // namespace

StatusOr<Task> ParseTask(const json& body) {
  PARSYN_RETURN_IF_ERROR(RequireObject(body, "a task"));
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
  t.secure_aggregation = f.Bool("secure_aggregation", false).value_or(false);
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

std::string_view GlobalDeltaCodec(std::string_view global) {
  for (const auto& [name, codec] : kGlobalCodecs) {
    if (name == global) return codec;
  }
  return "";
}

json UpdateCompressionToJson(const UpdateCompression& c) {
  return {{"update", c.update},
          {"delta", c.delta},
          {"zstd_level", c.zstd_level},
          {"error_feedback", c.error_feedback},
          {"global", c.global}};
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
  if (const std::optional<TaskGlobalDelta>& delta = t.global_weights.delta) {
    w.Key("delta").BeginObject().Field("url", delta->url).Field("sha256", delta->sha256);
    w.Field("size_bytes", delta->size_bytes).Field("base_sha256", delta->base_sha256).Field("codec", delta->codec);
    w.Field("zstd", delta->zstd).Key("metadata").BeginObject();
    for (const auto& [key, value] : delta->metadata) w.Field(key, value);
    w.EndObject().EndObject();
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
  if (t.secure_aggregation) w.Key("secure_aggregation").Bool(true);
  w.EndObject();
  return w.Take();
}

}  // namespace parsyn::protocol
