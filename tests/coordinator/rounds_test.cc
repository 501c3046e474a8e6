// Round-engine scenarios against a real `parsyn server`, with scripted workers making real HTTP requests:
// normal rounds (each global checked against an independent FedAvg of the uploads), a worker gone mid-round, a
// straggler, too few workers, bad updates, and a SIGKILL mid-round followed by a restart.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "base/sha256.h"
#include "base/testing/raw_socket.h"
#include "harness.h"
#include "net/transport.h"
#include "protocol/training_config.h"
#include "weights/peft_config.h"

namespace parsyn::testing {
namespace {

constexpr auto kJobTimeout = std::chrono::seconds(60);

class RoundsTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> extra = {}) {
    server_ = std::make_unique<ServerProcess>(dir_.path() / "data", std::move(extra));
    admin_ = AdminClient(*server_);
  }
  int64_t CreateJob(const json& spec) {
    auto job = admin_->PostJson("/api/v1/training-jobs", spec);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? (*job->Json())["id"].get<int64_t>() : 0;
  }
  // Starts the workers and waits until they are all online, so a job created next starts with all of them.
  std::vector<std::unique_ptr<ScriptedWorker>> StartWorkers(const Fixture& f, std::vector<Behaviour> behaviours) {
    std::vector<std::unique_ptr<ScriptedWorker>> workers;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < behaviours.size(); ++i) {
      workers.push_back(std::make_unique<ScriptedWorker>(*server_, f.worker_ids[i], f.worker_tokens[i], behaviours[i]));
      workers.back()->Start();
      ids.push_back(f.worker_ids[i]);
    }
    EXPECT_TRUE(WaitForWorkersOnline(*admin_, ids, std::chrono::seconds(10)));
    return workers;
  }
  json Rounds(int64_t job_id) {
    auto res = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/rounds");
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? (*res->Json())["rounds"] : json::array();
  }
  std::string Artifact(int64_t job_id, const std::string& name) {
    auto res = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/artifacts/" + name);
    EXPECT_TRUE(res.ok()) << name << ": " << res.status().ToString();
    return res.ok() ? res->body : "";
  }

  // Says hello as the fixture's first worker, starts a one-round job over that worker alone and polls (by hand,
  // no scripted worker) until the job's task arrives. Returns the task; `api` is left holding it.
  json HoldOneTask(const Fixture& f, std::unique_ptr<http::Client>& api) {
    api = ClientWithToken(*server_, f.worker_tokens[0]);
    auto hello = api->PostJson("/api/v1/worker/hello", json::object());
    EXPECT_TRUE(hello.ok()) << hello.status().ToString();
    if (!hello.ok()) return json();
    const std::string session = (*hello->Json())["session_id"];
    Fixture one = f;
    one.worker_ids = {f.worker_ids[0]};
    one.worker_tokens = {f.worker_tokens[0]};
    CreateJob(DistributedSpec(one, 1, 1, 60));
    for (int i = 0; i < 30; ++i) {
      auto next = api->Get("/api/v1/worker/tasks/next?session_id=" + session + "&wait_ms=1000");
      EXPECT_TRUE(next.ok()) << next.status().ToString();
      if (!next.ok()) return json();
      if (next->status == 200) return *next->Json();
    }
    ADD_FAILURE() << "no task came";
    return json();
  }
  json Metrics(int64_t job_id, const std::string& query = "") {
    auto res = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/metrics" + query);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
};

// One worker token was all it took to kill the server with SIGSEGV: a result whose metrics nest ~200,000 arrays
// (400 KB, under the body cap), parsed without a depth limit and copied recursively on the event loop. Now every
// route refuses such a body with a 400 before parsing it, and the server goes on.
TEST_F(RoundsTest, DeeplyNestedBodiesAreRefusedAndTheServerGoesOn) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 40, 1);
  auto worker = ClientWithToken(*server_, f.worker_tokens[0]);
  const std::string nested = std::string(200'000, '[') + std::string(200'000, ']');
  const std::string result = R"({"job_id": 1, "round": 1, "attempt": 1, "metrics": {"steps": )" + nested + "}}";
  for (int i = 0; i < 3; ++i) {
    auto answer = worker->Send(http::Method::kPost, "/api/v1/worker/result", result, "application/json");
    ASSERT_FALSE(answer.ok());
    EXPECT_NE(answer.status().message().find("HTTP 400: request body nests deeper than 64 levels"), std::string::npos)
        << answer.status().ToString();
  }
  // The admin routes parse through the same reader.
  auto job = admin_->Send(http::Method::kPost, "/api/v1/training-jobs", R"({"name": "x", "config": )" + nested + "}",
                          "application/json");
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("HTTP 400: request body nests deeper than 64 levels"), std::string::npos)
      << job.status().ToString();
  auto workers =
      admin_->Send(http::Method::kPost, "/api/v1/workers", R"({"name": )" + nested + "}", "application/json");
  ASSERT_FALSE(workers.ok());
  EXPECT_NE(workers.status().message().find("nests deeper than 64 levels"), std::string::npos);
  auto health = admin_->Get("/healthz");
  EXPECT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_TRUE(server_->running());
}

