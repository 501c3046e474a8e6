// parsyn model init: a new, randomly initialised model folder, written by parsyn-trainer:
//   --architecture llama|qwen2: a Llama-family folder (config.json, model.safetensors, tokenizer.json), model-init
//     (src/trainer/model_init.h);
//   --architecture mlp|logreg --data CSV: a tabular folder (tabular_model.json, model.safetensors), tabular-init
//     (src/trainer/tabular_model.h), its standardisation and classes taken from the whole CSV; the starting model of
//     a federated tabular job, so that every worker scales features and numbers classes alike.
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/trainer_runner.h"

namespace parsyn::cli {
namespace {

struct InitFlags {
  std::string out;
  std::string architecture = "llama";
  int64_t hidden_size = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  std::string tokenizer;
  bool tie_embeddings = false;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  uint64_t seed = 0;
  std::string dtype = "f32";
  // Tabular (mlp, logreg) only.
  std::string data;
  std::vector<int64_t> hidden_sizes = {64};
  std::string label_column = "label";
};

// Runs `parsyn-trainer <command> <out> <options JSON>`. Returns 0 with the trainer's final message in `done`, or
// prints why it failed and returns the exit code for `parsyn model init`: 1 when the trainer could not be run, else
// the trainer's own.
int RunInitTrainer(const std::string& command, const std::string& out, const nlohmann::json& options,
                   nlohmann::json& done) {
  auto outcome = RunTrainer({command, out, options.dump()}, nullptr);
  if (!outcome.ok()) {
    std::cerr << "parsyn model init: " << outcome.status().message() << "\n";
    return 1;
  }
  if (outcome->exit_code != 0) {
    std::cerr << "parsyn model init: " << TrainerFailureMessage(*outcome) << "\n";
    return outcome->exit_code;
  }
  done = std::move(outcome->done);
  return 0;
}

int RunTabularInit(const InitFlags& f) {
  if (f.data.empty()) {
    std::cerr << "parsyn model init: --architecture " << f.architecture << " needs --data CSV\n";
    return 2;
  }
  nlohmann::json config = {{"model_type", f.architecture}, {"label_column", f.label_column}};
  if (f.architecture == "mlp") config["hidden_sizes"] = f.hidden_sizes;
  const nlohmann::json options = {
      {"data", std::filesystem::absolute(f.data).string()}, {"seed", f.seed}, {"config", config}};
  nlohmann::json done;
  if (int code = RunInitTrainer("tabular-init", f.out, options, done); code != 0) return code;
  const nlohmann::json& spec = done["spec"];
  std::cout << "wrote tabular " << f.architecture << " model to " << f.out << ": "
            << spec.value("feature_names", nlohmann::json::array()).size() << " features, "
            << spec.value("class_names", nlohmann::json::array()).size() << " classes, hidden "
            << spec.value("hidden_sizes", nlohmann::json::array()).dump() << "\n";
  return 0;
}

int RunInit(const InitFlags& f) {
  if (f.architecture == "mlp" || f.architecture == "logreg") return RunTabularInit(f);
  std::string dtype = f.dtype;
  for (char& c : dtype) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16") {
    std::cerr << "parsyn model init: --dtype must be f32, bf16 or f16, got " << f.dtype << "\n";
    return 2;
  }
  nlohmann::json options = {{"architecture", f.architecture},
                            {"hidden_size", f.hidden_size},
                            {"num_hidden_layers", f.layers},
                            {"num_attention_heads", f.heads},
                            {"num_key_value_heads", f.kv_heads},
                            {"intermediate_size", f.intermediate_size},
                            {"vocab_size", f.vocab_size},
                            {"tie_word_embeddings", f.tie_embeddings},
                            {"max_position_embeddings", f.max_position_embeddings},
                            {"rope_theta", f.rope_theta},
                            {"seed", f.seed},
                            {"dtype", dtype}};
  if (!f.tokenizer.empty()) options["tokenizer_json"] = std::filesystem::absolute(f.tokenizer).string();
  nlohmann::json done;
  if (int code = RunInitTrainer("model-init", f.out, options, done); code != 0) return code;
  const nlohmann::json& config = done["config"];
  std::cout << "wrote " << config.value("model_type", "llama") << " model to " << f.out << ": hidden "
            << config.value("hidden_size", 0) << ", " << config.value("num_hidden_layers", 0) << " layers, "
            << config.value("num_attention_heads", 0) << " heads (" << config.value("num_key_value_heads", 0)
            << " kv), vocabulary " << config.value("vocab_size", 0) << "\n";
  return 0;
}

}  // namespace

void AddModelCommands(CLI::App& app, int& exit_code) {
  CLI::App* model = app.add_subcommand("model", "Model folders (Hugging Face layout)");
  model->require_subcommand(1);
  auto flags = std::make_shared<InitFlags>();
  CLI::App* init = model->add_subcommand(
      "init", "Write a new, randomly initialised model folder: Llama-family, or tabular (mlp, logreg) for a CSV");
  init->add_option("--out,-o", flags->out, "Folder to create (must not already hold a model)")->required();
  init->add_option("--architecture", flags->architecture, "llama, qwen2, or tabular: mlp, logreg (with --data)")
      ->check(CLI::IsMember({"llama", "qwen2", "mlp", "logreg"}))
      ->capture_default_str();
  init->add_option("--data", flags->data,
                   "Tabular: the whole CSV dataset (features standardised and classes numbered from all its rows)")
      ->check(CLI::ExistingFile);
  init->add_option("--hidden-sizes", flags->hidden_sizes, "Tabular mlp: hidden layer widths")->capture_default_str();
  init->add_option("--label-column", flags->label_column, "Tabular: the CSV's label column")->capture_default_str();
  init->add_option("--hidden-size", flags->hidden_size, "Model width")->capture_default_str();
  init->add_option("--layers", flags->layers, "Transformer layers")->capture_default_str();
  init->add_option("--heads", flags->heads, "Attention heads")->capture_default_str();
  init->add_option("--kv-heads", flags->kv_heads, "Key/value heads (grouped-query attention); 0 = --heads")
      ->capture_default_str();
  init->add_option("--intermediate-size", flags->intermediate_size, "MLP width; 0 = 8/3 x hidden, rounded up to 32")
      ->capture_default_str();
  init->add_option("--vocab-size", flags->vocab_size, "Embedding rows; 0 = the tokenizer's size")
      ->capture_default_str();
  init->add_option("--tokenizer", flags->tokenizer,
                   "tokenizer.json to copy (default: a byte-level tokenizer, 259 tokens)")
      ->check(CLI::ExistingFile);
  init->add_flag("--tie-embeddings", flags->tie_embeddings, "Share the output head with the token embeddings");
  init->add_option("--max-position-embeddings", flags->max_position_embeddings, "Longest sequence")
      ->capture_default_str();
  init->add_option("--rope-theta", flags->rope_theta, "Rotary embedding base")->capture_default_str();
  init->add_option("--seed", flags->seed, "Initialisation seed")->capture_default_str();
  init->add_option("--dtype", flags->dtype, "Checkpoint dtype: f32, bf16 or f16")->capture_default_str();
  init->callback([flags, &exit_code] { exit_code = RunInit(*flags); });
}

}  // namespace parsyn::cli
