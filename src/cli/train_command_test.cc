// `parsyn model init` and `parsyn train` as a new user runs them: real processes, real files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "weights/safetensors.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

struct CommandRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandRun RunParsyn(const std::string& args) {
  const std::string command = std::string(PARSYN_CLI_PATH) + " " + args + " 2>&1";
  CommandRun run;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(PARSYN_CLI_PATH).parent_path() / "parsyn-trainer")) {
      GTEST_SKIP() << "built without the trainer (PARSYN_WITH_TORCH=OFF)";
    }
    dir_ = fs::path(::testing::TempDir()) /
           ("cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TrainCommandTest, ModelInitThenLoraTrainingWritesPeftAdapter) {
  CommandRun init = RunParsyn("model init --out " + Path("model") + " --hidden-size 32 --layers 1 --heads 2 --seed 3");
  ASSERT_EQ(init.exit_code, 0) << init.output;
  EXPECT_NE(init.output.find("wrote llama model"), std::string::npos) << init.output;
  EXPECT_TRUE(fs::exists(dir_ / "model/config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "model/tokenizer.json"));

  std::ofstream data(dir_ / "data.jsonl");
  for (int i = 0; i < 10; ++i)
    data << R"({"prompt": "q)" << i << R"(", "completion": " a"})"
         << "\n";
  data.close();
  CommandRun train = RunParsyn("train --model " + Path("model") + " --data " + Path("data.jsonl") + " --out " +
                               Path("adapter") + " --use-peft --lora-r 4 --lora-target-modules q_proj,k_proj,v_proj" +
                               " --max-steps 3 --batch-size 4 --learning-rate 1e-3");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("3/3"), std::string::npos) << train.output;  // the progress bar's last step
  EXPECT_NE(train.output.find("wrote LoRA adapter (PEFT layout)"), std::string::npos) << train.output;
  std::ifstream config_file(dir_ / "adapter/adapter_config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["target_modules"].size(), 3u);
  EXPECT_TRUE(fs::exists(dir_ / "adapter/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "adapter/training_result.json"));
  EXPECT_FALSE(fs::exists(dir_ / "adapter/.parsyn-train"));
}

// parsyn model init (bf16) -> parsyn train (LoRA) -> parsyn adapter merge -> parsyn train on the merged folder.
TEST_F(TrainCommandTest, AdapterMergeWritesAFolderThatTrainLoadsBack) {
  ASSERT_EQ(RunParsyn("model init --out " + Path("model") + " --hidden-size 32 --layers 1 --heads 2 --seed 5 " +
                      "--dtype bf16")
                .exit_code,
            0);
  std::ofstream data(dir_ / "data.jsonl");
  for (int i = 0; i < 12; ++i)
    data << R"({"prompt": "q)" << i << R"(", "completion": " answer"})"
         << "\n";
  data.close();
  CommandRun train =
      RunParsyn("train --model " + Path("model") + " --data " + Path("data.jsonl") + " --out " + Path("adapter") +
                " --use-peft --lora-r 4 --lora-target-modules q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" +
                " --max-steps 4 --batch-size 4 --learning-rate 1e-2");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto adapter_config = nlohmann::json::parse(std::ifstream(dir_ / "adapter/adapter_config.json"));
  // No _name_or_path in the initialised model's config.json: the folder's absolute path, which PEFT resolves.
  EXPECT_EQ(adapter_config["base_model_name_or_path"], fs::weakly_canonical(dir_ / "model").string());
  EXPECT_EQ(adapter_config["use_dora"], false);

  CommandRun merge = RunParsyn("adapter merge --model " + Path("model") + " --adapter " + Path("adapter") + " --out " +
                               Path("merged"));
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  std::printf("[ merge    ] %s", merge.output.c_str());
  EXPECT_NE(merge.output.find("merged adapter " + Path("adapter") + " into llama model " + Path("model") + ": wrote " +
                              Path("merged") + " (config.json, model.safetensors bfloat16, tokenizer)"),
            std::string::npos)
      << merge.output;
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_TRUE(fs::exists(dir_ / "merged" / name)) << name;
  }
  // The base checkpoint's dtype, and the adapter in the weights: every adapted projection moved, nothing else did.
  auto base = weights::ReadSafetensorsFile(dir_ / "model/model.safetensors");
  auto merged = weights::ReadSafetensorsFile(dir_ / "merged/model.safetensors");
  ASSERT_TRUE(base.ok() && merged.ok());
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir_ / "merged/config.json"))["torch_dtype"], "bfloat16");
  ASSERT_EQ(merged->size(), base->size());
  for (const weights::Tensor& t : base->tensors()) {
    const weights::Tensor* m = merged->Find(t.name);
    ASSERT_NE(m, nullptr) << t.name;
    EXPECT_EQ(m->dtype, weights::DType::kBF16) << t.name;
    const bool same = std::equal(t.data.begin(), t.data.end(), m->data.begin(), m->data.end());
    EXPECT_EQ(same, t.name.find("_proj.weight") == std::string::npos) << t.name;
  }

  // Loaded back: `parsyn train` fine-tunes the merged folder like any model folder.
  CommandRun again = RunParsyn("train --model " + Path("merged") + " --data " + Path("data.jsonl") + " --out " +
                               Path("again") + " --use-peft --max-steps 1 --batch-size 4");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(fs::exists(dir_ / "again/adapter_model.safetensors"));

  // An existing model folder is not overwritten; an adapter with a PEFT option we do not implement is refused.
  CommandRun over = RunParsyn("adapter merge --model " + Path("model") + " --adapter " + Path("adapter") + " --out " +
                              Path("merged"));
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_NE(over.output.find("already holds a model (config.json)"), std::string::npos) << over.output;
  nlohmann::json dora = adapter_config;
  dora["use_dora"] = true;
  std::ofstream(dir_ / "adapter/adapter_config.json", std::ios::trunc) << dora.dump(2);
  CommandRun refused = RunParsyn("adapter merge --model " + Path("model") + " --adapter " + Path("adapter") +
                                 " --out " + Path("merged2"));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("use_dora is not supported (true)"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(dir_ / "merged2/config.json"));
}