TEST_F(RoundsTest, NormalRoundsCommitTheFedAvgOfTheUploads) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 41, 2);  // shards of 21 and 20 rows: unequal weights
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest});
  const int64_t job_id = CreateJob(DistributedSpec(f, 3, 2, 20));
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  EXPECT_EQ(job["committed_round"], 3);
  // The scripted workers report 2/t for the global they receive in round t's task (t = 4: the final evaluation).
  EXPECT_EQ(job["initial_validation_loss"], 2.0);
  EXPECT_EQ(job["final_validation_loss"], 0.5);
  EXPECT_EQ(job["best_round"], 3);
  EXPECT_EQ(job["best_validation_loss"], 0.5);

  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 3u) << rounds.dump();
  for (int r = 1; r <= 3; ++r) {
    const json& round = rounds[r - 1];
    EXPECT_EQ(round["round"], r);
    EXPECT_EQ(round["outcome"], "committed");
    ASSERT_EQ(round["updates"].size(), 2u);
    for (const json& u : round["updates"]) EXPECT_EQ(u["status"], "accepted") << u.dump();
    EXPECT_NEAR(round["train_loss"].get<double>(), 1.0 / r, 1e-12);
    // Round r's validation_loss is that of the global it committed, measured by round r + 1's workers.
    EXPECT_NEAR(round["validation_loss"].get<double>(), 2.0 / (r + 1), 1e-12);
    // Up: the two updates as stored. Down: the global each worker fetched through /blobs (round r - 1's; the
    // scripted workers fetch nothing else). Moved: both.
    int64_t update_bytes = 0;
    for (const json& u : round["updates"]) update_bytes += u["size_bytes"].get<int64_t>();
    EXPECT_EQ(round["bytes_up"], update_bytes);
    if (r >= 2) {
      char previous[64];
      std::snprintf(previous, sizeof(previous), "rounds/%06d/global.safetensors", r - 1);
      EXPECT_EQ(round["bytes_down"], 2 * static_cast<int64_t>(Artifact(job_id, previous).size()));
    }
    EXPECT_EQ(round["bytes_moved"], round["bytes_down"].get<int64_t>() + update_bytes);

    // Independent FedAvg in double of exactly what the workers uploaded for this round.
    std::vector<Upload> uploads;
    for (auto& w : workers) {
      for (const Upload& u : w->uploads()) {
        if (u.round == r && u.attempt == round["attempt"]) uploads.push_back(u);
      }
    }
    ASSERT_EQ(uploads.size(), 2u);
    char name[64];
    std::snprintf(name, sizeof(name), "rounds/%06d/global.safetensors", r);
    auto global = DecodeF32(Artifact(job_id, name));
    ASSERT_EQ(global.size(), uploads[0].tensors.size());
    double total = 0;
    for (const Upload& u : uploads) total += static_cast<double>(u.sample_count);
    EXPECT_EQ(total, 37);  // training rows: shards of 21 and 20 rows, 2 validation rows each
    double max_diff = 0;
    for (size_t t = 0; t < global.size(); ++t) {
      ASSERT_EQ(global[t].first, uploads[0].tensors[t].first);
      for (size_t i = 0; i < global[t].second.size(); ++i) {
        double sum = 0;
        for (const Upload& u : uploads) sum += static_cast<double>(u.sample_count) * u.tensors[t].second[i];
        max_diff = std::max(max_diff, std::abs(sum / total - global[t].second[i]));
      }
    }
    // The exact accumulation rounds once to float: within half an ulp of values below 1.
    EXPECT_LT(max_diff, 1e-7) << "round " << r;
  }

  // The result in PEFT layout: the last global and a config built from the job.
  EXPECT_EQ(Artifact(job_id, "adapter_model.safetensors"), Artifact(job_id, "rounds/000003/global.safetensors"));
  json config = json::parse(Artifact(job_id, "adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8);
  EXPECT_EQ(config["target_modules"], json({"q_proj", "v_proj"}));
  // Written by the one adapter_config.json writer `parsyn train` uses too; the model's config.json has no
  // _name_or_path, so the base is named by its registered name.
  EXPECT_EQ(Artifact(job_id, "adapter_config.json"),
            weights::PeftAdapterConfigJson({.r = 4,
                                            .lora_alpha = 8,
                                            .lora_dropout = protocol::TrainingConfig{}.lora_dropout,
                                            .target_modules = {"q_proj", "v_proj"},
                                            .base_model_name_or_path = "tiny-llama"}));
  // The best adapter, in the same form: round 3's global had the lowest validation loss.
  EXPECT_EQ(Artifact(job_id, "best/adapter_model.safetensors"), Artifact(job_id, "rounds/000003/global.safetensors"));
  EXPECT_EQ(Artifact(job_id, "best/adapter_config.json"), Artifact(job_id, "adapter_config.json"));

  auto metrics = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_EQ((*metrics->Json())["workers"].size(), 2u);

  // Each committed round's updates were uploaded into its updates/ directory and are deleted once it is committed
  // (in the background: waited for, bounded); the records above are all that stays.
  const std::filesystem::path rounds_dir = dir_.path() / "data" / "blobs" / "jobs" / std::to_string(job_id) / "rounds";
  int update_dirs = 0, files_left = 0;
  for (int i = 0; i < 500; ++i) {
    update_dirs = files_left = 0;
    for (const auto& attempt : std::filesystem::directory_iterator(rounds_dir)) {
      if (!std::filesystem::is_directory(attempt.path() / "updates")) continue;
      ++update_dirs;
      for (const auto& f : std::filesystem::directory_iterator(attempt.path() / "updates")) {
        files_left += f.is_regular_file() ? 1 : 0;
      }
    }
    if (files_left == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(update_dirs, 3);
  EXPECT_EQ(files_left, 0) << "update files left under " << rounds_dir;
}

json ProgressReport(int64_t job_id, int round, int attempt, int64_t step) {
  return {{"job_id", job_id}, {"round", round}, {"attempt", attempt}, {"step", step}, {"loss", 0.5}};
}

// Any worker token could store progress points, two fsynced rows a request, for a job it had no task in. Now only
// the task the worker holds may report (409 otherwise, nothing stored), and at most once per --progress-interval-ms.
TEST_F(RoundsTest, ProgressComesOnlyFromTheTaskHolderAtABoundedRate) {
  // An hour between stored reports: the test's second report is always too soon, however slow the machine.
  StartServer({"--progress-interval-ms", "3600000"});
  Fixture f = MakeFixture(*admin_, 40, 2);
  std::unique_ptr<http::Client> holder;
  const json task = HoldOneTask(f, holder);
  ASSERT_TRUE(task.is_object());
  const int64_t job_id = task["job_id"];
  const int round = task["round"];
  const int attempt = task["attempt"];

  auto expect_no_task = [&](http::Client& api, int64_t worker_id, int r, int a) {
    auto answer = api.PostJson("/api/v1/worker/progress", ProgressReport(job_id, r, a, 1));
    ASSERT_FALSE(answer.ok());
    EXPECT_EQ(answer.status().code(), StatusCode::kFailedPrecondition) << answer.status().ToString();
    const std::string expected = "HTTP 409: worker " + std::to_string(worker_id) + " has no task in job " +
                                 std::to_string(job_id) + " round " + std::to_string(r) + " attempt " +
                                 std::to_string(a);
    EXPECT_NE(answer.status().message().find(expected), std::string::npos) << answer.status().ToString();
  };
  // A worker of the same owner with no task in the job; the holder for a round or attempt it does not hold.
  auto other = ClientWithToken(*server_, f.worker_tokens[1]);
  expect_no_task(*other, f.worker_ids[1], round, attempt);
  expect_no_task(*holder, f.worker_ids[0], round + 1, attempt);
  expect_no_task(*holder, f.worker_ids[0], round, attempt + 1);
  EXPECT_EQ(Metrics(job_id)["workers"], json::array()) << "a refused report stored nothing";

  // The holder's own task: stored.
  auto first = holder->PostJson("/api/v1/worker/progress", ProgressReport(job_id, round, attempt, 1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->status, 204);
  // At once again: 429 with a Retry-After (read through the transport, which keeps a refusal's headers).
  net::Transport transport(net::TransportOptions{});
  const std::string body = ProgressReport(job_id, round, attempt, 2).dump();
  auto request_body = net::MemoryBody(body);
  auto again = transport.Perform(
      {.method = "POST",
       .url = server_->url() + "/api/v1/worker/progress",
       .headers = {{"Authorization", "Bearer " + f.worker_tokens[0]}, {"Content-Type", "application/json"}},
       .body = request_body.get()});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->status, 429) << again->body;
  EXPECT_NE(again->body.find("resource_exhausted"), std::string::npos) << again->body;
  ASSERT_TRUE(again->headers.contains("retry-after"));
  const int retry_after = std::stoi(again->headers.at("retry-after"));
  EXPECT_GE(retry_after, 1);
  EXPECT_LE(retry_after, 3600);

  const json metrics = Metrics(job_id);
  ASSERT_EQ(metrics["workers"].size(), 1u) << metrics.dump();
  EXPECT_EQ(metrics["workers"][0]["worker_id"], f.worker_ids[0]);
  ASSERT_EQ(metrics["workers"][0]["points"].size(), 1u) << metrics.dump();
  EXPECT_EQ(metrics["workers"][0]["points"][0]["step"], 1);
}

// The interval was per worker across jobs: a worker whose task in one job ended within it (a fast trainer) had its
// first report in the next job refused, and a task that short stored no progress for that job at all.
TEST_F(RoundsTest, AReportInANewJobIsNotHeldToTheIntervalOfTheJobBefore) {
  StartServer({"--progress-interval-ms", "3600000"});
  Fixture f = MakeFixture(*admin_, 40, 2);
  std::unique_ptr<http::Client> holder;
  const json first_task = HoldOneTask(f, holder);
  ASSERT_TRUE(first_task.is_object());
  const int64_t first_job = first_task["job_id"];
  auto first = holder->PostJson("/api/v1/worker/progress",
                                ProgressReport(first_job, first_task["round"], first_task["attempt"], 1));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto cancelled = admin_->PostJson("/api/v1/training-jobs/" + std::to_string(first_job) + "/cancel", json::object());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  const json second_task = HoldOneTask(f, holder);  // a new session, a second job, its task
  ASSERT_TRUE(second_task.is_object());
  const int64_t second_job = second_task["job_id"];
  ASSERT_NE(second_job, first_job);
  auto second = holder->PostJson("/api/v1/worker/progress",
                                 ProgressReport(second_job, second_task["round"], second_task["attempt"], 1));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->status, 204);
  // Within the job, the interval holds.
  auto again = holder->PostJson("/api/v1/worker/progress",
                                ProgressReport(second_job, second_task["round"], second_task["attempt"], 2));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kResourceExhausted) << again.status().ToString();
  const json metrics = Metrics(second_job);
  ASSERT_EQ(metrics["workers"].size(), 1u) << metrics.dump();
  EXPECT_EQ(metrics["workers"][0]["points"].size(), 1u) << metrics.dump();
}

// The stored series was unbounded and read whole. Now at most --max-progress-points per job and worker are stored
// (later reports are taken, not stored), and GET .../metrics answers pages of ?limit= points after ?after=.
TEST_F(RoundsTest, ProgressPointsAreCappedAndTheMetricsArePaged) {
  StartServer({"--progress-interval-ms", "0", "--max-progress-points", "3"});
  Fixture f = MakeFixture(*admin_, 40, 1);
  std::unique_ptr<http::Client> holder;
  const json task = HoldOneTask(f, holder);
  ASSERT_TRUE(task.is_object());
  const int64_t job_id = task["job_id"];
  for (int64_t step = 1; step <= 5; ++step) {
    auto answer =
        holder->PostJson("/api/v1/worker/progress", ProgressReport(job_id, task["round"], task["attempt"], step));
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    EXPECT_EQ(answer->status, 204);
  }
  // Nor is an event stored past the cap: the full replay (?after=0) has three progress events. A stream that does not
  // say where to resume starts at the tail: the history without progress, then what comes.
  auto count_progress = [&](const std::string& query) {
    int progress = 0, others = 0;
    http::CallOptions call;
    call.timeout = std::chrono::seconds(2);
    // The stream stays open: the read ends at its timeout, and the counts are what the test checks.
    [[maybe_unused]] Status ended = admin_->ReadEvents(
        "/api/v1/training-jobs/" + std::to_string(job_id) + "/events" + query,
        [&](const http::SseEvent& e) {
          (e.event == "worker_progress" ? progress : others)++;
          return true;
        },
        call);
    return std::pair(progress, others);
  };
  EXPECT_EQ(count_progress("?after=0").first, 3);
  const auto [tail_progress, tail_others] = count_progress("");
  EXPECT_EQ(tail_progress, 0);
  EXPECT_GT(tail_others, 0);  // the job's status and round events
  const json all = Metrics(job_id);
  EXPECT_EQ(all["next"], nullptr);
  ASSERT_EQ(all["workers"].size(), 1u) << all.dump();
  std::vector<int64_t> steps;
  for (const json& p : all["workers"][0]["points"]) steps.push_back(p["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3})) << all.dump();

  const json page1 = Metrics(job_id, "?limit=2");
  ASSERT_EQ(page1["workers"].size(), 1u) << page1.dump();
  ASSERT_EQ(page1["workers"][0]["points"].size(), 2u) << page1.dump();
  EXPECT_EQ(page1["workers"][0]["points"][1]["step"], 2);
  ASSERT_TRUE(page1["next"].is_number_integer()) << page1.dump();
  EXPECT_EQ(page1["next"], page1["workers"][0]["points"][1]["id"]);
  const json page2 = Metrics(job_id, "?limit=2&after=" + std::to_string(page1["next"].get<int64_t>()));
  ASSERT_EQ(page2["workers"].size(), 1u) << page2.dump();
  ASSERT_EQ(page2["workers"][0]["points"].size(), 1u) << page2.dump();
  EXPECT_EQ(page2["workers"][0]["points"][0]["step"], 3);
  EXPECT_EQ(page2["next"], nullptr);
  // The same pages with the cursor every list pages with; `after`/`next` are its older spelling.
  ASSERT_TRUE(page1["next_cursor"].is_string()) << page1.dump();
  EXPECT_EQ(Metrics(job_id, "?limit=2&cursor=" + page1["next_cursor"].get<std::string>()), page2);
  EXPECT_EQ(page2["next_cursor"], nullptr);

  for (const char* bad : {"?limit=0", "?limit=10001", "?limit=x", "?after=-1"}) {
    auto res = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id) + "/metrics" + bad);
    ASSERT_FALSE(res.ok()) << bad;
    EXPECT_NE(res.status().message().find("HTTP 400: "), std::string::npos) << res.status().ToString();
    EXPECT_NE(res.status().message().find(bad[1] == 'l' ? "limit must be" : "after must be"), std::string::npos)
        << res.status().ToString();
  }
}

TEST_F(RoundsTest, WorkerGoneMidRoundLeavesAndTheOthersCommit) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 30, 3);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest, Behaviour::kCrashAfterTask});
  const int64_t job_id = CreateJob(DistributedSpec(f, 2, 2, 20));
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_GE(rounds.size(), 2u);
  EXPECT_EQ(rounds[0]["outcome"], "committed");
  EXPECT_EQ(rounds[0]["updates"].size(), 2u);
  bool dropped = WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) {
        return t == "worker_dropped" && d["worker_id"] == f.worker_ids[2] && d["cause"] == "disconnected";
      },
      std::chrono::seconds(5));
  EXPECT_TRUE(dropped);
}

