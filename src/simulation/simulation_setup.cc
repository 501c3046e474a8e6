#include "simulation/simulation_setup.h"

#include <algorithm>
#include <cctype>

#include "base/clock.h"
#include "base/secure_random.h"
#include "base/sha256.h"
#include "coordinator/dataset_import.h"
#include "coordinator/registration.h"
#include "protocol/training_config.h"
#include "simulation/worker_speeds.h"
#include "storage/byte_source.h"

namespace parsyn::simulation {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Stores the dataset file as POST /api/v1/datasets does (checked by the same rules) and records it.
StatusOr<storage::Dataset> RegisterDataset(const SimulationOptions& options, storage::MetadataStore& store,
                                           storage::BlobStore& blobs, int64_t now_ms) {
  std::string extension = options.data.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (extension != ".csv" && extension != ".jsonl") {
    return InvalidArgumentError("--data " + options.data.string() + ": the file must end in .csv or .jsonl");
  }
  const storage::DatasetFormat format =
      extension == ".csv" ? storage::DatasetFormat::kCsv : storage::DatasetFormat::kJsonl;
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, storage::OpenFileSource(options.data));
  const std::string key = fmt::format("datasets/simulate/data.{}", storage::ToString(format));
  PARSYN_ASSIGN_OR_RETURN(storage::BlobInfo stored, blobs.Put(key, *source));
  storage::Dataset dataset{.name = options.data.filename().string(),
                           .format = format,
                           .size_bytes = static_cast<int64_t>(stored.size_bytes),
                           .sha256 = stored.sha256,
                           .blob_key = key,
                           .created_at_ms = now_ms};
  PARSYN_ASSIGN_OR_RETURN(fs::path path, blobs.LocalPath(key));
  Status valid = coordinator::DescribeDatasetFile(path, format, options.label_column, dataset);
  if (!valid.ok()) return valid.WithContext("--data " + options.data.string() + " is not a valid dataset");
  return store.CreateDataset(dataset);
}

// Stores the model folder's files as POST /api/v1/uploads + /models do, checked by the same rules.
StatusOr<storage::Model> RegisterModel(const SimulationOptions& options, storage::MetadataStore& store,
                                       storage::BlobStore& blobs, int64_t now_ms) {
  if (!fs::is_directory(options.model_dir)) {
    return InvalidArgumentError("--model " + options.model_dir.string() + ": no such folder");
  }
  storage::Model model{.name = options.model_dir.filename().string(), .created_at_ms = now_ms};
  if (model.name.empty()) model.name = "model";
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(options.model_dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size(); ++i) {
    PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<storage::ByteSource> source, storage::OpenFileSource(files[i]));
    const std::string key = fmt::format("uploads/simulate-{:04}", i);
    PARSYN_RETURN_IF_ERROR(blobs.Put(key, *source).status());
    model.files.push_back({.path = fs::relative(files[i], options.model_dir).generic_string(), .blob_key = key});
  }
  Status checked = coordinator::DescribeModelFiles(blobs, model);
  if (checked.ok()) checked = coordinator::CheckModelWeights(blobs, model);
  if (!checked.ok()) return checked.WithContext("--model " + options.model_dir.string());
  return store.CreateModel(model);
}

std::string JoinProblems(const std::vector<std::string>& problems) {
  std::string text;
  for (const std::string& p : problems) text += (text.empty() ? "" : "; ") + p;
  return text;
}

}  // namespace

uint64_t SpeedSeed(const json& job) {
  const json seed = job.is_object() && job.contains("config") && job["config"].is_object()
                        ? job["config"].value("seed", json(protocol::TrainingConfig{}.seed))
                        : json(protocol::TrainingConfig{}.seed);
  return seed.is_number_unsigned() ? seed.get<uint64_t>() : protocol::TrainingConfig{}.seed;
}

Status CheckOptions(const SimulationOptions& o) {
  if (o.workers < 1 || o.workers > kMaxVirtualWorkers) {
    return InvalidArgumentError(fmt::format("--workers must be 1..{}, got {}", kMaxVirtualWorkers, o.workers));
  }
  if (o.parallel < 1) return InvalidArgumentError("--parallel must be at least 1");
  if (o.trainer_threads < 1) return InvalidArgumentError("--threads must be at least 1");
  if (!o.speeds.empty()) PARSYN_RETURN_IF_ERROR(ParseWorkerSpeeds(o.speeds, o.workers, SpeedSeed(o.job)).status());
  if (!(o.dropout >= 0 && o.dropout <= 1)) {
    return InvalidArgumentError(fmt::format("--dropout must be a probability in [0, 1], got {}", o.dropout));
  }
  if (!fs::is_regular_file(o.data)) return InvalidArgumentError("--data " + o.data.string() + ": no such file");
  if (!o.job.is_object()) return InvalidArgumentError("--job: expected a JSON object (a training job's body)");
  return Status::Ok();
}

