#include "coordinator/job_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "coordinator/strategy_spec.h"
#include "protocol/field_reader.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using protocol::FieldReader;

// A job spans at most this many workers (listed or taking part in a round): the control plane is sized and
// benchmarked for it (bench/control_plane).
constexpr int kMaxJobWorkers = 10'000;
constexpr size_t kMaxWorkerIds = kMaxJobWorkers;
constexpr size_t kMaxNameBytes = 128;

constexpr std::pair<std::string_view, AggregationStrategy> kStrategies[] = {
    {"federated_averaging", AggregationStrategy::kFederatedAveraging},
    {"fedprox", AggregationStrategy::kFedProx},
    {"fedavgm", AggregationStrategy::kFedAvgM},
    {"fedadam", AggregationStrategy::kFedAdam},
    {"fedyogi", AggregationStrategy::kFedYogi},
    {"fedadagrad", AggregationStrategy::kFedAdagrad},
    {"median", AggregationStrategy::kMedian},
    {"trimmed_mean", AggregationStrategy::kTrimmedMean},
    {"krum", AggregationStrategy::kKrum},
    {"multi_krum", AggregationStrategy::kMultiKrum},
    {"dp_fedavg", AggregationStrategy::kDpFedAvg}};
constexpr std::pair<std::string_view, WorkerSelectionMode> kModes[] = {{"own", WorkerSelectionMode::kOwn},
                                                                       {"managed", WorkerSelectionMode::kManaged},
                                                                       {"mixed", WorkerSelectionMode::kMixed},
                                                                       {"auto", WorkerSelectionMode::kAuto}};

template <typename Enum, size_t N>
std::string_view NameOf(Enum v, const std::pair<std::string_view, Enum> (&table)[N]) {
  for (const auto& [spelling, value] : table) {
    if (value == v) return spelling;
  }
  return "?";
}

constexpr std::pair<std::string_view, PartitionMethod> kPartitionMethods[] = {
    {"iid", PartitionMethod::kIid},
    {"dirichlet", PartitionMethod::kDirichlet},
    {"shards_per_worker", PartitionMethod::kShardsPerWorker}};

// distributed.partition; an option the method does not take is an error.
void ParsePartition(const json* object, DataPartition& p, std::vector<std::string>& errors) {
  if (object == nullptr) return;
  FieldReader r(*object, "distributed.partition.", errors);
  const bool method_ok = r.Choice("method", p.method, kPartitionMethods);
  const bool alpha_given = r.Get("alpha") != nullptr;
  r.Number("alpha", p.alpha, 0, 1e6, /*min_exclusive=*/true);
  const bool classes_given = r.Get("classes_per_worker") != nullptr;
  r.Integer("classes_per_worker", p.classes_per_worker, 1, 10000);
  r.String("label", p.label, 1, 256);
  r.RejectUnknown();
  if (!method_ok) return;
  const std::string method = FieldReader::Quoted(NameOf(p.method, kPartitionMethods));
  if (alpha_given && p.method != PartitionMethod::kDirichlet) {
    r.Error("distributed.partition.alpha applies only to method \"dirichlet\", not " + method);
  }
  if (classes_given && p.method != PartitionMethod::kShardsPerWorker) {
    r.Error("distributed.partition.classes_per_worker applies only to method \"shards_per_worker\", not " + method);
  }
}

json PartitionToJson(const DataPartition& p) {
  json out = {{"method", NameOf(p.method, kPartitionMethods)}};
  if (p.method == PartitionMethod::kDirichlet) out["alpha"] = p.alpha;
  if (p.method == PartitionMethod::kShardsPerWorker) out["classes_per_worker"] = p.classes_per_worker;
  if (!p.label.empty()) out["label"] = p.label;
  return out;
}

