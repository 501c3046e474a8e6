// bench_rounds' trainer run (rounds_trainers.h). Both runs are the same job (a 2-feature MLP, 800 rows, one optimizer
// step per round per worker, FedAvg), so what differs is what a trainer costs per task: parsyn-trainer loads libtorch
// and steps once; the external trainer (Debian's python3, no imports beyond json and shutil) copies the initial weights
// as its update. Round time is the coordinator's: a committed round's duration_ms (GET .../rounds).
#include "rounds_trainers.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/subprocess.h"
#include "fleet.h"
#include "http/client.h"

namespace parsyn::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Writes its update at once: the initial weights as they came, and the result the contract asks for.
constexpr char kInstantTrainer[] = R"PY(import json, shutil, sys
if sys.argv[1] == "--describe":
    print(json.dumps({"contract_versions": [1], "task_kinds": ["train", "evaluate"], "model_kinds": ["*"],
                      "name": "instant"}))
    sys.exit(0)
task = json.load(open(sys.argv[2]))
rows = max(sum(1 for _ in open(task["data"])) - 1, 1)
if task.get("kind", "train") == "train":
    shutil.copyfile(task["initial_weights"], task["output"]["weights"])
result = {"num_samples": rows, "train_loss": 0.5, "validation_before": {"loss": 0.7}, "validation_after": {"loss": 0.7}}
json.dump(result, open(task["output"]["result"], "w"))
print(json.dumps(dict(result, event="done")))
)PY";

void WritePoints(const fs::path& file, int rows) {
  std::ofstream out(file);
  out << "x1,x2,label\n";
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2 - 1;
  };
  for (int i = 0; i < rows; ++i) {
    const double a = next(), b = next();
    out << a << "," << b << "," << (a + b > 0 ? 1 : 0) << "\n";
  }
}

json Call(http::Client& admin, const std::string& what, StatusOr<http::ClientResponse> res) {
  if (!res.ok()) Die(what + ": " + res.status().ToString());
  return Must(res->Json(), what);
}

struct RunFigures {
  std::vector<double> round_s;  // committed rounds in order
  double median_s = 0;          // of rounds 2..
};

// One job on a fresh server with `workers` workers, each started with `worker_args`.
RunFigures RunJob(const std::string& parsyn_bin, const fs::path& dir, const fs::path& model_dir, const fs::path& data,
                  int workers, int rounds, const std::vector<std::string>& worker_args) {
  fs::create_directories(dir);
  ServerProcess server(dir / "server", parsyn_bin, "warn", {"--heartbeat-interval-ms", "500"});
  http::Client admin({.base_url = server.url(), .bearer_token = server.admin_key()});
  json files = json::object();
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    json up = Call(admin, "upload", admin.UploadFile(http::Method::kPost, "/api/v1/uploads", entry.path()));
    files[entry.path().filename().string()] = up["upload_id"];
  }
  const json model = Call(admin, "model", admin.PostJson("/api/v1/models", {{"name", "points"}, {"files", files}}));
  const json dataset =
      Call(admin, "dataset", admin.UploadFile(http::Method::kPost, "/api/v1/datasets?name=points.csv", data));
  std::vector<Subprocess> processes;
  std::vector<int64_t> ids;
  for (int i = 0; i < workers; ++i) {
    const json w = Call(admin, "worker", admin.PostJson("/api/v1/workers", {{"name", "w" + std::to_string(i)}}));
    ids.push_back(w["id"].get<int64_t>());
    std::vector<std::string> args = {"worker",
                                     "--server",
                                     server.url(),
                                     "--token",
                                     w["token"].get<std::string>(),
                                     "--cache-dir",
                                     (dir / ("cache-" + std::to_string(i))).string(),
                                     "--threads",
                                     "1"};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    SubprocessOptions options{.output = SubprocessOptions::Output::kFile,
                              .output_file = dir / ("worker-" + std::to_string(i) + ".log")};
    processes.push_back(Must(Subprocess::Start(parsyn_bin, args, options), "starting a worker"));
  }
  const json spec = {{"name", "trainer-rounds"},
                     {"dataset_id", dataset["id"]},
                     {"model_id", model["id"]},
                     {"config", {{"use_peft", false}, {"batch_size", 16}, {"learning_rate", 0.01}}},
                     {"distributed",
                      {{"enabled", true},
                       {"num_rounds", rounds},
                       {"steps_per_round", 1},
                       {"min_workers", workers},
                       {"max_workers", workers},
                       {"join_window", 30}}},
                     {"worker_selection", {{"mode", "own"}, {"worker_ids", ids}}}};
  const int64_t job = Call(admin, "job", admin.PostJson("/api/v1/training-jobs", spec))["id"].get<int64_t>();
  const std::string path = "/api/v1/training-jobs/" + std::to_string(job);
  json status;
  const auto deadline = Clock::now() + std::chrono::minutes(10);
  while (Clock::now() < deadline) {
    status = Call(admin, "job status", admin.Get(path));
    const std::string s = status.value("status", "");
    if (s == "succeeded" || s == "failed" || s == "cancelled" || s == "stopped") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (status.value("status", "") != "succeeded") Die("the trainer-rounds job did not succeed: " + status.dump());
  RunFigures figures;
  const json listed = Call(admin, "rounds", admin.Get(path + "/rounds"));
  for (const json& r : listed["rounds"]) {
    if (r.value("outcome", "") == "committed" && r.value("round", 0) >= 1 && r["duration_ms"].is_number()) {
      figures.round_s.push_back(r["duration_ms"].get<double>() / 1e3);
    }
  }
  if (figures.round_s.size() < 2) Die("the trainer-rounds job committed fewer than 2 rounds: " + listed.dump());
  for (Subprocess& p : processes) p.Terminate();
  for (Subprocess& p : processes) p.Wait();
  std::vector<double> later(figures.round_s.begin() + std::min<size_t>(1, figures.round_s.size()),
                            figures.round_s.end());
  std::sort(later.begin(), later.end());
  if (!later.empty()) figures.median_s = later[later.size() / 2];
  return figures;
}

