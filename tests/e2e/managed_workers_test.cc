// Managed workers: `parsyn server --managed-workers 1` registers and runs worker managed-1 (kind managed) itself.
// A mixed job with two own workers (started here) and the managed one completes its rounds with all three; when the
// managed worker's process is SIGKILLed the server starts it again and it takes a job; a graceful server shutdown
// ends it.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "base/subprocess.h"
#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

// Pids of the `parsyn worker` processes running as `name` with a cache directory under `under`, from /proc.
std::vector<pid_t> ManagedWorkerPids(const std::string& name, const fs::path& under) {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::stringstream raw;
    raw << in.rdbuf();
    std::vector<std::string> args;
    std::string arg;
    for (char c : raw.str()) {
      if (c == '\0') {
        args.push_back(arg);
        arg.clear();
      } else {
        arg += c;
      }
    }
    bool named = false, ours = false;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      named |= args[i] == "--name" && args[i + 1] == name;
      ours |= args[i] == "--cache-dir" && args[i + 1].rfind(under.string(), 0) == 0;
    }
    // A zombie (killed, not yet reaped) has an empty cmdline, so it never matches.
    if (named && ours && !args.empty() && args[0].ends_with("parsyn") && args[1] == "worker") {
      pids.push_back(static_cast<pid_t>(std::stol(pid)));
    }
  }
  return pids;
}

class ManagedWorkersTest : public LlamaJobTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(InitTabularMlp(300, "8"));
    server_flags_.insert(server_flags_.end(), {"--managed-workers", "1"});
    StartServerWith("points-mlp", "points.csv");
    ASSERT_GT(model_id_, 0);
    ASSERT_GT(dataset_id_, 0);
  }

  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "---- server ----\n%s\n", ServerLog().c_str());
    LlamaJobTest::TearDown();
  }

  std::string ServerLog() const {
    std::ifstream in(tmp_.path().string() + "/server.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  json MlpSpec(const std::string& mode, const std::vector<int64_t>& own, const std::vector<int64_t>& managed,
               int rounds) const {
    const int n = static_cast<int>(own.size() + managed.size());
    return {{"name", "e2e-managed-" + mode},
            {"dataset_id", dataset_id_},
            {"model_id", model_id_},
            {"config",
             {{"batch_size", 16},
              {"learning_rate", 0.01},
              {"use_peft", false},
              {"hidden_sizes", {8}},
              {"label_column", "label"},
              {"validation_fraction", 0.15},
              {"seed", 7}}},
            {"distributed",
             {{"enabled", true},
              {"num_rounds", rounds},
              {"steps_per_round", 10},
              {"min_workers", n},
              {"max_workers", n},
              {"aggregation_timeout", 120},
              {"fault_tolerance", 1}}},
            {"worker_selection", {{"mode", mode}, {"worker_ids", own}, {"parsyn_worker_ids", managed}}}};
  }

  // The accepted updates' workers of each committed training round.
  std::vector<std::set<int64_t>> CommittedParticipants(int64_t job_id) {
    std::vector<std::set<int64_t>> rounds;
    for (const json& r : Rounds(*admin_, job_id)) {
      if (r["outcome"] != "committed" || r["round"].get<int>() < 1) continue;
      std::set<int64_t> accepted;
      for (const json& u : r["updates"]) {
        if (u["status"] == "accepted") accepted.insert(u["worker_id"].get<int64_t>());
      }
      rounds.push_back(accepted);
    }
    return rounds;
  }
};

