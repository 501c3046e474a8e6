#include "trainer/task.h"

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "base/atomic_file.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "data/dataset.h"
#include "protocol/trainer_events.h"
#include "trainer/tabular_model.h"
#include "trainer/task_models.h"
#include "trainer/train_loop.h"
#include "weights/safetensors.h"

namespace parsyn::trainer {
namespace {

using nlohmann::json;

Status FieldError(std::string_view field, std::string_view what) {
  return InvalidArgumentError("task." + std::string(field) + ": " + std::string(what));
}

// A path of the task file, relative ones taken from `base_dir`; empty stays empty (not given).
std::filesystem::path Resolve(const std::filesystem::path& base_dir, const std::string& value) {
  if (value.empty()) return {};
  std::filesystem::path p(value);
  return p.is_absolute() || base_dir.empty() ? p : base_dir / p;
}

json MetricsJson(const EvalMetrics& m) {
  return json{{"num_examples", m.num_examples}, {"num_counted", m.num_counted}, {"loss", m.loss},
              {"perplexity", m.perplexity},     {"accuracy", m.accuracy},       {"exact_match", m.exact_match}};
}

std::string Sha256OfFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  Sha256 hash;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash.Update(std::string_view(buffer.data(), static_cast<size_t>(in.gcount())));
  }
  return hash.HexDigest();
}

Status WriteJsonFile(const json& value, const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  return WriteFileAtomically(path, value.dump(2) + "\n");
}

// What RunTrainTask needs from either kind of task once data and model are loaded.
struct Prepared {
  std::string kind;
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<ExampleSet> train;
  std::unique_ptr<ExampleSet> validation;
  bool autocast = true;  // false when the model runs reduced precision itself
  // Writes the loadable output folder (PEFT adapter, full model, tabular model).
  std::function<Status(const std::filesystem::path&)> save_model_dir;
};

// Every row index of a file of `n` rows.
std::vector<int64_t> AllRows(int64_t n) {
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = i;
  return rows;
}

// The rows of `data` the task trains and validates on: with a validation file, all of them train (in the split
// seed's order); else validation_fraction of them are held out by the split seed.
StatusOr<data::TrainValidationSplit> SplitRows(const TrainTask& task, int64_t n) {
  const double fraction = task.validation_data.empty() ? task.config.training.validation_fraction : 0.0;
  return data::SplitTrainValidation(n, fraction, task.split_seed);
}

StatusOr<Prepared> PrepareTabular(const TrainTask& task, torch::Device device) {
  Prepared prepared;
  prepared.kind = "tabular";
  std::unique_ptr<TabularModel> existing;
  data::TabularOptions options;
  options.label_column = task.config.training.LabelColumn();
  if (!task.model_dir.empty()) {
    PARSYN_ASSIGN_OR_RETURN(existing, TabularModel::Load(task.model_dir, device));
    options.label_column = existing->spec().label_column;
    options.class_names = existing->spec().class_names;
  }
  auto dataset = data::LoadTabularFile(task.data, options);
  if (!dataset.ok()) return dataset.status().WithContext(task.data.string());
  PARSYN_ASSIGN_OR_RETURN(const data::TrainValidationSplit split, SplitRows(task, dataset->num_rows()));
  if (!existing) {
    PARSYN_ASSIGN_OR_RETURN(TabularModelSpec spec, TabularSpecFor(task.config, *dataset, split.train));
    PARSYN_ASSIGN_OR_RETURN(existing, TabularModel::Create(std::move(spec), task.seed, device));
  }
  PARSYN_ASSIGN_OR_RETURN(TabularExamples train, TabularExamples::Create(*dataset, split.train, existing->spec()));
  StatusOr<TabularExamples> validation = TabularExamples::Create(*dataset, split.validation, existing->spec());
  if (!task.validation_data.empty()) {
    options.label_column = existing->spec().label_column;
    options.class_names = existing->spec().class_names;
    auto rows = data::LoadTabularFile(task.validation_data, options);
    if (!rows.ok()) return rows.status().WithContext(task.validation_data.string());
    validation = TabularExamples::Create(*rows, AllRows(rows->num_rows()), existing->spec());
  }
  if (!validation.ok()) return validation.status();
  prepared.train = std::make_unique<TabularExamples>(std::move(train));
  prepared.validation = std::make_unique<TabularExamples>(std::move(validation).value());
  TabularModel* model = existing.get();
  prepared.save_model_dir = [model](const std::filesystem::path& dir) { return model->Save(dir); };
  prepared.model = std::move(existing);
  return prepared;
}

