#include "coordinator/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace parsyn::coordinator {
namespace {

using nlohmann::json;

constexpr int64_t kMaxSeed = int64_t{1} << 53;  // integers a JSON number (a double) holds exactly
constexpr size_t kMaxWorkerIds = 1000;
constexpr size_t kMaxNameBytes = 128;

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Quoted(std::string_view s) { return json(std::string(s)).dump(); }

// Reads the fields of one JSON object, remembering which keys it knows, and collects every error with its path.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string prefix, std::vector<std::string>& errors)
      : object_(object), prefix_(std::move(prefix)), errors_(errors) {}

  std::string Path(std::string_view key) const { return prefix_ + std::string(key); }
  void Error(std::string message) { errors_.push_back(std::move(message)); }

  // The value under `key`, or nullptr when absent or null. Marks the key as known.
  const json* Get(std::string_view key) {
    known_.insert(std::string(key));
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool Required(std::string_view key) {
    if (Get(key) != nullptr) return true;
    Error(Path(key) + " is required");
    return false;
  }

  template <typename Int>
  void Integer(std::string_view key, Int& out, int64_t min, int64_t max) {
    const json* v = Get(key);
    if (v == nullptr) return;
    if (auto parsed = ReadInteger(*v, Path(key), min, max)) out = static_cast<Int>(*parsed);
  }

  void Number(std::string_view key, double& out, double min, double max, bool min_exclusive = false,
              bool max_exclusive = false) {
    const json* v = Get(key);
    if (v == nullptr) return;
    const std::string path = Path(key);
    if (!v->is_number()) {
      Error(path + " must be a number, got " + v->type_name());
      return;
    }
    const double x = v->get<double>();
    const bool below = min_exclusive ? !(x > min) : !(x >= min);
    const bool above = max_exclusive ? !(x < max) : !(x <= max);
    if (!std::isfinite(x) || below || above) {
      Error(path + " (" + FormatNumber(x) + ") must be " + (min_exclusive ? "> " : ">= ") + FormatNumber(min) +
            " and " + (max_exclusive ? "< " : "<= ") + FormatNumber(max));
      return;
    }
    out = x;
  }

  void Boolean(std::string_view key, bool& out) {
    const json* v = Get(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) {
      Error(Path(key) + " must be a boolean, got " + v->type_name());
      return;
    }
    out = v->get<bool>();
  }

  // A string of at most `max_bytes` bytes without control characters.
  void String(std::string_view key, std::string& out, size_t min_bytes, size_t max_bytes) {
    const json* v = Get(key);
    if (v == nullptr) return;
    const std::string path = Path(key);
    if (!v->is_string()) {
      Error(path + " must be a string, got " + v->type_name());
      return;
    }
    const std::string& s = v->get_ref<const std::string&>();
    if (s.size() < min_bytes || s.size() > max_bytes) {
      Error(path + " must be " + std::to_string(min_bytes) + ".." + std::to_string(max_bytes) + " bytes long, got " +
            std::to_string(s.size()));
      return;
    }
    if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      Error(path + " must not contain control characters");
      return;
    }
    out = s;
  }

  // Returns false after reporting an invalid value.
  template <typename Enum, size_t N>
  bool Choice(std::string_view key, Enum& out, const std::pair<std::string_view, Enum> (&choices)[N]) {
    const json* v = Get(key);
    if (v == nullptr) return true;
    const std::string path = Path(key);
    std::string allowed;
    for (const auto& [spelling, value] : choices) allowed += (allowed.empty() ? "" : ", ") + Quoted(spelling);
    if (!v->is_string()) {
      Error(path + " must be one of " + allowed + ", got " + v->type_name());
      return false;
    }
    const std::string& s = v->get_ref<const std::string&>();
    for (const auto& [spelling, value] : choices) {
      if (s == spelling) {
        out = value;
        return true;
      }
    }
    Error(path + " must be one of " + allowed + ", got " + Quoted(s));
    return false;
  }