TEST_F(ManagedWorkersTest, MixedJobUsesOwnAndManagedWorkersAndTheServerRestartsAKilledManagedWorker) {
  const auto started = std::chrono::steady_clock::now();
  // The server registered managed-1 itself, kind managed, with its token kept 0600 in the data directory.
  StatusOr<http::ClientResponse> list = admin_->Get("/api/v1/workers");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  StatusOr<json> workers = list->Json();
  ASSERT_TRUE(workers.ok()) << list->body;
  int64_t managed_id = 0;
  for (const json& w : (*workers)["workers"]) {
    if (w["name"] == "managed-1") {
      EXPECT_EQ(w["kind"], "managed") << w.dump();
      managed_id = w["id"].get<int64_t>();
    }
  }
  ASSERT_GT(managed_id, 0) << list->body;
  const fs::path token_file = server_->data_dir() / "managed-workers" / "managed-1.token";
  ASSERT_TRUE(fs::exists(token_file));
  EXPECT_EQ(fs::status(token_file).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_TRUE(WaitOnline({managed_id})) << "the managed worker did not say hello";

  const std::vector<int64_t> own = StartWorkers(2);
  const int kRounds = 2;
  const int64_t mixed_job = CreateJob(*admin_, MlpSpec("mixed", own, {managed_id}, kRounds));
  ASSERT_GT(mixed_job, 0);
  json job = WaitForJobEnd(*admin_, mixed_job, std::chrono::seconds(240));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  const std::set<int64_t> all = {own[0], own[1], managed_id};
  const std::vector<std::set<int64_t>> rounds = CommittedParticipants(mixed_job);
  ASSERT_EQ(rounds.size(), static_cast<size_t>(kRounds));
  for (const std::set<int64_t>& r : rounds) EXPECT_EQ(r, all);
  const double mixed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // SIGKILL the managed worker: the supervisor notices its exit and starts a new process.
  const fs::path managed_dir = server_->data_dir() / "managed-workers";
  std::vector<pid_t> before = ManagedWorkerPids("managed-1", managed_dir);
  ASSERT_EQ(before.size(), 1u);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(before[0], SIGKILL), 0);
  pid_t restarted = -1;
  const auto deadline = killed_at + std::chrono::seconds(30);
  while (restarted < 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<pid_t> now = ManagedWorkerPids("managed-1", managed_dir);
    if (now.size() == 1 && now[0] != before[0]) restarted = now[0];
    if (restarted < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(restarted, 0) << "the server did not restart the killed managed worker";
  const double restart_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_NE(ServerLog().find("managed worker managed-1 exited with 137; restarting"), std::string::npos);

  // Back online under the same identity once the new process has said hello (until then the killed one's session,
  // whose last long-poll the server has not yet seen fail, would be offered the task and then replaced).
  auto hellos = [&] {
    const std::string log = ServerLog();
    size_t count = 0;
    for (size_t at = log.find("worker managed-1: online"); at != std::string::npos;
         at = log.find("worker managed-1: online", at + 1)) {
      ++count;
    }
    return count;
  };
  const auto hello_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (hellos() < 2 && std::chrono::steady_clock::now() < hello_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(hellos(), 2u) << "the restarted managed worker did not say hello";
  // A managed-only job runs on it.
  const int64_t managed_job = CreateJob(*admin_, MlpSpec("managed", {}, {managed_id}, 1));
  ASSERT_GT(managed_job, 0);
  job = WaitForJobEnd(*admin_, managed_job, std::chrono::seconds(120));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  EXPECT_EQ(CommittedParticipants(managed_job), std::vector<std::set<int64_t>>{{managed_id}});

  std::printf(
      "[figures] managed workers: mixed job %d rounds x 3 workers in %.1f s; killed managed worker "
      "restarted after %.1f s\n",
      kRounds, mixed_seconds, restart_seconds);
  for (auto& w : workers_) EXPECT_EQ(w->Terminate(), 0) << w->log();
  // A graceful server shutdown stops its managed worker too.
  EXPECT_EQ(server_->Terminate(), 0);
  EXPECT_TRUE(ManagedWorkerPids("managed-1", managed_dir).empty());
}

TEST_F(ManagedWorkersTest, ManagedWorkersLeaveWhenTheServerIsKilled) {
  const fs::path managed_dir = server_->data_dir() / "managed-workers";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ManagedWorkerPids("managed-1", managed_dir).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(ManagedWorkerPids("managed-1", managed_dir).empty()) << "the server did not start managed-1";
  // The worker's token reaches it through its environment: its command line (readable by any local user) holds
  // neither the token nor a --token flag.
  std::string token;
  std::getline(std::ifstream(managed_dir / "managed-1.token"), token);
  ASSERT_FALSE(token.empty());
  for (pid_t pid : ManagedWorkerPids("managed-1", managed_dir)) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
    std::stringstream cmdline;
    cmdline << in.rdbuf();
    EXPECT_EQ(cmdline.str().find(token), std::string::npos) << "the token is in the managed worker's argv";
    EXPECT_EQ(cmdline.str().find("--token"), std::string::npos);
  }

  server_->Kill();
  // --exit-with-parent: the kernel tells the orphaned worker, which leaves; nothing is left for a restarted server
  // to compete with.
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ManagedWorkerPids("managed-1", managed_dir).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ManagedWorkerPids("managed-1", managed_dir).empty()) << "a managed worker outlived its SIGKILLed server";
}

// A managed worker read its parent with getppid() after it started: a server killed before then left the worker
// adopted by another process, which it took for its parent, and it ran on as an orphan. The parent is now the one
// the server names (PARSYN_DIE_WITH_PARENT); a worker whose named parent is not its parent leaves at once.
TEST(ManagedWorkerStartTest, AWorkerWhoseServerDiedBeforeItStartedLeavesAtOnce) {
  ::setenv(kDieWithParentEnv, "1", 1);  // not this worker's parent (the test is)
  const CommandResult run = RunParsyn(
      {"worker", "--server", "http://127.0.0.1:1", "--token", "pwt_unused", "--name", "orphan", "--exit-with-parent"},
      std::chrono::seconds(30));
  ::unsetenv(kDieWithParentEnv);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("the supervising process is gone"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace parsyn::e2e
