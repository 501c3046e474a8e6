// parsyn train: local single-machine training. Builds a task (src/trainer/task.h) from the flags, runs
// parsyn-trainer on it with a progress bar, and leaves in --out a loadable result: a PEFT adapter
// (adapter_config.json + adapter_model.safetensors) under LoRA, a full model folder, or a tabular model folder,
// plus training_result.json (metrics).
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "cli/trainer_runner.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct TrainFlags {
  std::string model;
  std::string data;
  std::string out;
  std::string config_file;
  std::string initial_weights;
  std::string device = "cpu";
  int64_t max_steps = -1;
  uint64_t seed = 0;
  int64_t threads = 0;
  bool force = false;
  std::string output = "text";
  json config_overrides = json::object();  // from the per-key flags; win over --config
};

StatusOr<json> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("--config " + path + ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("--config " + path + ": not valid JSON");
  // Accept a bare config object, or a job spec whose "config" holds it.
  if (j.is_object() && j.contains("config") && j["config"].is_object()) j = j["config"];
  if (!j.is_object()) return InvalidArgumentError("--config " + path + ": expected a JSON object of config keys");
  return j;
}

// Checks what can be checked without the trainer, so the common mistakes get an immediate, specific message.
Status CheckInputs(const TrainFlags& f) {
  if (!fs::is_regular_file(f.data)) return NotFoundError("--data " + f.data + ": no such file");
  if (!f.model.empty() && !fs::is_directory(f.model)) return NotFoundError("--model " + f.model + ": no such folder");
  if (!f.initial_weights.empty() && !fs::is_regular_file(f.initial_weights)) {
    return NotFoundError("--initial-weights " + f.initial_weights + ": no such file");
  }
  std::string ext = fs::path(f.data).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext != ".csv" && f.model.empty()) {
    return InvalidArgumentError("--model is required for text data (" + f.data +
                                "); create one with `parsyn model init --out DIR`");
  }
  std::error_code ec;
  if (fs::exists(f.out) && !fs::is_empty(f.out, ec) && !f.force) {
    return AlreadyExistsError("--out " + f.out + " is not empty (use --force to write into it)");
  }
  return Status::Ok();
}

int RunTrain(const TrainFlags& f) {
  if (Status s = CheckInputs(f); !s.ok())
    return Fail("train", s.message(), s.code() == StatusCode::kInvalidArgument ? 2 : 1);
  json config = json::object();
  if (!f.config_file.empty()) {
    auto file = ReadConfigFile(f.config_file);
    if (!file.ok()) return Fail("train", file.status().message());
    config = *file;
  }
  config.update(f.config_overrides);

  const fs::path out = fs::absolute(f.out);
  const fs::path work = out / ".parsyn-train";  // the task and the raw weights file; removed on success
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return Fail("train", "cannot create " + work.string() + ": " + ec.message());

  json task = {{"data", fs::absolute(f.data).string()},
               {"config", config},
               {"seed", f.seed},
               {"device", f.device},
               {"threads", f.threads},
               {"output",
                {{"weights", (work / "trainable.safetensors").string()},
                 {"result", (out / "training_result.json").string()},
                 {"model_dir", out.string()}}}};
  if (!f.model.empty()) task["model_dir"] = fs::absolute(f.model).string();
  if (!f.initial_weights.empty()) task["initial_weights"] = fs::absolute(f.initial_weights).string();
  if (f.max_steps >= 0) task["steps"] = f.max_steps;
  const fs::path task_path = work / "task.json";
  std::ofstream(task_path) << task.dump(2) << "\n";

  ProgressReporter progress(std::cerr, isatty(STDERR_FILENO) != 0);
  auto outcome = RunTrainer({"run", task_path.string()}, [&](const json& event) { progress.OnEvent(event); });
  progress.Finish();
  if (!outcome.ok()) return Fail("train", outcome.status().message());
  if (outcome->exit_code != 0) return Fail("train", TrainerFailureMessage(*outcome), outcome->exit_code);

  fs::remove_all(work, ec);  // best effort: a leftover work folder is harmless
  const json& done = outcome->done;
  const bool lora = fs::exists(out / "adapter_config.json");  // use_peft (on by default) wrote a PEFT adapter
  if (f.output == "json") {
    // What it wrote and the trainer's summary (its "done" event); the full metrics stay in training_result.json.
    const std::string wrote = done.value("kind", "") == "tabular" ? "tabular_model" : lora ? "lora_adapter" : "model";
    std::cout << json{{"out", out.string()},
                      {"wrote", wrote},
                      {"result", (out / "training_result.json").string()},
                      {"summary", done}}
                     .dump(2)
              << "\n";
    return 0;
  }
  const json metrics = done.value("metrics", json::object());
  std::cout << "trained " << metrics.value("steps", 0) << " steps on " << done.value("num_samples", 0) << " examples";
  if (done.contains("train_loss") && done["train_loss"].is_number()) {
    std::cout << ", mean loss " << RoundedNumber(done["train_loss"]);
  }
  std::cout << "\n";
  if (done.value("kind", "") == "tabular") {
    std::cout << "wrote tabular model to " << out.string() << " (tabular_model.json, model.safetensors)\n";
  } else if (lora) {
    std::cout << "wrote LoRA adapter (PEFT layout) to " << out.string()
              << " (adapter_config.json, adapter_model.safetensors)\n";
  } else {
    std::cout << "wrote fine-tuned model to " << out.string() << " (config.json, model.safetensors, tokenizer)\n";
  }
  std::cout << "metrics in " << (out / "training_result.json").string() << "\n";
  return 0;
}

