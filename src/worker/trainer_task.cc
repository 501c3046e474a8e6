#include "worker/trainer_task.h"

#include <algorithm>

namespace parsyn::worker {

using nlohmann::json;

namespace {

template <typename T>
Status Read(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return InvalidArgumentError(std::string("task: missing '") + key + "'");
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    return InvalidArgumentError(std::string("task: '") + key + "' has the wrong type: " + it->dump());
  }
  return Status::Ok();
}

std::optional<double> NumberOrNull(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

}  // namespace

StatusOr<TaskHeader> ParseTaskHeader(const json& task) {
  if (!task.is_object()) return InvalidArgumentError("task: not a JSON object");
  TaskHeader h;
  PARSYN_RETURN_IF_ERROR(Read(task, "task_id", h.task_id));
  PARSYN_RETURN_IF_ERROR(Read(task, "kind", h.kind));
  PARSYN_RETURN_IF_ERROR(Read(task, "job_id", h.job_id));
  PARSYN_RETURN_IF_ERROR(Read(task, "round", h.round));
  PARSYN_RETURN_IF_ERROR(Read(task, "attempt", h.attempt));
  PARSYN_RETURN_IF_ERROR(Read(task, "total_rounds", h.total_rounds));
  PARSYN_RETURN_IF_ERROR(Read(task, "shard", h.shard));
  PARSYN_RETURN_IF_ERROR(Read(task, "steps_per_round", h.steps_per_round));
  if (h.kind != "train" && h.kind != "evaluate") return InvalidArgumentError("task: unknown kind '" + h.kind + "'");
  if (h.kind == "train" && !task.contains("update_upload")) {
    return InvalidArgumentError("task: a train task without 'update_upload'");
  }
  return h;
}

StatusOr<json> BuildTrainerTask(const json& task, const TaskHeader& header, const TaskFiles& files,
                                const std::string& device, int threads) {
  auto config_it = task.find("config");
  if (config_it == task.end() || !config_it->is_object()) return InvalidArgumentError("task: missing 'config'");
  json config = *config_it;
  // The job spec's config carries keys the trainer takes elsewhere or not at all: the job seed (the task's own
  // per-round seed is used), and empty label_column / hidden_sizes meaning "the trainer's default".
  config.erase("seed");
  if (config.contains("label_column") && config["label_column"] == "") config.erase("label_column");
  if (config.contains("hidden_sizes") && config["hidden_sizes"].empty()) config.erase("hidden_sizes");
  if (files.validation_fraction) config["validation_fraction"] = *files.validation_fraction;
  uint64_t seed = 0;
  PARSYN_RETURN_IF_ERROR(Read(task, "seed", seed));
  const bool train = header.kind == "train";
  json out = {
      {"initial_weights", files.global_weights.string()},
      {"data", files.data.string()},
      {"data_format", files.data_format},
      {"config", config},
      {"steps", train ? header.steps_per_round : 0},
      // The trainer reads seeds as non-negative int64: keep the coordinator's 64-bit seed's low 63 bits.
      {"seed", seed & 0x7fff'ffff'ffff'ffffULL},
      {"split_seed", 0},
      {"device", device},
      {"threads", threads},
      {"output",
       {{"weights", (files.output_dir / "update.safetensors").string()},
        {"result", (files.output_dir / "result.json").string()}}},
  };
  if (train) {
    // One learning-rate schedule across the job: round r continues where round r-1 ended.
    out["schedule"] = {{"start_step", static_cast<int64_t>(header.round - 1) * header.steps_per_round},
                       {"total_steps", static_cast<int64_t>(header.total_rounds) * header.steps_per_round}};
  }
  if (!files.model_dir.empty()) out["model_dir"] = files.model_dir.string();
  return out;
}

StatusOr<json> BuildResultReport(const TaskHeader& header, const std::string& session_id, const json& done,
                                 const std::string& blob_key, const std::string& sha256) {
  int64_t samples = 0, num_validation = 0;
  PARSYN_RETURN_IF_ERROR(Read(done, "samples_used", samples));
  PARSYN_RETURN_IF_ERROR(Read(done, "num_validation", num_validation));
  json report = {{"session_id", session_id},  {"job_id", header.job_id}, {"round", header.round},
                 {"attempt", header.attempt}, {"sample_count", samples}, {"validation_samples", num_validation}};
  if (auto loss = NumberOrNull(done, "mean_train_loss")) report["train_loss"] = *loss;
  // The coordinator records the validation loss of the global this task received: the trainer's "before".
  const json before = done.value("validation_before", json());
  if (before.is_object()) {
    if (auto loss = NumberOrNull(before, "loss")) report["validation_loss"] = *loss;
  }
  json metrics = json::object();
  for (const char* key : {"validation_before", "validation_after", "steps", "examples_seen", "tokens_seen", "wall_s"}) {
    if (done.contains(key)) metrics[key] = done[key];
  }
  report["metrics"] = metrics;
  if (!blob_key.empty()) {
    report["blob_key"] = blob_key;
    report["sha256"] = sha256;
  }
  return report;
}

std::optional<json> BuildProgressReport(const TaskHeader& header, const std::string& session_id, const json& event,
                                        std::optional<double> utilization) {
  if (event.value("event", "") != "progress" || !event.contains("step") || !event["step"].is_number_integer()) {
    return std::nullopt;
  }
  json report = {{"session_id", session_id},
                 {"job_id", header.job_id},
                 {"round", header.round},
                 {"attempt", header.attempt},
                 {"step", event["step"]}};
  if (event.contains("total_steps") && event["total_steps"].is_number_integer()) {
    report["total_steps"] = event["total_steps"];
  }
  if (auto loss = NumberOrNull(event, "loss")) report["loss"] = *loss;
  std::optional<double> tokens = NumberOrNull(event, "tokens_per_s");
  std::optional<double> samples = NumberOrNull(event, "samples_per_s");
  if (tokens && *tokens > 0) {
    report["throughput"] = *tokens;
  } else if (samples) {
    report["throughput"] = *samples;
  }
  if (utilization) report["utilization"] = std::clamp(*utilization, 0.0, 1.0);
  return report;
}

}  // namespace parsyn::worker
