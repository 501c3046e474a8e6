#include "coordinator/api_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace parsyn::coordinator {

using nlohmann::json;

StatusOr<int64_t> ParseId(std::string_view text, std::string_view what) {
  int64_t id = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size() || id < 1) {
    std::string shown(text.substr(0, 64));
    return InvalidArgumentError(std::string(what) + " id must be a positive integer, got '" + shown + "'");
  }
  return id;
}

Status ValidateModelFilePath(std::string_view path) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("model file path '" + std::string(path.substr(0, 300)) + "' " + std::string(why));
  };
  if (path.empty() || path.size() > 256) return bad("must be 1..256 bytes");
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string_view seg = path.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (seg.empty()) return bad("has an empty segment (leading, trailing or double '/')");
    if (seg == "." || seg == "..") return bad("must not contain '.' or '..' segments");
    for (char c : seg) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
        return bad("may contain only letters, digits, '.', '_', '-' and '/'");
      }
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return Status::Ok();
}

Status ValidateUploadId(std::string_view id) {
  bool ok = id.size() == 32 &&
            std::all_of(id.begin(), id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (!ok) return InvalidArgumentError("upload id '" + std::string(id.substr(0, 64)) + "' is not 32 hex digits");
  return Status::Ok();
}

std::string UploadKey(std::string_view id) { return "uploads/" + std::string(id); }

StatusOr<storage::Model> ParseModelBody(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Parse(body, {"name", "files"}));
  std::optional<std::string> name = fields.String("name", true);
  std::optional<json> files = fields.Object("files", true);
  storage::Model model{.name = name.value_or("")};
  if (files) {
    if (files->empty()) {
      fields.AddProblem("'files' must name at least config.json, tabular_model.json or parsyn_model.json");
    }
    for (const auto& [path, upload] : files->items()) {
      Status path_ok = ValidateModelFilePath(path);
      if (!path_ok.ok()) {
        fields.AddProblem("files: " + path_ok.message());
        continue;
      }
      if (!upload.is_string()) {
        fields.AddProblem("files['" + path + "'] must be an upload id string");
        continue;
      }
      Status id_ok = ValidateUploadId(upload.get<std::string>());
      if (!id_ok.ok()) {
        fields.AddProblem("files['" + path + "']: " + id_ok.message());
        continue;
      }
      model.files.push_back({.path = path, .blob_key = UploadKey(upload.get<std::string>())});
    }
    // A language model is described by config.json; a tabular model (trainer/tabular_model.h) by
    // tabular_model.json, whose standardisation and class mapping every worker of a job then shares; a custom model
    // by parsyn_model.json (protocol/model_manifest.h).
    if (!files->contains("config.json") && !files->contains("tabular_model.json") &&
        !files->contains(protocol::kModelManifestFile)) {
      fields.AddProblem(
          "files must include config.json (language model), tabular_model.json (tabular model) or parsyn_model.json "
          "(a custom model: docs/trainer-contract.md)");
    }
  }
  PARSYN_RETURN_IF_ERROR(fields.status());
  return model;
}

StatusOr<WorkerRegistration> ParseWorkerRegistration(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(JsonFields fields, JsonFields::Parse(body, {"name", "kind"}));
  WorkerRegistration registration;
  registration.name = fields.String("name", true).value_or("");
  if (std::optional<std::string> kind = fields.String("kind", false)) {
    StatusOr<storage::WorkerKind> k = storage::ParseWorkerKind(*kind);
    if (!k.ok()) {
      fields.AddProblem("'kind': " + k.status().message());
    } else {
      registration.kind = *k;
    }
  }
  PARSYN_RETURN_IF_ERROR(fields.status());
  return registration;
}

json DatasetJson(const storage::Dataset& d) {
  return {{"id", d.id},
          {"project_id", d.project_id},
          {"name", d.name},
          {"format", storage::ToString(d.format)},
          {"kind", storage::ToString(d.kind)},
          {"row_count", d.row_count},
          {"size_bytes", d.size_bytes},
          {"sha256", d.sha256},
          {"created_at_ms", d.created_at_ms}};
}

json ModelJson(const storage::Model& m) {
  json files = json::array();
  for (const storage::ModelFile& f : m.files) {
    files.push_back({{"path", f.path}, {"size_bytes", f.size_bytes}, {"sha256", f.sha256}});
  }
  return {{"id", m.id},
          {"project_id", m.project_id},
          {"name", m.name},
          {"model_type", m.model_type},
          {"size_bytes", m.size_bytes},
          {"files", files},
          {"created_at_ms", m.created_at_ms}};
}

json WorkerTrainersJson(std::string_view trainers_json) {
  json list = json::array();
  if (trainers_json.empty()) return list;  // never said hello: nothing announced yet
  for (const protocol::OfferedTrainer& t : protocol::OfferedTrainersFromJsonText(trainers_json)) {
    list.push_back({{"name", t.name}, {"describe", protocol::TrainerDescriptionToJson(t.description)}});
  }
  return list;
}

json WorkerJson(const storage::Worker& w) {
  return {{"id", w.id},
          {"name", w.name},
          {"kind", storage::ToString(w.kind)},
          // A managed worker serves every project: null.
          {"project_id", w.kind == storage::WorkerKind::kManaged ? json(nullptr) : json(w.project_id)},
          {"status", w.revoked ? "revoked" : std::string(storage::ToString(w.status))},
          {"device", w.device},
          {"trainers", WorkerTrainersJson(w.trainers_json)},
          {"last_heartbeat_at_ms", w.last_heartbeat_at_ms ? json(*w.last_heartbeat_at_ms) : json()},
          {"revoked", w.revoked},
          {"created_at_ms", w.created_at_ms}};
}