  // An array of at most `max_items` integers in [min, max]; nullopt after reporting an error.
  std::optional<std::vector<int64_t>> IntegerList(std::string_view key, size_t max_items, int64_t min, int64_t max) {
    const json* v = Get(key);
    if (v == nullptr) return std::vector<int64_t>{};
    const std::string path = Path(key);
    if (!v->is_array()) {
      Error(path + " must be an array of integers, got " + v->type_name());
      return std::nullopt;
    }
    if (v->size() > max_items) {
      Error(path + " has " + std::to_string(v->size()) + " entries, at most " + std::to_string(max_items) +
            " are allowed");
      return std::nullopt;
    }
    std::vector<int64_t> out;
    bool ok = true;
    for (size_t i = 0; i < v->size(); ++i) {
      auto parsed = ReadInteger((*v)[i], path + "[" + std::to_string(i) + "]", min, max);
      if (parsed) out.push_back(*parsed);
      ok = ok && parsed.has_value();
    }
    if (!ok) return std::nullopt;
    return out;
  }

  // The object under `key` (nullptr when absent or null); reports a non-object.
  const json* Object(std::string_view key) {
    const json* v = Get(key);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      Error(Path(key) + " must be an object, got " + v->type_name());
      return nullptr;
    }
    return v;
  }

  void RejectUnknown() {
    for (const auto& [key, value] : object_.items()) {
      if (known_.count(key) == 0) Error("unknown field " + Path(key));
    }
  }

 private:
  std::optional<int64_t> ReadInteger(const json& v, const std::string& path, int64_t min, int64_t max) {
    if (!v.is_number_integer()) {
      Error(path + " must be an integer, got " + (v.is_number() ? FormatNumber(v.get<double>()) : v.type_name()));
      return std::nullopt;
    }
    const bool too_big =
        v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    const std::string shown =
        v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
    if (too_big || v.get<int64_t>() < min || v.get<int64_t>() > max) {
      Error(path + " (" + shown + ") must be between " + std::to_string(min) + " and " + std::to_string(max));
      return std::nullopt;
    }
    return v.get<int64_t>();
  }

  const json& object_;
  std::string prefix_;
  std::vector<std::string>& errors_;
  std::set<std::string, std::less<>> known_;
};

constexpr std::pair<std::string_view, MixedPrecision> kMixedPrecisions[] = {
    {"bf16", MixedPrecision::kBf16}, {"fp16", MixedPrecision::kFp16}, {"no", MixedPrecision::kNo}};
constexpr std::pair<std::string_view, LrScheduler> kLrSchedulers[] = {
    {"constant", LrScheduler::kConstant}, {"linear", LrScheduler::kLinear}, {"cosine", LrScheduler::kCosine}};
constexpr std::pair<std::string_view, AggregationStrategy> kStrategies[] = {
    {"federated_averaging", AggregationStrategy::kFederatedAveraging}};
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

bool IsModuleName(const std::string& s) {
  return !s.empty() && s.size() <= 128 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
  });
}