// A worker killed while its task poll is open leaves that poll looking open until the server writes to it: its
// session stayed idle and online, and a job starting meanwhile gave it a task it never received (the round lost it
// until aggregation_timeout). The poll's connection is watched now: the worker is offline as soon as its kernel
// closes the socket, whatever the heartbeat timeout and poll wait (two minutes each here), and the job's task goes to
// the live worker only.
TEST_F(RoundsTest, AWorkerWhosePollConnectionClosesIsOfflineAtOnceAndGetsNoTask) {
  StartServer({"--heartbeat-timeout-ms", "120000", "--max-poll-wait-ms", "120000"});
  Fixture f = MakeFixture(*admin_, 30, 2);
  auto workers = StartWorkers(f, {Behaviour::kHonest});
  auto killed = ClientWithToken(*server_, f.worker_tokens[1]);
  auto hello = killed->PostJson("/api/v1/worker/hello", json::object());
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  const std::string session = (*hello->Json())["session_id"];
  ASSERT_TRUE(WaitForWorkersOnline(*admin_, {f.worker_ids[1]}, std::chrono::seconds(10)));
  // Its poll, on a raw socket closed right after the request, as the kernel of a SIGKILLed worker does.
  const uint16_t port = static_cast<uint16_t>(std::stoi(server_->url().substr(server_->url().rfind(':') + 1)));
  const int fd = test_support::ConnectLoopback(port);
  ASSERT_GE(fd, 0);
  const std::string poll = "GET /api/v1/worker/tasks/next?session_id=" + session +
                           "&wait_ms=120000 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                           f.worker_tokens[1] + "\r\n\r\n";
  ASSERT_EQ(::send(fd, poll.data(), poll.size(), MSG_NOSIGNAL), static_cast<ssize_t>(poll.size()));
  ::close(fd);

  std::string status;
  for (int i = 0; i < 200 && status != "offline"; ++i) {
    auto record = admin_->Get("/api/v1/workers/" + std::to_string(f.worker_ids[1]));
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    status = (*record->Json())["status"];
    if (status != "offline") std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(status, "offline") << "a worker whose poll connection closed is still " << status;

  const int64_t job_id = CreateJob(DistributedSpec(f, 1, 1, 60));
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(40));
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0]["updates"].size(), 1u) << rounds[0].dump();
  EXPECT_EQ(rounds[0]["updates"][0]["worker_id"], f.worker_ids[0]) << rounds[0].dump();
  EXPECT_EQ(rounds[0]["participants"], json::array({f.worker_ids[0]})) << rounds[0].dump();
  std::string assigned_to_killed;
  WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) {
        if (t == "task_assigned" && d["worker_id"] == f.worker_ids[1]) assigned_to_killed = d.dump();
        return !assigned_to_killed.empty();
      },
      std::chrono::seconds(2));
  EXPECT_EQ(assigned_to_killed, "") << "the killed worker's session was given a task";
}

