#include "worker/trainer_conformance.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "protocol/model_manifest.h"
#include "protocol/trainer_events.h"
#include "protocol/trainer_task.h"
#include "weights/lora_layout.h"
#include "weights/safetensors.h"

namespace parsyn::worker {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kProbeSteps = 4;
constexpr int64_t kNeverEndingSteps = 1'000'000'000;

// What every probe shares: the model, its kind, the initial weights, the data split and the config.
struct ProbeSetup {
  fs::path model_dir;
  std::string model_kind;
  fs::path initial_weights;
  fs::path train_data;
  fs::path validation_data;
  std::string data_format;
  protocol::TrainingConfig config;
};

// A deterministic stream of numbers in [0, 1) (the probes need no statistics, only repeatable files).
class Numbers {
 public:
  double Next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state_ >> 11) / static_cast<double>(1ULL << 53);
  }

 private:
  uint64_t state_ = 42;
};

Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) return InternalError("cannot write " + path.string());
  return Status::Ok();
}

StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("cannot read " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A tabular MLP folder in the built-in trainer's layout (4 features, 3 classes, one hidden layer of 16) and 160 rows
// whose class follows the features.
Status WriteDefaultModelAndData(const fs::path& dir, const fs::path& data) {
  fs::create_directories(dir);
  const json spec = {{"format", "parsyn-tabular"},
                     {"model_type", "mlp"},
                     {"hidden_sizes", {16}},
                     {"label_column", "label"},
                     {"feature_names", {"f0", "f1", "f2", "f3"}},
                     {"class_names", {"a", "b", "c"}},
                     {"standardizer", {{"mean", {0, 0, 0, 0}}, {"std", {1, 1, 1, 1}}}}};
  PARSYN_RETURN_IF_ERROR(WriteText(dir / "tabular_model.json", spec.dump(2)));
  Numbers numbers;
  weights::WeightSet set;
  const std::pair<int64_t, int64_t> layers[] = {{16, 4}, {3, 16}};
  for (size_t i = 0; i < 2; ++i) {
    const auto [out, in] = layers[i];
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    std::vector<float> w(static_cast<size_t>(out * in)), b(static_cast<size_t>(out));
    for (float& v : w) v = static_cast<float>((2 * numbers.Next() - 1) * bound);
    for (float& v : b) v = static_cast<float>((2 * numbers.Next() - 1) * bound);
    const std::string prefix = "layers." + std::to_string(i);
    PARSYN_RETURN_IF_ERROR(set.Add(prefix + ".weight", weights::DType::kF32, {out, in}, std::as_bytes(std::span(w))));
    PARSYN_RETURN_IF_ERROR(set.Add(prefix + ".bias", weights::DType::kF32, {out}, std::as_bytes(std::span(b))));
  }
  PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(set, dir / "model.safetensors"));
  std::string csv = "f0,f1,f2,f3,label\n";
  for (int row = 0; row < 160; ++row) {
    double x[4];
    for (double& v : x) v = 2 * numbers.Next() - 1;
    const char* label = x[0] > x[1] ? (x[2] > 0 ? "a" : "b") : "c";
    char line[160];
    std::snprintf(line, sizeof line, "%.4f,%.4f,%.4f,%.4f,%s\n", x[0], x[1], x[2], x[3], label);
    csv += line;
  }
  return WriteText(data, csv);
}

