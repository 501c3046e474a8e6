// The agent against a fake coordinator: failed tasks are reported through /api/v1/worker/failure, blob URLs are
// fetched without the worker's token while API calls carry it, and a refused (revoked) token stops the agent.
#include "worker/agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include "base/sha256.h"
#include "http/test_server.h"
#include "protocol/trainer_task.h"
#include "weights/safetensors.h"

namespace parsyn::worker {
namespace {

namespace fs = std::filesystem;
namespace net = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr char kToken[] = "worker-token-1";

// The global the fake coordinator serves: a safetensors image of one tensor.
std::string GlobalImage() {
  weights::WeightSet set;
  const float values[2] = {1.0f, 2.0f};
  EXPECT_TRUE(set.Add("w", weights::DType::kF32, {2}, std::as_bytes(std::span(values))).ok());
  const std::vector<std::byte> image = weights::SerializeSafetensors(set);
  return std::string(reinterpret_cast<const char*>(image.data()), image.size());
}
const std::string kGlobalBytes = GlobalImage();

// The trainer every test's agent offers, under the name jobs use by default.
DescribedTrainer BuiltinTrainer() {
  return {.command = {.name = "builtin", .argv = {"parsyn-trainer"}},
          .description = {.contract_versions = {1}, .task_kinds = {"train", "evaluate"}, .model_kinds = {"*"}}};
}

// A trainer that prints `lines` and exits with `exit_code`; with `write_outputs`, it first writes what a successful
// train task writes (the result, and the initial weights as the update).
class ScriptedTrainer : public TrainerLauncher {
 public:
  ScriptedTrainer(std::vector<std::string> lines, int exit_code, bool write_outputs = false)
      : lines_(std::move(lines)), exit_code_(exit_code), write_outputs_(write_outputs) {}
  StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>& argv) override {
    starts++;
    if (write_outputs_) {
      const json task = json::parse(std::ifstream(argv.back()));
      std::ofstream(task["output"]["result"].get<std::string>()) << R"({"num_samples": 1})";
      fs::copy_file(task["initial_weights"].get<std::string>(), task["output"]["weights"].get<std::string>());
    }
    return std::unique_ptr<TrainerRun>(new Run(lines_, exit_code_));
  }
  std::atomic<int> starts = 0;

 private:
  class Run : public TrainerRun {
   public:
    Run(std::vector<std::string> lines, int code) : lines_(lines.begin(), lines.end()), code_(code) {}
    std::optional<std::string> ReadLine() override {
      if (lines_.empty()) return std::nullopt;
      std::string line = lines_.front();
      lines_.pop_front();
      return line;
    }
    void Terminate() override {}
    int Wait() override { return code_; }

   private:
    std::deque<std::string> lines_;
    int code_;
  };
  std::vector<std::string> lines_;
  int exit_code_;
  bool write_outputs_;
};

// A trainer that prints one progress event, then runs until terminated (as a long round does).
class RunsUntilTerminated : public TrainerLauncher {
 public:
  StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>&) override {
    starts++;
    return std::unique_ptr<TrainerRun>(new Run(*this));
  }
  std::atomic<int> starts = 0;
  std::atomic<bool> terminated = false;

 private:
  class Run : public TrainerRun {
   public:
    explicit Run(RunsUntilTerminated& owner) : owner_(owner) {}
    std::optional<std::string> ReadLine() override {
      if (!progress_printed_) {
        progress_printed_ = true;
        return R"({"event": "progress", "step": 1, "total_steps": 100, "loss": 2.5})";
      }
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return owner_.terminated.load(); });
      return std::nullopt;
    }
    void Terminate() override {
      {
        std::lock_guard lock(mu_);
        owner_.terminated = true;
      }
      cv_.notify_all();
    }
    int Wait() override { return owner_.terminated ? -15 : 0; }

   private:
    RunsUntilTerminated& owner_;
    bool progress_printed_ = false;
    std::mutex mu_;
    std::condition_variable cv_;
  };
};

// What the fake coordinator saw, filled in on its loop thread and read by the test thread.
struct Seen {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<json> failures;
  std::vector<json> hellos;
  std::vector<std::string> api_authorizations;   // Authorization of each /api call
  std::vector<std::string> blob_authorizations;  // Authorization of each /blobs call
  int polls = 0;
  std::map<std::string, std::string> blobs;  // served at GET /blobs/<key>; any other key serves kGlobalBytes
  int refused = 0;                           // worker calls answered 401 (token_revoked)
  int uploads = 0;                           // PUTs to /blobs
  int polls_open = 0;                        // task polls being held now
  int heartbeats_during_poll = 0;            // heartbeats that came while a poll was held
  int heartbeats_between_polls = 0;          // heartbeats that came while none was

