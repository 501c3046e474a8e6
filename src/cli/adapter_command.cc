// parsyn adapter merge --model DIR --adapter DIR --out DIR: a PEFT LoRA adapter (ours, from `parsyn train` or a
// federated job's artifacts, or PEFT's own) merged into its base model's weights, written as a plain Hugging Face
// model folder (config.json, model.safetensors in the base checkpoint's dtype, the tokenizer files) that transformers,
// vLLM, llama.cpp's converter and `parsyn train --model` load without PEFT. The work is parsyn-trainer's
// merge-adapter (src/trainer/peft_io.h, MergeAdapterFolder).
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/trainer_runner.h"

namespace parsyn::cli {
namespace {

struct MergeFlags {
  std::string model;
  std::string adapter;
  std::string out;
};

int RunMerge(const MergeFlags& f) {
  namespace fs = std::filesystem;
  auto outcome = RunTrainer(
      {"merge-adapter", fs::absolute(f.model).string(), fs::absolute(f.adapter).string(), fs::absolute(f.out).string()},
      nullptr);
  if (!outcome.ok()) {
    std::cerr << "parsyn adapter merge: " << outcome.status().message() << "\n";
    return 1;
  }
  if (outcome->exit_code != 0) {
    std::cerr << "parsyn adapter merge: " << TrainerFailureMessage(*outcome) << "\n";
    return outcome->exit_code;
  }
  const nlohmann::json& config = outcome->done["config"];
  std::cout << "merged adapter " << f.adapter << " into " << config.value("model_type", "llama") << " model " << f.model
            << ": wrote " << f.out << " (config.json, model.safetensors " << outcome->done.value("dtype", "")
            << ", tokenizer)\n";
  return 0;
}

}  // namespace

void AddAdapterCommands(CLI::App& app, int& exit_code) {
  CLI::App* adapter = app.add_subcommand("adapter", "LoRA adapters (PEFT layout)");
  adapter->require_subcommand(1);
  auto flags = std::make_shared<MergeFlags>();
  CLI::App* merge = adapter->add_subcommand(
      "merge", "Merge a LoRA adapter into its base model and write a plain Hugging Face model folder");
  merge->add_option("--model", flags->model, "Base model folder (config.json, model.safetensors, tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
  merge->add_option("--adapter", flags->adapter, "Adapter folder (adapter_config.json, adapter_model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  merge->add_option("--out,-o", flags->out, "Folder to write (must not already hold a model)")->required();
  merge->callback([flags, &exit_code] { exit_code = RunMerge(*flags); });
}

}  // namespace parsyn::cli