void ParseConfig(const json& object, TrainingConfig& c, std::vector<std::string>& errors) {
  ObjectReader r(object, "config.", errors);
  r.Integer("epochs", c.epochs, 1, 1000);
  r.Integer("batch_size", c.batch_size, 1, 65536);
  r.Number("learning_rate", c.learning_rate, 0, 10, /*min_exclusive=*/true);
  r.Choice("mixed_precision", c.mixed_precision, kMixedPrecisions);
  r.Boolean("use_peft", c.use_peft);
  r.Integer("lora_r", c.lora_r, 1, 1024);
  r.Number("lora_alpha", c.lora_alpha, 0, 65536, /*min_exclusive=*/true);
  r.Number("lora_dropout", c.lora_dropout, 0, 1, /*min_exclusive=*/false, /*max_exclusive=*/true);
  if (const json* v = r.Get("lora_target_modules")) {
    const std::string path = r.Path("lora_target_modules");
    if (!v->is_array() || v->empty() || v->size() > 64) {
      r.Error(path + " must be an array of 1..64 module names");
    } else {
      std::vector<std::string> modules;
      for (size_t i = 0; i < v->size(); ++i) {
        const json& m = (*v)[i];
        const std::string item = path + "[" + std::to_string(i) + "]";
        if (!m.is_string()) {
          r.Error(item + " must be a string, got " + m.type_name());
        } else if (!IsModuleName(m.get<std::string>())) {
          r.Error(item + " (" + Quoted(m.get<std::string>()) + ") must be 1..128 characters of [A-Za-z0-9_.]");
        } else if (std::find(modules.begin(), modules.end(), m.get<std::string>()) != modules.end()) {
          r.Error(path + " lists " + Quoted(m.get<std::string>()) + " twice");
        } else {
          modules.push_back(m.get<std::string>());
        }
      }
      if (modules.size() == v->size()) c.lora_target_modules = std::move(modules);
    }
  }
  r.Integer("max_seq_len", c.max_seq_len, 8, 131072);
  r.Number("weight_decay", c.weight_decay, 0, 10);
  r.Integer("warmup_steps", c.warmup_steps, 0, 1'000'000'000);
  r.Choice("lr_scheduler", c.lr_scheduler, kLrSchedulers);
  r.Integer("gradient_accumulation_steps", c.gradient_accumulation_steps, 1, 1024);
  r.Number("max_grad_norm", c.max_grad_norm, 0, 1e6);
  r.Integer("seed", c.seed, 0, kMaxSeed);
  r.Number("validation_fraction", c.validation_fraction, 0, 0.5);
  r.String("label_column", c.label_column, 0, 128);
  if (auto sizes = r.IntegerList("hidden_sizes", 16, 1, 65536)) {
    c.hidden_sizes.assign(sizes->begin(), sizes->end());
  }
  r.RejectUnknown();
}

void ParseDistributed(const json* object, DistributedConfig& d, std::vector<std::string>& errors) {
  // The defaults of a distributed job; an ordinary job is normalised after validation.
  d.num_rounds = 10;
  d.steps_per_round = 500;
  d.min_workers = 2;
  d.max_workers = 0;  // 0 until given or defaulted from min_workers and the listed workers
  d.aggregation_timeout_ms = 600'000;
  d.fault_tolerance = 3;
  if (object == nullptr) return;
  ObjectReader r(*object, "distributed.", errors);
  r.Boolean("enabled", d.enabled);
  r.Choice("strategy", d.strategy, kStrategies);
  r.Integer("num_rounds", d.num_rounds, 1, 10000);
  r.Integer("steps_per_round", d.steps_per_round, 0, 10'000'000);
  r.Integer("min_workers", d.min_workers, 1, 1000);
  r.Integer("max_workers", d.max_workers, 1, 1000);
  double timeout_s = 600;
  r.Number("aggregation_timeout", timeout_s, 1, 604800);
  d.aggregation_timeout_ms = std::llround(timeout_s * 1000.0);
  r.Integer("fault_tolerance", d.fault_tolerance, 1, 1000);
  r.RejectUnknown();
}

// Returns false when the selection is invalid (the errors say why), so later checks that count workers are skipped.
bool ParseWorkerSelection(const json* object, WorkerSelection& w, std::vector<std::string>& errors) {
  if (object == nullptr) return true;
  const size_t errors_before = errors.size();
  ObjectReader r(*object, "worker_selection.", errors);
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
        r.Error("worker " + std::to_string(id) +
                " is in both worker_selection.worker_ids and "
                "worker_selection.parsyn_worker_ids");
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

std::string_view MixedPrecisionName(MixedPrecision v) { return NameOf(v, kMixedPrecisions); }
std::string_view LrSchedulerName(LrScheduler v) { return NameOf(v, kLrSchedulers); }
std::string_view AggregationStrategyName(AggregationStrategy v) { return NameOf(v, kStrategies); }
std::string_view WorkerSelectionModeName(WorkerSelectionMode v) { return NameOf(v, kModes); }

std::vector<int64_t> JobSpec::SelectedWorkers() const {
  std::vector<int64_t> ids = worker_selection.worker_ids;
  ids.insert(ids.end(), worker_selection.parsyn_worker_ids.begin(), worker_selection.parsyn_worker_ids.end());
  return ids;
}

StatusOr<JobSpec> ParseJobSpecJson(const json& body) {
  if (!body.is_object()) {
    return InvalidArgumentError(std::string("request body must be a JSON object, got ") + body.type_name());
  }
  std::vector<std::string> errors;
  JobSpec spec;
  ObjectReader r(body, "", errors);
  if (r.Required("name")) r.String("name", spec.name, 1, kMaxNameBytes);
  if (r.Required("dataset_id")) r.Integer("dataset_id", spec.dataset_id, 1, std::numeric_limits<int64_t>::max());
  if (r.Required("model_id")) r.Integer("model_id", spec.model_id, 1, std::numeric_limits<int64_t>::max());
  if (const json* config = r.Object("config")) ParseConfig(*config, spec.config, errors);
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
  if (!errors.empty()) {
    std::string message;
    for (const std::string& e : errors) message += (message.empty() ? "" : "; ") + e;
    return InvalidArgumentError(std::move(message));
  }
  if (!d.enabled) {
    d.num_rounds = 1;
    d.steps_per_round = 0;
    d.min_workers = 1;
    d.max_workers = 1;
  }
  return spec;
}

StatusOr<JobSpec> ParseJobSpec(std::string_view body) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 2: ..."; keep the readable part.
    std::string what = e.what();
    if (size_t end = what.find("] "); what.starts_with("[json.exception") && end != std::string::npos) {
      what.erase(0, end + 2);
    }
    return InvalidArgumentError("request body is not valid JSON: " + what);
  }
  return ParseJobSpecJson(parsed);
}