  // Waits (bounded) until `done` holds under the lock.
  bool WaitFor(const std::function<bool()>& done) {
    std::unique_lock lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(20), done);
  }
};

struct FakeCoordinatorOptions {
  bool serve_global = true;                // else the global weights' URL answers 404
  bool failure_route = true;               // else /api/v1/worker/failure is unknown (404), as on older coordinators
  bool abandon_on_heartbeat = false;       // heartbeats say the task's round moved on
  bool token_revoked = false;              // progress, heartbeat, failure and result calls answer 401 (a revoked token)
  int64_t heartbeat_interval_ms = 60'000;  // asked in the hello answer
  int task_on_poll = 1;                    // the poll that answers the task; the others are held poll_hold
  milliseconds poll_hold{50};
};

// A 401, as the coordinator answers a revoked token.
http::Response Refused(Seen& seen) {
  {
    std::lock_guard lock(seen.mu);
    seen.refused++;
  }
  seen.changed.notify_all();
  return http::Response::Error(UnauthenticatedError("invalid worker token"));
}

// One train task (made by `task` when first polled, once the server's URL is known), then none.
http::Router FakeCoordinator(Seen& seen, std::function<json()> task, FakeCoordinatorOptions options) {
  http::Router router;
  auto note_api = [&seen](http::Request& req) {
    std::lock_guard lock(seen.mu);
    seen.api_authorizations.emplace_back(req.Header("authorization"));
  };
  EXPECT_TRUE(router
                  .Add(http::Method::kPost, "/api/v1/worker/hello",
                       [&seen, note_api, options](http::Request& req) -> http::Awaitable<http::Response> {
                         note_api(req);
                         {
                           std::lock_guard lock(seen.mu);
                           seen.hellos.push_back(*req.JsonBody());
                         }
                         seen.changed.notify_all();
                         co_return http::Response::Json(200, {{"session_id", "s1"},
                                                              {"worker_id", 41},
                                                              {"heartbeat_interval_ms", options.heartbeat_interval_ms},
                                                              {"max_poll_wait_ms", 100}});
                       })
                  .ok());
  EXPECT_TRUE(router
                  .Add(http::Method::kGet, "/api/v1/worker/tasks/next",
                       [&seen, task, note_api, options](http::Request& req) -> http::Awaitable<http::Response> {
                         note_api(req);
                         int polls;
                         {
                           std::lock_guard lock(seen.mu);
                           polls = ++seen.polls;
                         }
                         seen.changed.notify_all();
                         if (polls == options.task_on_poll) co_return http::Response::Json(200, task());
                         {
                           std::lock_guard lock(seen.mu);
                           seen.polls_open++;
                         }
                         loop::Signal idle(co_await net::this_coro::executor);  // a short long-poll
                         co_await idle.Wait(options.poll_hold);
                         {
                           std::lock_guard lock(seen.mu);
                           seen.polls_open--;
                         }
                         co_return http::Response::NoContent();
                       })
                  .ok());
  EXPECT_TRUE(router
                  .Add(http::Method::kPost, "/api/v1/worker/heartbeat",
                       [&seen, note_api, options](http::Request& req) -> http::Awaitable<http::Response> {
                         note_api(req);
                         if (options.token_revoked) co_return Refused(seen);
                         {
                           std::lock_guard lock(seen.mu);
                           (seen.polls_open > 0 ? seen.heartbeats_during_poll : seen.heartbeats_between_polls)++;
                         }
                         seen.changed.notify_all();
                         json abandon = json::array();
                         if (options.abandon_on_heartbeat)
                           abandon.push_back({{"job_id", 7}, {"round", 2}, {"attempt", 1}});
                         co_return http::Response::Json(200, {{"abandon", abandon}});
                       })
                  .ok());
  EXPECT_TRUE(router
                  .Add(http::Method::kPost, "/api/v1/worker/goodbye",
                       [note_api](http::Request& req) -> http::Awaitable<http::Response> {
                         note_api(req);
                         co_return http::Response::Json(200, json::object());
                       })
                  .ok());
  for (const char* path : {"/api/v1/worker/progress", "/api/v1/worker/result"}) {
    EXPECT_TRUE(router
                    .Add(http::Method::kPost, path,
                         [&seen, note_api, options](http::Request& req) -> http::Awaitable<http::Response> {
                           note_api(req);
                           if (options.token_revoked) co_return Refused(seen);
                           co_return http::Response::Json(200, json::object());
                         })
                    .ok());
  }
  EXPECT_TRUE(router
                  .Add(http::Method::kPut, "/blobs/{key...}",
                       [&seen](http::Request&) -> http::Awaitable<http::Response> {
                         {
                           std::lock_guard lock(seen.mu);
                           seen.uploads++;
                         }
                         co_return http::Response::Json(201, json::object());
                       })
                  .ok());
  if (options.failure_route) {
    EXPECT_TRUE(router
                    .Add(http::Method::kPost, "/api/v1/worker/failure",
                         [&seen, note_api, options](http::Request& req) -> http::Awaitable<http::Response> {
                           note_api(req);
                           if (options.token_revoked) co_return Refused(seen);
                           {
                             std::lock_guard lock(seen.mu);
                             seen.failures.push_back(*req.JsonBody());
                           }
                           seen.changed.notify_all();
                           co_return http::Response::Json(200, json::object());
                         })
                    .ok());
  }
  EXPECT_TRUE(router
                  .Add(http::Method::kGet, "/blobs/{key...}",
                       [&seen, options](http::Request& req) -> http::Awaitable<http::Response> {
                         std::string bytes = kGlobalBytes;
                         {
                           std::lock_guard lock(seen.mu);
                           seen.blob_authorizations.emplace_back(req.Header("authorization"));
                           auto it = seen.blobs.find(req.params["key"]);
                           if (it != seen.blobs.end()) bytes = it->second;
                         }
                         if (!options.serve_global) co_return http::Response::Error(NotFoundError("no such blob"));
                         co_return http::Response::Text(200, bytes, "application/octet-stream");
                       })
                  .ok());
  return router;
}

