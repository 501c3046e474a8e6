#include "simulation/virtual_task.h"

#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <optional>
#include <span>

#include "base/log.h"
#include "base/sha256.h"
#include "protocol/trainer_task.h"
#include "storage/byte_source.h"
#include "weights/safetensors.h"
#include "worker/task_translation.h"

namespace parsyn::simulation {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The worker id in the task's id "<job>-<round>-<attempt>-w<worker>".
int64_t WorkerOfTask(const protocol::Task& task) {
  const size_t w = task.task_id.rfind("-w");
  return w == std::string::npos ? 0 : std::stoll(task.task_id.substr(w + 2));
}

}  // namespace

StatusOr<std::string> KeyOfUrl(const std::string& url) {
  if (!url.starts_with(kUrlScheme)) return InvalidArgumentError("not a simulation blob URL: " + url);
  return url.substr(kUrlScheme.size());
}

TaskOutcome VirtualTasks::Run(int64_t worker_id, const json& task_json, TaskControl& control, SecureMasking* masking) {
  TaskOutcome outcome;
  StatusOr<protocol::Task> task = protocol::ParseTask(task_json);
  if (!task.ok()) {
    outcome.result = task.status();
    return outcome;
  }
  const fs::path task_dir =
      work_dir_ / "tasks" / fmt::format("w{}-{}-{}-{}", worker_id, task->job_id, task->round, task->attempt);
  std::error_code ec;
  fs::remove_all(task_dir, ec);
  fs::create_directories(task_dir / "out", ec);
  outcome.result = Execute(*task, task_dir, control, masking, outcome.bytes_down);
  fs::remove_all(task_dir, ec);
  return outcome;
}

StatusOr<protocol::Result> VirtualTasks::Execute(const protocol::Task& task, const fs::path& task_dir,
                                                 TaskControl& control, SecureMasking* masking, uint64_t& bytes_down) {
  worker::TaskFiles files;
  files.output_dir = task_dir / "out";
  if (!task.model.files.empty()) {
    PARSYN_ASSIGN_OR_RETURN(files.model_dir, ModelFolder(task.model.files));
  }
  PARSYN_ASSIGN_OR_RETURN(std::string global_key, KeyOfUrl(task.global_weights.url));
  PARSYN_ASSIGN_OR_RETURN(files.global_weights, blobs_.LocalPath(global_key));
  bytes_down += GlobalDownloadBytes(task);
  PARSYN_ASSIGN_OR_RETURN(std::tie(files.data, files.validation_data), ShardFiles(task.data));
  files.data_format = task.data.format;

  const protocol::TrainerTask trainer_task =
      worker::BuildTrainerTask(task, files, options_.device, options_.trainer_threads);
  const fs::path task_file = task_dir / "task.json";
  {
    std::ofstream out(task_file);
    out << protocol::TrainerTaskToJson(trainer_task).dump(2);
    if (!out.flush()) return InternalError("cannot write " + task_file.string());
  }
  std::optional<protocol::Progress> progress;
  const worker::TrainerRunOptions run{.stop = control.abandoned.get_token(),
                                      .on_progress = [&](const protocol::TrainerProgress& p) {
                                        progress = worker::BuildProgress(task, "", p, std::nullopt);
                                      }};
  StatusOr<worker::TrainerOutput> output = supervisor_.Run(options_.trainer, task_file, trainer_task, run);
  if (control.abandoned.stop_requested()) return CancelledError("trainer stopped: the task was abandoned");
  if (!output.ok()) return output.status();
  if (progress) StoreProgress(task, *progress);
  std::string blob_key, sha256;
  if (task.kind == protocol::TaskKind::kTrain) {
    blob_key = task.update_upload->blob_key;  // ParseTask: every train task has an upload
    PARSYN_ASSIGN_OR_RETURN(sha256, StoreUpdate(task, files, *output, control, masking));
  }
  return worker::BuildResult(task, "", output->result, blob_key, sha256);
}