// One flag per config key, spelled with dashes (--batch-size for batch_size); each writes the key into the overrides.
template <typename T>
void AddConfigFlag(CLI::App* cmd, TrainFlags& flags, const std::string& key, const std::string& help) {
  std::string flag = "--" + key;
  for (char& c : flag) {
    if (c == '_') c = '-';
  }
  cmd->add_option_function<T>(
      flag, [&flags, key](const T& value) { flags.config_overrides[key] = value; }, help);
}

}  // namespace

void AddTrainCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train", "Train on this machine: fine-tune a model folder (LoRA or full) on JSONL, or a classifier on CSV");
  cmd->add_option("--model,-m", flags->model,
                  "Model folder (config.json, model.safetensors, tokenizer.json); for CSV data, an existing tabular "
                  "model to continue (default: a new one)");
  cmd->add_option("--data,-d", flags->data, "Training data: .jsonl ({\"text\"} or {\"prompt\",\"completion\"}) or .csv")
      ->required();
  cmd->add_option("--out,-o", flags->out, "Output folder")->required();
  cmd->add_option("--config,-c", flags->config_file,
                  "JSON file of config keys (or a job spec with a \"config\" object); flags below override it");
  cmd->add_option("--initial-weights", flags->initial_weights, "Trainable weights to start from (.safetensors)");
  cmd->add_option("--max-steps", flags->max_steps, "Optimizer steps to run; wins over --epochs (0: evaluate only)");
  cmd->add_option("--seed", flags->seed, "Seed for shuffling, dropout and initialisation")->capture_default_str();
  cmd->add_option("--device", flags->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", flags->threads, "CPU threads for torch (0: its default)")->capture_default_str();
  cmd->add_flag("--force", flags->force, "Write into a non-empty --out folder");
  cmd->add_option("--output", flags->output,
                  "text (for people) or json ({\"out\", \"wrote\": lora_adapter|model|tabular_model, \"result\", "
                  "\"summary\"} on stdout)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  TrainFlags& f = *flags;
  AddConfigFlag<int64_t>(cmd, f, "epochs", "Passes over the data (when --max-steps is not given)");
  AddConfigFlag<int64_t>(cmd, f, "batch_size", "Examples per micro-batch");
  AddConfigFlag<double>(cmd, f, "learning_rate", "Peak learning rate");
  AddConfigFlag<std::string>(cmd, f, "mixed_precision", "no, bf16 or fp16 (fp16: CUDA only)");
  AddConfigFlag<int64_t>(cmd, f, "lora_r", "LoRA rank");
  AddConfigFlag<double>(cmd, f, "lora_alpha", "LoRA alpha (scale = alpha / r)");
  AddConfigFlag<double>(cmd, f, "lora_dropout", "LoRA dropout");
  AddConfigFlag<std::vector<std::string>>(cmd, f, "lora_target_modules", "Comma-separated, e.g. q_proj,v_proj");
  AddConfigFlag<int64_t>(cmd, f, "max_seq_len", "Longer examples are truncated");
  AddConfigFlag<double>(cmd, f, "weight_decay", "AdamW weight decay");
  AddConfigFlag<int64_t>(cmd, f, "warmup_steps", "Linear warmup steps");
  AddConfigFlag<std::string>(cmd, f, "lr_scheduler", "constant, linear or cosine");
  AddConfigFlag<int64_t>(cmd, f, "gradient_accumulation_steps", "Micro-batches per optimizer step");
  AddConfigFlag<double>(cmd, f, "max_grad_norm", "Gradient clipping norm (0: off)");
  AddConfigFlag<double>(cmd, f, "validation_fraction", "Share of the data held out for evaluation");
  AddConfigFlag<std::string>(cmd, f, "model_type", "Tabular: mlp or logreg");
  AddConfigFlag<std::vector<int64_t>>(cmd, f, "hidden_sizes", "Tabular mlp: comma-separated widths, e.g. 64,32");
  AddConfigFlag<std::string>(cmd, f, "label_column", "Tabular: the CSV column holding the class");
  cmd->add_flag_function(
      "--use-peft,!--no-use-peft", [flags](int64_t count) { flags->config_overrides["use_peft"] = count > 0; },
      "Train LoRA adapters (the default) or, with --no-use-peft, every weight");
  for (const char* list : {"--lora-target-modules", "--hidden-sizes"}) cmd->get_option(list)->delimiter(',');
  cmd->callback([flags, &exit_code] { exit_code = RunTrain(*flags); });
}

}  // namespace parsyn::cli