json TrainTask(const std::string& base_url) {
  return {{"task_id", "7-2-1-w1"},
          {"job_id", 7},
          {"kind", "train"},
          {"round", 2},
          {"attempt", 1},
          {"total_rounds", 3},
          {"shard", 0},
          {"seed", 5},
          {"steps_per_round", 1},
          {"config", json::object()},
          {"global_weights",
           {{"url", base_url + "/blobs/jobs/7/global?sig=abc"},
            {"sha256", Sha256Hex(std::string_view(kGlobalBytes))},
            {"size_bytes", kGlobalBytes.size()}}},
          {"data_source", "workers"},  // the agent trains on its --data file
          {"data", {{"format", "csv"}}},
          {"model", {{"files", json::array()}}},
          {"update_upload", {{"blob_key", "jobs/7/u"}, {"url", base_url + "/blobs/jobs/7/u?sig=def"}}}};
}

// A train task of a platform-data job: its shard's two files at /blobs/jobs/7/shards/000/{train,validation}.csv,
// announced with the checksums of `train` and `validation`.
json PlatformTask(const std::string& base_url, const std::string& train, const std::string& validation) {
  json task = TrainTask(base_url);
  task["data_source"] = "platform";
  task["data"] = {{"format", "csv"},
                  {"kind", "tabular"},
                  {"train_url", base_url + "/blobs/jobs/7/shards/000/train.csv?sig=t"},
                  {"train_sha256", Sha256Hex(std::string_view(train))},
                  {"train_rows", 1},
                  {"validation_url", base_url + "/blobs/jobs/7/shards/000/validation.csv?sig=v"},
                  {"validation_sha256", Sha256Hex(std::string_view(validation))},
                  {"validation_rows", 1}};
  return task;
}

// A trainer that keeps the task file and the data files each run was given, then fails.
class DataRecordingTrainer : public TrainerLauncher {
 public:
  StatusOr<std::unique_ptr<TrainerRun>> Start(const std::vector<std::string>& argv) override {
    const fs::path task_file = argv.back();
    json task = json::parse(std::ifstream(task_file));
    task_files.push_back(task_file);
    tasks_seen.push_back(task);
    std::ifstream global(task.value("initial_weights", ""));
    globals_seen.emplace_back(std::istreambuf_iterator<char>(global), std::istreambuf_iterator<char>());
    std::ifstream data(task["data"].get<std::string>());
    data_seen.emplace_back(std::istreambuf_iterator<char>(data), std::istreambuf_iterator<char>());
    std::ifstream validation(task.value("validation_data", ""));
    validation_seen.emplace_back(std::istreambuf_iterator<char>(validation), std::istreambuf_iterator<char>());
    return failing_.Start(argv);
  }
  std::vector<std::string> data_seen;
  std::vector<std::string> validation_seen;
  std::vector<json> tasks_seen;
  std::vector<fs::path> task_files;
  std::vector<std::string> globals_seen;  // the initial_weights file's bytes

