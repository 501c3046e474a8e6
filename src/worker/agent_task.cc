// The worker agent's work on one task (worker/agent.h): fetch its inputs (checked), run the trainer the task names
// through the TrainerSupervisor with progress reports, upload the update, report the result or the failure. The
// session (hello, polls, heartbeats, reconnects) is agent.cc.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "base/log.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "weights/safetensors.h"
#include "weights/update_wire.h"
#include "worker/agent.h"
#include "worker/agent_internal.h"
#include "worker/global_downlink.h"
#include "worker/secure_participation.h"
#include "worker/telemetry.h"
#include "worker/update_upload.h"

namespace parsyn::worker {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxFailureReasonBytes = 500;

// `text` cut to at most `max_bytes` at a UTF-8 character boundary, with invalid UTF-8 replaced (U+FFFD), so that it
// can go into a JSON body (nlohmann throws on invalid UTF-8 when dumping).
std::string JsonSafePrefix(std::string_view text, size_t max_bytes) {
  size_t end = std::min(text.size(), max_bytes);
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) end--;
  const std::string quoted =
      json(std::string(text.substr(0, end))).dump(-1, ' ', false, json::error_handler_t::replace);
  return json::parse(quoted).get<std::string>();
}

std::string ExtensionFor(const std::string& format) { return format == "csv" ? ".csv" : ".jsonl"; }

// Points a "workers" job's task at the worker's own file (--data), which must be of the kind the job's model reads.
Status UseLocalData(const protocol::Task& task, const fs::path& local_data, TaskFiles& files) {
  // The job trains on the workers' own files. Local data never leaves: the trainer holds out its validation slice
  // (the config's fraction, split by the job's seed: task_translation.h).
  if (local_data.empty()) {
    return FailedPreconditionError("job " + std::to_string(task.job_id) +
                                   " trains on the workers' own data (data.source \"workers\"), but this worker "
                                   "was started without --data");
  }
  files.data = local_data;
  files.data_format = local_data.extension() == ".csv" ? "csv" : "jsonl";
  const std::string& type = task.model.model_type;
  const bool tabular_model = type.starts_with("tabular-");
  if (!type.empty() && tabular_model != (files.data_format == "csv")) {
    return FailedPreconditionError("job " + std::to_string(task.job_id) + "'s model is " +
                                   (tabular_model ? "tabular (" + type + "): it needs a .csv file"
                                                  : "a language model (" + type + "): it needs a .jsonl file") +
                                   ", but --data is " + local_data.filename().string());
  }
  return Status::Ok();
}

// Phase 3 of a secure round: the trainer's update as its masked input, written beside it (the file uploaded in the
// update's place).
StatusOr<WireUpdate> WriteMaskedInput(SecureParticipation& secure, const TrainerOutput& output,
                                      const fs::path& global_file, const fs::path& dir) {
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet global, weights::ReadSafetensorsFile(global_file));
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet trained, weights::ReadSafetensorsFile(output.update));
  PARSYN_ASSIGN_OR_RETURN(std::string packed, secure.MaskedInput(global, trained, output.result.num_samples));
  const fs::path file = dir / "masked_input.bin";
  std::ofstream out(file, std::ios::binary);
  out.write(packed.data(), static_cast<std::streamsize>(packed.size()));
  if (!out.flush()) return InternalError("cannot write " + file.string());
  return WireUpdate{.file = file, .sha256 = Sha256Hex(packed)};
}

