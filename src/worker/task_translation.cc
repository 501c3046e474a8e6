#include "worker/task_translation.h"

#include <algorithm>

#include "base/sha256.h"
#include "weights/safetensors.h"
#include "weights/update_wire.h"

namespace parsyn::worker {

using nlohmann::json;

protocol::TrainerTask BuildTrainerTask(const protocol::Task& task, const TaskFiles& files, const std::string& device,
                                       int threads) {
  const bool train = task.kind == protocol::TaskKind::kTrain;
  protocol::TrainerTask out;
  out.kind = task.kind;
  out.model_kind = task.model.model_type;
  out.initial_weights = files.global_weights.string();
  out.data = files.data.string();
  out.validation_data = files.validation_data.string();
  out.data_format = files.data_format;
  out.config.training = task.config;
  // steps_per_round 0 means "a round trains config.epochs passes over the shard": no step budget then.
  if (!train) {
    out.steps = 0;  // evaluate only
  } else if (task.steps_per_round > 0) {
    out.steps = task.steps_per_round;
  }
  // The trainer reads seeds as non-negative int64: keep the coordinator's 64-bit seed's low 63 bits.
  out.seed = task.seed & 0x7fff'ffff'ffff'ffffULL;
  // A worker's own file is split by the job's seed, the same rows in every round (a shard has its validation file).
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

protocol::Result BuildResult(const protocol::Task& task, const std::string& session_id,
                             const protocol::TrainerResult& result, const std::string& blob_key,
                             const std::string& sha256) {
  protocol::Result report;
  report.sample_count = result.num_samples;
  report.validation_samples = result.num_validation;
  report.session_id = session_id;
  report.job_id = task.job_id;
  report.round = task.round;
  report.attempt = task.attempt;
  report.train_loss = result.train_loss;
  // The coordinator records the validation loss of the global this task received: the trainer's "before".
  report.validation_loss = result.ValidationLossBefore();
  report.metrics = protocol::ResultMetricsFrom(result);
  report.blob_key = blob_key;
  report.sha256 = blob_key.empty() ? "" : sha256;
  return report;
}

protocol::Progress BuildProgress(const protocol::Task& task, const std::string& session_id,
                                 const protocol::TrainerProgress& event, std::optional<double> utilization) {
  protocol::Progress report{.session_id = session_id,
                            .job_id = task.job_id,
                            .round = task.round,
                            .attempt = task.attempt,
                            .step = event.step};
  if (event.total_steps > 0) report.total_steps = event.total_steps;
  report.loss = event.loss;
  if (event.throughput) {
    report.throughput = *event.throughput;
    report.throughput_unit = event.throughput_unit;
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
  PARSYN_ASSIGN_OR_RETURN(std::string sha256, Sha256File(wire_file));
  return WireUpdate{.file = wire_file, .sha256 = std::move(sha256)};
}

}  // namespace parsyn::worker