StatusOr<Prepared> PrepareLanguageModel(const TrainTask& task, torch::Device device) {
  if (task.model_dir.empty()) return FieldError("model_dir", "a language-model task needs a model folder");
  auto dataset = data::LoadTextFile(task.data);
  if (!dataset.ok()) return dataset.status().WithContext(task.data.string());
  PARSYN_ASSIGN_OR_RETURN(const data::TrainValidationSplit split,
                          SplitRows(task, static_cast<int64_t>(dataset->rows.size())));
  PARSYN_ASSIGN_OR_RETURN(LanguageModelBundle bundle,
                          LoadLanguageModel(task.model_dir, task.config.training, task.seed, device));
  PARSYN_ASSIGN_OR_RETURN(LmExamples train,
                          LmExamples::Create(*dataset, split.train, *bundle.tokenizer, bundle.tokenization));
  StatusOr<LmExamples> validation =
      LmExamples::Create(*dataset, split.validation, *bundle.tokenizer, bundle.tokenization);
  if (!task.validation_data.empty()) {
    auto rows = data::LoadTextFile(task.validation_data);
    if (!rows.ok()) return rows.status().WithContext(task.validation_data.string());
    validation = LmExamples::Create(*rows, AllRows(static_cast<int64_t>(rows->rows.size())), *bundle.tokenizer,
                                    bundle.tokenization);
  }
  if (!validation.ok()) return validation.status();
  Prepared prepared;
  prepared.kind = "language_model";
  prepared.train = std::make_unique<LmExamples>(std::move(train));
  prepared.validation = std::make_unique<LmExamples>(std::move(validation).value());
  prepared.save_model_dir = std::move(bundle.save_model_dir);
  prepared.autocast = !bundle.model_handles_precision;
  prepared.model = std::move(bundle.model);
  return prepared;
}

bool IsCsv(const TrainTask& task) {
  if (!task.data_format.empty()) return task.data_format == "csv";
  return ToLower(task.data.extension().string()) == ".csv";
}

}  // namespace

StatusOr<TrainTask> ParseTrainTask(const json& j, const std::filesystem::path& base_dir) {
  PARSYN_ASSIGN_OR_RETURN(const protocol::TrainerTask t, protocol::ParseTrainerTask(j));
  TrainTask task;
  task.model_dir = Resolve(base_dir, t.model_dir);
  task.initial_weights = Resolve(base_dir, t.initial_weights);
  task.kind = t.kind;
  task.data = Resolve(base_dir, t.data);
  task.validation_data = Resolve(base_dir, t.validation_data);
  task.data_format = t.data_format;
  task.config = t.config;
  task.config.training.validation_fraction = t.ValidationFraction();
  task.steps = t.kind == protocol::TaskKind::kEvaluate ? std::optional<int64_t>(0) : t.steps;
  task.seed = t.seed;
  task.split_seed = t.split_seed;
  if (t.schedule) {
    task.schedule_start_step = t.schedule->start_step;
    task.schedule_total_steps = t.schedule->total_steps;
  }
  task.proximal_mu = t.proximal_mu;
  task.device = t.device;
  task.threads = t.threads;
  task.output_weights = Resolve(base_dir, t.output_weights);
  task.output_result = Resolve(base_dir, t.output_result);
  task.output_model_dir = Resolve(base_dir, t.output_model_dir);
  return task;
}