std::string Rounds(const RunFigures& f) {
  std::string text;
  for (double s : f.round_s) text += (text.empty() ? "" : " ") + std::to_string(static_cast<int>(s * 1e3));
  return text;
}

}  // namespace

void RunTrainerRounds(const std::string& parsyn_bin, const fs::path& root, int workers, int rounds) {
  const fs::path dir = root / "trainer-rounds";
  fs::create_directories(dir);
  WritePoints(dir / "points.csv", 800);
  const int init = std::system((parsyn_bin + " model init --architecture mlp --data " + (dir / "points.csv").string() +
                                " --hidden-sizes 16 --out " + (dir / "model").string() + " --seed 1 > /dev/null")
                                   .c_str());
  if (init != 0) Die("parsyn model init failed");
  std::ofstream(dir / "instant_trainer.py") << kInstantTrainer;
  std::printf(
      "\nTrainers: %d real workers, %d rounds of one step each, built-in parsyn-trainer vs an external\n"
      "trainer (python3, writes its update at once); round = the coordinator's duration of a committed round\n",
      workers, rounds);
  std::fflush(stdout);
  const RunFigures builtin =
      RunJob(parsyn_bin, dir / "builtin", dir / "model", dir / "points.csv", workers, rounds, {});
  const RunFigures external =
      RunJob(parsyn_bin, dir / "external", dir / "model", dir / "points.csv", workers, rounds,
             {"--trainer", "builtin=/usr/bin/python3 " + (dir / "instant_trainer.py").string()});
  std::printf("  %-9s rounds (ms): %s; median of rounds 2..: %.0f ms\n", "built-in", Rounds(builtin).c_str(),
              builtin.median_s * 1e3);
  std::printf("  %-9s rounds (ms): %s; median of rounds 2..: %.0f ms\n", "external", Rounds(external).c_str(),
              external.median_s * 1e3);
  const double ratio = external.median_s / builtin.median_s;
  std::printf("bench_rounds: external trainer round / built-in trainer round = %.2f (target <= 1.20): %s\n", ratio,
              ratio <= 1.2 ? "PASS" : "MISS");
  std::fflush(stdout);
}

}  // namespace parsyn::bench
