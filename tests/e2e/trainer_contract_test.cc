// The trainer contract end to end (docs/trainer-contract.md): real `parsyn server` and `parsyn worker` processes whose
// trainers are the built-in parsyn-trainer and the Python example trainers of examples/trainers, run by Debian's
// python3 with its torch. A job mixes built-in and Python workers under one trainer name; jobs name trainers the
// selected workers must offer; a trainer that breaks a rule fails its task and leaves the worker usable; a worker
// whose trainer cannot be described does not start; a custom model folder registers by its parsyn_model.json, and
// the digits CNN example trains one federated; `parsyn trainer check` passes for the built-in trainer and fails a bad
// one.
#include <cstdlib>
#include <fstream>
#include <map>

#include "base/testing/build_paths.h"
#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

const fs::path kExamples = fs::path(test_support::BuildPath("source_dir")) / "examples" / "trainers";

// Debian's python3, with its numpy and torch (a python3 earlier on PATH may lack them).
std::string PythonTrainer(const std::string& script) { return "/usr/bin/python3 " + (kExamples / script).string(); }

class TrainerContractTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(400, "16"));
    StartServerWith("points-mlp", "points.csv");
    ASSERT_GT(model_id_, 0);
  }

  json Worker(int64_t id) {
    StatusOr<http::ClientResponse> res = admin_->Get("/api/v1/workers/" + std::to_string(id));
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  }
};

// Two workers train with parsyn-trainer and one with examples/trainers/pytorch_tabular.py, which its owner maps to the
// name "builtin": every round takes all three updates, each committed global is their FedAvg by sample count
// (recomputed here from the stored updates), and the validation loss falls.
TEST_F(TrainerContractTest, PythonWorkerJoinsBuiltinWorkersAndTheGlobalIsTheirFedAvg) {
  std::vector<int64_t> ids = StartWorkers(2);
  const std::vector<int64_t> python = StartWorkers(1, {"--trainer", "builtin=" + PythonTrainer("pytorch_tabular.py")});
  ids.push_back(python[0]);
  const json announced = Worker(python[0])["trainers"];
  ASSERT_EQ(announced.size(), 1u) << announced.dump();
  EXPECT_EQ(announced[0]["name"], "builtin");
  EXPECT_EQ(announced[0]["describe"]["model_kinds"], json({"tabular-mlp", "tabular-logreg"})) << announced.dump();

  const int kRounds = 3;
  json spec = TabularJobSpec("mixed-trainers", dataset_id_, model_id_, ids, kRounds, 20);
  const int64_t job_id = CreateJob(*admin_, spec);
  ASSERT_GT(job_id, 0);
  const json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  for (const json& r : Rounds(*admin_, job_id)) {
    if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
    std::vector<int64_t> accepted;
    for (const json& u : r["updates"]) {
      if (u["status"] == "accepted") accepted.push_back(u["worker_id"].get<int64_t>());
    }
    EXPECT_EQ(accepted.size(), 3u) << r.dump();
    EXPECT_NE(std::find(accepted.begin(), accepted.end(), python[0]), accepted.end()) << r.dump();
  }
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), kRounds);
  ASSERT_TRUE(job["initial_validation_loss"].is_number() && job["final_validation_loss"].is_number()) << job.dump();
  EXPECT_LT(job["final_validation_loss"].get<double>(), job["initial_validation_loss"].get<double>()) << job.dump();
  std::printf("[figures] mixed trainers: validation loss %.4f -> %.4f over %d rounds\n",
              job["initial_validation_loss"].get<double>(), job["final_validation_loss"].get<double>(), kRounds);
}

// A job naming a trainer its selected workers do not offer is refused at creation, naming each such worker.
TEST_F(TrainerContractTest, JobNamingATrainerItsWorkersDoNotOfferIsRefused) {
  const std::vector<int64_t> ids = StartWorkers(1);
  json spec = TabularJobSpec("no-such-trainer", dataset_id_, model_id_, ids, 1, 5);
  spec["config"]["trainer"] = "tabular-py";
  StatusOr<http::ClientResponse> res = admin_->PostJson("/api/v1/training-jobs", spec);
  ASSERT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status().ToString();
  EXPECT_NE(res.status().message().find("worker " + std::to_string(ids[0]) +
                                        " (w0) offers no trainer 'tabular-py' (config.trainer); it offers builtin"),
            std::string::npos)
      << res.status().message();
}