StatusOr<TrainTask> ReadTrainTaskFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("task file not found: " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    return InvalidArgumentError(path.string() + ": not valid JSON: " + e.what());
  }
  auto task = ParseTrainTask(j, path.parent_path());
  if (!task.ok()) return task.status().WithContext(path.string());
  return task;
}

namespace {

// Loads the task's initial weights (finite, the model's trainable layout) into `model`.
Status LoadInitialWeights(const std::filesystem::path& path, TrainableModel& model) {
  auto initial = weights::ReadSafetensorsFile(path);
  if (!initial.ok()) return initial.status().WithContext("initial weights " + path.string());
  if (Status s = weights::CheckFinite(*initial); !s.ok()) return s.WithContext("initial weights " + path.string());
  if (Status s = model.ImportTrainable(*initial); !s.ok()) return s.WithContext("initial weights " + path.string());
  return Status::Ok();
}

// The training loop's options for the task; each step is reported to `on_event` as a progress event.
TrainOptions TrainOptionsFor(const TrainTask& task, bool language_model, bool autocast, const TaskEventSink& on_event,
                             std::stop_token stop) {
  TrainOptions options;
  options.config = task.config.training;
  options.max_steps = task.steps;
  options.seed = task.seed;
  options.schedule_start_step = task.schedule_start_step;
  options.schedule_total_steps = task.schedule_total_steps;
  options.proximal_mu = task.proximal_mu;
  options.language_model = language_model;
  options.autocast = autocast;
  options.stop = stop;
  options.on_step = [&on_event, language_model](const StepProgress& p) {
    protocol::TrainerProgress progress{.step = p.step, .total_steps = p.total_steps};
    if (std::isfinite(p.loss)) progress.loss = p.loss;
    progress.throughput = language_model ? p.tokens_per_s : p.samples_per_s;
    progress.throughput_unit = language_model ? protocol::kTokensPerSecond : protocol::kSamplesPerSecond;
    json event = protocol::TrainerProgressToJson(progress);
    event["epoch"] = p.epoch;
    event["lr"] = p.learning_rate;
    event["grad_norm"] = std::isfinite(p.grad_norm) ? json(p.grad_norm) : json(nullptr);
    event["skipped"] = p.skipped;
    if (on_event) on_event(event);
  };
  return options;
}

// Writes the trained weights (checked finite) to the task's output_weights and, if asked, the loadable model folder.
Status WriteTrainedWeights(const TrainTask& task, const Prepared& prepared) {
  TrainableModel& model = *prepared.model;
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet trained, model.ExportTrainable());
  if (Status s = weights::CheckFinite(trained); !s.ok()) return s.WithContext("trained weights");
  {
    std::error_code ec;
    if (task.output_weights.has_parent_path())
      std::filesystem::create_directories(task.output_weights.parent_path(), ec);
  }
  PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(trained, task.output_weights));
  if (!task.output_model_dir.empty()) {
    if (Status s = prepared.save_model_dir(task.output_model_dir); !s.ok()) {
      return s.WithContext("writing " + task.output_model_dir.string());
    }
  }
  return Status::Ok();
}

// The task's result (result.json): the contract's keys, then this trainer's own (ignored by readers of the contract).
json ResultJson(const TrainTask& task, const Prepared& prepared, const TrainSummary& summary,
                const json& validation_before, const json& validation_after) {
  protocol::TrainerResult contract_result{.num_samples = prepared.train->size(),
                                          .num_validation = prepared.validation->size(),
                                          .validation_before = validation_before,
                                          .validation_after = validation_after,
                                          .metrics = json{{"steps", summary.steps},
                                                          {"examples_seen", summary.examples_seen},
                                                          {"tokens_seen", summary.tokens_seen},
                                                          {"wall_s", summary.wall_seconds}}};
  if (summary.steps > 0) contract_result.train_loss = summary.mean_loss;
  json result = protocol::TrainerResultToJson(contract_result);
  result["kind"] = prepared.kind;
  result["weights"] = task.output_weights.string();
  result["weights_sha256"] = Sha256OfFile(task.output_weights);
  if (!task.output_model_dir.empty()) result["model_dir"] = task.output_model_dir.string();
  return result;
}