StatusOr<std::string> VirtualTasks::StoreUpdate(const protocol::Task& task, const worker::TaskFiles& files,
                                                const worker::TrainerOutput& output, TaskControl& control,
                                                SecureMasking* masking) {
  const protocol::UpdateUpload& upload = *task.update_upload;
  std::unique_ptr<storage::ByteSource> update;
  std::string sha256;
  if (masking != nullptr) {
    // Phase 3, as a worker's: the masked input of its change, once the loop handed its shares over.
    PARSYN_RETURN_IF_ERROR(masking->Wait(control.abandoned.get_token()));
    PARSYN_ASSIGN_OR_RETURN(weights::WeightSet global, weights::ReadSafetensorsFile(files.global_weights));
    PARSYN_ASSIGN_OR_RETURN(weights::WeightSet trained, weights::ReadSafetensorsFile(output.update));
    PARSYN_ASSIGN_OR_RETURN(std::string packed, masking->MaskedInput(global, trained, output.result.num_samples));
    sha256 = Sha256Hex(packed);
    update = std::make_unique<storage::StringByteSource>(std::move(packed));
  } else {
    // The job's distributed.compression, as a worker applies it (error feedback's residuals per virtual worker).
    PARSYN_ASSIGN_OR_RETURN(
        worker::WireUpdate wire,
        worker::EncodeUpdateForJob(task, output.update, output.update_sha256, files.global_weights,
                                   work_dir_ / "state" / ("w" + std::to_string(WorkerOfTask(task)))));
    sha256 = wire.sha256;
    PARSYN_ASSIGN_OR_RETURN(update, storage::OpenFileSource(wire.file));
  }
  storage::PutOptions put{.max_size_bytes = upload.max_size_bytes, .expected_sha256 = sha256};
  PARSYN_RETURN_IF_ERROR(blobs_.Put(upload.blob_key, *update, put).status());
  return sha256;
}

void VirtualTasks::StoreProgress(const protocol::Task& task, const protocol::Progress& p) {
  storage::MetricPoint point{.job_id = task.job_id,
                             .round = static_cast<int32_t>(p.round),
                             .worker_id = WorkerOfTask(task),
                             .step = p.step,
                             .loss = p.loss,
                             .throughput = p.throughput,
                             .utilization = p.utilization,
                             .time_ms = clock_.UnixMillis()};
  Status stored = store_.AppendMetrics(std::span<const storage::MetricPoint>(&point, 1));
  if (!stored.ok()) PARSYN_LOG_WARN("progress point not stored: {}", stored.message());
}

uint64_t VirtualTasks::GlobalDownloadBytes(const protocol::Task& task) {
  std::lock_guard lock(held_mutex_);
  std::string& held = held_globals_[{WorkerOfTask(task), task.job_id}];
  const std::optional<protocol::TaskGlobalDelta>& delta = task.global_weights.delta;
  const uint64_t bytes = delta && delta->base_sha256 == held ? delta->size_bytes : task.global_weights.size_bytes;
  held = task.global_weights.sha256;
  return bytes;
}

StatusOr<fs::path> VirtualTasks::ModelFolder(const std::vector<protocol::TaskModelFile>& model_files) {
  std::lock_guard lock(model_mutex_);
  const fs::path dir = work_dir_ / "model";
  if (model_ready_) return dir;
  for (const protocol::TaskModelFile& f : model_files) {
    PARSYN_ASSIGN_OR_RETURN(std::string key, KeyOfUrl(f.url));
    PARSYN_ASSIGN_OR_RETURN(fs::path source, blobs_.LocalPath(key));
    const fs::path dest = dir / f.path;
    std::error_code ec;
    fs::create_directories(dest.parent_path(), ec);
    fs::remove(dest, ec);
    fs::create_hard_link(source, dest, ec);
    if (ec) fs::copy_file(source, dest, fs::copy_options::overwrite_existing, ec);
    if (ec) return InternalError("cannot lay out the model file " + dest.string() + ": " + ec.message());
  }
  model_ready_ = true;
  return dir;
}

StatusOr<std::pair<fs::path, fs::path>> VirtualTasks::ShardFiles(const protocol::TaskData& data) {
  if (data.format.empty() || data.train_url.empty() || data.validation_url.empty()) {
    return InvalidArgumentError("task: its data needs a format, a train_url and a validation_url");
  }
  PARSYN_ASSIGN_OR_RETURN(std::string train_key, KeyOfUrl(data.train_url));
  PARSYN_ASSIGN_OR_RETURN(std::string validation_key, KeyOfUrl(data.validation_url));
  PARSYN_ASSIGN_OR_RETURN(fs::path train, blobs_.LocalPath(train_key));
  PARSYN_ASSIGN_OR_RETURN(fs::path validation, blobs_.LocalPath(validation_key));
  return std::make_pair(std::move(train), std::move(validation));
}

}  // namespace parsyn::simulation