// A trainer that writes an update of another layout fails its task with the rule and the tensor named; the round goes
// on without it, and the same worker then trains the next job with its other trainer.
TEST_F(TrainerContractTest, TrainerBreakingARuleFailsItsTaskAndTheWorkerStaysUsable) {
  const fs::path bad = tmp_.path() / "bad_trainer.py";
  std::ofstream(bad) << R"PY(
import json, struct, sys
if sys.argv[1] == "--describe":
    print(json.dumps({"contract_versions": [1], "task_kinds": ["train", "evaluate"], "model_kinds": ["*"]}))
    sys.exit(0)
task = json.load(open(sys.argv[2]))
header = json.dumps({"layers.0.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
header += b" " * (-len(header) % 8)
open(task["output"]["weights"], "wb").write(struct.pack("<Q", len(header)) + header + struct.pack("<f", 0.5))
json.dump({"num_samples": 10, "validation_before": {"loss": 1.0}}, open(task["output"]["result"], "w"))
print(json.dumps({"event": "done", "num_samples": 10}))
)PY";
  const std::vector<int64_t> ids = StartWorkers(1, {"--trainer", "bad=/usr/bin/python3 " + bad.string()});
  json spec = TabularJobSpec("bad-trainer", dataset_id_, model_id_, ids, 1, 5);
  spec["config"]["trainer"] = "bad";
  spec["distributed"]["fault_tolerance"] = 1;
  spec["distributed"]["aggregation_timeout"] = 20;
  const int64_t failing = CreateJob(*admin_, spec);
  const json failed = WaitForJobEnd(*admin_, failing, std::chrono::seconds(120));
  EXPECT_EQ(failed.value("status", ""), "failed") << failed.dump(2);
  const std::string rounds = Rounds(*admin_, failing).dump();
  EXPECT_NE(rounds.find("trainer 'bad' broke rule 'layout': tensor 'layers.0.weight' has shape [1]"), std::string::npos)
      << rounds;

  const int64_t next = CreateJob(*admin_, TabularJobSpec("after-bad", dataset_id_, model_id_, ids, 1, 5));
  const json job = WaitForJobEnd(*admin_, next, std::chrono::seconds(120));
  EXPECT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
}

// `--trainer` with a command that does not exist, or whose --describe fails, stops the worker at start with the reason.
TEST_F(TrainerContractTest, WorkerWhoseTrainerCannotBeDescribedDoesNotStart) {
  const Registered r = RegisterWorker(*admin_, "w-bad");
  const CommandResult missing = RunParsyn({"worker", "--server", server_->url(), "--token", r.token, "--trainer",
                                           "x=/no/such/trainer", "--cache-dir", (tmp_.path() / "c1").string()},
                                          std::chrono::seconds(60));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("--trainer x: /no/such/trainer does not exist or is not executable"), std::string::npos)
      << missing.output;
  const CommandResult failing = RunParsyn({"worker", "--server", server_->url(), "--token", r.token, "--trainer",
                                           "x=sh -c 'exit 5'", "--cache-dir", (tmp_.path() / "c2").string()},
                                          std::chrono::seconds(60));
  EXPECT_EQ(failing.exit_code, 1) << failing.output;
  EXPECT_NE(failing.output.find("trainer 'x' ("), std::string::npos) << failing.output;
  EXPECT_NE(failing.output.find("--describe) exited with status 5"), std::string::npos) << failing.output;
}

// A custom model folder: parsyn_model.json names the trainer and the files; a manifest that names a file the folder
// lacks, or another kind, is refused with a 400 naming it.
TEST_F(TrainerContractTest, CustomModelFolderRegistersByItsManifest) {
  const fs::path dir = tmp_.path() / "custom";
  fs::create_directories(dir);
  fs::copy_file(tmp_.path() / "model" / "model.safetensors", dir / "model.safetensors");
  std::ofstream(dir / "net.py") << "# the network's code travels with the folder\n";
  std::ofstream(dir / "parsyn_model.json")
      << R"({"kind": "custom", "trainer": "tabular-py", "files": ["model.safetensors", "net.py"]})";
  const int64_t id = UploadModel(*admin_, dir, "custom-mlp");
  StatusOr<http::ClientResponse> got = admin_->Get("/api/v1/models/" + std::to_string(id));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got->Json())["model_type"], "custom");

  std::ofstream(dir / "parsyn_model.json")
      << R"({"kind": "custom", "trainer": "tabular-py", "files": ["model.safetensors", "missing.py"]})";
  CommandResult refused =
      RunParsyn({"model", "upload", dir.string(), "--server", server_->url(), "--api-key", server_->admin_key()});
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("parsyn_model.json names the file 'missing.py', which is not among the model's files"),
            std::string::npos)
      << refused.output;
  std::ofstream(dir / "parsyn_model.json") << R"({"kind": "keras", "trainer": "t", "files": ["model.safetensors"]})";
  refused = RunParsyn({"model", "upload", dir.string(), "--server", server_->url(), "--api-key", server_->admin_key()});
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("kind must be \"custom\""), std::string::npos) << refused.output;
}