StatusOr<Prepared> Prepare(const SimulationOptions& options) {
  std::error_code ec;
  for (const char* sub : {"spool", "tmp", "tasks"}) fs::create_directories(options.out / "work" / sub, ec);
  Prepared p;
  PARSYN_ASSIGN_OR_RETURN(p.store, storage::SqliteMetadataStore::Open((options.out / "parsyn.db").string()));
  PARSYN_ASSIGN_OR_RETURN(p.blobs, storage::DirectoryBlobStore::Open(options.out / "blobs"));
  SystemClock clock;
  const int64_t now = clock.UnixMillis();

  PARSYN_ASSIGN_OR_RETURN(storage::Dataset dataset, RegisterDataset(options, *p.store, *p.blobs, now));
  PARSYN_ASSIGN_OR_RETURN(storage::Model model, RegisterModel(options, *p.store, *p.blobs, now));
  for (int i = 1; i <= options.workers; ++i) {
    storage::Worker w{.name = fmt::format("sim-{}", i),
                      .kind = storage::WorkerKind::kOwn,
                      .token_sha256 = Sha256Hex(fmt::format("parsyn simulate worker {}", i)),
                      .device = options.device,
                      .status = storage::WorkerStatus::kOnline,
                      .created_at_ms = now};
    PARSYN_ASSIGN_OR_RETURN(storage::Worker created, p.store->CreateWorker(w));
    p.worker_ids.push_back(created.id);
  }

  // The job, as POST /api/v1/training-jobs takes it, over this dataset, model and the virtual workers.
  json body = options.job;
  if (body.contains("worker_selection") && !body["worker_selection"].is_null()) {
    p.warnings.push_back("worker_selection is set by parsyn simulate: the job lists its " +
                         std::to_string(options.workers) + " virtual workers (--workers)");
  }
  if (body.contains("data") && body["data"].is_object() && body["data"].value("source", "platform") != "platform") {
    return InvalidArgumentError(
        "data.source: parsyn simulate trains on the --data file, split over the virtual workers; give data.source "
        "\"platform\" or leave it out");
  }
  body["dataset_id"] = dataset.id;
  body["model_id"] = model.id;
  body["worker_selection"] = {{"mode", "own"}, {"worker_ids", p.worker_ids}};
  std::vector<coordinator::FieldProblem> field_problems;
  StatusOr<coordinator::JobSpec> spec = coordinator::ParseJobSpecJson(body, field_problems);
  if (!spec.ok()) return InvalidArgumentError("--job: " + spec.status().message());
  if (!options.speeds.empty() && spec->distributed.steps_per_round <= 0) {
    return InvalidArgumentError(
        "--speeds gives each worker a time per step: it needs a job whose rounds are distributed.steps_per_round steps "
        "long (not 0)");
  }
  if (options.dropout > 0 && !spec->distributed.secure_aggregation.enabled) {
    return InvalidArgumentError(
        "--dropout drops virtual workers out of secure aggregation's phases: it needs a job with "
        "distributed.secure_aggregation.enabled true");
  }
  p.spec = *spec;
  for (std::string& w : coordinator::JobSpecWarnings(body, *spec)) p.warnings.push_back(std::move(w));
  std::vector<std::string> problems;
  PARSYN_RETURN_IF_ERROR(
      coordinator::CheckReferences(*p.store, storage::kDefaultProjectId, *spec, body, p.warnings, problems));
  if (!problems.empty()) return InvalidArgumentError("--job: " + JoinProblems(problems));
  PARSYN_ASSIGN_OR_RETURN(std::string private_seed, SecureRandomHex(32));
  p.job = storage::TrainingJob{.name = spec->name,
                               .dataset_id = spec->dataset_id,
                               .model_id = spec->model_id,
                               .spec_json = coordinator::JobSpecToJsonString(*spec),
                               .created_at_ms = now,
                               .private_seed = std::move(private_seed)};
  PARSYN_ASSIGN_OR_RETURN(p.job, p.store->CreateJob(p.job));
  auto append = [&](const std::string& type, const json& payload) {
    p.store->AppendJobEvent({.job_id = p.job.id, .type = type, .payload_json = payload.dump(), .time_ms = now})
        .status()
        .IgnoreError();  // events describe; the job's records are what counts
  };
  append("job_status", {{"status", "queued"}});
  for (const std::string& w : p.warnings) append("warning", {{"message", w}});

  return p;
}

}  // namespace parsyn::simulation
