// JobSpec: the typed, validated form of a training job's request body (POST /api/v1/training-jobs, docs/openapi.yaml),
// and its normalised JSON (the stored form, every default filled in).
//
// ParseJobSpec checks every field: JSON types, ranges, enum spellings, cross-field rules; unknown fields are errors.
// An error is InvalidArgument whose message lists every problem found, each naming the field path and the reason,
// separated by "; ", e.g.
//   "unknown field config.lerning_rate; distributed.min_workers (3) must be <= distributed.max_workers (2)".
// Whether dataset_id, model_id and worker ids exist is checked by the coordinator, not here.
// A field given as JSON null is treated as absent (its default applies); a required field that is null is missing.
// Pure functions; safe from any thread.
//
// Fields and defaults (ranges are inclusive):
//   field                               type              default              range / values
//   name                                string            required             1..128 bytes, no control characters
//   dataset_id                          integer           required for         >= 1; must be absent or null
//                                                         data.source platform for data.source "workers"
//   model_id                            integer           required             >= 1
//   config.*                            object            see protocol/training_config.h (the job's config schema)
//   config.lora_r "auto", config.lora_r_max, config.lora_ranks, config.lora_aggregation: lora_rank_spec.h
//   distributed.enabled                 boolean           false
//   distributed.strategy                string            "federated_averaging" one of strategy::StrategyKinds()
//   distributed.strategy_options        object            the strategy's        per strategy: strategy_spec.h,
//                                                         defaults              docs/training.md "Strategies"
//   distributed.num_rounds              integer           10                   1..10000
//   distributed.steps_per_round         integer           500                  0..10^7 (0: a round trains
//                                                                              config.epochs passes over the shard)
//   distributed.min_workers             integer           2                    1..10000
//   distributed.max_workers             integer           max(min_workers,     1..10000, >= min_workers
//                                                             listed workers)
//   distributed.aggregation_timeout     number (seconds)  600                  1..604800
//   distributed.fault_tolerance         integer           3                    1..1000: the job fails after this
//                                                                              many consecutive failed rounds
//   distributed.early_stopping          object            absent (off)         distributed jobs only
//   distributed.early_stopping.patience integer           required             1..10000 evaluated globals
//   distributed.early_stopping.min_delta number           0                    >= 0
//   distributed.partition               object            {"method": "iid"}    data.source "platform" only
//   distributed.partition.method        string            "iid"                "iid" | "dirichlet" |
//                                                                              "shards_per_worker" (partition.h)
//   distributed.partition.alpha         number            0.5 (dirichlet)      (0, 10^6]; dirichlet only
//   distributed.partition.classes_per_worker integer      2 (shards_per_worker) 1..10000; shards_per_worker only
//   distributed.partition.label         string            CSV: the label       1..256 bytes; required for a JSONL
//                                                         column               dataset unless method is "iid"
//   distributed.compression             object            {"update": "none"}   how workers encode their updates
//                                                                              (docs/compression.md "In jobs")
//   distributed.compression.update      string            "none"               "none" | "bf16" | "int8" | "int4"
//   distributed.compression.delta       boolean           false                bf16/int8/int4 only
//   distributed.compression.zstd_level  integer           0 (no zstd)          0..19; also zstd on the globals
//   distributed.compression.error_feedback boolean        false                bf16/int8/int4 only
//   distributed.secure_aggregation      object            absent (off)         secure_aggregation_spec.h,
//                                                                              docs/secure-aggregation.md
//   worker_selection.mode               string            from the lists:      "own" | "managed" | "mixed" | "auto"
//                                                         own, managed, mixed
//                                                         or (none) auto
//   worker_selection.worker_ids         array of integer  []                   the user's own workers, ids >= 1
//   worker_selection.parsyn_worker_ids  array of integer  []                   platform-managed workers, ids >= 1
//   data.source                         string            "platform"           "platform" (the dataset_id's
//                                                                              shards) | "workers" (each worker's
//                                                                              own --data file)
//   data.max_samples_per_worker         integer           required for         1..10^9: the most training samples
//                                                         "workers"; absent    a worker's update may claim (its
//                                                         for "platform"       FedAvg weight); "workers" only
//
// Cross-field rules: own needs worker_ids and no parsyn_worker_ids; managed the reverse; mixed needs both; auto
// needs neither (any available worker may take part). No id twice, nor in both lists; at most 10000 ids. For a
// distributed job, the listed workers must be at least min_workers.
//
// early_stopping on a job that is not distributed is an error (an ordinary job has one round: nothing to stop). The
// normalised form omits early_stopping when it is off.
//
// A job without `distributed`, or with enabled=false, is an ordinary job on one worker: its distributed fields are
// still validated, then normalised to num_rounds 1, min_workers = max_workers = 1, steps_per_round 0 (0: the one
// round trains config.epochs passes over the data), so a one-worker job's normalised JSON parses back to itself.
//
// Round length (docs/training.md "Round length: epochs and steps_per_round"):
//   - distributed, steps_per_round > 0: each round is steps_per_round optimizer steps on the worker's shard (cycling
//     over the shard as often as needed); config.epochs is ignored.
//   - distributed, steps_per_round 0: each round trains config.epochs passes over the shard.
//   - not distributed: one worker trains config.epochs passes over all the training data; the distributed fields
//     other than `enabled` are ignored.
//
// JobSpecWarnings lists what the body gave that is accepted but ignored (or, for a secure aggregation threshold, not
// what the job can keep to); the job is still created. The coordinator
// adds the warnings that need the dataset or the model (job_routes.cc) and returns them all in the 201 answer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "coordinator/async_aggregation_spec.h"
#include "coordinator/lora_rank_spec.h"
#include "coordinator/secure_aggregation_spec.h"
#include "protocol/messages.h"
#include "protocol/training_config.h"
#include "strategy/strategy_options.h"