StatusOr<json> RunTrainTaskUnguarded(const TrainTask& task, const TaskEventSink& on_event, std::stop_token stop) {
  PARSYN_ASSIGN_OR_RETURN(const torch::Device device, ParseDevice(task.device));
  if (task.config.training.mixed_precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return InvalidArgumentError("config.mixed_precision: fp16 needs a CUDA device (this task runs on " + device.str() +
                                "); use \"bf16\" or \"no\" on CPU");
  }
  if (task.threads > 0) torch::set_num_threads(static_cast<int>(task.threads));
  const auto emit = [&](const json& event) {
    if (on_event) on_event(event);
  };

  StatusOr<Prepared> prepared_or = IsCsv(task) ? PrepareTabular(task, device) : PrepareLanguageModel(task, device);
  if (!prepared_or.ok()) return prepared_or.status();
  Prepared prepared = std::move(prepared_or).value();
  TrainableModel& model = *prepared.model;

  if (!task.initial_weights.empty()) PARSYN_RETURN_IF_ERROR(LoadInitialWeights(task.initial_weights, model));

  const bool language_model = prepared.kind == "language_model";
  const int64_t num_train = prepared.train->size();
  PARSYN_ASSIGN_OR_RETURN(const StepPlan plan, PlanSteps(task.config.training, num_train, task.steps));
  int64_t trainable_parameters = 0;
  for (const auto& p : model.TrainableParameters()) trainable_parameters += p.numel();
  emit(json{{"event", "start"},
            {"kind", prepared.kind},
            {"num_samples", num_train},
            {"num_validation", prepared.validation->size()},
            {"total_steps", plan.total_steps},
            {"trainable_parameters", trainable_parameters},
            {"device", device.str()}});

  const MixedPrecision eval_precision = prepared.autocast ? task.config.training.mixed_precision : MixedPrecision::kNo;
  // Evaluates on the validation split, emits the metrics as an "eval" event of `phase`, and returns them.
  auto evaluate_validation = [&](std::string_view phase) -> StatusOr<json> {
    PARSYN_ASSIGN_OR_RETURN(const EvalMetrics metrics, Evaluate(model, *prepared.validation,
                                                                task.config.training.batch_size, eval_precision, stop));
    json result = MetricsJson(metrics);
    json event = result;
    event["event"] = "eval";
    event["phase"] = phase;
    emit(event);
    return result;
  };
  // The coordinator records a validation loss for every global it hands out: evaluate before training.
  json validation_before = nullptr;
  if (prepared.validation->size() > 0) {
    PARSYN_ASSIGN_OR_RETURN(validation_before, evaluate_validation("before"));
  }

  TrainSummary summary;
  if (plan.total_steps > 0) {
    const TrainOptions options = TrainOptionsFor(task, language_model, prepared.autocast, on_event, stop);
    PARSYN_ASSIGN_OR_RETURN(summary, Train(model, *prepared.train, options));
  }

  json validation_after = nullptr;
  if (prepared.validation->size() > 0 && plan.total_steps > 0) {
    PARSYN_ASSIGN_OR_RETURN(validation_after, evaluate_validation("after"));
  } else {
    validation_after = validation_before;  // evaluation only: the weights did not change
  }

  PARSYN_RETURN_IF_ERROR(WriteTrainedWeights(task, prepared));

  const json result = ResultJson(task, prepared, summary, validation_before, validation_after);
  PARSYN_RETURN_IF_ERROR(WriteJsonFile(result, task.output_result));
  return result;
}

}  // namespace

StatusOr<json> RunTrainTask(const TrainTask& task, const TaskEventSink& on_event, std::stop_token stop) {
  // Training and evaluation catch libtorch's exceptions themselves; this catches those of loading and exporting.
  try {
    return RunTrainTaskUnguarded(task, on_event, stop);
  } catch (const std::exception& e) {
    return StatusFromTorchException(e, "running the task");
  }
}

}  // namespace parsyn::trainer