// The model's kind as a job would record it (model_routes.cc's rules, read loosely: the check is not registration).
StatusOr<std::string> ModelKindOf(const fs::path& dir) {
  if (fs::exists(dir / protocol::kModelManifestFile)) return std::string(protocol::kCustomModelKind);
  if (fs::exists(dir / "config.json")) {
    PARSYN_ASSIGN_OR_RETURN(std::string text, ReadText(dir / "config.json"));
    const json config = json::parse(text, nullptr, false);
    if (config.is_object() && config.contains("model_type") && config["model_type"].is_string()) {
      return config["model_type"].get<std::string>();
    }
    return InvalidArgumentError(dir.string() + "/config.json has no model_type");
  }
  if (fs::exists(dir / "tabular_model.json")) {
    PARSYN_ASSIGN_OR_RETURN(std::string text, ReadText(dir / "tabular_model.json"));
    const json spec = json::parse(text, nullptr, false);
    return "tabular-" + (spec.is_object() ? spec.value("model_type", "mlp") : std::string("mlp"));
  }
  return InvalidArgumentError("--model " + dir.string() +
                              " holds neither parsyn_model.json, config.json nor tabular_model.json");
}

// Rows 1..3/4 of the data file train, the rest validate (a CSV's header goes with both).
Status SplitData(const fs::path& data, const fs::path& train, const fs::path& validation, bool csv) {
  PARSYN_ASSIGN_OR_RETURN(std::string text, ReadText(data));
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line != "\r") lines.push_back(line + "\n");
  }
  const std::string header = csv && !lines.empty() ? lines.front() : "";
  if (csv && !lines.empty()) lines.erase(lines.begin());
  if (lines.size() < 4) return InvalidArgumentError("--data " + data.string() + " needs at least 4 rows");
  const size_t cut = lines.size() * 3 / 4;
  std::string a = header, b = header;
  for (size_t i = 0; i < lines.size(); ++i) (i < cut ? a : b) += lines[i];
  PARSYN_RETURN_IF_ERROR(WriteText(train, a));
  return WriteText(validation, b);
}

StatusOr<ProbeSetup> Prepare(const ConformanceOptions& options) {
  ProbeSetup s;
  std::error_code ec;
  fs::create_directories(options.work_dir, ec);
  if (ec) return InvalidArgumentError("cannot create " + options.work_dir.string() + ": " + ec.message());
  fs::path data = options.data;
  s.model_dir = options.model_dir;
  if (s.model_dir.empty()) {
    s.model_dir = options.work_dir / "model";
    if (data.empty()) data = options.work_dir / "data.csv";
    PARSYN_RETURN_IF_ERROR(WriteDefaultModelAndData(s.model_dir, options.work_dir / "data.csv"));
  } else if (data.empty()) {
    return InvalidArgumentError("--data FILE (.csv or .jsonl rows for the model) is required with --model");
  }
  s.model_dir = fs::absolute(s.model_dir);
  PARSYN_ASSIGN_OR_RETURN(s.model_kind, ModelKindOf(s.model_dir));
  s.data_format = data.extension() == ".csv" ? "csv" : "jsonl";
  s.train_data = fs::absolute(options.work_dir / ("train." + s.data_format));
  s.validation_data = fs::absolute(options.work_dir / ("validation." + s.data_format));
  PARSYN_RETURN_IF_ERROR(SplitData(data, s.train_data, s.validation_data, s.data_format == "csv"));
  s.config.use_peft = s.model_kind == "llama" || s.model_kind == "qwen2" || s.model_kind == "mistral";
  s.config.batch_size = 16;
  s.config.learning_rate = s.config.use_peft ? 1e-3 : 1e-2;
  s.config.lora_r = 8;
  s.initial_weights = fs::absolute(options.work_dir / "initial.safetensors");
  if (s.config.use_peft) {
    PARSYN_ASSIGN_OR_RETURN(std::string config_json, ReadText(s.model_dir / "config.json"));
    weights::LoraLayoutOptions lora{.r = s.config.lora_r, .target_modules = s.config.lora_target_modules};
    PARSYN_ASSIGN_OR_RETURN(weights::WeightSet adapters, weights::InitialLoraAdapters(config_json, lora, 7));
    PARSYN_RETURN_IF_ERROR(weights::WriteSafetensorsFile(adapters, s.initial_weights));
  } else {
    if (!fs::exists(s.model_dir / "model.safetensors")) {
      return InvalidArgumentError("--model " + s.model_dir.string() + " has no model.safetensors");
    }
    fs::copy_file(s.model_dir / "model.safetensors", s.initial_weights, fs::copy_options::overwrite_existing, ec);
    if (ec) return InternalError("cannot copy the model's weights: " + ec.message());
  }
  return s;
}

