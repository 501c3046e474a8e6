// Task mode, end to end: `parsyn-trainer run TASK.json` as a child process, as the worker runs it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/testing/build_paths.h"
#include "protocol/trainer_events.h"
#include "trainer/model_init.h"
#include "trainer/tabular_test_data.h"
#include "trainer/task.h"
#include "trainer/torch_weights.h"
#include "weights/safetensors.h"

extern char** environ;

namespace parsyn::trainer {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A running parsyn-trainer: stdout read line by line through a pipe, stderr to a file.
class TrainerProcess {
 public:
  TrainerProcess(const std::vector<std::string>& args, const fs::path& stderr_path) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const std::string trainer = test_support::BuildPath("parsyn-trainer");
    std::vector<std::string> full = {trainer};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, trainer.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~TrainerProcess() {
    if (out_) fclose(out_);
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Next stdout line parsed as JSON; null at end of output.
  json NextEvent() {
    char* line = nullptr;
    size_t capacity = 0;
    const ssize_t n = getline(&line, &capacity, out_);
    json event = n > 0 ? json::parse(std::string(line, static_cast<size_t>(n))) : json(nullptr);
    free(line);
    return event;
  }
  std::vector<json> AllEvents() {
    std::vector<json> events;
    for (json e = NextEvent(); !e.is_null(); e = NextEvent()) events.push_back(e);
    return events;
  }
  void Signal(int signal) { kill(pid_, signal); }
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    waited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  bool waited_ = false;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

class TaskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("task_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  json TabularTask(int64_t rows) {
    WriteFile(dir_ / "data.csv", testing::SeparableCsv(rows, 4));
    return json{
        {"data", "data.csv"},
        {"config",
         {{"model_type", "mlp"},
          {"hidden_sizes", {16}},
          {"epochs", 4},
          {"batch_size", 16},
          {"learning_rate", 1e-2},
          {"validation_fraction", 0.2}}},
        {"seed", 1},
        {"device", "cpu"},
        {"threads", 1},
        {"output", {{"weights", "out/update.safetensors"}, {"result", "out/result.json"}, {"model_dir", "out/model"}}}};
  }

  int RunTask(const json& task, std::vector<json>* events = nullptr) {
    WriteFile(dir_ / "task.json", task.dump());
    TrainerProcess process({"run", (dir_ / "task.json").string()}, dir_ / "stderr.txt");
    std::vector<json> all = process.AllEvents();
    if (events) *events = std::move(all);
    return process.Wait();
  }

  std::string Stderr() { return ReadFile(dir_ / "stderr.txt"); }

  fs::path dir_;
};

TEST(ParseTrainTaskTest, ResolvesPathsAndReadsOptionalFields) {
  const json j = {{"model_dir", "m"},
                  {"data", "/abs/data.jsonl"},
                  {"config", {{"use_peft", true}}},
                  {"steps", 5},
                  {"seed", 3},
                  {"schedule", {{"start_step", 10}, {"total_steps", 100}}},
                  {"output", {{"weights", "out/w.safetensors"}, {"result", "out/r.json"}}}};
  auto task = ParseTrainTask(j, "/base");
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(task->model_dir, fs::path("/base/m"));
  EXPECT_EQ(task->data, fs::path("/abs/data.jsonl"));
  EXPECT_EQ(task->steps, 5);
  EXPECT_EQ(task->seed, 3u);
  EXPECT_EQ(task->split_seed, 0u);
  EXPECT_EQ(task->schedule_start_step, 10);
  EXPECT_EQ(task->schedule_total_steps, 100);
  EXPECT_TRUE(task->config.training.use_peft);
  EXPECT_DOUBLE_EQ(task->config.training.validation_fraction, 0.1);
  EXPECT_EQ(task->output_weights, fs::path("/base/out/w.safetensors"));
  EXPECT_TRUE(task->output_model_dir.empty());
  EXPECT_EQ(task->proximal_mu, 0);  // absent: plain training

  json fedprox = j;
  fedprox["proximal_mu"] = 0.01;
  auto with_mu = ParseTrainTask(fedprox, "/base");
  ASSERT_TRUE(with_mu.ok()) << with_mu.status().ToString();
  EXPECT_DOUBLE_EQ(with_mu->proximal_mu, 0.01);

  // The platform's held-out share replaces the config's, beyond the job's 0.5 where a small shard needs it.
  json held_out = j;
  held_out["validation_fraction"] = 2.0 / 3.0;
  auto with_share = ParseTrainTask(held_out, "/base");
  ASSERT_TRUE(with_share.ok()) << with_share.status().ToString();
  EXPECT_DOUBLE_EQ(with_share->config.training.validation_fraction, 2.0 / 3.0);
}

TEST(ParseTrainTaskTest, RejectsMissingOrMalformedFields) {
  const json output = {{"weights", "w"}, {"result", "r"}};
  struct Case {
    json task;
    const char* message;
  };
  const Case cases[] = {
      {{{"output", output}}, "task.data is required"},
      {{{"data", "d.csv"}}, "task.output is required"},
      {{{"data", "d.csv"}, {"output", {{"weights", "w"}}}}, "task.output.result is required"},
      {{{"data", "d.csv"}, {"output", output}, {"steps", -1}}, "task.steps (-1) must be between 0 and"},
      {{{"data", "d.csv"}, {"output", output}, {"data_format", "xml"}}, "task.data_format must be one of"},
      {{{"data", "d.csv"}, {"output", output}, {"config", {{"lora_r", 0}}}},
       "config.lora_r (0) must be between 1 and 1024"},
      {{{"data", "d.csv"}, {"output", output}, {"proximal_mu", -1}}, "task.proximal_mu (-1) must be >= 0 and <= 1e+06"},
      {{{"data", "d.csv"}, {"output", output}, {"proximal_mu", 1e7}},
       "task.proximal_mu (1e+07) must be >= 0 and <= 1e+06"},
      {{{"data", "d.csv"}, {"output", output}, {"proximal_mu", "0.1"}},
       "task.proximal_mu must be a number, got string"},
  };
  for (const Case& c : cases) {
    auto task = ParseTrainTask(c.task, "/base");
    ASSERT_FALSE(task.ok()) << c.task.dump();
    EXPECT_EQ(task.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(task.status().message().find(c.message), std::string::npos) << task.status().message();
  }
}

TEST_F(TaskTest, TabularTaskReportsProgressAndWritesOutputs) {
  std::vector<json> events;
  ASSERT_EQ(RunTask(TabularTask(200), &events), 0) << Stderr();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.front()["event"], "start");
  EXPECT_EQ(events.front()["num_samples"], 160);
  EXPECT_EQ(events[1]["event"], "eval");
  EXPECT_EQ(events[1]["phase"], "before");
  int progress = 0;
  for (const json& e : events) {
    if (e["event"] != "progress") continue;
    ++progress;
    EXPECT_EQ(e["step"], progress);
    EXPECT_TRUE(e.contains("loss") && e.contains("lr") && e.contains("throughput"));
    EXPECT_EQ(e["throughput_unit"], "samples/s");
  }
  EXPECT_EQ(progress, 4 * 10);  // 160 examples / 16 per step, 4 epochs
  EXPECT_EQ(events.back()["event"], "done");

  const json result = json::parse(ReadFile(dir_ / "out/result.json"));
  ASSERT_TRUE(protocol::ParseTrainerResult(result).ok()) << result.dump();  // the trainer contract's result
  EXPECT_EQ(result["kind"], "tabular");
  EXPECT_EQ(result["num_samples"], 160);
  EXPECT_EQ(result["num_validation"], 40);
  EXPECT_EQ(result["metrics"]["steps"], 40);
  EXPECT_TRUE(result["train_loss"].is_number());
  EXPECT_GE(result["validation_after"]["accuracy"].get<double>(), 0.95);
  EXPECT_LT(result["validation_after"]["loss"].get<double>(), result["validation_before"]["loss"].get<double>());
  EXPECT_EQ(result["weights_sha256"].get<std::string>().size(), 64u);

  auto weights = weights::ReadSafetensorsFile(dir_ / "out/update.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  EXPECT_NE(weights->Find("layers.0.weight"), nullptr);
  EXPECT_TRUE(fs::exists(dir_ / "out/model/tabular_model.json"));
}

TEST_F(TaskTest, EvaluationOnlyWithReceivedWeights) {
  // First task creates a model; the second evaluates it with steps 0 from its saved weights.
  ASSERT_EQ(RunTask(TabularTask(60)), 0) << Stderr();
  json task = TabularTask(60);
  task["model_dir"] = "out/model";
  task["initial_weights"] = "out/update.safetensors";
  task["steps"] = 0;
  task["output"] = {{"weights", "eval/update.safetensors"}, {"result", "eval/result.json"}};
  std::vector<json> events;
  ASSERT_EQ(RunTask(task, &events), 0) << Stderr();
  for (const json& e : events) EXPECT_NE(e["event"], "progress");
  const json first = json::parse(ReadFile(dir_ / "out/result.json"));
  const json result = json::parse(ReadFile(dir_ / "eval/result.json"));
  EXPECT_EQ(result["metrics"]["steps"], 0);
  EXPECT_TRUE(result["train_loss"].is_null());
  EXPECT_EQ(result["validation_before"], result["validation_after"]);
  EXPECT_NEAR(result["validation_before"]["loss"].get<double>(), first["validation_after"]["loss"].get<double>(), 1e-6);
  EXPECT_EQ(result["weights_sha256"], first["weights_sha256"]);
}

TEST_F(TaskTest, BadDataFailsNamingTheLine) {
  json task = TabularTask(20);
  WriteFile(dir_ / "data.csv", "x0,x1,label\n1,2,a\n3,4,b\n5,oops,a\n");
  std::vector<json> events;
  EXPECT_EQ(RunTask(task, &events), 1);
  const std::string err = Stderr();
  EXPECT_NE(err.find("parsyn-trainer: InvalidArgument"), std::string::npos) << err;
  EXPECT_NE(err.find("line 4"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["event"], "error");
  EXPECT_EQ(events.back()["code"], "invalid_argument");
  EXPECT_FALSE(fs::exists(dir_ / "out/result.json"));
}

TEST_F(TaskTest, BadInitialWeightsFail) {
  json task = TabularTask(30);
  WriteFile(dir_ / "bad.safetensors", "not a safetensors file");
  task["initial_weights"] = "bad.safetensors";
  EXPECT_EQ(RunTask(task), 1);
  EXPECT_NE(Stderr().find("initial weights"), std::string::npos) << Stderr();
}

TEST_F(TaskTest, UnknownTaskKeyIsRejected) {
  json task = TabularTask(30);
  task["stepz"] = 3;
  EXPECT_EQ(RunTask(task), 1);
  EXPECT_NE(Stderr().find("unknown field task.stepz"), std::string::npos) << Stderr();
}

TEST_F(TaskTest, OtherContractVersionIsRefusedByItsCode) {
  json task = TabularTask(30);
  task["contract_version"] = 2;
  std::vector<json> events;
  EXPECT_EQ(RunTask(task, &events), 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["code"], "unsupported_contract_version");
  EXPECT_EQ(events[0]["message"], "task.contract_version 2 is not supported: this trainer reads version 1");
  EXPECT_FALSE(fs::exists(dir_ / "out"));
}

TEST_F(TaskTest, DescribeSaysWhatItTrains) {
  TrainerProcess process({"--describe"}, dir_ / "stderr.txt");
  const json described = process.NextEvent();
  EXPECT_EQ(process.Wait(), 0);
  StatusOr<protocol::TrainerDescription> d = protocol::ParseTrainerDescription(described);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->TrainsModelKind("llama") && d->TrainsModelKind("tabular-mlp"));
  EXPECT_FALSE(d->TrainsModelKind("custom"));
}

// With validation_data, every row of data trains and exactly that file's rows validate.
TEST_F(TaskTest, ValidationFileHoldsTheValidationRows) {
  json task = TabularTask(100);
  WriteFile(dir_ / "validation.csv", testing::SeparableCsv(30, 4));
  task["validation_data"] = "validation.csv";
  task["config"]["epochs"] = 1;
  ASSERT_EQ(RunTask(task), 0) << Stderr();
  const json result = json::parse(ReadFile(dir_ / "out/result.json"));
  EXPECT_EQ(result["num_samples"], 100);
  EXPECT_EQ(result["num_validation"], 30);
  EXPECT_EQ(result["validation_before"]["num_examples"], 30);
}

TEST_F(TaskTest, SigtermStopsPromptly) {
  json task = TabularTask(200);
  task["steps"] = 10'000'000;
  WriteFile(dir_ / "task.json", task.dump());
  TrainerProcess process({"run", (dir_ / "task.json").string()}, dir_ / "stderr.txt");
  // Wait for training to be under way (a progress line), not for a fixed time.
  for (json e = process.NextEvent(); !e.is_null() && e["event"] != "progress"; e = process.NextEvent()) {
  }
  process.Signal(SIGTERM);
  const std::vector<json> rest = process.AllEvents();
  EXPECT_EQ(process.Wait(), 3) << Stderr();
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back()["code"], "cancelled");
  EXPECT_FALSE(fs::exists(dir_ / "out/result.json"));
}

// FedProx through parsyn-trainer on a LoRA task: the proximal term covers the adapters, anchored to the received
// adapters (initial_weights, as a worker passes the round's global). proximal_mu 0 gives the plain run's bytes; a
// large mu ends nearer the global than the plain run.
TEST_F(TaskTest, ProximalMuKeepsLoraAdaptersNearTheReceivedGlobal) {
  ModelInitOptions init;
  init.hidden_size = 32;
  init.num_hidden_layers = 1;
  init.num_attention_heads = 2;
  init.seed = 5;
  ASSERT_TRUE(InitModelFolder(dir_ / "model", init).ok());
  std::string data;
  for (int i = 0; i < 16; ++i)
    data += R"({"prompt": "say )" + std::to_string(i) +
            R"(:", "completion": " ok"})"
            "\n";
  WriteFile(dir_ / "data.jsonl", data);
  auto task_with = [&](const std::string& out, std::optional<double> mu) {
    json task = {{"model_dir", "model"},
                 {"data", "data.jsonl"},
                 {"config",
                  {{"use_peft", true},
                   {"lora_r", 4},
                   {"lora_alpha", 8},
                   {"lora_dropout", 0.0},
                   {"batch_size", 4},
                   {"max_seq_len", 32},
                   {"learning_rate", 1e-2},
                   {"lr_scheduler", "constant"},
                   {"validation_fraction", 0.25}}},
                 {"steps", 6},
                 {"seed", 2},
                 {"threads", 1},
                 {"output", {{"weights", out + "/update.safetensors"}, {"result", out + "/result.json"}}}};
    if (out != "global") task["initial_weights"] = "global/update.safetensors";
    if (mu) task["proximal_mu"] = *mu;
    return task;
  };
  json global = task_with("global", std::nullopt);
  global["steps"] = 0;  // the round's global adapters: the model's initial ones, exported
  ASSERT_EQ(RunTask(global), 0) << Stderr();
  ASSERT_EQ(RunTask(task_with("plain", std::nullopt)), 0) << Stderr();
  ASSERT_EQ(RunTask(task_with("zero", 0.0)), 0) << Stderr();
  ASSERT_EQ(RunTask(task_with("proximal", 1e3)), 0) << Stderr();

  auto sha = [&](const std::string& out) {
    return json::parse(ReadFile(dir_ / out / "result.json"))["weights_sha256"].get<std::string>();
  };
  EXPECT_EQ(sha("zero"), sha("plain"));
  EXPECT_NE(sha("proximal"), sha("plain"));
  auto distance_to_global = [&](const std::string& out) {
    auto start = weights::ReadSafetensorsFile(dir_ / "global/update.safetensors");
    auto end = weights::ReadSafetensorsFile(dir_ / out / "update.safetensors");
    EXPECT_TRUE(start.ok() && end.ok());
    double squared = 0;
    for (const weights::Tensor& t : end->tensors()) {
      EXPECT_NE(t.name.find("lora_"), std::string::npos) << t.name;  // adapters only
      const weights::Tensor* s = start->Find(t.name);
      EXPECT_NE(s, nullptr) << t.name;
      if (s == nullptr) continue;
      squared += (ToTorch(t).to(torch::kFloat64) - ToTorch(*s).to(torch::kFloat64)).square().sum().item<double>();
    }
    return std::sqrt(squared);
  };
  const double plain = distance_to_global("plain");
  const double proximal = distance_to_global("proximal");
  EXPECT_GT(plain, 0);
  EXPECT_LT(proximal, plain);
}