// distributed.compression; delta and error feedback need a codec (the plain update has no encoded form to take a
// delta of or a quantisation error to carry).
void ParseCompression(const json* object, protocol::UpdateCompression& c, std::vector<std::string>& errors) {
  if (object == nullptr) return;
  FieldReader r(*object, "distributed.compression.", errors);
  static constexpr std::pair<std::string_view, std::string_view> kCodecs[] = {
      {"none", "none"}, {"bf16", "bf16"}, {"int8", "int8"}, {"int4", "int4"}};
  std::string_view codec = c.update;
  const bool codec_ok = r.Choice("update", codec, kCodecs);
  c.update = std::string(codec);
  r.Boolean("delta", c.delta);
  r.Integer("zstd_level", c.zstd_level, 0, protocol::kMaxCompressionZstdLevel);
  r.Boolean("error_feedback", c.error_feedback);
  static constexpr std::pair<std::string_view, std::string_view> kGlobals[] = {
      {"none", "none"}, {"delta_bf16", "delta_bf16"}, {"delta_int8", "delta_int8"}, {"delta_int4", "delta_int4"}};
  std::string_view global = c.global;
  r.Choice("global", global, kGlobals);
  c.global = std::string(global);
  r.RejectUnknown();
  if (!codec_ok || c.update != "none") return;
  if (c.delta) {
    r.Error(
        "distributed.compression.delta needs distributed.compression.update \"bf16\", \"int8\" or \"int4\" "
        "(a delta travels encoded); set update or remove delta");
  }
  if (c.error_feedback) {
    r.Error(
        "distributed.compression.error_feedback needs a lossy distributed.compression.update (\"bf16\", "
        "\"int8\" or \"int4\"): \"none\" has no quantisation error to carry; set update or remove "
        "error_feedback");
  }
}

// A JSON number of seconds for a duration in milliseconds: an integer when it is whole.
json Seconds(int64_t ms) { return ms % 1000 == 0 ? json(ms / 1000) : json(static_cast<double>(ms) / 1000.0); }

void ParseDistributed(const json* object, DistributedConfig& d, std::vector<std::string>& errors) {
  // The defaults of a distributed job; an ordinary job is normalised after validation.
  d = DistributedJobDefaults();
  if (object == nullptr) return;
  FieldReader r(*object, "distributed.", errors);
  r.Boolean("enabled", d.enabled);
  if (r.Choice("strategy", d.strategy, kStrategies)) {
    ParseStrategyOptions(r.Object("strategy_options"), d.strategy, d.strategy_options, errors);
  } else {
    r.Get("strategy_options");  // judged once the strategy is valid
  }
  r.Integer("num_rounds", d.num_rounds, 1, 10000);
  r.Integer("steps_per_round", d.steps_per_round, 0, 10'000'000);
  r.Integer("min_workers", d.min_workers, 1, kMaxJobWorkers);
  r.Integer("max_workers", d.max_workers, 1, kMaxJobWorkers);
  double timeout_s = static_cast<double>(d.aggregation_timeout_ms) / 1000.0;
  r.Number("aggregation_timeout", timeout_s, 1, 604800);
  d.aggregation_timeout_ms = std::llround(timeout_s * 1000.0);
  r.Integer("fault_tolerance", d.fault_tolerance, 1, 1000);
  double join_window_s = static_cast<double>(d.join_window_ms) / 1000.0;
  r.Number("join_window", join_window_s, 0, 3600);
  d.join_window_ms = std::llround(join_window_s * 1000.0);
  if (const json* early = r.Object("early_stopping")) {
    FieldReader e(*early, "distributed.early_stopping.", errors);
    EarlyStopping es;
    if (e.Required("patience")) e.Integer("patience", es.patience, 1, 10000);
    e.Number("min_delta", es.min_delta, 0, 1e9);
    e.RejectUnknown();
    d.early_stopping = es;
  }
  ParsePartition(r.Object("partition"), d.partition, errors);
  ParseCompression(r.Object("compression"), d.compression, errors);
  ParseSecureAggregation(r.Object("secure_aggregation"), d.secure_aggregation, errors);
  const json* aggregation = r.Get("aggregation");
  ParseAsyncAggregation(aggregation, r.Object("async"), d.async, errors);
  r.RejectUnknown();
}

constexpr std::pair<std::string_view, DataSource> kDataSources[] = {{"platform", DataSource::kPlatform},
                                                                    {"workers", DataSource::kWorkers}};