// The initial weights damaged (every float value NaN, or the first tensor one row longer), written to `path`.
enum class Damage { kNaN, kWrongShape };
Status WriteDamagedWeights(const fs::path& from, const fs::path& path, Damage damage) {
  PARSYN_ASSIGN_OR_RETURN(weights::WeightSet set, weights::ReadSafetensorsFile(from));
  weights::WeightSet out;
  for (size_t i = 0; i < set.size(); ++i) {
    const weights::Tensor& t = set[i];
    std::vector<int64_t> shape = t.shape;
    if (damage == Damage::kWrongShape && i == 0) {
      if (shape.empty()) shape.push_back(1);
      shape[0] += 1;
    }
    PARSYN_ASSIGN_OR_RETURN(std::span<std::byte> bytes, out.AddZeros(t.name, t.dtype, shape));
    std::memcpy(bytes.data(), t.data.data(), std::min(bytes.size(), t.data.size()));
    if (damage == Damage::kNaN && t.dtype == weights::DType::kF32) {
      const float nan = std::nanf("");
      for (size_t at = 0; at + sizeof(float) <= bytes.size(); at += sizeof(float)) {
        std::memcpy(bytes.data() + at, &nan, sizeof(float));
      }
    } else if (damage == Damage::kNaN && weights::IsFloat(t.dtype)) {
      std::memset(bytes.data(), 0xff, bytes.size());  // all bits set: a NaN in every float format
    }
  }
  return weights::WriteSafetensorsFile(out, path);
}

class Prober {
 public:
  Prober(TrainerLauncher& launcher, const TrainerCommand& trainer, const ConformanceOptions& options, ProbeSetup setup)
      : launcher_(launcher), supervisor_(launcher), trainer_(trainer), options_(options), setup_(std::move(setup)) {}

  std::vector<ProbeResult> RunAll() {
    std::vector<ProbeResult> results;
    results.push_back(Describe());
    results.push_back(Train());
    results.push_back(Evaluate());
    results.push_back(ZeroSteps());
    results.push_back(Refused("wrong_layout", Damage::kWrongShape));
    results.push_back(Refused("nan_loss", Damage::kNaN));
    results.push_back(Sigterm());
    results.push_back(UnknownVersion());
    return results;
  }