TEST_F(RoundsTest, AWorkerReportingItsTaskFailedLeavesAtOnceWithTheReason) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 30, 3);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest, Behaviour::kReportsFailure});
  // A 60 s aggregation timeout: the round can only end in time if the failure report drops the worker at once.
  // One round: all three are idle when it starts (a second round could start with the failing worker and only one
  // other, which then fails it for too few updates).
  const int64_t job_id = CreateJob(DistributedSpec(f, 1, 2, 60));
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(40));
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0]["outcome"], "committed");
  EXPECT_EQ(rounds[0]["updates"].size(), 2u) << rounds[0].dump();
  bool dropped = WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) {
        return t == "worker_dropped" && d["worker_id"] == f.worker_ids[2] && d["cause"] == "task_failed" &&
               d["reason"] == "the worker's task failed: the trainer ran out of memory";
      },
      std::chrono::seconds(5));
  EXPECT_TRUE(dropped);
  // A second report for the same task is refused: it is no longer in training.
  auto again =
      ClientWithToken(*server_, f.worker_tokens[2])
          ->PostJson("/api/v1/worker/failure", {{"job_id", job_id}, {"round", 1}, {"attempt", 1}, {"reason", "again"}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status().ToString();
}

// Regression: a poll's availability offer waits for the job's mutex; when the event holding it (another worker's
// result closing the round) gives the polling worker its next task, the offer is stale and must not make the engine
// drop the worker for "asking for a new task before reporting". Back-to-back polls keep such offers in flight at
// every round transition.
TEST_F(RoundsTest, AnOfferThatWentStaleWhileTheRoundTurnedDoesNotDropTheWorker) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 30, 3);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest, Behaviour::kHonest});
  for (auto& w : workers) w->set_poll_wait(std::chrono::milliseconds(0));
  const int64_t job_id = CreateJob(DistributedSpec(f, 5, 3, 20));
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 5u) << rounds.dump();
  for (const json& round : rounds) {
    EXPECT_EQ(round["attempt"], 1) << round.dump();
    EXPECT_EQ(round["updates"].size(), 3u) << round.dump();
  }
  std::string drop;
  WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) {
        if (t == "worker_dropped") drop = d.dump();
        return t == "worker_dropped";
      },
      std::chrono::seconds(2));
  EXPECT_EQ(drop, "") << "no worker may be dropped";
}