void ParseData(const json* object, JobData& d, std::vector<std::string>& errors) {
  if (object == nullptr) return;
  FieldReader r(*object, "data.", errors);
  const bool source_ok = r.Choice("source", d.source, kDataSources);
  const bool bound_given = r.Get("max_samples_per_worker") != nullptr;
  r.Integer("max_samples_per_worker", d.max_samples_per_worker, 1, kMaxSamplesPerWorkerLimit);
  r.RejectUnknown();
  if (!source_ok) return;
  if (d.source == DataSource::kWorkers && !bound_given) {
    r.Error(
        "data.max_samples_per_worker is required when data.source is \"workers\": the most training samples one "
        "worker's update may claim (its weight in the average)");
  } else if (d.source == DataSource::kPlatform && bound_given) {
    r.Error("data.max_samples_per_worker applies only to data.source \"workers\" (a platform shard bounds it)");
  }
}

json JobDataToJson(const JobData& data) {
  json out = {{"source", DataSourceName(data.source)}};
  if (data.source == DataSource::kWorkers) out["max_samples_per_worker"] = data.max_samples_per_worker;
  return out;
}

// Returns false when the selection is invalid (the errors say why), so later checks that count workers are skipped.
bool ParseWorkerSelection(const json* object, WorkerSelection& w, std::vector<std::string>& errors) {
  if (object == nullptr) return true;
  const size_t errors_before = errors.size();
  FieldReader r(*object, "worker_selection.", errors);
  const bool mode_given = r.Get("mode") != nullptr;
  const bool mode_ok = r.Choice("mode", w.mode, kModes);
  const auto own = r.IntegerList("worker_ids", kMaxWorkerIds, 1, std::numeric_limits<int64_t>::max());
  const auto managed = r.IntegerList("parsyn_worker_ids", kMaxWorkerIds, 1, std::numeric_limits<int64_t>::max());
  r.RejectUnknown();
  if (!mode_ok || !own || !managed) return false;
  w.worker_ids = *own;
  w.parsyn_worker_ids = *managed;
  if (!mode_given) {
    w.mode = w.worker_ids.empty()
                 ? (w.parsyn_worker_ids.empty() ? WorkerSelectionMode::kAuto : WorkerSelectionMode::kManaged)
                 : (w.parsyn_worker_ids.empty() ? WorkerSelectionMode::kOwn : WorkerSelectionMode::kMixed);
  }

  std::set<int64_t> seen;
  for (const auto* list : {&w.worker_ids, &w.parsyn_worker_ids}) {
    const std::string path = r.Path(list == &w.worker_ids ? "worker_ids" : "parsyn_worker_ids");
    std::set<int64_t> in_list;
    for (int64_t id : *list) {
      if (!in_list.insert(id).second) {
        r.Error(path + " lists worker " + std::to_string(id) + " twice");
      } else if (!seen.insert(id).second) {
        r.Error(path + " lists worker " + std::to_string(id) + ", which worker_selection.worker_ids lists too");
      }
    }
  }
  if (w.worker_ids.size() + w.parsyn_worker_ids.size() > kMaxWorkerIds) {
    r.Error("worker_selection lists more than " + std::to_string(kMaxWorkerIds) + " workers");
  }
  const bool has_own = !w.worker_ids.empty();
  const bool has_managed = !w.parsyn_worker_ids.empty();
  switch (w.mode) {
    case WorkerSelectionMode::kOwn:
      if (!has_own) r.Error("worker_selection.mode \"own\" needs worker_selection.worker_ids");
      if (has_managed) r.Error("worker_selection.mode \"own\" must not list worker_selection.parsyn_worker_ids");
      break;
    case WorkerSelectionMode::kManaged:
      if (!has_managed) r.Error("worker_selection.mode \"managed\" needs worker_selection.parsyn_worker_ids");
      if (has_own) r.Error("worker_selection.mode \"managed\" must not list worker_selection.worker_ids");
      break;
    case WorkerSelectionMode::kMixed:
      if (!has_own || !has_managed) {
        r.Error(
            "worker_selection.mode \"mixed\" needs both worker_selection.worker_ids and "
            "worker_selection.parsyn_worker_ids");
      }
      break;
    case WorkerSelectionMode::kAuto:
      if (has_own || has_managed) {
        r.Error("worker_selection.mode \"auto\" chooses workers itself and must not list worker ids");
      }
      break;
  }
  return errors.size() == errors_before;
}

}  // namespace

std::string_view AggregationStrategyName(AggregationStrategy v) { return strategy::StrategyKindName(v); }
std::string_view WorkerSelectionModeName(WorkerSelectionMode v) { return NameOf(v, kModes); }
std::string_view PartitionMethodName(PartitionMethod v) { return NameOf(v, kPartitionMethods); }

