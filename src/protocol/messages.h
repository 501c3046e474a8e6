// The worker protocol's messages (/api/v1/worker/...; docs/openapi.yaml), one typed struct each with one reader and
// one writer. The JSON is what the coordinator and `parsyn worker` exchange today, field for field.
//
//   worker → coordinator                      coordinator → worker
//   POST hello      Hello                     HelloAnswer
//   POST heartbeat  Heartbeat                 HeartbeatAnswer (the tasks to abandon)
//   GET tasks/next  -                         Task (200) or nothing (204)
//   POST progress   Progress                  -
//   POST result     Result                    the verdict {"status", "reason"}
//   POST failure    Failure                   {"status": "recorded"}
//   POST goodbye    Goodbye                   -
//
// Readers of what the coordinator receives take the request body and reject unknown fields, as its routes always
// have ("unknown field 'worker_id'"). Readers of what the worker receives ignore fields they do not know, so that a
// newer coordinator can add some. Every reader checks types and bounds (ids, rounds, string and list sizes) and
// reports every problem at once, naming the field (json_fields.h). Plain values and pure functions; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "protocol/trainer_events.h"
#include "protocol/training_config.h"

namespace parsyn::protocol {

// Bounds the readers apply.
inline constexpr int64_t kMaxRound = 1'000'000;  // rounds and attempts
inline constexpr size_t kMaxUrlBytes = 8192;     // presigned S3 URLs run to ~1.5 KB
inline constexpr size_t kMaxReasonBytes = 2000;  // Failure::reason
// Progress::throughput_unit and Progress::utilization_device values.
inline constexpr std::string_view kTokensPerSecond = "tokens/s";
inline constexpr std::string_view kSamplesPerSecond = "samples/s";
inline constexpr std::string_view kUtilizationGpu = "gpu";
inline constexpr std::string_view kUtilizationHostCpu = "host_cpu";

// --- hello ---------------------------------------------------------------------------------------------------------

// The worker's own data file (`parsyn worker --data`), announced so that the coordinator gives it tasks of jobs whose
// data.source is "workers". Only its shape leaves the machine: {"format": "csv" | "jsonl", "rows": N}.
inline constexpr int64_t kMaxLocalRows = 1'000'000'000'000;
struct LocalData {
  std::string format;  // "csv" | "jsonl"
  int64_t rows = 0;    // data rows (CSV: without the header), 1..kMaxLocalRows
  friend bool operator==(const LocalData&, const LocalData&) = default;
};

// A trainer the worker offers (docs/trainer-contract.md): the name jobs choose it by (config.trainer) and its
// `--describe` answer.
struct OfferedTrainer {
  std::string name;
  TrainerDescription description;
  friend bool operator==(const OfferedTrainer&, const OfferedTrainer&) = default;
};
inline constexpr size_t kMaxOfferedTrainers = 32;
// A LoRA rank's range, as config.lora_r's.
inline constexpr int kMaxLoraRank = 1024;

struct Hello {
  std::string device;                   // "cpu", "cuda:0", ...; empty: not said
  std::string version;                  // "parsyn-worker 0.1.0"; empty: not said
  std::optional<LocalData> local_data;  // absent: the worker trains only on platform shards
  // JSON "trainers": [{"name", "describe"}], distinct names. Absent (a worker older than the trainer contract): the
  // worker offers the built-in trainer alone (OfferedTrainers).
  std::vector<OfferedTrainer> trainers;
  // The memory of the device the worker trains on (a GPU's, else the machine's), in bytes: with config.lora_r "auto"
  // the job's rank for it follows from this and the model's size (docs/training.md "Workers of different ranks").
  // Absent: not said.
  std::optional<int64_t> device_memory_bytes;
  // The highest LoRA rank the worker trains (`parsyn worker --lora-rank`), 1..kMaxLoraRank; absent: any.
  std::optional<int> lora_rank;
  friend bool operator==(const Hello&, const Hello&) = default;
};
StatusOr<Hello> ParseHello(std::string_view body);  // an empty body is {}
nlohmann::json HelloToJson(const Hello& hello);
// The trainers as JSON text ([{"name", "describe"}]), as the worker record keeps them, and back. Text that is not
// such a list (an older record's "") reads as the built-in trainer alone, its description unknown (empty).
std::string OfferedTrainersToJsonText(const std::vector<OfferedTrainer>& trainers);
std::vector<OfferedTrainer> OfferedTrainersFromJsonText(std::string_view text);

struct HelloAnswer {
  int64_t worker_id = 0;
  std::string session_id;
  int64_t heartbeat_interval_ms = 5'000;
  int64_t heartbeat_timeout_ms = 0;  // 0: not said
  int64_t max_poll_wait_ms = 30'000;
  std::string worker_name;  // the name the worker was registered under (its logs use it); empty: not said
  friend bool operator==(const HelloAnswer&, const HelloAnswer&) = default;
};
StatusOr<HelloAnswer> ParseHelloAnswer(const nlohmann::json& body);
nlohmann::json HelloAnswerToJson(const HelloAnswer& answer);

// --- heartbeat and goodbye -----------------------------------------------------------------------------------------

struct Heartbeat {
  std::string session_id;
  friend bool operator==(const Heartbeat&, const Heartbeat&) = default;
};
using Goodbye = Heartbeat;  // the same body: {"session_id"}
StatusOr<Heartbeat> ParseHeartbeat(std::string_view body);
nlohmann::json HeartbeatToJson(const Heartbeat& heartbeat);

// A task the worker must drop: its round moved on (straggler) or its job ended.
struct AbandonedTask {
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
  friend bool operator==(const AbandonedTask&, const AbandonedTask&) = default;
};
struct HeartbeatAnswer {
  std::vector<AbandonedTask> abandon;
  // Jobs this session had tasks of that have ended since: the worker drops what it kept for them (its held global,
  // its error-feedback residual). JSON "ended_jobs", absent when empty.
  std::vector<int64_t> ended_jobs;
  friend bool operator==(const HeartbeatAnswer&, const HeartbeatAnswer&) = default;
};
StatusOr<HeartbeatAnswer> ParseHeartbeatAnswer(const nlohmann::json& body);
nlohmann::json HeartbeatAnswerToJson(const HeartbeatAnswer& answer);

// --- task ----------------------------------------------------------------------------------------------------------

enum class TaskKind { kTrain, kEvaluate };
std::string_view TaskKindName(TaskKind kind);  // "train" | "evaluate"

// Where a task's training data comes from: the platform's shard (its URLs in `data`), or the worker's own file
// (a job whose data.source is "workers"; `data` is then empty, and written as {}).
enum class DataSource { kPlatform, kWorkers };
std::string_view DataSourceName(DataSource source);  // "platform" | "workers"

// Every sha256 of a task (its global's, its model files', its shard's) is 64 lowercase hex digits: the worker names
// cached files by it and checks each download against it.
bool IsSha256Hex(std::string_view text);

struct TaskModelFile {
  std::string path;  // within the model folder
  std::string url;   // signed GET
  std::string sha256;
  uint64_t size_bytes = 0;
  friend bool operator==(const TaskModelFile&, const TaskModelFile&) = default;
};
struct TaskModel {
  int64_t id = 0;
  std::string name;
  std::string model_type;  // "llama", "tabular-mlp", ...
  std::vector<TaskModelFile> files;
  friend bool operator==(const TaskModel&, const TaskModel&) = default;
};
// A zstd copy of a blob (docs/compression.md, "In jobs"): the worker downloads it, checks its sha256 (of the
// compressed bytes), decompresses it bounded by the original's size_bytes and checks the original's sha256.
struct TaskZstdCopy {
  std::string url;  // signed GET
  std::string sha256;
  uint64_t size_bytes = 0;
  friend bool operator==(const TaskZstdCopy&, const TaskZstdCopy&) = default;
};
// The global as a delta from the global before it (distributed.compression.global; docs/compression.md,
// "Downlink"): a worker that holds the base (by its sha256) downloads this instead, decodes it against the base,
// gives the result `metadata` as the global's safetensors metadata, and checks the file it writes against the
// global's sha256.
struct TaskGlobalDelta {
  std::string url;  // signed GET
  std::string sha256;
  uint64_t size_bytes = 0;
  std::string base_sha256;  // the global the delta is from
  std::string codec;        // "bf16" | "int8" | "int4": the update codec's format (weights/update_codec.h)
  bool zstd = false;        // the encoded image is zstd-compressed
  std::vector<std::pair<std::string, std::string>> metadata;  // the global's __metadata__
  friend bool operator==(const TaskGlobalDelta&, const TaskGlobalDelta&) = default;
};
struct TaskGlobalWeights {
  std::string url;  // signed GET
  std::string sha256;
  uint64_t size_bytes = 0;
  int round = 0;                         // the round that produced them (0: the initial global)
  std::optional<TaskZstdCopy> zstd;      // JSON "zstd"; absent: download `url`
  std::optional<TaskGlobalDelta> delta;  // JSON "delta"; absent: no delta offered
  friend bool operator==(const TaskGlobalWeights&, const TaskGlobalWeights&) = default;
};
// The shard's two files, each with the sha256 the coordinator recorded when it wrote them: the worker caches them by
// that checksum and checks every download against it (a reset coordinator's new job with the same id and shard
// index has other checksums, so old cached files are never used for it). Each sha256 is required with its URL.
struct TaskData {
  std::string format;  // "jsonl" | "csv"
  std::string kind;    // the dataset's kind
  std::string train_url;
  std::string train_sha256;  // 64 lowercase hex digits
  int64_t train_rows = 0;
  std::string validation_url;
  std::string validation_sha256;  // 64 lowercase hex digits
  int64_t validation_rows = 0;
  friend bool operator==(const TaskData&, const TaskData&) = default;
};
using HttpHeaders = std::map<std::string, std::string>;
struct UploadPart {
  int64_t part_number = 0;  // 1-based
  std::string url;
  HttpHeaders headers;
  friend bool operator==(const UploadPart&, const UploadPart&) = default;
};
// Where the update goes (worker/update_upload.h): one signed PUT to url (with headers, for S3), or S3 parts.
struct UpdateUpload {
  std::string blob_key;
  uint64_t max_size_bytes = 0;
  std::string url;                     // empty with multipart
  std::optional<HttpHeaders> headers;  // S3's signed headers for the single PUT
  struct Multipart {
    uint64_t part_size_bytes = 0;
    std::vector<UploadPart> parts;
    friend bool operator==(const Multipart&, const Multipart&) = default;
  };
  std::optional<Multipart> multipart;
  friend bool operator==(const UpdateUpload&, const UpdateUpload&) = default;
};

// A job's distributed.compression (docs/training.md, docs/compression.md "In jobs"): how a worker encodes the update
// it uploads. The job spec checks the rules between the fields; a task's reader checks each field alone.
inline constexpr int kMaxCompressionZstdLevel = 19;
struct UpdateCompression {
  std::string update = "none";  // "none" | "bf16" | "int8" | "int4"
  bool delta = false;           // send w_local - w_global
  int zstd_level = 0;           // 0: no zstd; 1..19
  bool error_feedback = false;  // carry the quantisation residual to the worker's next update of the job
  // The downlink: "none" | "delta_bf16" | "delta_int8" | "delta_int4" (kGlobalCodecs). Other than "none", each
  // round's global is also offered as a delta from the one before, and workers keep the last global they received.
  std::string global = "none";
  friend bool operator==(const UpdateCompression&, const UpdateCompression&) = default;
};
// Every field, always (the job's normalised form and the task's).
nlohmann::json UpdateCompressionToJson(const UpdateCompression& compression);
// distributed.compression.global's values, and the update codec each one encodes its delta with ("" for none).
inline constexpr std::pair<std::string_view, std::string_view> kGlobalCodecs[] = {
    {"none", ""}, {"delta_bf16", "bf16"}, {"delta_int8", "int8"}, {"delta_int4", "int4"}};
// The codec of a distributed.compression.global value: "" for "none" and for an unknown value.
std::string_view GlobalDeltaCodec(std::string_view global);

struct Task {
  std::string task_id;  // "<job>-<round>-<attempt>-w<worker>"
  int64_t job_id = 0;
  TaskKind kind = TaskKind::kTrain;
  int round = 0;
  int attempt = 0;
  int total_rounds = 0;
  int shard = 0;
  uint64_t seed = 0;  // this task's own seed (all 64 bits used)
  int64_t steps_per_round = 0;
  TrainingConfig config;
  // FedProx: the trainer adds proximal_mu/2 * ||w - w_global||^2 over the trainable weights to its loss (w_global:
  // this task's global). 0..kMaxProximalMu; 0 (the default, absent from the JSON) is plain FedAvg training.
  double proximal_mu = 0;
  int64_t deadline_unix_ms = 0;
  TaskGlobalWeights global_weights;
  DataSource data_source = DataSource::kPlatform;  // JSON "data_source"; absent reads as "platform"
  TaskData data;
  TaskModel model;
  std::optional<UpdateUpload> update_upload;  // train tasks only, and always there
  UpdateCompression compression;              // JSON "compression"; absent: none (the plain update)
  // The round is securely aggregated (docs/secure-aggregation.md): the worker takes part in the attempt's phases
  // through /api/v1/worker/secure-aggregation/... and sends its masked input there instead of uploading an update.
  // JSON "secure_aggregation": true; absent: false.
  bool secure_aggregation = false;
  friend bool operator==(const Task&, const Task&) = default;
};
StatusOr<Task> ParseTask(const nlohmann::json& body);
// What a task's round is called in logs and messages: "round 2/4", or "the final evaluation" for the evaluation the
// engine runs after the last round (its round number is total_rounds + 1, which is no round of the job).
std::string RoundLabel(int round, int total_rounds);
// The task's JSON text, written directly (JsonTextWriter): one task per worker per round. `config_json` is
// TrainingConfigToJson(task.config) already dumped, when the caller has it (the same for every task of a job);
// empty: dumped here.
std::string TaskJsonText(const Task& task, std::string_view config_json = {});

// --- progress, result, failure -------------------------------------------------------------------------------------

struct Progress {
  std::string session_id;  // empty: not said
  int64_t job_id = 0;
  int round = 0;
  std::optional<int> attempt;
  int64_t step = 0;
  std::optional<int64_t> total_steps;
  std::optional<double> loss;
  std::optional<double> throughput;   // tokens per second for language models, else samples per second
  std::string throughput_unit;        // what `throughput` counts: "tokens/s" or "samples/s" (empty: not said)
  std::optional<double> utilization;  // 0..1
  // What `utilization` measures: "gpu" (the task's GPU) or "host_cpu" (the worker machine's whole CPU, every
  // process on it); empty: not said.
  std::string utilization_device;
  // The GPU's memory in use and in all (NVML), with utilization_device "gpu"; absent otherwise.
  std::optional<int64_t> device_memory_used_bytes;
  std::optional<int64_t> device_memory_total_bytes;
  friend bool operator==(const Progress&, const Progress&) = default;
};
StatusOr<Progress> ParseProgress(std::string_view body);
nlohmann::json ProgressToJson(const Progress& progress);

struct Result {
  std::string session_id;  // empty: not said
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
  std::string blob_key;  // the uploaded update (train tasks); empty for evaluate tasks
  std::string sha256;
  int64_t sample_count = 0;
  std::optional<double> train_loss;
  std::optional<double> validation_loss;  // of the global the task received
  int64_t validation_samples = 0;
  nlohmann::json metrics = nlohmann::json::object();  // the trainer's: validation_before/after, steps, ...
  friend bool operator==(const Result&, const Result&) = default;
};
StatusOr<Result> ParseResult(std::string_view body);
// A result's `metrics` from a trainer's result (docs/trainer-contract.md): its validation metrics before and after,
// and its counters, keeping only the names ParseResult accepts (the trainer's others stay on the worker).
nlohmann::json ResultMetricsFrom(const TrainerResult& result);
nlohmann::json ResultToJson(const Result& result);

struct Failure {
  std::string session_id;  // empty: not said
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
  std::string reason;  // 1..kMaxReasonBytes bytes
  friend bool operator==(const Failure&, const Failure&) = default;
};
StatusOr<Failure> ParseFailure(std::string_view body);
nlohmann::json FailureToJson(const Failure& failure);

}  // namespace parsyn::protocol