TEST_F(RoundsTest, StragglerIsDroppedAtTheAggregationTimeout) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 30, 3);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest, Behaviour::kSilent});
  const int64_t job_id = CreateJob(DistributedSpec(f, 1, 2, 2));
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0]["updates"].size(), 2u);
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) {
        return t == "worker_dropped" && d["worker_id"] == f.worker_ids[2] && d["cause"] == "straggler";
      },
      std::chrono::seconds(5)));
}

TEST_F(RoundsTest, TooFewWorkersFailRoundsThenTheJob) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 20, 2);
  const int64_t job_id = CreateJob(DistributedSpec(f, 2, 2, 1, /*fault_tolerance=*/2));
  auto workers = StartWorkers(f, {Behaviour::kHonest});  // the second worker never comes
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "failed") << job.dump();
  EXPECT_NE(job["failure_reason"].get<std::string>().find("fault_tolerance 2"), std::string::npos) << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 2u);
  for (int a = 0; a < 2; ++a) {
    EXPECT_EQ(rounds[a]["round"], 1);
    EXPECT_EQ(rounds[a]["attempt"], a + 1);
    EXPECT_EQ(rounds[a]["outcome"], "failed");
  }
  EXPECT_EQ(job["committed_round"], 0);
}

TEST_F(RoundsTest, BadUpdatesAreRejectedWithTheReasonAndTheJobGoesOn) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 70, 7);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest, Behaviour::kNaN, Behaviour::kWrongShape,
                                  Behaviour::kCorrupt, Behaviour::kOversize, Behaviour::kBadSha});
  const int64_t job_id = CreateJob(DistributedSpec(f, 1, 2, 20));
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  json rounds = Rounds(job_id);
  ASSERT_EQ(rounds.size(), 1u);
  std::map<int64_t, json> by_worker;
  for (const json& u : rounds[0]["updates"]) by_worker[u["worker_id"].get<int64_t>()] = u;
  auto expect = [&](size_t i, const char* status, const char* reason_part) {
    SCOPED_TRACE("worker " + std::to_string(i));
    ASSERT_TRUE(by_worker.count(f.worker_ids[i])) << rounds.dump();
    const json& u = by_worker[f.worker_ids[i]];
    EXPECT_EQ(u["status"], status) << u.dump();
    if (reason_part[0] != '\0') {
      EXPECT_NE(u.value("reason", "").find(reason_part), std::string::npos) << u.dump();
    }
  };
  expect(0, "accepted", "");
  expect(1, "accepted", "");
  // Its values were checked as the upload streamed in (PUT /blobs); the rejection is still the update check's own
  // (CheckFinite's words), not a later one by the strategy (which would add "round 1 update: " before them).
  expect(2, "rejected", "has a non-finite value (nan) at index 0");
  EXPECT_TRUE(by_worker[f.worker_ids[2]].value("reason", "").starts_with("tensor '")) << by_worker[f.worker_ids[2]];
  expect(3, "rejected", "shape");
  expect(4, "rejected", "safetensors");
  expect(5, "rejected", "not uploaded");
  expect(6, "rejected", "sha256");
}