std::vector<int64_t> JobSpec::SelectedWorkers() const {
  std::vector<int64_t> ids = worker_selection.worker_ids;
  ids.insert(ids.end(), worker_selection.parsyn_worker_ids.begin(), worker_selection.parsyn_worker_ids.end());
  return ids;
}

namespace {

// ParseJobSpecJson, its problems appended to `errors`.
StatusOr<JobSpec> ParseJobSpecCollecting(const json& body, std::vector<std::string>& errors) {
  if (!body.is_object()) {
    errors.push_back(std::string("request body must be a JSON object, got ") + body.type_name());
    return protocol::ErrorsToStatus(errors);
  }
  JobSpec spec;
  FieldReader r(body, "", errors);
  if (r.Required("name")) r.String("name", spec.name, 1, kMaxNameBytes);
  ParseData(r.Object("data"), spec.data, errors);
  if (spec.data.source == DataSource::kWorkers) {
    if (r.Get("dataset_id") != nullptr) {
      errors.push_back(
          "dataset_id must be absent or null when data.source is \"workers\": the workers train on their own "
          "files (parsyn worker --data)");
    }
  } else if (r.Required("dataset_id")) {
    r.Integer("dataset_id", spec.dataset_id, 1, std::numeric_limits<int64_t>::max());
  }
  if (r.Required("model_id")) r.Integer("model_id", spec.model_id, 1, std::numeric_limits<int64_t>::max());
  if (const json* config = r.Object("config")) {
    json trainer_config = *config;  // without the keys only the coordinator reads (lora_rank_spec.h)
    TakeLoraRankFields(trainer_config, spec.lora_ranks, errors);
    FieldReader config_reader(trainer_config, "config.", errors);
    protocol::ReadTrainingConfigFields(config_reader, spec.config);
    config_reader.RejectUnknown();
  }
  const json* distributed = r.Object("distributed");
  ParseDistributed(distributed, spec.distributed, errors);
  const bool selection_ok = ParseWorkerSelection(r.Object("worker_selection"), spec.worker_selection, errors);
  r.RejectUnknown();

  DistributedConfig& d = spec.distributed;
  const int listed = static_cast<int>(spec.SelectedWorkers().size());
  if (d.max_workers == 0) d.max_workers = std::max(d.min_workers, listed);
  if (d.min_workers > d.max_workers) {
    errors.push_back("distributed.min_workers (" + std::to_string(d.min_workers) +
                     ") must be <= distributed.max_workers (" + std::to_string(d.max_workers) + ")");
  }
  if (d.enabled && selection_ok && spec.worker_selection.mode != WorkerSelectionMode::kAuto && listed < d.min_workers) {
    errors.push_back("distributed.min_workers (" + std::to_string(d.min_workers) +
                     ") exceeds the number of workers listed in worker_selection (" + std::to_string(listed) + ")");
  }
  CheckStrategyRules(d.strategy, d.strategy_options, d.enabled, d.min_workers, d.max_workers, errors);
  FinishLoraRanks(spec.lora_ranks, spec.config, d.strategy, spec.SelectedWorkers(), errors);
  CheckSecureAggregation(d.secure_aggregation, d.enabled, d.strategy, d.compression, d.min_workers, errors);
  CheckAsyncAggregation(d.async, d.enabled, d.max_workers, d.secure_aggregation.enabled, errors);
  if (d.secure_aggregation.enabled && spec.lora_ranks.mixed()) {
    errors.push_back(
        "distributed.secure_aggregation needs one LoRA rank for every worker (their updates are added element by "
        "element): remove config.lora_ranks and config.lora_r \"auto\"");
  }
  if (d.async.enabled && spec.lora_ranks.mixed()) {
    errors.push_back(
        "distributed.aggregation \"async\" needs one LoRA rank for every worker (a stale update is moved onto the "
        "current global value by value): remove config.lora_ranks and config.lora_r \"auto\", or use aggregation "
        "\"sync\"");
  }
  if (!d.enabled && d.early_stopping) {
    errors.push_back(
        "distributed.early_stopping needs distributed.enabled true: an ordinary job trains one round, so there is "
        "nothing to stop early; remove early_stopping or make the job distributed");
  }
  if (spec.data.source == DataSource::kWorkers && distributed != nullptr &&
      JobSpecGives(body, "distributed", "partition")) {
    errors.push_back(
        "distributed.partition applies only to data.source \"platform\": with \"workers\" each worker trains on "
        "its own file, which the coordinator does not split; remove distributed.partition");
  }
  PARSYN_RETURN_IF_ERROR(protocol::ErrorsToStatus(errors));
  if (!d.enabled) {
    d.num_rounds = 1;
    d.steps_per_round = 0;
    d.min_workers = 1;
    d.max_workers = 1;
    d.compression = {};  // ignored (JobSpecWarnings says so): a one-worker job's update stays plain
  }
  return spec;
}

// The job spec's top-level keys: a problem's leading path names a field only when it starts with one of them.
constexpr std::string_view kSpecKeys[] = {"name",        "dataset_id",       "model_id", "config",
                                          "distributed", "worker_selection", "data"};

}  // namespace

