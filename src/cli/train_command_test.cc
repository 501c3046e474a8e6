// `parsyn model init` and `parsyn train` as a new user runs them: real processes, real files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "base/strings.h"
#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"
#include "weights/safetensors.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

struct CommandRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line; its stdout (add 2>&1 for stderr too).
CommandRun RunShell(const std::string& command) {
  CommandRun run;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// Runs `parsyn ARGS`; its stdout, and its stderr too unless `with_stderr` is false (then stderr is dropped).
CommandRun RunParsyn(const std::string& args, bool with_stderr = true) {
  return RunShell(test_support::BuildPath("parsyn") + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

class TrainCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(test_support::BuildPath("parsyn")).parent_path() / "parsyn-trainer")) {
      PARSYN_SKIP_FOR_MISSING_DEPENDENCY("built without the trainer (PARSYN_WITH_TORCH=OFF)");
    }
    dir_ = fs::path(::testing::TempDir()) /
           ("cli_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // `parsyn server --data-dir DIR` on a free loopback port, waited for until it wrote DIR/server.json.
  void StartServer(const std::string& data_dir) {
    SubprocessOptions server_options;
    server_options.output = SubprocessOptions::Output::kFile;
    server_options.output_file = dir_ / "server.log";
    StatusOr<Subprocess> server =
        Subprocess::Start(test_support::BuildPath("parsyn"),
                          {"server", "--data-dir", data_dir, "--listen", "127.0.0.1:0"}, server_options);
    ASSERT_TRUE(server.ok()) << server.status().message();
    for (int i = 0; i < 600 && !fs::exists(fs::path(data_dir) / "server.json") && !server->HasExited(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    server_.emplace(*std::move(server));
    ASSERT_TRUE(fs::exists(fs::path(data_dir) / "server.json"))
        << "the server did not start; see " << Path("server.log");
  }
  void TearDown() override {
    if (server_) {
      server_->Terminate();
      server_->Wait();
    }
  }
  fs::path dir_;
  std::optional<Subprocess> server_;
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
  // No _name_or_path in the initialised model's config.json: the folder's name, not a path of this machine.
  EXPECT_EQ(adapter_config["base_model_name_or_path"], "model");
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

  // --output json: what it wrote and the trainer's summary, alone on stdout (the progress is on stderr).
  CommandRun json_run = RunParsyn("train --data " + Path("data.csv") + " --out " + Path("tab2") +
                                      " --model-type logreg --epochs 2 --batch-size 8 --output json",
                                  /*with_stderr=*/false);
  ASSERT_EQ(json_run.exit_code, 0) << json_run.output;
  const nlohmann::json result = nlohmann::json::parse(json_run.output, nullptr, false);
  ASSERT_FALSE(result.is_discarded()) << json_run.output;
  EXPECT_EQ(result["wrote"], "tabular_model");
  EXPECT_EQ(result["out"], Path("tab2"));
  EXPECT_GT(result["summary"]["metrics"].value("steps", 0), 0);
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
  const std::string reason = "config.mixed_precision must be one of \"bf16\", \"fp16\", \"no\", got \"fp8\"";
  const size_t first = bad_config.output.find(reason);
  EXPECT_NE(first, std::string::npos) << bad_config.output;
  EXPECT_EQ(bad_config.output.find(reason, first + 1), std::string::npos) << "printed twice:\n" << bad_config.output;

  // A reason from the trainer (its error event) is shown once, not again as parsyn-trainer's own stderr line.
  std::ofstream(dir_ / "bad.csv") << "x,label\n1,a\n2,b\noops,a\n4,b\n";
  CommandRun bad_row = RunParsyn("train --data " + Path("bad.csv") + " --out " + Path("o4"));
  EXPECT_EQ(bad_row.exit_code, 1) << bad_row.output;
  const std::string row_reason = "line 4: column 1 (\"x\"): \"oops\" is not a finite number";
  const size_t at = bad_row.output.find(row_reason);
  EXPECT_NE(at, std::string::npos) << bad_row.output;
  EXPECT_EQ(bad_row.output.find(row_reason, at + 1), std::string::npos) << "printed twice:\n" << bad_row.output;

  CommandRun no_model = RunParsyn("train --data " + Path("x.jsonl") + " --out " + Path("o2"));
  EXPECT_NE(no_model.exit_code, 0);

  std::ofstream(dir_ / "x.jsonl") << "{\"text\": \"hi\"}\n";
  CommandRun text_without_model = RunParsyn("train --data " + Path("x.jsonl") + " --out " + Path("o3"));
  EXPECT_EQ(text_without_model.exit_code, 2);
  EXPECT_NE(text_without_model.output.find("--model is required for text data"), std::string::npos)
      << text_without_model.output;
}

// Usage errors exit 2 whatever CLI11 would have used (105-109...), with its message and where the command's help is;
// --help and --version still exit 0, and a runtime failure keeps 1.
TEST(CliUsageTest, UsageErrorsExitTwoWithAHint) {
  CommandRun unknown_flag = RunParsyn("job list --no-such-flag");
  EXPECT_EQ(unknown_flag.exit_code, 2) << unknown_flag.output;
  EXPECT_NE(unknown_flag.output.find("--no-such-flag"), std::string::npos) << unknown_flag.output;
  EXPECT_NE(unknown_flag.output.find("Run 'parsyn job list --help' for usage."), std::string::npos)
      << unknown_flag.output;

  CommandRun missing_option = RunParsyn("job create");
  EXPECT_EQ(missing_option.exit_code, 2) << missing_option.output;
  EXPECT_NE(missing_option.output.find("--file"), std::string::npos) << missing_option.output;
  EXPECT_NE(missing_option.output.find("parsyn job create --help"), std::string::npos) << missing_option.output;

  CommandRun bad_value = RunParsyn("job create -f spec.json --workers 1,abc");
  EXPECT_EQ(bad_value.exit_code, 2) << bad_value.output;
  EXPECT_NE(bad_value.output.find("--workers: must be a positive id, not 'abc'"), std::string::npos)
      << bad_value.output;
  CommandRun bad_number = RunParsyn("job create -f spec.json --managed-workers -1");
  EXPECT_EQ(bad_number.exit_code, 2) << bad_number.output;
  EXPECT_NE(bad_number.output.find("--managed-workers"), std::string::npos) << bad_number.output;
  CommandRun bad_id = RunParsyn("job create -f spec.json --dataset 0");
  EXPECT_EQ(bad_id.exit_code, 2) << bad_id.output;
  EXPECT_NE(bad_id.output.find("--dataset"), std::string::npos) << bad_id.output;

  CommandRun unknown_subcommand = RunParsyn("job frobnicate");
  EXPECT_EQ(unknown_subcommand.exit_code, 2) << unknown_subcommand.output;
  EXPECT_NE(unknown_subcommand.output.find("parsyn job --help"), std::string::npos) << unknown_subcommand.output;
  EXPECT_NE(unknown_subcommand.output.find("parsyn job: unknown command 'frobnicate'"), std::string::npos)
      << unknown_subcommand.output;
  EXPECT_EQ(RunParsyn("no-such-command").exit_code, 2);
  EXPECT_EQ(RunParsyn("").exit_code, 2);  // a subcommand is required

  EXPECT_EQ(RunParsyn("--help").exit_code, 0);
  EXPECT_EQ(RunParsyn("job create --help").exit_code, 0);
  EXPECT_EQ(RunParsyn("--version").exit_code, 0);

  // A runtime failure (the spec file is not there) is not a usage error.
  const std::string missing_spec = (fs::path(::testing::TempDir()) / "no-such-spec.json").string();
  CommandRun runtime = RunParsyn("job create -f " + missing_spec + " --server http://127.0.0.1:1 --api-key k");
  EXPECT_EQ(runtime.exit_code, 1) << runtime.output;
}

// `parsyn job create -f examples/...json` with --dataset/--model/--workers/--managed-workers against a real
// `parsyn server` on a new data directory: the shipped example (ids 42 and 7) is created as it is.
TEST_F(TrainCommandTest, JobCreateOverridesRunTheShippedExampleOnANewServer) {
  const std::string data_dir = Path("server");
  ASSERT_NO_FATAL_FAILURE(StartServer(data_dir));
  const std::string remote = " --data-dir " + data_dir;

  ASSERT_EQ(
      RunParsyn("model init --out " + Path("model") + " --hidden-size 32 --layers 1 --heads 2 --seed 3").exit_code, 0);
  CommandRun model = RunParsyn("model upload " + Path("model") + remote);
  ASSERT_EQ(model.exit_code, 0) << model.output;
  std::ofstream data(dir_ / "train.jsonl");
  for (int i = 0; i < 40; ++i)
    data << R"({"prompt": "q)" << i << R"(", "completion": " a"})"
         << "\n";
  data.close();
  CommandRun dataset = RunParsyn("dataset upload " + Path("train.jsonl") + remote);
  ASSERT_EQ(dataset.exit_code, 0) << dataset.output;
  std::string first_token;
  for (const char* worker : {"--name own-a", "--name own-b", "--name platform-1 --kind managed"}) {
    CommandRun registered = RunParsyn(std::string("worker register ") + worker + remote);
    ASSERT_EQ(registered.exit_code, 0) << registered.output;
    const size_t token_at = registered.output.find("): ");
    if (first_token.empty() && token_at != std::string::npos) {
      first_token = registered.output.substr(token_at + 3, registered.output.find('\n', token_at) - token_at - 3);
    }
  }  // a new server: model 1, dataset 1, workers 1 and 2 (own) and 3 (managed)

  // A worker started without --name logs under its registered name once the coordinator has answered its hello.
  SubprocessOptions worker_options;
  worker_options.output = SubprocessOptions::Output::kFile;
  worker_options.output_file = dir_ / "worker.log";
  worker_options.environment = {{"PARSYN_WORKER_TOKEN", first_token}};
  const std::string url = nlohmann::json::parse(std::ifstream(dir_ / "server" / "server.json"))["url"];
  StatusOr<Subprocess> worker =
      Subprocess::Start(test_support::BuildPath("parsyn"),
                        {"worker", "--server", url, "--cache-dir", Path("worker-cache")}, worker_options);
  ASSERT_TRUE(worker.ok()) << worker.status().message();
  auto worker_log = [&] {
    std::ifstream in(dir_ / "worker.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (int i = 0; i < 600 && worker_log().find(": online") == std::string::npos && !worker->HasExited(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(worker_log().find("worker own-a: online"), std::string::npos) << worker_log();
  worker->Terminate();
  worker->Wait();

  const std::string example = test_support::SourcePath("examples/distributed-llama-finetune.json");
  CommandRun as_shipped = RunParsyn("job create -f " + example + remote);
  EXPECT_EQ(as_shipped.exit_code, 1) << as_shipped.output;
  EXPECT_NE(as_shipped.output.find("dataset 42 does not exist"), std::string::npos) << as_shipped.output;

  CommandRun too_many = RunParsyn("job create -f " + example + remote + " --managed-workers 2");
  EXPECT_EQ(too_many.exit_code, 1) << too_many.output;
  EXPECT_NE(too_many.output.find("--managed-workers 2: the server has 1 managed workers"), std::string::npos)
      << too_many.output;

  CommandRun created =
      RunParsyn("job create -f " + example + remote + " --dataset 1 --model 1 --workers 1,2 --managed-workers 1");
  ASSERT_EQ(created.exit_code, 0) << created.output;
  EXPECT_NE(created.output.find("created training job 1"), std::string::npos) << created.output;
  CommandRun got = RunParsyn("job get 1" + remote, /*with_stderr=*/false);
  ASSERT_EQ(got.exit_code, 0) << got.output;
  const nlohmann::json job = nlohmann::json::parse(got.output);
  EXPECT_EQ(job["dataset_id"], 1);
  EXPECT_EQ(job["model_id"], 1);
  EXPECT_EQ(job["spec"]["worker_selection"]["worker_ids"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(job["spec"]["worker_selection"]["parsyn_worker_ids"], nlohmann::json::array({3}));
  EXPECT_EQ(job["spec"]["worker_selection"]["mode"], "mixed");

  // Only own workers: the example's managed list is dropped and the mode follows.
  CommandRun own_only =
      RunParsyn("job create -f " + example + remote + " --dataset 1 --model 1 --workers 1,2 --managed-workers 0");
  ASSERT_EQ(own_only.exit_code, 0) << own_only.output;
  const nlohmann::json job2 = nlohmann::json::parse(RunParsyn("job get 2" + remote, false).output);
  EXPECT_EQ(job2["spec"]["worker_selection"]["mode"], "own");
  EXPECT_EQ(job2["spec"]["worker_selection"].value("parsyn_worker_ids", nlohmann::json::array()),
            nlohmann::json::array());
}

// Where the coordinator commands find the server and key: flags > environment > config file > the data directory;
// a config file's mistakes are errors naming FILE:LINE.
TEST_F(TrainCommandTest, ConfigFileEnvironmentAndFlagsResolveInThatOrder) {
  const std::string data_dir = Path("server");
  ASSERT_NO_FATAL_FAILURE(StartServer(data_dir));
  const std::string url = nlohmann::json::parse(std::ifstream(dir_ / "server" / "server.json"))["url"];
  fs::create_directories(dir_ / "xdg" / "parsyn");
  const fs::path config = dir_ / "xdg" / "parsyn" / "config.toml";
  ::setenv("XDG_CONFIG_HOME", Path("xdg").c_str(), 1);
  for (const char* name : {"PARSYN_CONFIG", "PARSYN_SERVER", "PARSYN_API_KEY", "PARSYN_KEY_FILE", "PARSYN_DATA_DIR"}) {
    ::unsetenv(name);
  }
  // Run from a folder without ./parsyn-data, so that only what the test sets can name the server.
  const std::string cd = "cd " + Path("xdg") + " && ";
  auto list = [&](const std::string& flags) {
    return RunShell(cd + test_support::BuildPath("parsyn") + " worker list " + flags + " 2>&1");
  };

  EXPECT_NE(list("").output.find("no server"), std::string::npos);
  // The default config file ($XDG_CONFIG_HOME/parsyn/config.toml); key_file relative to its folder.
  fs::copy_file(dir_ / "server" / "admin-key", dir_ / "xdg" / "parsyn" / "admin-key");
  std::ofstream(config) << "# written by the test\nserver = \"" << url << "\"\nkey_file = \"admin-key\"\n";
  CommandRun from_config = list("");
  EXPECT_EQ(from_config.exit_code, 0) << from_config.output;
  EXPECT_NE(from_config.output.find("ID    NAME"), std::string::npos) << from_config.output;

  // The environment beats the config file, and flags beat the environment.
  ::setenv("PARSYN_SERVER", "http://127.0.0.1:1", 1);
  CommandRun env_wins = list("");
  EXPECT_EQ(env_wins.exit_code, 1);
  EXPECT_NE(env_wins.output.find("127.0.0.1:1"), std::string::npos) << env_wins.output;
  EXPECT_EQ(list("--server " + url).exit_code, 0);
  ::unsetenv("PARSYN_SERVER");
  ::setenv("PARSYN_KEY_FILE", Path("no-such-key").c_str(), 1);
  CommandRun bad_key_file = list("");
  EXPECT_EQ(bad_key_file.exit_code, 1);
  EXPECT_NE(bad_key_file.output.find("the admin key file " + Path("no-such-key") + " (PARSYN_KEY_FILE) cannot be read"),
            std::string::npos)
      << bad_key_file.output;
  EXPECT_EQ(list("--key-file " + Path("server/admin-key")).exit_code, 0);
  ::unsetenv("PARSYN_KEY_FILE");

  // --config and PARSYN_CONFIG name another file, which must exist; its errors name the file and line.
  std::ofstream(dir_ / "bad.toml") << "server = \"" << url << "\"\napi_key = \"k\"\n";
  CommandRun unknown_key = list("--config " + Path("bad.toml"));
  EXPECT_EQ(unknown_key.exit_code, 1);
  EXPECT_NE(unknown_key.output.find("parsyn worker list: " + Path("bad.toml") + ":2: unknown key 'api_key'"),
            std::string::npos)
      << unknown_key.output;
  ::setenv("PARSYN_CONFIG", Path("missing.toml").c_str(), 1);
  CommandRun missing = list("");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("config file " + Path("missing.toml") + " does not exist (named by PARSYN_CONFIG)"),
            std::string::npos)
      << missing.output;
  ::unsetenv("PARSYN_CONFIG");
  ::unsetenv("XDG_CONFIG_HOME");
}

// --output json: the API's JSON (or the documented object) alone on stdout, for every command that prints data;
// progress bars only on a terminal or with --progress, and on stderr.
TEST_F(TrainCommandTest, OutputJsonPrintsOnlyJsonOnStdout) {
  const std::string data_dir = Path("server");
  ASSERT_NO_FATAL_FAILURE(StartServer(data_dir));
  const std::string remote = " --data-dir " + data_dir + " --output json";
  // stdout alone (stderr dropped) must parse as one JSON document.
  auto json_of = [&](const std::string& args, int exit_code = 0) {
    CommandRun run = RunParsyn(args + remote, /*with_stderr=*/false);
    EXPECT_EQ(run.exit_code, exit_code) << args << ": " << run.output;
    nlohmann::json parsed = nlohmann::json::parse(run.output, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << args << " printed more than JSON:\n" << run.output;
    return parsed;
  };
  ASSERT_EQ(
      RunParsyn("model init --out " + Path("model") + " --hidden-size 32 --layers 1 --heads 2 --seed 3").exit_code, 0);
  std::ofstream data(dir_ / "train.jsonl");
  for (int i = 0; i < 40; ++i)
    data << R"({"prompt": "q)" << i << R"(", "completion": " a"})"
         << "\n";
  data.close();

  const nlohmann::json model = json_of("model upload " + Path("model"));
  EXPECT_EQ(model["id"], 1);
  EXPECT_EQ(model["name"], "model");
  const nlohmann::json dataset = json_of("dataset upload " + Path("train.jsonl"));
  EXPECT_EQ(dataset["id"], 1);
  EXPECT_EQ(dataset["row_count"], 40);
  const nlohmann::json worker = json_of("worker register --name w1");
  EXPECT_EQ(worker["name"], "w1");
  EXPECT_TRUE(worker["token"].is_string());
  json_of("worker register --name w2");
  const nlohmann::json job = json_of("job create -f " + test_support::SourcePath("examples") +
                                     "/distributed-llama-finetune.json --dataset 1 --model 1 --workers 1,2 "
                                     "--managed-workers 0");
  EXPECT_EQ(job["id"], 1);
  EXPECT_EQ(job["status"], "queued");
  EXPECT_EQ(json_of("job get 1")["id"], 1);
  EXPECT_EQ(json_of("job list")["training_jobs"][0]["id"], 1);
  EXPECT_TRUE(json_of("job list")["next_cursor"].is_null());
  EXPECT_EQ(json_of("worker list")["workers"].size(), 2u);
  EXPECT_EQ(json_of("dataset list")["datasets"][0]["name"], "train.jsonl");
  EXPECT_EQ(json_of("model list")["models"][0]["model_type"], model["model_type"]);
  EXPECT_EQ(json_of("dataset get 1")["row_count"], 40);
  EXPECT_EQ(json_of("model get 1")["name"], "model");
  EXPECT_EQ(json_of("worker get 2")["name"], "w2");
  CommandRun missing = RunParsyn("dataset get 9" + remote);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("parsyn dataset get: "), std::string::npos) << missing.output;
  // The job ends here (cancelled), and `job watch` prints the ended job (exiting 1: it did not succeed).
  EXPECT_EQ(json_of("job cancel 1")["id"], 1);
  const nlohmann::json watched = json_of("job watch 1", /*exit_code=*/1);
  EXPECT_EQ(watched["status"], "cancelled");

  // Text stays the default; a bad --output value is a usage error.
  CommandRun text = RunParsyn("dataset list --data-dir " + data_dir);
  EXPECT_NE(text.output.find("ID    NAME"), std::string::npos) << text.output;
  EXPECT_EQ(RunParsyn("dataset list --data-dir " + data_dir + " --output yaml").exit_code, 2);
  // In text mode stop/cancel say what happened in a line, not the job's JSON.
  EXPECT_EQ(json_of("job create -f " + test_support::SourcePath("examples") +
                    "/distributed-llama-finetune.json --dataset 1 --model 1 --workers 1,2 --managed-workers 0")["id"],
            2);
  CommandRun cancelled = RunParsyn("job cancel 2 --data-dir " + data_dir, /*with_stderr=*/false);
  EXPECT_EQ(cancelled.exit_code, 0) << cancelled.output;
  EXPECT_EQ(cancelled.output, "job 2: cancelled\n");

  // Transfer bars: none when stderr is not a terminal (here), shown with --progress, never on stdout.
  CommandRun quiet = RunParsyn("dataset upload " + Path("train.jsonl") + " --name quiet --data-dir " + data_dir);
  EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_EQ(quiet.output.find("[#"), std::string::npos) << quiet.output;
  CommandRun forced = RunShell(test_support::BuildPath("parsyn") + " dataset upload " + Path("train.jsonl") +
                               " --name forced --progress --data-dir " + data_dir + " 2>&1 >/dev/null");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_NE(forced.output.find("[########################]"), std::string::npos) << forced.output;
  EXPECT_NE(forced.output.find("forced"), std::string::npos) << forced.output;
  CommandRun model_bars = RunShell(test_support::BuildPath("parsyn") + " model upload " + Path("model") +
                                   " --name again --progress --data-dir " + data_dir + " 2>&1 >/dev/null");
  EXPECT_NE(model_bars.output.find("  config.json"), std::string::npos) << model_bars.output;
  EXPECT_NE(model_bars.output.find("  model.safetensors"), std::string::npos) << model_bars.output;
}

// parsyn completion bash|zsh: generated from the app, so it completes the commands and options this build has.
TEST(CliCompletionTest, BashScriptCompletesCommandsAndOptions) {
  const fs::path script = fs::path(::testing::TempDir()) / "parsyn-completion.bash";
  ASSERT_EQ(RunShell(test_support::BuildPath("parsyn") + " completion bash > " + script.string()).exit_code, 0);
  CommandRun syntax = RunShell("bash -n " + script.string() + " 2>&1");
  EXPECT_EQ(syntax.exit_code, 0) << syntax.output;
  // What bash offers for the words typed so far (the last one being completed), as `complete -F` would call it.
  auto complete = [&](const std::string& words) {
    CommandRun run =
        RunShell("bash -c 'source " + script.string() + " && complete -p parsyn >/dev/null && COMP_WORDS=(" + words +
                 ") && COMP_CWORD=$((${#COMP_WORDS[@]} - 1)) && _parsyn && "
                 "echo \"${COMPREPLY[*]}\"' 2>&1");
    EXPECT_EQ(run.exit_code, 0) << words << ": " << run.output;
    return std::string(Trim(run.output));
  };
  EXPECT_EQ(complete("parsyn jo"), "job");
  EXPECT_EQ(complete("parsyn job cr"), "create");
  EXPECT_EQ(complete("parsyn job create --da"), "--data-dir --dataset");
  EXPECT_EQ(complete("parsyn dataset upload --out"), "--output");
  EXPECT_EQ(complete("parsyn comp"), "completion");
  EXPECT_EQ(complete("parsyn worker register --name gpu-1 --ki"), "--kind");
  // After an option that takes a value, the shell's own (file name) completion: nothing offered here.
  EXPECT_EQ(complete("parsyn job create -f \"\""), "");
  EXPECT_EQ(RunParsyn("completion fish").exit_code, 2);
}

TEST(CliCompletionTest, ZshScriptHasTheSameTables) {
  CommandRun zsh = RunParsyn("completion zsh", /*with_stderr=*/false);
  ASSERT_EQ(zsh.exit_code, 0) << zsh.output;
  EXPECT_EQ(zsh.output.rfind("#compdef parsyn\n", 0), 0u) << zsh.output;
  EXPECT_NE(zsh.output.find("    \"job\") echo \"create list get watch stop cancel download\" ;;"), std::string::npos)
      << zsh.output;
  EXPECT_NE(zsh.output.find("compdef _parsyn parsyn"), std::string::npos);
  EXPECT_NE(zsh.output.find("compadd -a candidates"), std::string::npos);
  if (RunShell("command -v zsh >/dev/null").exit_code == 0) {  // a real check where zsh is installed
    const fs::path script = fs::path(::testing::TempDir()) / "_parsyn";
    std::ofstream(script) << zsh.output;
    CommandRun syntax = RunShell("zsh -n " + script.string() + " 2>&1");
    EXPECT_EQ(syntax.exit_code, 0) << syntax.output;
  }
}

}  // namespace
}  // namespace parsyn::cli