// Fault injection for the tests of asynchronous jobs (src/worker/README.md): PARSYN_WORKER_SLOW_S=SECONDS in the
// environment makes every task of this worker that much slower, as if its trainer had taken that long longer.
void WaitIfSlowWorker(std::stop_token stop) {
  const char* asked = std::getenv("PARSYN_WORKER_SLOW_S");
  if (asked == nullptr) return;
  const double seconds = std::atof(asked);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

void Agent::RunTask(const Session& session, const json& task_json, std::stop_token stop) {
  StatusOr<protocol::Task> task = protocol::ParseTask(task_json);
  if (!task.ok()) {
    PARSYN_LOG_ERROR("worker {}: dropping a malformed task: {}", options_.name, task.status().message());
    counters_.tasks_failed++;
    return;
  }
  // The task stops with the worker, and on its own when the coordinator drops it (a straggler at the round's
  // timeout): an upload to a round that is over is cut rather than finished.
  std::stop_source task_stop;
  std::stop_callback stop_with_worker(stop, [&task_stop] { task_stop.request_stop(); });
  {
    std::lock_guard lock(mutex_);
    current_ = CurrentTask{.job_id = task->job_id, .round = task->round, .attempt = task->attempt, .stop = task_stop};
  }
  PARSYN_LOG_INFO("worker {}: task {} ({} job {} {} attempt {})", options_.name, task->task_id,
                  protocol::TaskKindName(task->kind), task->job_id,
                  protocol::RoundLabel(task->round, task->total_rounds), task->attempt);
  const Clock::time_point started = Clock::now();
  Status done = ExecuteTask(session, *task, task_stop.get_token());
  bool abandoned = false;
  bool result_posted = false;
  {
    std::lock_guard lock(mutex_);
    if (current_) {
      abandoned = current_->abandoned;
      result_posted = current_->result_posted;
    }
    current_.reset();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (done.ok()) {
    counters_.tasks_completed++;
    PARSYN_LOG_INFO("worker {}: task {} done in {:.1f} s", options_.name, task->task_id, seconds);
  } else {
    counters_.tasks_failed++;
    PARSYN_LOG_ERROR("worker {}: task {} failed after {:.1f} s: {}", options_.name, task->task_id, seconds,
                     done.message());
    // A stopped or abandoned task, or one whose round moved on, is already known to the coordinator (or is its
    // decision); any other failure is reported so it drops this worker from the round instead of waiting it out.
    const bool coordinator_knows =
        abandoned || result_posted || stop.stop_requested() || token_refused_ || done.code() == StatusCode::kCancelled;
    if (!coordinator_knows) ReportFailure(*task, done);
  }
}

void Agent::ReportFailure(const protocol::Task& task, const Status& failure) {
  http::CallOptions call;
  call.timeout = std::chrono::seconds(5);
  call.retry = false;
  // The reason is shown on the coordinator's dashboard: paths on this machine (its cache, task files, data) say
  // nothing there and are cut to their file names; the worker's own log keeps them whole.
  const protocol::Failure body{.job_id = task.job_id,
                               .round = task.round,
                               .attempt = task.attempt,
                               .reason = JsonSafePrefix(WithoutLocalPaths(failure.message()), kMaxFailureReasonBytes)};
  Status sent = client_->PostJson("/api/v1/worker/failure", protocol::FailureToJson(body), call).status();
  NoteTokenRefused(sent);
  if (sent.ok()) {
    counters_.failures_reported++;
    return;
  }
  // Best effort: a coordinator without the route (404) or out of reach still drops the task at the next long-poll.
  PARSYN_LOG_WARN("worker {}: could not report the failure of job {} {}: {}", options_.name, task.job_id,
                  protocol::RoundLabel(task.round, task.total_rounds), sent.message());
}

StatusOr<TaskFiles> Agent::FetchInputs(const Session& session, const protocol::Task& task, const fs::path& task_dir,
                                       std::stop_token stop) {
  TaskFiles files;
  files.output_dir = task_dir / "out";
  if (!task.model.files.empty()) {
    PARSYN_ASSIGN_OR_RETURN(files.model_dir, cache_.FetchModel(*blob_client_, task.model.files, stop));
  }
  files.global_weights = task_dir / "global.safetensors";
  PARSYN_RETURN_IF_ERROR(FetchGlobalWeights(session, task, task_dir, files.global_weights, stop));
  if (task.data_source == protocol::DataSource::kWorkers) {
    PARSYN_RETURN_IF_ERROR(UseLocalData(task, options_.local_data, files));
    return files;
  }
  // A platform job trains on its shard, also on a worker started with --data (that file is for "workers" jobs).
  const protocol::TaskData& data = task.data;
  if (data.format.empty() || data.train_url.empty() || data.validation_url.empty() || data.train_sha256.empty() ||
      data.validation_sha256.empty()) {
    return InvalidArgumentError(
        "task: its data needs a format, a train_url and a validation_url, each URL with its sha256");
  }
  files.data_format = data.format;
  const bool csv = files.data_format == "csv";
  const std::string extension = ExtensionFor(files.data_format);
  // The shard is cached by its files' checksums, never by job and shard index: a coordinator reset to a new job
  // with the same id and index sends other checksums, so files cached for the old one are not used. Fetched once and
  // kept across rounds; each part is downloaded into the task folder, checked, and moved into the cache.
  const std::string cached = Sha256Hex(data.train_sha256 + "\n" + data.validation_sha256);
  files.data = cache_.root() / "shards" / (cached + ".train" + extension);
  files.validation_data = cache_.root() / "shards" / (cached + ".validation" + extension);
  if (!fs::exists(files.data) || !fs::exists(files.validation_data)) {
    const std::string shard = "shard " + std::to_string(task.shard) + "'s ";
    const fs::path train = task_dir / ("train" + extension);
    const fs::path validation = task_dir / ("validation" + extension);
    PARSYN_RETURN_IF_ERROR(DownloadVerified(*blob_client_, data.train_url, train, data.train_sha256, stop,
                                            shard + "training file (train" + extension + ")"));
    PARSYN_RETURN_IF_ERROR(DownloadVerified(*blob_client_, data.validation_url, validation, data.validation_sha256,
                                            stop, shard + "validation file (validation" + extension + ")"));
    PARSYN_ASSIGN_OR_RETURN(int64_t got_train, CountRows(train, csv));
    if (got_train != data.train_rows) {
      return DataLossError("shard " + std::to_string(task.shard) + " arrived with " + std::to_string(got_train) +
                           " training rows, the task says " + std::to_string(data.train_rows));
    }
    std::error_code ec;
    fs::create_directories(files.data.parent_path(), ec);
    // The validation file first: the training file's presence is what a later task checks.
    if (!ec) fs::rename(validation, files.validation_data, ec);
    if (!ec) fs::rename(train, files.data, ec);
    if (ec)
      return InternalError("cannot move the shard into " + files.data.parent_path().string() + ": " + ec.message());
  }
  return files;
}

Status Agent::FetchGlobalWeights(const Session& session, const protocol::Task& task, const fs::path& task_dir,
                                 const fs::path& global_weights, std::stop_token stop) {
  const std::string global_name =
      "the global weights of round " + std::to_string(task.global_weights.round) + " (global.safetensors)";
  const fs::path state_dir = WorkerStateDir(cache_.root(), session.worker_id);
  const bool job_sends_deltas = task.compression.global != "none" || task.global_weights.delta.has_value();
  const std::string held = job_sends_deltas ? HeldGlobalSha256(state_dir, task.job_id) : "";
  if (!held.empty() && held == task.global_weights.sha256) {  // held already: a round retried after a failed attempt
    PARSYN_LOG_INFO("worker {}: job {}: {} is the one this worker holds", options_.name, task.job_id, global_name);
    return UseHeldGlobal(state_dir, task.job_id, global_weights);
  }
  if (const std::optional<protocol::TaskGlobalDelta>& delta = task.global_weights.delta) {
    // Asked before anything is downloaded: a delta is of use only from the very global it was taken from.
    if (held == delta->base_sha256) {
      const fs::path delta_file = task_dir / "global.delta";
      PARSYN_RETURN_IF_ERROR(
          DownloadVerified(*blob_client_, delta->url, delta_file, delta->sha256, stop, global_name + ", delta"));
      PARSYN_RETURN_IF_ERROR(
          GlobalFromDelta(*delta, task.global_weights.sha256, state_dir, task.job_id, delta_file, global_weights)
              .WithContext("rebuilding " + global_name + " from its " + delta->codec + " delta"));
      PARSYN_LOG_INFO("worker {}: job {}: {} rebuilt from its {} delta ({} bytes instead of {})", options_.name,
                      task.job_id, global_name, delta->codec, delta->size_bytes, task.global_weights.size_bytes);
      return HoldGlobal(state_dir, task.job_id, global_weights, task.global_weights.sha256);
    }
    PARSYN_LOG_INFO(
        "worker {}: job {}: {} is offered as a delta from global {}…, which this worker does not hold ({}): "
        "downloading the whole global",
        options_.name, task.job_id, global_name, delta->base_sha256.substr(0, 12),
        held.empty() ? "it holds none for the job" : "it holds " + held.substr(0, 12) + "…");
  }
  if (const std::optional<protocol::TaskZstdCopy>& zstd = task.global_weights.zstd;
      zstd && task.global_weights.size_bytes > 0) {
    // The zstd copy: its own bytes checked, decompressed bounded by the global's size, then the global's checked.
    const fs::path compressed = task_dir / "global.safetensors.zst";
    PARSYN_RETURN_IF_ERROR(
        DownloadVerified(*blob_client_, zstd->url, compressed, zstd->sha256, stop, global_name + ", zstd"));
    PARSYN_RETURN_IF_ERROR(weights::ZstdDecompressFile(compressed, global_weights, task.global_weights.size_bytes)
                               .WithContext("decompressing " + global_name));
    std::error_code ignored;
    fs::remove(compressed, ignored);
    PARSYN_ASSIGN_OR_RETURN(std::string got, Sha256File(global_weights));
    if (got != task.global_weights.sha256) {
      fs::remove(global_weights, ignored);
      return DataLossError(global_name + " decompressed to sha256 " + got + ", expected " + task.global_weights.sha256);
    }
  } else {
    PARSYN_RETURN_IF_ERROR(DownloadVerified(*blob_client_, task.global_weights.url, global_weights,
                                            task.global_weights.sha256, stop, global_name));
  }
  if (job_sends_deltas) return HoldGlobal(state_dir, task.job_id, global_weights, task.global_weights.sha256);
  return Status::Ok();
}

StatusOr<const DescribedTrainer*> Agent::TrainerFor(const protocol::Task& task) const {
  std::string offered;
  for (const DescribedTrainer& t : options_.trainers) {
    if (t.command.name == task.config.trainer) return &t;
    offered += (offered.empty() ? "" : ", ") + t.command.name;
  }
  return FailedPreconditionError("job " + std::to_string(task.job_id) + " trains with the trainer '" +
                                 task.config.trainer + "', which this worker does not offer (it offers: " + offered +
                                 "); start it with --trainer " + task.config.trainer + "=COMMAND");
}

Status Agent::ExecuteTask(const Session& session, const protocol::Task& task, std::stop_token stop) {
  // Only validated numbers name the folder this function removes: nothing from the wire becomes a path. The worker's
  // id is in it so that two workers sharing one cache folder never remove each other's task.
  const fs::path task_dir = cache_.root() / "tasks" /
                            ("w" + std::to_string(session.worker_id) + "-" + std::to_string(task.job_id) + "-" +
                             std::to_string(task.round) + "-" + std::to_string(task.attempt));
  std::error_code ec;
  fs::remove_all(task_dir, ec);
  fs::create_directories(task_dir / "out", ec);
  if (ec) return InternalError("cannot create " + task_dir.string() + ": " + ec.message());
  // The task folder holds the round's global and update: remove it whatever happens.
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{task_dir};

  PARSYN_ASSIGN_OR_RETURN(const DescribedTrainer* trainer, TrainerFor(task));
  PARSYN_ASSIGN_OR_RETURN(TaskFiles files, FetchInputs(session, task, task_dir, stop));
  // A securely aggregated round: its keys and shares are exchanged before training (phases 1 and 2).
  std::optional<SecureParticipation> secure;
  if (task.secure_aggregation && task.kind == protocol::TaskKind::kTrain) {
    StatusOr<SecureParticipation> joined = JoinSecureRound(session, task, stop);
    if (!joined.ok()) return joined.status().WithContext("joining the round's secure aggregation");
    secure.emplace(*std::move(joined));
  }
  const protocol::TrainerTask trainer_task = BuildTrainerTask(task, files, options_.device, options_.trainer_threads);
  const fs::path task_file = task_dir / "task.json";
  {
    std::ofstream out(task_file);
    out << protocol::TrainerTaskToJson(trainer_task).dump(2);
    if (!out.flush()) return InternalError("cannot write " + task_file.string());
  }
  PARSYN_ASSIGN_OR_RETURN(TrainerOutput output,
                          RunTrainer(session, task, trainer->command, task_file, trainer_task, stop));
  WaitIfSlowWorker(stop);

  std::string blob_key, sha256;
  if (task.kind == protocol::TaskKind::kTrain) {
    // Ask before uploading: a heartbeat now applies any abandon (straggler, job ended) and proves the session lives.
    Status alive = Heartbeat(session);
    std::string why;
    if (CurrentAbandoned(&why) || alive.code() == StatusCode::kFailedPrecondition || token_refused_) {
      counters_.uploads_skipped++;
      return FailedPreconditionError("round " + std::to_string(task.round) + " is no longer current (" +
                                     (why.empty() ? alive.message() : why) + "); update not uploaded");
    }
    const protocol::UpdateUpload& upload = *task.update_upload;  // ParseTask: every train task has one
    blob_key = upload.blob_key;
    // In a secure round (phase 3) the masked input takes the update's place.
    PARSYN_ASSIGN_OR_RETURN(const WireUpdate wire,
                            secure ? WriteMaskedInput(*secure, output, files.global_weights, task_dir)
                                   : EncodeUpdateForJob(task, output.update, output.update_sha256, files.global_weights,
                                                        WorkerStateDir(cache_.root(), session.worker_id)));
    sha256 = wire.sha256;
    PARSYN_RETURN_IF_ERROR(
        UploadUpdate(*blob_client_, upload, wire.file, sha256, stop).WithContext("uploading the update"));
  }
  const protocol::Result report = BuildResult(task, session.id, output.result, blob_key, sha256);
  StatusOr<http::ClientResponse> posted = PostResult(report, secure ? &*secure : nullptr, stop);
  NoteTokenRefused(posted.status());
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, std::move(posted));
  {
    std::lock_guard lock(mutex_);
    if (current_) current_->result_posted = true;  // the coordinator has its verdict: no failure report after this
  }
  StatusOr<json> verdict = res.Json();
  if (verdict.ok() && verdict->value("status", "") == "rejected") {
    return FailedPreconditionError("the coordinator rejected the update: " + verdict->value("reason", ""));
  }
  auto shown = [](const std::optional<double>& loss) { return loss ? std::to_string(*loss) : std::string("null"); };
  PARSYN_LOG_INFO("worker {}: {} reported: {} samples, train loss {}, validation loss {}", options_.name,
                  protocol::RoundLabel(task.round, task.total_rounds), report.sample_count, shown(report.train_loss),
                  shown(report.validation_loss));
  return Status::Ok();
}

StatusOr<SecureParticipation> Agent::JoinSecureRound(const Session& session, const protocol::Task& task,
                                                     std::stop_token stop) {
  PARSYN_ASSIGN_OR_RETURN(const secagg::KeySigner signer,
                          SecureParticipation::SignerFromFiles(options_.client_cert_file, options_.client_key_file));
  PARSYN_ASSIGN_OR_RETURN(const secagg::KeyVerifier verify,
                          SecureParticipation::VerifierFromFile(options_.peer_ca_file));
  return SecureParticipation::Join(*client_, task, session.worker_id, signer, verify, stop);
}

StatusOr<http::ClientResponse> Agent::PostResult(const protocol::Result& report, SecureParticipation* secure,
                                                 std::stop_token stop) {
  // Phase 4 of a secure round runs beside the result: the coordinator answers the last result once the round is
  // aggregated, which needs every survivor's revealed shares, this worker's too.
  std::stop_source reveal_stop;
  std::stop_callback stop_reveal(stop, [&] { reveal_stop.request_stop(); });
  Status revealed;
  std::optional<std::jthread> revealing;
  if (secure != nullptr) revealing.emplace([&] { revealed = secure->Reveal(reveal_stop.get_token()); });
  http::CallOptions call;
  call.stop = stop;
  call.retry = true;  // the coordinator treats a repeated result for the same task as a duplicate
  StatusOr<http::ClientResponse> posted =
      client_->PostJson("/api/v1/worker/result", protocol::ResultToJson(report), call);
  if (revealing) {
    if (!posted.ok()) reveal_stop.request_stop();  // no survivor: nothing to reveal
    revealing->join();
    if (posted.ok() && !revealed.ok()) {
      PARSYN_LOG_WARN("worker {}: revealing the secure aggregation's shares: {}", options_.name, revealed.ToString());
    }
  }
  return posted;
}

StatusOr<TrainerOutput> Agent::RunTrainer(const Session& session, const protocol::Task& task,
                                          const TrainerCommand& trainer, const fs::path& task_file,
                                          const protocol::TrainerTask& trainer_task, std::stop_token stop) {
  UtilizationSampler utilization(options_.device);
  utilization.Sample();  // the first CPU sample only sets the baseline
  Clock::time_point last_sent{};
  std::optional<protocol::Progress> pending;
  // Every report carries a device sample, the final step's included.
  auto send = [&](protocol::Progress& report) {
    if (std::optional<double> u = utilization.Sample()) {
      report.utilization = std::clamp(*u, 0.0, 1.0);
      report.utilization_device = utilization.device_kind();
    }
    if (std::optional<UtilizationSampler::DeviceMemory> m = utilization.Memory()) {
      report.device_memory_used_bytes = static_cast<int64_t>(m->used_bytes);
      report.device_memory_total_bytes = static_cast<int64_t>(m->total_bytes);
    }
    http::CallOptions call;
    call.timeout = std::chrono::seconds(5);
    call.retry = false;
    Status s = client_->PostJson("/api/v1/worker/progress", protocol::ProgressToJson(report), call).status();
    NoteTokenRefused(s);  // stops the trainer: the supervisor then returns
    if (!s.ok()) PARSYN_LOG_DEBUG("worker {}: progress not delivered: {}", options_.name, s.message());
    last_sent = Clock::now();
    pending.reset();
  };
  TrainerRunOptions run{.stop = stop, .on_progress = [&](const protocol::TrainerProgress& event) {
                          pending = BuildProgress(task, session.id, event, std::nullopt);
                          if (Clock::now() - last_sent < options_.progress_interval) return;
                          send(*pending);
                        }};
  if (task.deadline_unix_ms > 0) {
    // The coordinator's deadline for the task, on this machine's steady clock: a trainer still running then is
    // stopped (the contract's `timeout` rule), and the worker takes its next task.
    const auto left =
        std::chrono::milliseconds(task.deadline_unix_ms) -
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch());
    run.deadline = Clock::now() + std::max(left, std::chrono::milliseconds(0));
  }
  StatusOr<TrainerOutput> output = supervisor_.Run(trainer, task_file, trainer_task, run);
  if (pending) send(*pending);  // the final step
  std::string why;
  if (CurrentAbandoned(&why)) return CancelledError("trainer stopped: " + why);
  if (stop.stop_requested()) return CancelledError("trainer stopped: the worker is shutting down");
  return output;
}

}  // namespace parsyn::worker
