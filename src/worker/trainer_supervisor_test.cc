// TrainerSupervisor against real trainer processes: a small Python script that keeps or breaks each rule of the
// trainer contract, chosen by its first argument.
#include "worker/trainer_supervisor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "base/sha256.h"
#include "protocol/trainer_task.h"
#include "weights/safetensors.h"

namespace parsyn::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The trainer: `trainer.py MODE run TASK` writes its outputs by MODE; `--describe` prints a description.
constexpr char kTrainerScript[] = R"PY(
import json, shutil, signal, sys, time
mode = sys.argv[1]
if sys.argv[2] == "--describe":
    if mode == "bad_describe":
        print("not json")
    else:
        print(json.dumps({"contract_versions": [1], "task_kinds": ["train"], "model_kinds": ["*"]}))
    sys.exit(0)
task = json.load(open(sys.argv[3]))
out = task["output"]
def progress(step):
    print(json.dumps({"event": "progress", "step": step, "total_steps": 2, "loss": 0.5,
                      "throughput": 10.0, "throughput_unit": "samples/s"}), flush=True)
progress(1)
if mode == "garbage":
    print("loading model...", flush=True)
if mode == "hang":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
    time.sleep(60)
if mode == "ignore_sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
if mode == "fail":
    print(json.dumps({"event": "error", "code": "invalid_argument", "message": "data.csv:3: bad row"}))
    sys.exit(1)
if mode == "crash":
    sys.exit(7)
progress(2)
json.dump({"num_samples": 5, "train_loss": 0.4} if mode != "bad_result" else {"train_loss": 0.4},
          open(out["result"], "w"))
if mode != "no_update":
    source = {"wrong_layout": "wrong.safetensors", "nan": "nan.safetensors"}.get(mode, task["initial_weights"])
    shutil.copy(source if "/" in source else task["initial_weights"].rsplit("/", 1)[0] + "/" + source, out["weights"])
if mode != "no_done":
    print(json.dumps({"event": "done", "num_samples": 5}))
)PY";

class TrainerSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("supervisor-" + std::to_string(::getpid()) + "-" +
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "out");
    std::ofstream(dir_ / "trainer.py") << kTrainerScript;
    WriteWeights("global.safetensors", {2, 2}, 1.0f);
    WriteWeights("wrong.safetensors", {4, 2}, 1.0f);
    WriteWeights("nan.safetensors", {2, 2}, std::nanf(""));
    task_.kind = protocol::TaskKind::kTrain;
    task_.initial_weights = (dir_ / "global.safetensors").string();
    task_.data = (dir_ / "data.csv").string();
    task_.output_weights = (dir_ / "out/update.safetensors").string();
    task_.output_result = (dir_ / "out/result.json").string();
    std::ofstream(dir_ / "task.json") << protocol::TrainerTaskToJson(task_).dump();
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteWeights(const std::string& name, std::vector<int64_t> shape, float value) {
    weights::WeightSet set;
    std::vector<float> values(static_cast<size_t>(shape[0] * shape[1]), value);
    ASSERT_TRUE(set.Add("layers.0.weight", weights::DType::kF32, shape, std::as_bytes(std::span(values))).ok());
    ASSERT_TRUE(weights::WriteSafetensorsFile(set, dir_ / name).ok());
  }

  TrainerCommand Trainer(const std::string& mode) {
    return {.name = "scripted", .argv = {"/usr/bin/python3", (dir_ / "trainer.py").string(), mode}};
  }

  StatusOr<TrainerOutput> Run(const std::string& mode, TrainerRunOptions options = {}) {
    return supervisor_.Run(Trainer(mode), dir_ / "task.json", task_, options);
  }

  fs::path dir_;
  protocol::TrainerTask task_;
  ProcessTrainerLauncher launcher_{std::chrono::milliseconds(500)};
  TrainerSupervisor supervisor_{launcher_};
};

TEST_F(TrainerSupervisorTest, TaskThatKeepsTheRulesGivesItsCheckedOutput) {
  std::vector<int64_t> steps;
  StatusOr<TrainerOutput> out =
      Run("ok", {.on_progress = [&](const protocol::TrainerProgress& p) { steps.push_back(p.step); }});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->result.num_samples, 5);
  EXPECT_EQ(out->result.train_loss, 0.4);
  EXPECT_EQ(out->update, dir_ / "out/update.safetensors");
  EXPECT_EQ(out->update_sha256, *Sha256File(dir_ / "global.safetensors"));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2}));
}