TEST_F(TaskTest, LoraTaskWritesPeftAdapter) {
  ModelInitOptions init;
  init.hidden_size = 32;
  init.num_hidden_layers = 1;
  init.num_attention_heads = 2;
  init.seed = 5;
  auto config = InitModelFolder(dir_ / "model", init);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  std::string data;
  for (int i = 0; i < 12; ++i)
    data += R"({"prompt": "say )" + std::to_string(i) +
            R"(:", "completion": " ok"})"
            "\n";
  WriteFile(dir_ / "data.jsonl", data);
  const json task = {
      {"model_dir", "model"},
      {"data", "data.jsonl"},
      {"config",
       {{"use_peft", true},
        {"lora_r", 4},
        {"lora_alpha", 8},
        {"batch_size", 4},
        {"max_seq_len", 32},
        {"learning_rate", 1e-3},
        {"validation_fraction", 0.25}}},
      {"steps", 3},
      {"seed", 2},
      {"output",
       {{"weights", "out/adapter_update.safetensors"}, {"result", "out/result.json"}, {"model_dir", "out/adapter"}}}};
  std::vector<json> events;
  ASSERT_EQ(RunTask(task, &events), 0) << Stderr();
  int progress = 0;
  for (const json& e : events) {
    if (e["event"] == "progress") {
      ++progress;
      EXPECT_GT(e["throughput"].get<double>(), 0);
      EXPECT_EQ(e["throughput_unit"], "tokens/s");
    }
  }
  EXPECT_EQ(progress, 3);
  const json result = json::parse(ReadFile(dir_ / "out/result.json"));
  EXPECT_EQ(result["kind"], "language_model");
  EXPECT_EQ(result["num_samples"], 9);
  EXPECT_GT(result["metrics"]["tokens_seen"].get<int64_t>(), 0);
  EXPECT_FALSE(result["validation_before"].is_null());
  auto weights = weights::ReadSafetensorsFile(dir_ / "out/adapter_update.safetensors");
  ASSERT_TRUE(weights.ok());
  EXPECT_NE(weights->Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_TRUE(fs::exists(dir_ / "out/adapter/adapter_config.json"));
  EXPECT_TRUE(fs::exists(dir_ / "out/adapter/adapter_model.safetensors"));
}

}  // namespace
}  // namespace parsyn::trainer