TEST_F(RoundsTest, StopFinishesWithTheLatestCommittedGlobal) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 20, 2);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest});
  const int64_t job_id = CreateJob(DistributedSpec(f, 1000, 2, 20));
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id, [](const std::string& t, const json&) { return t == "round_committed"; }, kJobTimeout));
  auto stopped = admin_->PostJson("/api/v1/training-jobs/" + std::to_string(job_id) + "/stop", json::object());
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "stopped") << job.dump();
  const int committed = job["committed_round"];
  ASSERT_GE(committed, 1);
  char name[64];
  std::snprintf(name, sizeof(name), "rounds/%06d/global.safetensors", committed);
  EXPECT_EQ(Artifact(job_id, "adapter_model.safetensors"), Artifact(job_id, name));
}

TEST_F(RoundsTest, RepeatedResultsAreIdempotentAndLateOnesRefused) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 20, 2);
  auto silent = StartWorkers(f, {Behaviour::kSilent});  // holds the round open: it never reports
  auto worker = ClientWithToken(*server_, f.worker_tokens[1]);
  auto hello = worker->PostJson("/api/v1/worker/hello", {{"device", "cpu"}});
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  const std::string session = (*hello->Json())["session_id"];
  const int64_t job_id = CreateJob(DistributedSpec(f, 1, 2, 20));
  json task;
  for (int i = 0; i < 10 && task.is_null(); ++i) {
    auto res = worker->Get("/api/v1/worker/tasks/next?wait_ms=2000&session_id=" + session);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    if (res->status == 200) task = *res->Json();
  }
  ASSERT_FALSE(task.is_null());
  http::ClientOptions o;
  o.max_attempts = 1;
  http::Client blobs(o);
  auto global = blobs.Get(task["global_weights"]["url"].get<std::string>());
  ASSERT_TRUE(global.ok());
  // Uploading the global itself is a valid update.
  auto put = blobs.Send(http::Method::kPut, task["update_upload"]["url"].get<std::string>(), global->body,
                        "application/octet-stream");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto again = blobs.Send(http::Method::kPut, task["update_upload"]["url"].get<std::string>(), global->body,
                          "application/octet-stream");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);  // updates are create-only
  json result = {{"job_id", job_id},
                 {"round", task["round"]},
                 {"attempt", task["attempt"]},
                 {"blob_key", task["update_upload"]["blob_key"]},
                 {"sha256", Sha256Hex(global->body)},
                 {"sample_count", task["data"]["train_rows"]},
                 {"train_loss", 1.5},
                 {"session_id", session}};
  auto first = worker->PostJson("/api/v1/worker/result", result);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first->Json())["status"], "accepted");
  auto repeat = worker->PostJson("/api/v1/worker/result", result);
  ASSERT_TRUE(repeat.ok()) << repeat.status().ToString();
  EXPECT_EQ((*repeat->Json())["status"], "duplicate");
  result["round"] = 2;
  auto late = worker->PostJson("/api/v1/worker/result", result);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("refused"), std::string::npos) << late.status().message();
  // Identity comes from the token: a body naming another worker is an unknown field.
  result["round"] = task["round"];
  result["worker_id"] = f.worker_ids[0];
  auto spoofed = worker->PostJson("/api/v1/worker/result", result);
  EXPECT_EQ(spoofed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spoofed.status().message().find("unknown field 'worker_id'"), std::string::npos);
  for (auto& w : silent) w->Stop();
}