 private:
  ScriptedTrainer failing_{{R"({"event": "error", "code": "internal", "message": "recorded"})"}, 1};
};

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("agent-" + std::to_string(::getpid()) + "-" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    local_data_ = root_ / "local.csv";
    std::ofstream(local_data_) << "x,y\n1,2\n";
  }
  void TearDown() override { fs::remove_all(root_); }

  AgentOptions Options(const std::string& url) {
    return AgentOptions{.server_url = url,
                        .token = kToken,
                        .name = "w1",
                        .local_data = local_data_,
                        .cache_dir = root_ / "cache",
                        .trainers = {BuiltinTrainer()},
                        .backoff_initial = milliseconds(20),
                        .backoff_max = milliseconds(50)};
  }

  fs::path root_;
  fs::path local_data_;
};

// Runs the agent on a thread until the test stops it.
class RunningAgent {
 public:
  RunningAgent(AgentOptions options, TrainerLauncher& launcher)
      : agent_(std::move(options), launcher), thread_([this] { result_ = agent_.Run(stop_.get_token()); }) {}
  ~RunningAgent() { (void)Stop(); }
  Status Stop() {
    if (thread_.joinable()) {
      stop_.request_stop();
      thread_.join();
    }
    return result_;
  }
  const AgentCounters& counters() const { return agent_.counters(); }

 private:
  Agent agent_;
  std::stop_source stop_;
  Status result_;
  std::thread thread_;  // last: starts once the rest is built
};

TEST_F(AgentTest, FailedDownloadIsReportedOnceAndBlobsGetNoToken) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(io,
                                        FakeCoordinator(seen, [&] { return TrainTask(url); }, {.serve_global = false}));
  url = coordinator.url();
  ScriptedTrainer trainer({}, 0);
  RunningAgent agent(Options(url), trainer);
  // Reported, and the agent polls on afterwards.
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty() && seen.polls >= 3; }));
  ASSERT_TRUE(agent.Stop().ok());

  std::lock_guard lock(seen.mu);
  ASSERT_EQ(seen.failures.size(), 1u);
  const json& failure = seen.failures[0];
  EXPECT_EQ(failure["job_id"], 7);
  EXPECT_EQ(failure["round"], 2);
  EXPECT_EQ(failure["attempt"], 1);
  // The URL's query (its signature) stays out of the reason.
  EXPECT_EQ(failure["reason"], "GET " + url + "/blobs/jobs/7/global?…: HTTP 404: no such blob");
  EXPECT_EQ(trainer.starts.load(), 0);
  EXPECT_EQ(agent.counters().tasks_failed.load(), 1);
  EXPECT_EQ(agent.counters().failures_reported.load(), 1);
  // Blob URLs are signed in their query: the token stays with the coordinator's API.
  ASSERT_FALSE(seen.blob_authorizations.empty());
  for (const std::string& a : seen.blob_authorizations) EXPECT_EQ(a, "");
  for (const std::string& a : seen.api_authorizations) EXPECT_EQ(a, std::string("Bearer ") + kToken);
}

TEST_F(AgentTest, TrainerCrashIsReportedWithItsMessage) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(io, FakeCoordinator(seen, [&] { return TrainTask(url); }, {}));
  url = coordinator.url();
  ScriptedTrainer trainer({R"({"event": "error", "code": "out_of_memory", "message": "CUDA out of memory"})"}, 4);
  RunningAgent agent(Options(url), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
  ASSERT_TRUE(agent.Stop().ok());

  std::lock_guard lock(seen.mu);
  ASSERT_EQ(seen.failures.size(), 1u);
  EXPECT_EQ(seen.failures[0]["reason"], "trainer 'builtin' exited with status 4: out_of_memory: CUDA out of memory");
  EXPECT_EQ(trainer.starts.load(), 1);
}