 private:
  // A probe's task in its own folder, written to task.json (with `version` as its contract_version).
  struct ProbeTask {
    fs::path file;
    protocol::TrainerTask task;
  };
  StatusOr<ProbeTask> Task(const std::string& probe, protocol::TaskKind kind, std::optional<int64_t> steps,
                           const fs::path& initial, int version = protocol::kTrainerContractVersion) {
    const fs::path dir = fs::absolute(options_.work_dir / probe);
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir / "out", ec);
    protocol::TrainerTask t;
    t.kind = kind;
    t.model_kind = setup_.model_kind;
    t.model_dir = setup_.model_dir.string();
    t.initial_weights = initial.string();
    t.data = setup_.train_data.string();
    t.validation_data = setup_.validation_data.string();
    t.data_format = setup_.data_format;
    t.config.training = setup_.config;
    t.config.training.trainer = trainer_.name;
    t.steps = steps;
    t.seed = 7;
    t.output_weights = (dir / "out/update.safetensors").string();
    t.output_result = (dir / "out/result.json").string();
    json j = protocol::TrainerTaskToJson(t);
    j["contract_version"] = version;
    PARSYN_RETURN_IF_ERROR(WriteText(dir / "task.json", j.dump(2)));
    return ProbeTask{.file = dir / "task.json", .task = std::move(t)};
  }

  StatusOr<TrainerOutput> RunTask(const ProbeTask& p) {
    return supervisor_.Run(trainer_, p.file, p.task, {.deadline = Clock::now() + options_.task_timeout});
  }

  static bool WroteSomething(const protocol::TrainerTask& t) {
    return fs::exists(t.output_weights) || fs::exists(t.output_result);
  }

  ProbeResult Describe() {
    StatusOr<protocol::TrainerDescription> d = supervisor_.Describe(trainer_);
    if (!d.ok()) return {"describe", false, d.status().message()};
    if (!d->RunsTaskKind("train")) return {"describe", false, "its task_kinds do not list \"train\""};
    if (!d->TrainsModelKind(setup_.model_kind)) {
      return {"describe", false, "its model_kinds do not list this model's kind, \"" + setup_.model_kind + "\""};
    }
    return {"describe", true, protocol::TrainerDescriptionToJson(*d).dump()};
  }

  ProbeResult Train() {
    StatusOr<ProbeTask> p = Task("train", protocol::TaskKind::kTrain, kProbeSteps, setup_.initial_weights);
    if (!p.ok()) return {"train", false, p.status().message()};
    StatusOr<TrainerOutput> out = RunTask(*p);
    if (!out.ok()) return {"train", false, out.status().message()};
    return {"train", true,
            "exit 0, done, num_samples " + std::to_string(out->result.num_samples) +
                ", an update of the initial weights' layout, every value finite"};
  }

  ProbeResult Evaluate() {
    StatusOr<ProbeTask> p = Task("evaluate", protocol::TaskKind::kEvaluate, 0, setup_.initial_weights);
    if (!p.ok()) return {"evaluate", false, p.status().message()};
    StatusOr<TrainerOutput> out = RunTask(*p);
    if (!out.ok()) return {"evaluate", false, out.status().message()};
    const std::optional<double> loss = out->result.ValidationLossBefore();
    if (!loss) return {"evaluate", false, "the result has no validation_before.loss"};
    return {"evaluate", true, "validation loss " + std::to_string(*loss)};
  }

  ProbeResult ZeroSteps() {
    StatusOr<ProbeTask> p = Task("zero_steps", protocol::TaskKind::kTrain, 0, setup_.initial_weights);
    if (!p.ok()) return {"zero_steps", false, p.status().message()};
    StatusOr<TrainerOutput> out = RunTask(*p);
    if (!out.ok()) return {"zero_steps", false, out.status().message()};
    StatusOr<weights::WeightSet> got = weights::ReadSafetensorsFile(out->update);
    StatusOr<weights::WeightSet> want = weights::ReadSafetensorsFile(setup_.initial_weights);
    if (!got.ok() || !want.ok()) return {"zero_steps", false, "cannot read the update or the initial weights"};
    for (size_t i = 0; i < want->size(); ++i) {
      const weights::Tensor& w = (*want)[i];
      const weights::Tensor& g = (*got)[i];
      if (w.data.size() != g.data.size() || std::memcmp(w.data.data(), g.data.data(), w.data.size()) != 0) {
        return {"zero_steps", false,
                "with steps 0, tensor '" + w.name + "' of the update differs from the initial weights"};
      }
    }
    return {"zero_steps", true, "the update equals the initial weights bit for bit"};
  }

  // The trainer is given initial weights it must refuse (another layout, or NaN): it fails with an error event and
  // writes no update.
  ProbeResult Refused(const std::string& probe, Damage damage) {
    const fs::path damaged = fs::absolute(options_.work_dir / (probe + ".safetensors"));
    if (Status s = WriteDamagedWeights(setup_.initial_weights, damaged, damage); !s.ok()) {
      return {probe, false, s.message()};
    }
    StatusOr<ProbeTask> p = Task(probe, protocol::TaskKind::kTrain, kProbeSteps, damaged);
    if (!p.ok()) return {probe, false, p.status().message()};
    StatusOr<TrainerOutput> out = RunTask(*p);
    const char* given = damage == Damage::kNaN ? "initial weights holding NaN" : "initial weights of another layout";
    if (out.ok()) return {probe, false, std::string("it trained ") + given + " and wrote an update"};
    const StatusCode code = out.status().code();
    if (code != StatusCode::kFailedPrecondition && code != StatusCode::kResourceExhausted) {
      return {probe, false, out.status().message()};
    }
    if (fs::exists(p->task.output_weights)) return {probe, false, "it failed but left an update"};
    return {probe, true, "refused: " + out.status().message()};
  }

  ProbeResult Sigterm() {
    StatusOr<ProbeTask> p = Task("sigterm", protocol::TaskKind::kTrain, kNeverEndingSteps, setup_.initial_weights);
    if (!p.ok()) return {"sigterm", false, p.status().message()};
    std::vector<std::string> argv = trainer_.argv;
    argv.push_back("run");
    argv.push_back(p->file.string());
    StatusOr<std::unique_ptr<TrainerRun>> run = launcher_.Start(argv);
    if (!run.ok()) return {"sigterm", false, run.status().message()};
    bool progressed = false;
    while (std::optional<std::string> line = (*run)->ReadLine()) {
      std::optional<json> event = protocol::ParseEventObject(*line);
      if (event && event->value("event", "") == "progress") {
        progressed = true;
        break;
      }
    }
    if (!progressed) {
      const int code = (*run)->Wait();
      return {"sigterm", false, "it ended (exit " + std::to_string(code) + ") before any progress event"};
    }
    const Clock::time_point sent = Clock::now();
    (*run)->Terminate();  // SIGTERM, and SIGKILL after the contract's 10 s
    while ((*run)->ReadLine()) {
    }
    const int code = (*run)->Wait();
    const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s", seconds);
    if (code == 128 + 9) return {"sigterm", false, std::string("it was still running 10 s after SIGTERM: killed")};
    if (code != protocol::kTrainerExitStopped) {
      return {"sigterm", false, "it exited " + std::to_string(code) + " " + took + " after SIGTERM, not 3"};
    }
    if (WroteSomething(p->task)) return {"sigterm", false, "it exited 3 but left its outputs"};
    return {"sigterm", true, std::string("exited 3, ") + took + " after SIGTERM, nothing written"};
  }

  ProbeResult UnknownVersion() {
    StatusOr<ProbeTask> p =
        Task("unknown_version", protocol::TaskKind::kTrain, kProbeSteps, setup_.initial_weights, 999);
    if (!p.ok()) return {"unknown_version", false, p.status().message()};
    StatusOr<TrainerOutput> out = RunTask(*p);
    if (out.ok()) return {"unknown_version", false, "it ran a task of contract_version 999"};
    if (out.status().code() != StatusCode::kFailedPrecondition) {
      return {"unknown_version", false, out.status().message()};
    }
    const std::string code = ": " + std::string(protocol::kUnsupportedContractVersion) + ": ";
    if (out.status().message().find(code) == std::string::npos) {
      return {"unknown_version", false,
              "its error code is not \"unsupported_contract_version\": " + out.status().message()};
    }
    if (WroteSomething(p->task)) return {"unknown_version", false, "it refused the task but left outputs"};
    return {"unknown_version", true, "refused: " + out.status().message()};
  }

  TrainerLauncher& launcher_;
  TrainerSupervisor supervisor_;
  const TrainerCommand& trainer_;
  const ConformanceOptions& options_;
  const ProbeSetup setup_;
};

}  // namespace

StatusOr<std::vector<ProbeResult>> RunConformanceProbes(TrainerLauncher& launcher, const TrainerCommand& trainer,
                                                        const ConformanceOptions& options) {
  PARSYN_ASSIGN_OR_RETURN(ProbeSetup setup, Prepare(options));
  return Prober(launcher, trainer, options, std::move(setup)).RunAll();
}

}  // namespace parsyn::worker