namespace parsyn::coordinator {

// The config part is the protocol layer's one schema.
using protocol::LrScheduler;
using protocol::LrSchedulerName;
using protocol::MixedPrecision;
using protocol::MixedPrecisionName;
using protocol::TrainingConfig;
// Where a job's training data is: "platform" (an uploaded dataset, sharded) or "workers" (their own files).
using protocol::DataSource;
using protocol::DataSourceName;

// distributed.strategy: "federated_averaging", "fedadam", ... (strategy/strategy_options.h).
using AggregationStrategy = strategy::StrategyKind;
enum class WorkerSelectionMode { kOwn, kManaged, kMixed, kAuto };

// The JSON spellings: "federated_averaging", "mixed", ...
std::string_view AggregationStrategyName(AggregationStrategy v);
std::string_view WorkerSelectionModeName(WorkerSelectionMode v);

// The member defaults are an ordinary one-worker job's; a distributed job's defaults are those of the table above.
// distributed.early_stopping: end the job once `patience` evaluated globals in a row did not lower the validation
// loss by more than min_delta below the lowest so far (docs/training.md).
struct EarlyStopping {
  int patience = 1;
  double min_delta = 0;

  friend bool operator==(const EarlyStopping&, const EarlyStopping&) = default;
};

// distributed.partition: how a platform dataset is split over the workers (coordinator/partition.h,
// docs/training.md "Data partition"). The label is checked against the dataset when the job is created (CSV: it must
// be the job's label column; JSONL: it is required for dirichlet and shards_per_worker).
enum class PartitionMethod { kIid, kDirichlet, kShardsPerWorker };
std::string_view PartitionMethodName(PartitionMethod v);  // "iid", "dirichlet", "shards_per_worker"

struct DataPartition {
  PartitionMethod method = PartitionMethod::kIid;
  double alpha = 0.5;          // dirichlet: the concentration of each class's Dir(alpha) over the workers
  int classes_per_worker = 2;  // shards_per_worker: the pieces (and so, at most, the classes) each worker gets
  std::string label;           // "" : CSV: the job's label column (config.label_column, else "label")

  friend bool operator==(const DataPartition&, const DataPartition&) = default;
};

struct DistributedConfig {
  bool enabled = false;
  AggregationStrategy strategy = AggregationStrategy::kFederatedAveraging;
  // distributed.strategy_options, the strategy's defaults filled in (fedprox's mu goes to the workers' tasks).
  strategy::StrategyOptions strategy_options;
  int num_rounds = 1;
  int64_t steps_per_round = 0;
  int min_workers = 1;
  int max_workers = 1;
  int64_t aggregation_timeout_ms = 600'000;  // JSON: aggregation_timeout, in seconds
  int fault_tolerance = 3;
  // How long a round waits, once min_workers are idle, for selected workers still busy (reporting the previous
  // round) before it starts without them. JSON: join_window, in seconds.
  int64_t join_window_ms = 5'000;
  std::optional<EarlyStopping> early_stopping;  // absent: off
  DataPartition partition;                      // JSON: distributed.partition
  protocol::UpdateCompression compression;      // JSON: distributed.compression
  SecureAggregationSpec secure_aggregation;     // JSON: distributed.secure_aggregation
  AsyncAggregationSpec async;                   // JSON: distributed.aggregation and distributed.async