// The hello announces the offered trainers with their descriptions; a task whose job names another trainer fails,
// saying which this worker offers, and the trainer is never started.
TEST_F(AgentTest, TrainersAreAnnouncedAndATaskNamingAnotherFails) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(io, FakeCoordinator(seen,
                                                            [&] {
                                                              json task = TrainTask(url);
                                                              task["config"]["trainer"] = "tabular";
                                                              return task;
                                                            },
                                                            {}));
  url = coordinator.url();
  ScriptedTrainer trainer({}, 0);
  RunningAgent agent(Options(url), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
  ASSERT_TRUE(agent.Stop().ok());
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.hellos.at(0)["trainers"], json::parse(R"([{"name": "builtin", "describe": {"contract_versions": [1],
                            "task_kinds": ["train", "evaluate"], "model_kinds": ["*"]}}])"));
  EXPECT_EQ(seen.failures.at(0)["reason"],
            "job 7 trains with the trainer 'tabular', which this worker does not offer (it offers: builtin); start it "
            "with --trainer tabular=COMMAND");
  EXPECT_EQ(trainer.starts.load(), 0);
}

// A worker with --data says so in its hello (format and rows only). One without it that gets a task of a job over
// the workers' own data fails it, saying why.
TEST_F(AgentTest, OwnDataIsAnnouncedAndItsAbsenceFailsSuchTasks) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(io, FakeCoordinator(seen, [&] { return TrainTask(url); }, {}));
  url = coordinator.url();
  ScriptedTrainer trainer({}, 0);
  AgentOptions options = Options(url);
  {
    RunningAgent with_data(options, trainer);
    ASSERT_TRUE(seen.WaitFor([&] { return !seen.hellos.empty(); }));
    ASSERT_TRUE(with_data.Stop().ok());
  }
  {
    std::lock_guard lock(seen.mu);
    EXPECT_EQ(seen.hellos[0]["local_data"], (json{{"format", "csv"}, {"rows", 1}}));
    seen.hellos.clear();
    seen.failures.clear();
    seen.polls = 0;
  }
  options.local_data.clear();
  RunningAgent without(options, trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
  ASSERT_TRUE(without.Stop().ok());
  std::lock_guard lock(seen.mu);
  EXPECT_FALSE(seen.hellos.at(0).contains("local_data"));
  EXPECT_EQ(seen.failures[0]["reason"],
            "job 7 trains on the workers' own data (data.source \"workers\"), but this worker was started without "
            "--data");
}

// One connection per idle worker: an open long-poll is the worker's presence, so the heartbeat thread sends nothing
// while one is held; it heartbeats while the worker has a task.
TEST_F(AgentTest, HeartbeatsGoOnlyWhileNoPollIsOpen) {
  net::io_context io;
  Seen seen;
  std::string url;
  http::testing::TestServer server(
      io, FakeCoordinator(seen, [&] { return TrainTask(url); },
                          {.heartbeat_interval_ms = 10, .task_on_poll = 4, .poll_hold = milliseconds(300)}));
  url = server.url();
  RunsUntilTerminated trainer;
  RunningAgent agent(Options(url), trainer);
  // Three polls held 300 ms each (30 heartbeat intervals apiece), then a task whose trainer runs until stopped.
  ASSERT_TRUE(seen.WaitFor([&] { return seen.polls >= 4; }));
  // The task's global is being fetched; then the trainer starts.
  for (int i = 0; i < 4000 && trainer.starts == 0; ++i) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_GT(trainer.starts.load(), 0);
  int before_task;
  {
    std::lock_guard lock(seen.mu);
    before_task = seen.heartbeats_between_polls;
  }
  ASSERT_TRUE(seen.WaitFor([&] { return seen.heartbeats_between_polls >= before_task + 3; }));
  EXPECT_TRUE(agent.Stop().ok());
  std::lock_guard lock(seen.mu);
  EXPECT_GE(seen.polls, 4);
  EXPECT_EQ(seen.heartbeats_during_poll, 0);
  EXPECT_GE(agent.counters().heartbeats.load(), 3);
}

TEST_F(AgentTest, TaskWhoseRoundMovedOnIsNotReported) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(
      io, FakeCoordinator(seen, [&] { return TrainTask(url); }, {.abandon_on_heartbeat = true}));
  url = coordinator.url();
  ScriptedTrainer trainer({R"({"event": "done", "num_samples": 1})"}, 0, /*write_outputs=*/true);
  RunningAgent agent(Options(url), trainer);
  // The heartbeat before the upload learns the round moved on; the agent then polls again.
  ASSERT_TRUE(seen.WaitFor([&] { return seen.polls >= 3; }));
  ASSERT_TRUE(agent.Stop().ok());
  EXPECT_EQ(agent.counters().uploads_skipped.load(), 1);
  EXPECT_EQ(agent.counters().tasks_failed.load(), 1);
  EXPECT_EQ(agent.counters().failures_reported.load(), 0);
  std::lock_guard lock(seen.mu);
  EXPECT_TRUE(seen.failures.empty());
}