json JobSpecToJson(const JobSpec& spec) {
  const TrainingConfig& c = spec.config;
  const DistributedConfig& d = spec.distributed;
  const WorkerSelection& w = spec.worker_selection;
  json timeout_s = d.aggregation_timeout_ms % 1000 == 0 ? json(d.aggregation_timeout_ms / 1000)
                                                        : json(static_cast<double>(d.aggregation_timeout_ms) / 1000.0);
  return json{
      {"name", spec.name},
      {"dataset_id", spec.dataset_id},
      {"model_id", spec.model_id},
      {"config",
       {
           {"epochs", c.epochs},
           {"batch_size", c.batch_size},
           {"learning_rate", c.learning_rate},
           {"mixed_precision", MixedPrecisionName(c.mixed_precision)},
           {"use_peft", c.use_peft},
           {"lora_r", c.lora_r},
           {"lora_alpha", c.lora_alpha},
           {"lora_dropout", c.lora_dropout},
           {"lora_target_modules", c.lora_target_modules},
           {"max_seq_len", c.max_seq_len},
           {"weight_decay", c.weight_decay},
           {"warmup_steps", c.warmup_steps},
           {"lr_scheduler", LrSchedulerName(c.lr_scheduler)},
           {"gradient_accumulation_steps", c.gradient_accumulation_steps},
           {"max_grad_norm", c.max_grad_norm},
           {"seed", c.seed},
           {"validation_fraction", c.validation_fraction},
           {"label_column", c.label_column},
           {"hidden_sizes", c.hidden_sizes},
       }},
      {"distributed",
       {
           {"enabled", d.enabled},
           {"strategy", AggregationStrategyName(d.strategy)},
           {"num_rounds", d.num_rounds},
           {"steps_per_round", d.steps_per_round},
           {"min_workers", d.min_workers},
           {"max_workers", d.max_workers},
           {"aggregation_timeout", timeout_s},
           {"fault_tolerance", d.fault_tolerance},
       }},
      {"worker_selection",
       {
           {"mode", WorkerSelectionModeName(w.mode)},
           {"worker_ids", w.worker_ids},
           {"parsyn_worker_ids", w.parsyn_worker_ids},
       }},
  };
}

std::string JobSpecToJsonString(const JobSpec& spec) { return JobSpecToJson(spec).dump(); }

}  // namespace parsyn::coordinator
