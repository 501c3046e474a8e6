#include "worker/trainer_task.h"

#include <algorithm>

#include "weights/safetensors.h"
#include "weights/sha256.h"
#include "weights/update_wire.h"

namespace parsyn::worker {

using nlohmann::json;

namespace {

std::optional<double> NumberOrNull(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

StatusOr<int64_t> RequiredInteger(const json& done, const char* key) {
  auto it = done.find(key);
  if (it == done.end() || !it->is_number_integer()) {
    return InvalidArgumentError(std::string("the trainer's result lacks the integer '") + key + "'");
  }
  return it->get<int64_t>();
}

}  // namespace

std::optional<double> ShardValidationFraction(const protocol::TaskData& data) {
  if (data.train_rows + data.validation_rows <= 0) return std::nullopt;
  return static_cast<double>(data.validation_rows) / static_cast<double>(data.train_rows + data.validation_rows);
}

protocol::TrainerTask BuildTrainerTask(const protocol::Task& task, const TaskFiles& files, const std::string& device,
                                       int threads) {
  const bool train = task.kind == protocol::TaskKind::kTrain;
  protocol::TrainerTask out;
  out.initial_weights = files.global_weights.string();
  out.data = files.data.string();
  out.data_format = files.data_format;
  out.config.training = task.config;
  out.validation_fraction = files.validation_fraction;
  // steps_per_round 0 means "a round trains config.epochs passes over the shard": no step budget then.
  if (!train) {
    out.steps = 0;  // evaluate only
  } else if (task.steps_per_round > 0) {
    out.steps = task.steps_per_round;
  }
  // The trainer reads seeds as non-negative int64: keep the coordinator's 64-bit seed's low 63 bits.
  out.seed = task.seed & 0x7fff'ffff'ffff'ffffULL;
  // A platform shard's validation slice is fixed by the coordinator (split_seed 0 re-finds it); a worker's own file
  // is split by the job's seed, the same in every round.
  out.split_seed = task.data_source == protocol::DataSource::kWorkers ? task.config.seed : 0;
  out.device = device;
  out.threads = threads;
  out.output_weights = (files.output_dir / "update.safetensors").string();
  out.output_result = (files.output_dir / "result.json").string();
  if (train && task.steps_per_round > 0) {
    // One learning-rate schedule across the job: round r continues where round r-1 ended.
    out.schedule =
        protocol::TrainerSchedule{.start_step = static_cast<int64_t>(task.round - 1) * task.steps_per_round,
                                  .total_steps = static_cast<int64_t>(task.total_rounds) * task.steps_per_round};
  }
  if (train) out.proximal_mu = task.proximal_mu;  // FedProx: anchored to this task's global (its initial_weights)
  if (!files.model_dir.empty()) out.model_dir = files.model_dir.string();
  return out;
}

StatusOr<protocol::Result> BuildResult(const protocol::Task& task, const std::string& session_id, const json& done,
                                       const std::string& blob_key, const std::string& sha256) {
  protocol::Result report;
  PARSYN_ASSIGN_OR_RETURN(report.sample_count, RequiredInteger(done, "samples_used"));
  PARSYN_ASSIGN_OR_RETURN(report.validation_samples, RequiredInteger(done, "num_validation"));
  report.session_id = session_id;
  report.job_id = task.job_id;
  report.round = task.round;
  report.attempt = task.attempt;
  report.train_loss = NumberOrNull(done, "mean_train_loss");
  // The coordinator records the validation loss of the global this task received: the trainer's "before".
  const json before = done.value("validation_before", json());
  if (before.is_object()) report.validation_loss = NumberOrNull(before, "loss");
  for (const char* key : {"validation_before", "validation_after", "steps", "examples_seen", "tokens_seen", "wall_s"}) {
    if (done.contains(key)) report.metrics[key] = done[key];
  }
  report.blob_key = blob_key;
  report.sha256 = blob_key.empty() ? "" : sha256;
  return report;
}

std::optional<protocol::Progress> BuildProgress(const protocol::Task& task, const std::string& session_id,
                                                const json& event, std::optional<double> utilization) {
  if (event.value("event", "") != "progress" || !event.contains("step") || !event["step"].is_number_integer()) {
    return std::nullopt;
  }
  protocol::Progress report{.session_id = session_id,
                            .job_id = task.job_id,
                            .round = task.round,
                            .attempt = task.attempt,
                            .step = event["step"].get<int64_t>()};
  if (event.contains("total_steps") && event["total_steps"].is_number_integer()) {
    report.total_steps = event["total_steps"].get<int64_t>();
  }
  report.loss = NumberOrNull(event, "loss");
  std::optional<double> tokens = NumberOrNull(event, "tokens_per_s");
  std::optional<double> samples = NumberOrNull(event, "samples_per_s");
  if (tokens && *tokens > 0) {
    report.throughput = *tokens;
    report.throughput_unit = protocol::kTokensPerSecond;
  } else if (samples) {
    report.throughput = *samples;
    report.throughput_unit = protocol::kSamplesPerSecond;
  }
  if (utilization) report.utilization = std::clamp(*utilization, 0.0, 1.0);
  return report;
}

StatusOr<WireUpdate> EncodeUpdateForJob(const protocol::Task& task, const std::filesystem::path& update_file,
                                        const std::string& update_sha256, const std::filesystem::path& global_file,
                                        const std::filesystem::path& state_dir) {
  const protocol::UpdateCompression& c = task.compression;
  weights::WireEncoding encoding{.delta = c.delta, .zstd_level = c.zstd_level, .error_feedback = c.error_feedback};
  if (StatusOr<weights::UpdateCodec> codec = weights::ParseUpdateCodec(c.update); codec.ok()) encoding.codec = *codec;
  if (encoding.plain()) return WireUpdate{.file = update_file, .sha256 = update_sha256};
  std::error_code ec;
  if (encoding.error_feedback) std::filesystem::create_directories(state_dir, ec);
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet global, weights::ReadSafetensorsFile(global_file));
  const std::filesystem::path wire_file = update_file.parent_path() / "update.wire";
  PARSYN_RETURN_IF_ERROR(weights::EncodeUpdateFileForWire(
                             update_file, global, encoding,
                             state_dir / ("job-" + std::to_string(task.job_id) + "-residual.safetensors"), wire_file)
                             .WithContext("compressing the update"));
  PARSYN_ASSIGN_OR_RETURN(std::string sha256, weights::Sha256File(wire_file));
  return WireUpdate{.file = wire_file, .sha256 = std::move(sha256)};
}

}  // namespace parsyn::worker