TEST_F(RoundsTest, AWorkerThatRejoinsGetsTheLatestGlobalAndKeepsItsShard) {
  StartServer();
  Fixture f = MakeFixture(*admin_, 20, 2);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest});
  // A round whose workers leave fails and is retried, so allow for it.
  const int64_t job_id = CreateJob(DistributedSpec(f, 30, 1, 20, /*fault_tolerance=*/3));
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id, [](const std::string& t, const json& d) { return t == "round_committed" && d["round"] == 1; },
      kJobTimeout));
  std::vector<Upload> before = workers[1]->uploads();
  for (auto& w : workers) w->Stop();  // both leave (goodbye); the job waits
  auto job_now = admin_->Get("/api/v1/training-jobs/" + std::to_string(job_id));
  ASSERT_TRUE(job_now.ok());
  const int committed = (*job_now->Json())["committed_round"];
  ASSERT_LT(committed, 30);  // rounds are quick: enough of them that the job is still running here
  // The second worker comes back alone: it must train the next round on the latest committed global.
  workers[1] = std::make_unique<ScriptedWorker>(*server_, f.worker_ids[1], f.worker_tokens[1]);
  workers[1]->Start();
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& t, const json& d) { return t == "round_committed" && d["round"] == committed + 1; },
      kJobTimeout));
  workers[0] = std::make_unique<ScriptedWorker>(*server_, f.worker_ids[0], f.worker_tokens[0]);
  workers[0]->Start();
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();
  ASSERT_FALSE(before.empty());
  bool trained_next_round = false;
  for (const Upload& u : workers[1]->uploads()) {
    EXPECT_EQ(u.shard, before.front().shard);  // it keeps its shard
    EXPECT_EQ(u.global_round, u.round - 1);    // and gets the latest committed global
    trained_next_round = trained_next_round || u.round == committed + 1;
  }
  EXPECT_TRUE(trained_next_round);
}

