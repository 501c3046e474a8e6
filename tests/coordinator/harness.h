// Test harness for multi-process coordinator tests: a real `parsyn server` child process on 127.0.0.1 (port 0), an
// admin client, and scripted workers that speak the worker protocol over real HTTP from threads of the test.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/testing/temp_dir.h"
#include "http/client.h"
#include "http/status_codes.h"
#include "support/job_events.h"
#include "weights/weight_set.h"

namespace parsyn::testing {

using nlohmann::json;

// A fresh directory parsyn-coord-<random> under the system temp dir, removed on destruction.
class TempDir : public test_support::TempDir {
 public:
  TempDir() : test_support::TempDir("parsyn-coord") {}
};

class ServerProcess {
 public:
  // Starts `parsyn server --data-dir dir --listen 127.0.0.1:0` with short heartbeat and poll timings and waits
  // (bounded) until it prints its URL. `extra` args are appended (a flag among those defaults replaces its value).
  explicit ServerProcess(std::filesystem::path data_dir, std::vector<std::string> extra = {});
  ~ServerProcess();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& url() const { return url_; }
  // What the server printed on stdout (a pipe, as a container's log is) until it listened.
  const std::string& startup_output() const { return startup_output_; }
  std::string admin_key() const;
  std::string signing_secret() const;
  // SIGKILL, then reap.
  void Kill();
  // SIGTERM, then reap; returns the exit status.
  int Terminate();
  // Starts it again on the same data directory (a new port).
  void Restart();

 private:
  void Launch();
  std::filesystem::path data_dir_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
  std::string startup_output_;
  std::string url_;
};

std::unique_ptr<http::Client> AdminClient(const ServerProcess& server);
std::unique_ptr<http::Client> ClientWithToken(const ServerProcess& server, const std::string& token);
// The HTTP status of a call's answer, 2xx included.
inline int StatusOf(const StatusOr<http::ClientResponse>& res) {
  return res.ok() ? res->status : http::HttpStatusFor(res.status().code());
}

// JSONL text rows {"text": "row <i>"}.
std::string TextDataset(int rows);
// A tiny Llama config.json (hidden 16, 2 layers, 2 heads, intermediate 32).
std::string TinyLlamaConfig();

// Fixture data created through the API.
struct Fixture {
  int64_t dataset_id = 0;
  int64_t model_id = 0;
  std::vector<int64_t> worker_ids;
  std::vector<std::string> worker_tokens;
};
// Uploads a `rows`-row dataset and the tiny model, registers `workers` own workers. Fails the test on errors.
Fixture MakeFixture(http::Client& admin, int rows, int workers);
// The spec of a distributed LoRA job over the fixture's workers with short timeouts.
json DistributedSpec(const Fixture& f, int rounds, int min_workers, double aggregation_timeout_s,
                     int fault_tolerance = 1);

// Waits (bounded) until every worker in `ids` has said hello (status online or busy).
bool WaitForWorkersOnline(http::Client& admin, const std::vector<int64_t>& ids, std::chrono::milliseconds timeout);
// Read the job's events (one stream, replayed from the start) until it reaches a terminal status (returning the final
// job JSON) or `pred` accepts one, or `timeout` passes: test_support::WaitForJobEnd / WaitForJobEvent.
inline json WaitForJobEnd(http::Client& admin, int64_t job_id, std::chrono::milliseconds timeout) {
  return test_support::WaitForJobEnd(admin, job_id, timeout, test_support::OnStreamEnd::kGiveUp);
}
inline bool WaitForEvent(http::Client& admin, int64_t job_id, const test_support::JobEventPredicate& pred,
                         std::chrono::milliseconds timeout) {
  return test_support::WaitForJobEvent(admin, job_id, pred, timeout, test_support::OnStreamEnd::kGiveUp);
}

// What a scripted worker does with a train task.
enum class Behaviour {
  kHonest,
  kSilent,
  kCorrupt,
  kNaN,
  kWrongShape,
  kOversize,
  kBadSha,
  kCrashAfterTask,
  kReportsFailure,  // posts /api/v1/worker/failure for every train task, stays online
};

// One upload a worker made, for checking the aggregation independently.
struct Upload {
  int64_t job_id = 0;
  int round = 0;
  int attempt = 0;
  int64_t worker_id = 0;
  int64_t sample_count = 0;
  int shard = 0;
  int global_round = 0;                                             // the committed round whose global the task carried
  std::vector<std::pair<std::string, std::vector<float>>> tensors;  // name -> values (F32 only)
};

// A worker agent stand-in on its own thread: hello, heartbeats, long-poll, download the global (and checks its
// sha256), upload an update = global + a deterministic per-(seed, tensor, index) delta, report the result.
// Deterministic: the same task gives the same update bytes, so interrupted and uninterrupted runs can be compared.
class ScriptedWorker {
 public:
  ScriptedWorker(const ServerProcess& server, int64_t id, std::string token, Behaviour behaviour = Behaviour::kHonest);
  ~ScriptedWorker();
  void Start();
  void Stop();  // ends the thread (after goodbye unless the behaviour is a crash)
  void set_behaviour(Behaviour b) { behaviour_ = b; }
  // The wait_ms of its task long-polls (default 1000); 0 polls back to back.
  void set_poll_wait(std::chrono::milliseconds wait) { poll_wait_ms_ = static_cast<int>(wait.count()); }
  int64_t id() const { return id_; }
  std::vector<Upload> uploads() const;
  std::vector<json> results() const;  // the server's answers to this worker's results
  int tasks_seen() const { return tasks_seen_; }
  // Points the worker at a restarted server.
  void Reconnect(const ServerProcess& server);

 private:
  void Run(std::stop_token stop);
  Status HandleTask(const json& task);

  std::string url_;
  int64_t id_;
  std::string token_;
  std::atomic<Behaviour> behaviour_;
  std::atomic<int> tasks_seen_{0};
  std::atomic<int> poll_wait_ms_{1000};
  mutable std::mutex mu_;
  std::vector<Upload> uploads_;
  std::vector<json> results_;
  std::jthread thread_;
};

// Decodes a safetensors image of F32 tensors into (name, values) pairs; empty on errors.
std::vector<std::pair<std::string, std::vector<float>>> DecodeF32(const std::string& bytes);

}  // namespace parsyn::testing