TEST_F(TrainerSupervisorTest, EachBrokenRuleIsNamedWithWhatBrokeIt) {
  const std::pair<const char*, const char*> cases[] = {
      {"wrong_layout",
       "trainer 'scripted' broke rule 'layout': tensor 'layers.0.weight' has shape [4, 2], expected [2, 2]"},
      {"nan", "trainer 'scripted' broke rule 'finite': tensor 'layers.0.weight' has a non-finite value (nan)"},
      {"garbage", "trainer 'scripted' broke rule 'stdout': line 2 is not a JSON event: \"loading model...\""},
      {"no_done", "trainer 'scripted' broke rule 'done': it exited 0 without a done event"},
      {"no_update", "trainer 'scripted' broke rule 'update': no update was written to update.safetensors"},
      {"bad_result", "trainer 'scripted' broke rule 'result': result.num_samples is required"},
      {"crash", "trainer 'scripted' broke rule 'exit': it exited with status 7 without an error event"},
      {"fail", "trainer 'scripted' exited with status 1: invalid_argument: data.csv:3: bad row"},
  };
  for (const auto& [mode, message] : cases) {
    fs::remove_all(dir_ / "out");
    fs::create_directories(dir_ / "out");
    StatusOr<TrainerOutput> out = Run(mode);
    // A rule broken is the trainer's fault; a failure it reported is the task's (its data, its memory).
    EXPECT_EQ(out.status().code(),
              std::string(mode) == "fail" ? StatusCode::kFailedPrecondition : StatusCode::kInvalidArgument)
        << mode;
    EXPECT_THAT(out.status().message(), HasSubstr(message)) << mode;
  }
}

TEST_F(TrainerSupervisorTest, TrainerPastTheDeadlineIsStoppedAndFails) {
  const auto started = std::chrono::steady_clock::now();
  StatusOr<TrainerOutput> out = Run("hang", {.deadline = started + std::chrono::milliseconds(300)});
  EXPECT_EQ(out.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(out.status().message(), HasSubstr("trainer 'scripted' broke rule 'timeout'"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

// A stop (the coordinator dropped the task) sends SIGTERM; a trainer that ignores it is killed after the grace.
TEST_F(TrainerSupervisorTest, StopEndsEvenATrainerThatIgnoresSigterm) {
  std::stop_source stop;
  const auto started = std::chrono::steady_clock::now();
  StatusOr<TrainerOutput> out =
      Run("ignore_sigterm",
          {.stop = stop.get_token(), .on_progress = [&](const protocol::TrainerProgress&) { stop.request_stop(); }});
  EXPECT_EQ(out.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

TEST_F(TrainerSupervisorTest, DescribeReadsTheDescriptionOrSaysWhatWasWrong) {
  StatusOr<protocol::TrainerDescription> d = supervisor_.Describe(Trainer("ok"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->TrainsModelKind("custom"));
  StatusOr<protocol::TrainerDescription> bad = supervisor_.Describe(Trainer("bad_describe"));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("did not print one JSON object: \"not json \""));
}

TEST(TrainerCommandTest, SplitsLikeAShellWithoutExpansions) {
  EXPECT_EQ(*SplitCommandLine(R"(python3  'my trainer.py' --name "a \"b\"" c\ d)"),
            (std::vector<std::string>{"python3", "my trainer.py", "--name", "a \"b\"", "c d"}));
  EXPECT_EQ(SplitCommandLine("python3 'open").status().message(), "the command has an unterminated ' quote");
  EXPECT_EQ(SplitCommandLine("  ").status().message(), "the command is empty");
  const TrainerCommand c{.name = "t", .argv = {"/usr/bin/python3", "my trainer.py"}};
  EXPECT_EQ(c.CommandLine(), "/usr/bin/python3 'my trainer.py'");
}

TEST(TrainerCommandTest, NameAndProgramAreChecked) {
  StatusOr<TrainerCommand> ok = ParseTrainerCommand("tabular=sh -c true");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->name, "tabular");
  EXPECT_TRUE(fs::path(ok->argv[0]).is_absolute()) << ok->argv[0];  // found in $PATH
  EXPECT_EQ(ok->argv.size(), 3u);
  EXPECT_THAT(ParseTrainerCommand("python3 train.py").status().message(), HasSubstr("--trainer takes NAME=COMMAND"));
  EXPECT_THAT(ParseTrainerCommand("my trainer=python3").status().message(), HasSubstr("the name 'my trainer'"));
  const StatusOr<TrainerCommand> missing = ParseTrainerCommand("t=no-such-program-here x");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no program 'no-such-program-here' in $PATH"));
}

}  // namespace
}  // namespace parsyn::worker