json JobJson(const storage::TrainingJob& job) {
  json spec = json::parse(job.spec_json, nullptr, false);
  json out = {{"id", job.id},
              {"project_id", job.project_id},
              {"name", job.name},
              {"status", storage::ToString(job.status)},
              {"dataset_id", job.dataset_id == 0 ? json(nullptr) : json(job.dataset_id)},  // 0: workers' own data
              {"model_id", job.model_id},
              {"current_round", job.current_round},
              {"committed_round", job.committed_round},
              {"total_rounds", spec.is_discarded() ? json() : spec["distributed"]["num_rounds"]},
              {"consecutive_failed_rounds", job.consecutive_failed_rounds},
              {"created_at_ms", job.created_at_ms},
              {"started_at_ms", job.started_at_ms ? json(*job.started_at_ms) : json()},
              {"finished_at_ms", job.finished_at_ms ? json(*job.finished_at_ms) : json()},
              {"spec", spec.is_discarded() ? json() : spec}};
  if (!job.failure_reason.empty()) out["failure_reason"] = job.failure_reason;
  if (!job.status_reason.empty()) out["status_reason"] = job.status_reason;
  // Validation losses, each of one set of weights (docs/openapi.yaml Job); null until measured.
  auto optional = [](const auto& v) { return v ? json(*v) : json(); };
  out["initial_validation_loss"] = optional(job.initial_validation_loss);
  out["final_validation_loss"] = optional(job.final_validation_loss);
  out["best_round"] = optional(job.best_round);
  out["best_validation_loss"] = optional(job.best_validation_loss);
  return out;
}

json RoundJson(const storage::Round& r, const std::vector<storage::RoundUpdate>& updates, const json& privacy,
               std::optional<uint64_t> plain_update_bytes) {
  json participants = r.participants;
  json ups = json::array();
  uint64_t plain_bytes = 0, wire_bytes = 0;
  for (const storage::RoundUpdate& u : updates) {
    if (plain_update_bytes && u.size_bytes > 0) {
      plain_bytes += *plain_update_bytes;
      wire_bytes += static_cast<uint64_t>(u.size_bytes);
    }
    if (std::find(r.participants.begin(), r.participants.end(), u.worker_id) == r.participants.end()) {
      participants.push_back(u.worker_id);
    }
    json j = {{"worker_id", u.worker_id},
              {"status", storage::ToString(u.status)},
              {"num_samples", u.num_samples},
              {"size_bytes", u.size_bytes},
              {"sha256", u.sha256},
              {"train_loss", u.train_loss ? json(*u.train_loss) : json()},
              {"metrics", json::parse(u.metrics_json, nullptr, false).is_discarded()
                              ? json::object()
                              : json::parse(u.metrics_json, nullptr, false)}};
    if (!u.reject_reason.empty()) j["reason"] = u.reject_reason;
    if (u.trained_on_round) {  // an asynchronous job's: the version it trained on, and how many came since
      j["trained_on_round"] = *u.trained_on_round;
      j["staleness"] = r.round - 1 - *u.trained_on_round;
    }
    ups.push_back(std::move(j));
  }
  json out = {{"round", r.round},
              {"attempt", r.attempt},
              {"outcome", storage::ToString(r.status)},
              {"participants", participants},
              {"updates", ups},
              {"train_loss", r.train_loss ? json(*r.train_loss) : json()},
              {"validation_loss", r.validation_loss ? json(*r.validation_loss) : json()},
              {"started_at_ms", r.started_at_ms},
              {"duration_ms", r.ended_at_ms ? json(*r.ended_at_ms - r.started_at_ms) : json()},
              {"bytes_moved", r.bytes_moved},
              {"bytes_down", r.bytes_down ? json(*r.bytes_down) : json()},
              {"bytes_up", r.bytes_up ? json(*r.bytes_up) : json()}};
  if (!r.global_sha256.empty()) out["global_sha256"] = r.global_sha256;
  if (!r.failure_reason.empty()) out["failure_reason"] = r.failure_reason;
  if (!privacy.is_null()) out["privacy"] = privacy;
  out["compression_ratio"] =
      wire_bytes > 0
          ? json(std::round(1000.0 * static_cast<double>(plain_bytes) / static_cast<double>(wire_bytes)) / 1000.0)
          : json(nullptr);
  return out;
}

json RoundPrivacyJson(const strategy::DpRoundReport& report, const strategy::DpFedAvgOptions& options) {
  // JSON has no +inf (no noise: no privacy); job specs refuse noise_multiplier 0, so this is a safety net.
  const bool bounded = std::isfinite(report.epsilon);
  json out = {{"epsilon", bounded ? json(report.epsilon) : json(nullptr)},
              {"delta", options.delta},
              {"participants", report.participants},
              {"clipped", report.clipped},
              {"noise_stddev", report.noise_stddev},
              {"sampling_rate", report.sampling_rate},
              {"noise_multiplier", options.noise_multiplier},
              {"clip_norm", options.clip_norm}};
  if (!bounded) out["epsilon_unbounded"] = true;
  return out;
}

json ArtifactJson(const storage::JobArtifact& a) {
  return {{"name", a.name}, {"size_bytes", a.size_bytes}, {"sha256", a.sha256}, {"created_at_ms", a.created_at_ms}};
}

http::Response ProblemsResponse(const std::vector<FieldProblem>& problems) {
  std::string message;
  json errors = json::array();
  for (const FieldProblem& p : problems) {
    message += (message.empty() ? "" : "; ") + p.message;
    errors.push_back({{"field", p.field.empty() ? json(nullptr) : json(p.field)}, {"message", p.message}});
  }
  return http::Response::Json(
      400, {{"error", {{"code", "invalid_argument"}, {"message", message}, {"errors", std::move(errors)}}}});
}

}  // namespace parsyn::coordinator