// examples/trainers/digits_cnn.py, a CNN the built-in trainer does not have, registered as a custom model and trained
// federated by `parsyn simulate` (the real JobRunner, partitioner and FedAvg) on 5 virtual workers whose shards split
// scikit-learn's digits by Dirichlet(0.5): its last global classifies held-out digits at >= 95%.
TEST(DigitsCnnTest, FiveWorkersOnADirichletSplitReachNinetyFivePercent) {
  TempDir tmp;
  const fs::path all = tmp.path() / "digits.csv";
  const std::string make_csv = "/usr/bin/python3 " +
                               (fs::path(test_support::BuildPath("source_dir")) / "bench" / "digits_csv.py").string() +
                               " " + all.string();
  ASSERT_EQ(std::system(make_csv.c_str()), 0);
  // Every fifth row is held out for the test; the rest is the federated dataset.
  {
    std::ifstream in(all);
    std::ofstream train(tmp.path() / "train.csv"), test(tmp.path() / "test.csv");
    std::string line;
    std::getline(in, line);
    train << line << "\n";
    test << line << "\n";
    for (int row = 0; std::getline(in, line); ++row) (row % 5 == 4 ? test : train) << line << "\n";
  }
  const std::string digits = PythonTrainer("digits_cnn.py");
  ASSERT_EQ(std::system((digits + " init " + (tmp.path() / "model").string() + " --seed 1").c_str()), 0);
  const json job = {{"name", "digits-cnn"},
                    {"config",
                     {{"use_peft", false},
                      {"batch_size", 32},
                      {"learning_rate", 0.003},
                      {"lr_scheduler", "constant"},
                      {"max_grad_norm", 1.0},
                      {"validation_fraction", 0.1},
                      {"seed", 3}}},
                    {"distributed",
                     {{"enabled", true},
                      {"num_rounds", 6},
                      {"steps_per_round", 80},
                      {"min_workers", 5},
                      {"max_workers", 5},
                      {"partition", {{"method", "dirichlet"}, {"alpha", 0.5}}}}}};
  std::ofstream(tmp.path() / "job.json") << job.dump(2);
  const CommandResult sim =
      RunParsyn({"simulate", "--job", (tmp.path() / "job.json").string(), "--data", (tmp.path() / "train.csv").string(),
                 "--model", (tmp.path() / "model").string(), "--workers", "5", "--parallel", "2", "--out",
                 (tmp.path() / "sim").string(), "--trainer", digits},
                std::chrono::seconds(600));
  ASSERT_EQ(sim.exit_code, 0) << sim.output;
  // The last global on the held-out rows, through the trainer's own evaluate task.
  const json task = {
      {"contract_version", 1},
      {"kind", "evaluate"},
      {"model_kind", "custom"},
      {"model_dir", (tmp.path() / "model").string()},
      {"initial_weights", (tmp.path() / "sim" / "global.safetensors").string()},
      {"data", (tmp.path() / "test.csv").string()},
      {"validation_data", (tmp.path() / "test.csv").string()},
      {"config", {{"batch_size", 64}, {"use_peft", false}}},
      {"steps", 0},
      {"seed", 1},
      {"output",
       {{"weights", (tmp.path() / "eval.safetensors").string()}, {"result", (tmp.path() / "eval.json").string()}}}};
  std::ofstream(tmp.path() / "eval-task.json") << task.dump(2);
  ASSERT_EQ(std::system((digits + " run " + (tmp.path() / "eval-task.json").string() + " > /dev/null").c_str()), 0);
  const json result = json::parse(std::ifstream(tmp.path() / "eval.json"));
  const double accuracy = result["validation_before"].value("accuracy", 0.0);
  std::printf("[figures] digits CNN, 5 workers, Dirichlet(0.5), 6 rounds x 80 steps: held-out accuracy %.4f\n",
              accuracy);
  EXPECT_GE(accuracy, 0.95) << result.dump(2) << "\n" << sim.output;
}