TEST_F(AgentTest, CoordinatorWithoutTheFailureRouteKeepsTheAgentOnline) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(
      io, FakeCoordinator(seen, [&] { return TrainTask(url); }, {.serve_global = false, .failure_route = false}));
  url = coordinator.url();
  ScriptedTrainer trainer({}, 0);
  RunningAgent agent(Options(url), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return seen.polls >= 3; }));
  EXPECT_TRUE(agent.Stop().ok());
  EXPECT_EQ(agent.counters().tasks_failed.load(), 1);
  EXPECT_EQ(agent.counters().failures_reported.load(), 0);
  EXPECT_EQ(agent.counters().sessions.load(), 1);  // the 404 did not end the session
}

// A coordinator reset (a new database) hands out a new job 7 whose shard 0 has other rows: the worker's cache is
// keyed by the shard files' checksums, so the second task trains on the new rows, not on those cached for the
// first; a task of the same content again uses the cache (no download).
TEST_F(AgentTest, ShardCacheIsKeyedByContentNotByJobAndShard) {
  Seen seen;
  std::string url;
  std::string train = "x,y\n1,2\n";
  const std::string validation = "x,y\n3,4\n";
  seen.blobs = {{"jobs/7/shards/000/train.csv", train}, {"jobs/7/shards/000/validation.csv", validation}};
  net::io_context io;
  http::testing::TestServer coordinator(
      io, FakeCoordinator(seen, [&] { return PlatformTask(url, train, validation); }, {}));
  url = coordinator.url();
  DataRecordingTrainer trainer;
  auto run_one_task = [&] {
    {
      std::lock_guard lock(seen.mu);
      seen.failures.clear();
      seen.polls = 0;
    }
    RunningAgent agent(Options(url), trainer);
    ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
    ASSERT_TRUE(agent.Stop().ok());
  };
  run_one_task();
  // The coordinator was reset: same job id and shard index, other content.
  train = "x,y\n5,6\n";
  {
    std::lock_guard lock(seen.mu);
    seen.blobs["jobs/7/shards/000/train.csv"] = train;
  }
  run_one_task();
  size_t gets_before;
  {
    std::lock_guard lock(seen.mu);
    gets_before = seen.blob_authorizations.size();
  }
  run_one_task();
  ASSERT_EQ(trainer.data_seen.size(), 3u);
  EXPECT_EQ(trainer.data_seen[0], "x,y\n1,2\n");
  EXPECT_EQ(trainer.data_seen[1], "x,y\n5,6\n");
  EXPECT_EQ(trainer.data_seen[2], "x,y\n5,6\n");
  for (const std::string& v : trainer.validation_seen) EXPECT_EQ(v, validation);
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.blob_authorizations.size(), gets_before + 1) << "only the global is downloaded again";
  EXPECT_EQ(seen.failures.at(0)["reason"], "trainer 'builtin' exited with status 1: internal: recorded");
}

// A shard file whose bytes differ from the task's sha256 (a tampered store, a man in the middle) is never used: the
// task fails with a reason naming the file and both checksums, reported to the coordinator, and nothing of it stays
// in the cache.
TEST_F(AgentTest, ShardThatDiffersFromItsChecksumFailsTheTaskAndIsRemoved) {
  Seen seen;
  std::string url;
  const std::string train = "x,y\n1,2\n", validation = "x,y\n3,4\n", served = "x,y\n9,9\n";
  seen.blobs = {{"jobs/7/shards/000/train.csv", served}, {"jobs/7/shards/000/validation.csv", validation}};
  net::io_context io;
  http::testing::TestServer coordinator(
      io, FakeCoordinator(seen, [&] { return PlatformTask(url, train, validation); }, {}));
  url = coordinator.url();
  DataRecordingTrainer trainer;
  RunningAgent agent(Options(url), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
  ASSERT_TRUE(agent.Stop().ok());
  EXPECT_TRUE(trainer.data_seen.empty());
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.failures.at(0)["reason"],
            "shard 0's training file (train.csv) arrived with sha256 " + Sha256Hex(std::string_view(served)) +
                ", expected " + Sha256Hex(std::string_view(train)) + " (the task's); the download was removed");
  const fs::path cache = root_ / "cache";
  EXPECT_FALSE(fs::exists(cache / "shards") && !fs::is_empty(cache / "shards"));
  EXPECT_TRUE(!fs::exists(cache / "tasks") || fs::is_empty(cache / "tasks"));
}

