// Federated jobs under faults, with real processes: a worker SIGKILLed mid-round, the server SIGKILLed mid-job, and
// a worker whose local data must never reach the coordinator.
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

// The live (not zombie) children of `parent`, from /proc.
std::vector<pid_t> LiveChildren(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat) || stat.rfind(')') == std::string::npos) continue;
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    char state = 0;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent && state != 'Z') children.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return children;
}

// The live children of `parent`, theirs, and so on: a worker's trainer runs are children of its trainer fork server.
std::vector<pid_t> LiveDescendants(pid_t parent) {
  std::vector<pid_t> all = LiveChildren(parent);
  for (size_t i = 0; i < all.size(); ++i) {
    for (pid_t child : LiveChildren(all[i])) all.push_back(child);
  }
  return all;
}

bool Alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  return std::getline(in, stat) && stat.rfind(')') != std::string::npos && stat[stat.rfind(')') + 2] != 'Z';
}

bool FileContains(const fs::path& file, const std::string& needle) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().find(needle) != std::string::npos;
}

TEST_F(LlamaJobTest, LocalDataNeverReachesTheCoordinator) {
  const fs::path local = tmp_.path() / "private.jsonl";
  {
    std::ofstream out(local);
    for (int i = 0; i < 40; ++i)
      out << json{{"text", "zebra-secret-" + std::to_string(i) + " likes alice."}}.dump() << "\n";
  }
  std::vector<int64_t> ids = StartWorkers(1);
  std::vector<int64_t> local_ids = StartWorkers(1, {"--data", local.string()});
  ids.push_back(local_ids[0]);
  const int64_t job_id = CreateJob(*admin_, LoraSpec(ids, 2, 4, 2));
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  // A platform-data job trains every worker on its shard, this one too: its file is only for jobs whose data.source
  // is "workers" (local_data_test.cc). Each shard of the 96 rows has 48, 7 of them (15%) held out for validation.
  int checked = 0;
  for (const json& r : Rounds(*admin_, job_id)) {
    for (const json& u : r["updates"]) {
      if (u["worker_id"] != local_ids[0]) continue;
      EXPECT_EQ(u["num_samples"].get<int64_t>(), 41) << u.dump();
      checked++;
    }
  }
  EXPECT_EQ(checked, 2);
  // Nothing the server stored (blobs, metadata, logs) holds a line of it.
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(tmp_.path() / "server")) {
    if (!entry.is_regular_file()) continue;
    files++;
    EXPECT_FALSE(FileContains(entry.path(), "zebra-secret")) << entry.path();
  }
  EXPECT_FALSE(FileContains(tmp_.path() / "server.log", "zebra-secret"));
  EXPECT_GT(files, 5);
}

TEST_F(LlamaJobTest, WorkerKilledMidRoundIsLeftOutAndRejoins) {
  std::vector<int64_t> ids = StartWorkers(3);
  // Six rounds: the victim comes back after round 1 and must be online before the last one starts; with trainer runs
  // forked a round takes about a second, a restarted worker about as long.
  const int64_t job_id = CreateJob(*admin_, LoraSpec(ids, 6, 40, 2, 180));
  // Kill the third worker while it trains in round 1.
  const int64_t victim = ids[2];
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        return type == "worker_progress" && d.value("worker_id", int64_t{0}) == victim && d.value("round", 0) == 1;
      },
      std::chrono::seconds(180)));
  // Its parsyn-trainer dies with it (SubprocessOptions::die_with_parent), rather than training on unseen: the fork
  // server and the run it forked.
  const std::vector<pid_t> trainers = LiveDescendants(workers_[2]->pid());
  EXPECT_GE(trainers.size(), 2u) << "the victim was training: it should have a trainer fork server and a run";
  workers_[2]->Kill();
  for (pid_t trainer : trainers) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (Alive(trainer) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_FALSE(Alive(trainer)) << "parsyn-trainer " << trainer << " outlived its SIGKILLed worker";
  }
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) { return type == "round_committed" && d.value("round", 0) == 1; },
      std::chrono::seconds(180)));
  workers_[2]->Start();  // the same machine comes back with its token and cache
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(400));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  json rounds = Rounds(*admin_, job_id);
  bool rejoined = false;
  for (const json& r : rounds) {
    if (r["outcome"] != "committed") continue;
    std::set<int64_t> accepted;
    for (const json& u : r["updates"]) {
      if (u["status"] == "accepted") accepted.insert(u["worker_id"].get<int64_t>());
    }
    if (r["round"] == 1) {
      EXPECT_EQ(accepted, (std::set<int64_t>{ids[0], ids[1]})) << r.dump();
    } else if (accepted.count(victim)) {
      rejoined = true;
    }
  }
  EXPECT_TRUE(rejoined) << rounds.dump(2);
  EXPECT_EQ(ExpectGlobalsAreFedAvg(job_id), 6);
}

TEST_F(LlamaJobTest, ServerKilledMidJobFinishesWithTheUninterruptedWeights) {
  std::vector<int64_t> ids = StartWorkers(2);
  ExpectAResumedJobEndsWithTheUninterruptedWeights(LoraSpec(ids, 3, 4, 2));
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
}

}  // namespace
}  // namespace parsyn::e2e

namespace parsyn::e2e {
namespace {

TEST_F(LlamaJobTest, TrainerCrashFailsTheTaskAndTheWorkerStaysOnline) {
  // A trainer that dies at once, as a crash or out-of-memory would, for the second worker only (its built-in trainer,
  // as the worker's owner maps it).
  const fs::path crashing = WriteCrashingTrainer();
  std::vector<int64_t> ids = StartWorkers(1);
  std::vector<int64_t> crash_ids = StartWorkers(1, {"--trainer", "builtin=" + crashing.string()});
  ids.push_back(crash_ids[0]);
  const int64_t job_id = CreateJob(*admin_, LoraSpec(ids, 2, 4, 1, 60));
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(240));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  for (const json& r : Rounds(*admin_, job_id)) {
    for (const json& u : r["updates"]) EXPECT_NE(u["worker_id"], crash_ids[0]) << r.dump();
  }
  // It told the coordinator by dropping the task, and is still online for the next one.
  EXPECT_NE(workers_[1]->log().find("simulated crash"), std::string::npos) << workers_[1]->log();
  EXPECT_FALSE(workers_[1]->Exited());
  StatusOr<http::ClientResponse> w = admin_->Get("/api/v1/workers/" + std::to_string(crash_ids[0]));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_NE((*w->Json())["status"], "offline");
}

}  // namespace
}  // namespace parsyn::e2e