// A custom model whose weights are a sharded checkpoint (model.safetensors.index.json and its shards): the job's
// starting global is the shards joined, the workers train it, and the last global holds every tensor of every shard.
TEST(DigitsCnnTest, ShardedCustomModelTrainsFromItsJoinedShards) {
  TempDir tmp;
  const std::string digits = PythonTrainer("digits_cnn.py");
  const fs::path model = tmp.path() / "model";
  ASSERT_EQ(std::system((digits + " init " + model.string() + " --seed 2").c_str()), 0);
  // The weights split in two shards with an index, as Hugging Face saves a large model.
  std::map<std::string, std::vector<double>> whole = ReadTensors(model / "model.safetensors");
  ASSERT_GE(whole.size(), 2u);
  const std::string split = R"PY(
import json, sys
sys.path.insert(0, sys.argv[2])
from parsyn import safetensors
folder = sys.argv[1]
tensors = safetensors.load(folder + "/model.safetensors")
names = list(tensors)
half = len(names) // 2
index = {"metadata": {}, "weight_map": {}}
for i, part in enumerate((names[:half], names[half:])):
    shard = "model-%05d-of-00002.safetensors" % (i + 1)
    safetensors.save(folder + "/" + shard, {n: tensors[n] for n in part})
    index["weight_map"].update({n: shard for n in part})
json.dump(index, open(folder + "/model.safetensors.index.json", "w"))
json.dump({"kind": "custom", "trainer": "digits-cnn", "files": ["model.safetensors.index.json",
           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "parsyn_model.json"]},
          open(folder + "/parsyn_model.json", "w"))
)PY";
  std::ofstream(tmp.path() / "split.py") << split;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + (tmp.path() / "split.py").string() + " " + model.string() + " " +
                         (fs::path(test_support::BuildPath("source_dir")) / "python").string())
                            .c_str()),
            0);
  fs::remove(model / "model.safetensors");
  ASSERT_EQ(std::system(("/usr/bin/python3 " +
                         (fs::path(test_support::BuildPath("source_dir")) / "bench" / "digits_csv.py").string() + " " +
                         (tmp.path() / "digits.csv").string())
                            .c_str()),
            0);
  const json job = {
      {"name", "sharded"},
      {"config", {{"use_peft", false}, {"batch_size", 32}, {"learning_rate", 0.003}}},
      {"distributed", {{"enabled", true}, {"num_rounds", 1}, {"steps_per_round", 5}, {"min_workers", 2}}}};
  std::ofstream(tmp.path() / "job.json") << job.dump();
  const CommandResult sim =
      RunParsyn({"simulate", "--job", (tmp.path() / "job.json").string(), "--data",
                 (tmp.path() / "digits.csv").string(), "--model", model.string(), "--workers", "2", "--parallel", "2",
                 "--out", (tmp.path() / "sim").string(), "--trainer", digits},
                std::chrono::seconds(300));
  ASSERT_EQ(sim.exit_code, 0) << sim.output;
  const std::map<std::string, std::vector<double>> last = ReadTensors(tmp.path() / "sim" / "global.safetensors");
  ASSERT_EQ(last.size(), whole.size());
  for (const auto& [name, values] : whole) {
    ASSERT_TRUE(last.contains(name)) << name;
    EXPECT_EQ(last.at(name).size(), values.size()) << name;
  }
}

// `parsyn trainer check` passes for the built-in trainer (the examples' checks are
// python/tests/test_example_probes.py), and fails, naming the probe, for a trainer that ignores SIGTERM and never
// refuses anything.
TEST(TrainerCheckTest, BuiltinPassesAndABadTrainerFails) {
  const CommandResult builtin = RunParsyn({"trainer", "check"}, std::chrono::seconds(300));
  EXPECT_EQ(builtin.exit_code, 0) << builtin.output;
  EXPECT_NE(builtin.output.find("8 passed, 0 failed"), std::string::npos) << builtin.output;
  TempDir tmp;
  const fs::path lazy = tmp.path() / "lazy.py";
  std::ofstream(lazy) << R"PY(
import json, shutil, signal, sys, time
if sys.argv[1] == "--describe":
    print(json.dumps({"contract_versions": [1], "task_kinds": ["train", "evaluate"], "model_kinds": ["*"]}))
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
task = json.load(open(sys.argv[2]))
print(json.dumps({"event": "progress", "step": 1, "total_steps": 1}), flush=True)
if task.get("steps", 0) > 1000:
    time.sleep(30)
shutil.copy(task["initial_weights"], task["output"]["weights"])
json.dump({"num_samples": 1, "validation_before": {"loss": 1.0}}, open(task["output"]["result"], "w"))
print(json.dumps({"event": "done", "num_samples": 1}))
)PY";
  const CommandResult check =
      RunParsyn({"trainer", "check", "--trainer", "/usr/bin/python3 " + lazy.string()}, std::chrono::seconds(300));
  EXPECT_EQ(check.exit_code, 1) << check.output;
  EXPECT_NE(check.output.find("PASS train:"), std::string::npos) << check.output;
  EXPECT_NE(check.output.find("FAIL wrong_layout: it trained initial weights of another layout"), std::string::npos)
      << check.output;
  EXPECT_NE(check.output.find("FAIL sigterm: it was still running 10 s after SIGTERM: killed"), std::string::npos)
      << check.output;
  EXPECT_NE(check.output.find("FAIL unknown_version: it ran a task of contract_version 999"), std::string::npos)
      << check.output;
}

}  // namespace
}  // namespace parsyn::e2e