  friend bool operator==(const DistributedConfig&, const DistributedConfig&) = default;
};

struct WorkerSelection {
  WorkerSelectionMode mode = WorkerSelectionMode::kAuto;
  std::vector<int64_t> worker_ids;         // the user's own machines
  std::vector<int64_t> parsyn_worker_ids;  // platform-managed machines

  friend bool operator==(const WorkerSelection&, const WorkerSelection&) = default;
};

// The job's `data` object.
struct JobData {
  DataSource source = DataSource::kPlatform;
  // "workers": a reported sample count above it is rejected (it is the update's FedAvg weight). 0 for "platform".
  int64_t max_samples_per_worker = 0;

  friend bool operator==(const JobData&, const JobData&) = default;
};
inline constexpr int64_t kMaxSamplesPerWorkerLimit = 1'000'000'000;

struct JobSpec {
  std::string name;
  int64_t dataset_id = 0;  // 0 (JSON null) for data.source "workers"
  int64_t model_id = 0;
  TrainingConfig config;
  DistributedConfig distributed;
  WorkerSelection worker_selection;
  JobData data;
  // config.lora_r "auto", lora_r_max, lora_ranks, lora_aggregation (lora_rank_spec.h); config.lora_r holds r_max.
  LoraRankSpec lora_ranks;

  // worker_ids then parsyn_worker_ids, in the order given: the selected workers (empty for mode auto).
  std::vector<int64_t> SelectedWorkers() const;

  friend bool operator==(const JobSpec&, const JobSpec&) = default;
};

// A distributed job's section before the request's fields apply: the defaults of the table above (num_rounds 10,
// steps_per_round 500, min_workers 2, ...; max_workers 0 until derived). ParseJobSpec starts from it.
DistributedConfig DistributedJobDefaults();
// The same as the job form shows them (the dashboard's training_defaults.js, DISTRIBUTED_DEFAULTS): strategy,
// num_rounds, steps_per_round, min_workers, aggregation_timeout and join_window in seconds, fault_tolerance, and
// partition {method, alpha, classes_per_worker}.
nlohmann::json DistributedDefaultsJson();

// Parses and validates a request body. InvalidArgument for malformed JSON (with the parser's position) or any
// invalid field (see above).
StatusOr<JobSpec> ParseJobSpec(std::string_view body);
StatusOr<JobSpec> ParseJobSpecJson(const nlohmann::json& body);

// One problem of a request body, as the API lists it in error.errors (docs/openapi.yaml FieldProblem).
struct FieldProblem {
  std::string field;    // "distributed.min_workers", "config.lora_target_modules[1]"; "" when it is about no one field
  std::string message;  // the whole sentence, which names the field too

  friend bool operator==(const FieldProblem&, const FieldProblem&) = default;
};
// The field a problem is about. Every problem of a job spec starts with the path of its field ("distributed.min_workers
// (3) must be ...", "dataset_id: dataset 9 does not exist", "'name' must be ..."), or is "unknown field <path>":
// that path (array index kept) when it starts with one of the spec's keys (any path for an unknown field), else "".
std::string ProblemField(std::string_view message);
// Each message with its field, in order.
std::vector<FieldProblem> FieldProblems(const std::vector<std::string>& messages);
// ParseJobSpecJson that also answers its problems one by one in `problems` (nothing added when the spec is valid);
// the InvalidArgument's message joins the same problems with "; ".
StatusOr<JobSpec> ParseJobSpecJson(const nlohmann::json& body, std::vector<FieldProblem>& problems);

// Each setting `body` gave explicitly (not null) that the job ignores, one sentence naming the field, why, and how to
// make it count, and a secure aggregation threshold below what unmasking needs (SecureThresholdWarning); in a fixed
// order. `body` is the request body `spec` was parsed from (ParseJobSpecJson(body) == spec).
std::vector<std::string> JobSpecWarnings(const nlohmann::json& body, const JobSpec& spec);
// Whether `body` gives body[section][key] (present and not null: null means absent, as in ParseJobSpecJson).
bool JobSpecGives(const nlohmann::json& body, std::string_view section, std::string_view key);

// The normalised form: every field present, defaults filled in, aggregation_timeout in seconds.
// ParseJobSpec(JobSpecToJson(spec)) == spec for any spec ParseJobSpec returned.
nlohmann::json JobSpecToJson(const JobSpec& spec);
std::string JobSpecToJsonString(const JobSpec& spec);

}  // namespace parsyn::coordinator