StatusOr<JobSpec> ParseJobSpecJson(const json& body) {
  std::vector<std::string> errors;
  return ParseJobSpecCollecting(body, errors);
}

StatusOr<JobSpec> ParseJobSpecJson(const json& body, std::vector<FieldProblem>& problems) {
  std::vector<std::string> errors;
  StatusOr<JobSpec> spec = ParseJobSpecCollecting(body, errors);
  if (!spec.ok()) {
    for (FieldProblem& p : FieldProblems(errors)) problems.push_back(std::move(p));
  }
  return spec;
}

std::string ProblemField(std::string_view message) {
  constexpr std::string_view kUnknown = "unknown field ";
  if (message.starts_with(kUnknown)) return std::string(message.substr(kUnknown.size()));  // any key, as given
  if (message.starts_with('\'')) message.remove_prefix(1);
  size_t end = 0;
  while (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '_' ||
                                  message[end] == '.' || message[end] == '[' || message[end] == ']')) {
    ++end;
  }
  // The path ends the message or is followed by what follows a field's name: " must", ": ...", " (3)", "'".
  if (end == 0 || (end < message.size() && std::string_view(" :('").find(message[end]) == std::string_view::npos)) {
    return "";
  }
  const std::string_view path = message.substr(0, end);
  const std::string_view head = path.substr(0, path.find_first_of(".["));
  return std::find(std::begin(kSpecKeys), std::end(kSpecKeys), head) != std::end(kSpecKeys) ? std::string(path) : "";
}

std::vector<FieldProblem> FieldProblems(const std::vector<std::string>& messages) {
  std::vector<FieldProblem> out;
  out.reserve(messages.size());
  for (const std::string& m : messages) out.push_back({ProblemField(m), m});
  return out;
}

StatusOr<JobSpec> ParseJobSpec(std::string_view body) {
  PARSYN_ASSIGN_OR_RETURN(json parsed, protocol::ParseJsonText(body, "request body"));
  return ParseJobSpecJson(parsed);
}

bool JobSpecGives(const json& body, std::string_view section, std::string_view key) {
  auto object = body.find(section);
  if (object == body.end() || !object->is_object()) return false;
  auto value = object->find(key);
  return value != object->end() && !value->is_null();
}