TEST_F(RoundsTest, KilledMidRoundAndRestartedGivesTheSameWeightsAsUninterrupted) {
  // Uninterrupted reference run in its own data directory.
  std::string reference;
  {
    TempDir other;
    ServerProcess server(other.path() / "data");
    auto admin = AdminClient(server);
    Fixture f = MakeFixture(*admin, 30, 2);
    auto job = admin->PostJson("/api/v1/training-jobs", DistributedSpec(f, 3, 2, 20));
    ASSERT_TRUE(job.ok());
    const int64_t id = (*job->Json())["id"];
    ScriptedWorker a(server, f.worker_ids[0], f.worker_tokens[0]), b(server, f.worker_ids[1], f.worker_tokens[1]);
    a.Start();
    b.Start();
    json end = WaitForJobEnd(*admin, id, kJobTimeout);
    a.Stop();
    b.Stop();
    ASSERT_EQ(end["status"], "succeeded");
    auto art = admin->Get("/api/v1/training-jobs/" + std::to_string(id) + "/artifacts/adapter_model.safetensors");
    ASSERT_TRUE(art.ok());
    reference = art->body;
  }

  StartServer();
  Fixture f = MakeFixture(*admin_, 30, 2);
  auto workers = StartWorkers(f, {Behaviour::kHonest, Behaviour::kHonest});
  const int64_t job_id = CreateJob(DistributedSpec(f, 3, 2, 20));
  ASSERT_TRUE(WaitForEvent(
      *admin_, job_id, [](const std::string& t, const json& d) { return t == "round_started" && d["round"] == 2; },
      kJobTimeout));
  server_->Kill();
  server_->Restart();
  admin_ = AdminClient(*server_);
  for (auto& w : workers) w->Reconnect(*server_);
  json job = WaitForJobEnd(*admin_, job_id, kJobTimeout);
  for (auto& w : workers) w->Stop();
  ASSERT_EQ(job["status"], "succeeded") << job.dump();

  // Every round committed exactly once, in order; the interrupted attempt is marked failed, not lost.
  std::vector<int> committed;
  for (const json& r : Rounds(job_id)) {
    if (r["outcome"] == "committed") committed.push_back(r["round"]);
  }
  EXPECT_EQ(committed, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(Sha256Hex(Artifact(job_id, "adapter_model.safetensors")), Sha256Hex(reference));
}

}  // namespace
}  // namespace parsyn::testing