// The same for the global weights: the task's global sha256 is checked before the trainer starts.
TEST_F(AgentTest, GlobalThatDiffersFromItsChecksumFailsTheTask) {
  Seen seen;
  std::string url;
  seen.blobs = {{"jobs/7/global", "tampered weights"}};
  net::io_context io;
  http::testing::TestServer coordinator(io, FakeCoordinator(seen, [&] { return TrainTask(url); }, {}));
  url = coordinator.url();
  DataRecordingTrainer trainer;
  RunningAgent agent(Options(url), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
  ASSERT_TRUE(agent.Stop().ok());
  EXPECT_TRUE(trainer.data_seen.empty());
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.failures.at(0)["reason"], "the global weights of round 0 (global.safetensors) arrived with sha256 " +
                                               Sha256Hex(std::string_view("tampered weights")) + ", expected " +
                                               Sha256Hex(std::string_view(kGlobalBytes)) +
                                               " (the task's); the download was removed");
}

// FedProx: the coordinator's proximal_mu reaches parsyn-trainer's task file, beside the downloaded global that
// anchors the term (initial_weights); a FedAvg task's file has no proximal_mu.
TEST_F(AgentTest, ProximalMuReachesTheTrainersTaskFile) {
  Seen seen;
  std::string url;
  double mu = 0.25;
  net::io_context io;
  auto task = [&] {
    json train = TrainTask(url);
    if (mu > 0) train["proximal_mu"] = mu;
    return train;
  };
  http::testing::TestServer coordinator(io, FakeCoordinator(seen, task, {}));
  url = coordinator.url();
  DataRecordingTrainer trainer;
  auto run_one_task = [&] {
    {
      std::lock_guard lock(seen.mu);
      seen.failures.clear();
      seen.polls = 0;
    }
    RunningAgent agent(Options(url), trainer);
    ASSERT_TRUE(seen.WaitFor([&] { return !seen.failures.empty(); }));
    ASSERT_TRUE(agent.Stop().ok());
  };
  run_one_task();
  mu = 0;
  run_one_task();
  ASSERT_EQ(trainer.tasks_seen.size(), 2u);
  auto fedprox = protocol::ParseTrainerTask(trainer.tasks_seen[0]);
  ASSERT_TRUE(fedprox.ok()) << fedprox.status().ToString();
  EXPECT_EQ(fedprox->proximal_mu, 0.25);
  EXPECT_FALSE(fedprox->initial_weights.empty());
  EXPECT_EQ(trainer.globals_seen.at(0), kGlobalBytes);  // the term's anchor: the task's global
  EXPECT_FALSE(trainer.tasks_seen[1].contains("proximal_mu"));
  // The task's folder carries the worker's id (the hello answer's), so workers sharing one cache folder never remove
  // each other's task.
  EXPECT_TRUE(trainer.task_files[0].parent_path().filename().string().starts_with("w41-")) << trainer.task_files[0];
}