TEST_F(TrainCommandTest, TabularTrainingWritesAModel) {
  std::ofstream data(dir_ / "data.csv");
  data << "a,b,label\n";
  for (int i = 0; i < 40; ++i)
    data << (i % 2 ? 1 : -1) * (1 + i % 5) << "," << i % 7 << "," << (i % 2 ? "yes" : "no") << "\n";
  data.close();
  CommandRun train = RunParsyn("train --data " + Path("data.csv") + " --out " + Path("tab") +
                               " --model-type logreg --epochs 2 --batch-size 8");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("wrote tabular model"), std::string::npos) << train.output;
  EXPECT_TRUE(fs::exists(dir_ / "tab/tabular_model.json"));
}

TEST_F(TrainCommandTest, BadInputsGiveClearErrors) {
  CommandRun missing =
      RunParsyn("train --data " + Path("nope.jsonl") + " --out " + Path("o") + " --model " + Path("m"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("parsyn train: --data " + Path("nope.jsonl") + ": no such file"), std::string::npos)
      << missing.output;

  std::ofstream(dir_ / "data.csv") << "x,label\n1,a\n2,b\n3,a\n4,b\n";
  CommandRun bad_config =
      RunParsyn("train --data " + Path("data.csv") + " --out " + Path("o") + " --mixed-precision fp8");
  EXPECT_EQ(bad_config.exit_code, 1);
  EXPECT_NE(bad_config.output.find("config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got \"fp8\""),
            std::string::npos)
      << bad_config.output;

  CommandRun no_model = RunParsyn("train --data " + Path("x.jsonl") + " --out " + Path("o2"));
  EXPECT_NE(no_model.exit_code, 0);

  std::ofstream(dir_ / "x.jsonl") << "{\"text\": \"hi\"}\n";
  CommandRun text_without_model = RunParsyn("train --data " + Path("x.jsonl") + " --out " + Path("o3"));
  EXPECT_EQ(text_without_model.exit_code, 2);
  EXPECT_NE(text_without_model.output.find("--model is required for text data"), std::string::npos)
      << text_without_model.output;
}

}  // namespace
}  // namespace parsyn::cli