std::vector<std::string> JobSpecWarnings(const json& body, const JobSpec& spec) {
  std::vector<std::string> warnings;
  const DistributedConfig& d = spec.distributed;
  if (d.enabled && d.steps_per_round > 0 && JobSpecGives(body, "config", "epochs")) {
    warnings.push_back("config.epochs is ignored: distributed.steps_per_round (" + std::to_string(d.steps_per_round) +
                       ") sets each round's length; set steps_per_round to 0 to train config.epochs passes per round");
  }
  if (!d.enabled) {
    // Every distributed field the body gave: they shape rounds of several workers, which a one-worker job has not.
    // Not `strategy`: it has one value, and the dashboard's form always sends it.
    if (auto distributed = body.find("distributed"); distributed != body.end() && distributed->is_object()) {
      for (const auto& [key, value] : distributed->items()) {
        if (key == "enabled" || key == "strategy" || value.is_null()) continue;
        warnings.push_back("distributed." + key +
                           " is ignored: distributed.enabled is false (the job trains on one worker)");
      }
    }
  }
  if (d.enabled && d.secure_aggregation.enabled) {
    if (std::optional<std::string> low = SecureThresholdWarning(d.secure_aggregation, d.max_workers)) {
      warnings.push_back(*std::move(low));
    }
  }
  if (!spec.config.use_peft) {
    for (std::string_view key : {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"}) {
      if (!JobSpecGives(body, "config", key)) continue;
      warnings.push_back("config." + std::string(key) +
                         " is ignored: config.use_peft is false (every weight is trained, no LoRA adapters)");
    }
  }
  return warnings;
}

DistributedConfig DistributedJobDefaults() {
  DistributedConfig d;
  d.num_rounds = 10;
  d.steps_per_round = 500;
  d.min_workers = 2;
  d.max_workers = 0;  // 0 until given or defaulted from min_workers and the listed workers
  d.aggregation_timeout_ms = 600'000;
  d.fault_tolerance = 3;
  d.join_window_ms = 5'000;
  return d;
}

json DistributedDefaultsJson() {
  const DistributedConfig d = DistributedJobDefaults();
  return {
      {"strategy", AggregationStrategyName(d.strategy)},
      {"num_rounds", d.num_rounds},
      {"steps_per_round", d.steps_per_round},
      {"min_workers", d.min_workers},
      {"aggregation_timeout", Seconds(d.aggregation_timeout_ms)},
      {"fault_tolerance", d.fault_tolerance},
      {"join_window", Seconds(d.join_window_ms)},
      {"partition",
       {{"method", PartitionMethodName(d.partition.method)},
        {"alpha", d.partition.alpha},
        {"classes_per_worker", d.partition.classes_per_worker}}},
  };
}

namespace {

json ConfigJson(const JobSpec& spec) {
  json config = protocol::TrainingConfigToJson(spec.config);
  LoraRanksToConfigJson(spec.lora_ranks, config);
  return config;
}

}  // namespace

json JobSpecToJson(const JobSpec& spec) {
  const DistributedConfig& d = spec.distributed;
  const WorkerSelection& w = spec.worker_selection;
  json out{
      {"name", spec.name},
      {"dataset_id", spec.data.source == DataSource::kWorkers ? json(nullptr) : json(spec.dataset_id)},
      {"data", JobDataToJson(spec.data)},
      {"model_id", spec.model_id},
      {"config", ConfigJson(spec)},
      {"distributed",
       {
           {"enabled", d.enabled},
           {"strategy", AggregationStrategyName(d.strategy)},
           {"strategy_options", StrategyOptionsToJson(d.strategy, d.strategy_options)},
           {"num_rounds", d.num_rounds},
           {"steps_per_round", d.steps_per_round},
           {"min_workers", d.min_workers},
           {"max_workers", d.max_workers},
           {"aggregation_timeout", Seconds(d.aggregation_timeout_ms)},
           {"fault_tolerance", d.fault_tolerance},
           {"join_window", Seconds(d.join_window_ms)},
       }},
      {"worker_selection",
       {
           {"mode", WorkerSelectionModeName(w.mode)},
           {"worker_ids", w.worker_ids},
           {"parsyn_worker_ids", w.parsyn_worker_ids},
       }},
  };
  // Like early_stopping, omitted when it is the default (iid, no label), so older stored specs read back the same.
  if (d.partition != DataPartition{}) out["distributed"]["partition"] = PartitionToJson(d.partition);
  // Omitted when off (update "none", no zstd), so older stored specs read back the same.
  if (d.compression != protocol::UpdateCompression{}) {
    out["distributed"]["compression"] = protocol::UpdateCompressionToJson(d.compression);
  }
  if (d.secure_aggregation != SecureAggregationSpec{}) {
    out["distributed"]["secure_aggregation"] = SecureAggregationToJson(d.secure_aggregation);
  }
  // Omitted for "sync", so older stored specs read back the same.
  if (d.async.enabled) {
    out["distributed"]["aggregation"] = "async";
    out["distributed"]["async"] = AsyncAggregationToJson(d.async);
  }
  if (d.early_stopping) {
    out["distributed"]["early_stopping"] = {{"patience", d.early_stopping->patience},
                                            {"min_delta", d.early_stopping->min_delta}};
  }
  return out;
}

std::string JobSpecToJsonString(const JobSpec& spec) { return JobSpecToJson(spec).dump(); }

}  // namespace parsyn::coordinator