// The cache root holds shards, weights and updates: created private (0700); an existing one keeps its mode.
TEST_F(AgentTest, CacheRootIsCreatedPrivate) {
  const fs::path cache = root_ / "new" / "cache";
  ASSERT_TRUE(CreateCacheRoot(cache).ok());
  EXPECT_EQ(fs::status(cache).permissions() & fs::perms::all, fs::perms::owner_all);
  fs::permissions(cache, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  ASSERT_TRUE(CreateCacheRoot(cache).ok());
  EXPECT_EQ(fs::status(cache).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
}

// A worker whose token is revoked mid-task stops its trainer at the first 401, uploads nothing, and Run ends with
// the refusal by itself (no stop requested).
TEST_F(AgentTest, RevokedTokenStopsTheTaskAndTheAgent) {
  Seen seen;
  std::string url;
  net::io_context io;
  http::testing::TestServer coordinator(io,
                                        FakeCoordinator(seen, [&] { return TrainTask(url); }, {.token_revoked = true}));
  url = coordinator.url();
  RunsUntilTerminated trainer;
  Agent agent(Options(url), trainer);
  std::stop_source stop;
  std::promise<Status> result;
  std::future<Status> ended_future = result.get_future();
  std::thread runner([&] { result.set_value(agent.Run(stop.get_token())); });
  // Run must end by itself; the bound only keeps a regression from hanging the test.
  const bool ended_alone = ended_future.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  stop.request_stop();
  runner.join();
  ASSERT_TRUE(ended_alone) << "the agent kept running after its token was refused";
  Status ended = ended_future.get();
  EXPECT_TRUE(ended.code() == StatusCode::kUnauthenticated || ended.code() == StatusCode::kPermissionDenied)
      << ended.ToString();
  EXPECT_EQ(trainer.starts.load(), 1);
  EXPECT_TRUE(trainer.terminated.load());
  EXPECT_EQ(agent.counters().tasks_completed.load(), 0);
  EXPECT_EQ(agent.counters().sessions.load(), 1);  // no new hello with a refused token
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.uploads, 0);
  EXPECT_GE(seen.refused, 1);
  EXPECT_EQ(seen.hellos.size(), 1u);
  EXPECT_TRUE(seen.failures.empty());
}

// A coordinator that is a standby (hello answered 503, as `parsyn server` answers on a standby) until `leader` is
// set; as the leader it accepts hellos and answers polls with no task.
struct Standby {
  std::atomic<bool> leader = false;
  std::atomic<int> hellos_refused = 0;
  std::atomic<int> hellos_accepted = 0;
  std::atomic<int> polls = 0;

  http::Router Routes() {
    http::Router router;
    EXPECT_TRUE(router
                    .Add(http::Method::kPost, "/api/v1/worker/hello",
                         [this](http::Request&) -> http::Awaitable<http::Response> {
                           if (!leader) {
                             hellos_refused++;
                             co_return http::Response::Error(
                                 UnavailableError("this coordinator is a standby; the leader is elsewhere"));
                           }
                           hellos_accepted++;
                           co_return http::Response::Json(200, {{"session_id", "s2"},
                                                                {"worker_id", 41},
                                                                {"heartbeat_interval_ms", 60'000},
                                                                {"max_poll_wait_ms", 100}});
                         })
                    .ok());
    EXPECT_TRUE(router
                    .Add(http::Method::kGet, "/api/v1/worker/tasks/next",
                         [this](http::Request&) -> http::Awaitable<http::Response> {
                           polls++;
                           loop::Signal idle(co_await net::this_coro::executor);
                           co_await idle.Wait(milliseconds(50));
                           co_return http::Response::NoContent();
                         })
                    .ok());
    for (const char* path : {"/api/v1/worker/heartbeat", "/api/v1/worker/goodbye"}) {
      EXPECT_TRUE(router
                      .Add(http::Method::kPost, path,
                           [](http::Request&) -> http::Awaitable<http::Response> {
                             co_return http::Response::Json(200, {{"abandon", json::array()}});
                           })
                      .ok());
    }
    return router;
  }
};

// `--server A,B`: hello goes past a standby's 503 to the leader; when the leader goes away, the agent finds the new
// one (the former standby) by itself.
TEST_F(AgentTest, SeveralCoordinatorsTheAgentFollowsTheLeader) {
  EXPECT_EQ(SplitServerUrls(" http://a:1/, http://b:2 ,,"), (std::vector<std::string>{"http://a:1", "http://b:2"}));
  Seen seen;
  net::io_context leader_io, standby_io;
  auto leader =
      std::make_unique<http::testing::TestServer>(leader_io, FakeCoordinator(seen, [] { return json(); }, {}));
  Standby standby;
  http::testing::TestServer standby_server(standby_io, standby.Routes());
  ScriptedTrainer trainer({}, 0);
  // The standby first: the agent must not stop there.
  RunningAgent agent(Options(standby_server.url() + "," + leader->url()), trainer);
  ASSERT_TRUE(seen.WaitFor([&] { return !seen.hellos.empty() && seen.polls >= 3; }));
  EXPECT_GE(standby.hellos_refused.load(), 1);
  EXPECT_EQ(standby.hellos_accepted.load(), 0);

  // The leader dies; the standby takes over.
  leader->Stop(milliseconds(100));
  standby.leader = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (standby.polls < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(standby.hellos_accepted.load(), 1);
  EXPECT_GE(standby.polls.load(), 3);
  EXPECT_TRUE(agent.Stop().ok());
  EXPECT_EQ(agent.counters().sessions.load(), 2);
}

}  // namespace
}  // namespace parsyn::worker
