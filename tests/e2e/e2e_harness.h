// End-to-end harness: real `parsyn server`, `parsyn worker` and `parsyn-trainer` processes on 127.0.0.1, driven
// through the REST API. Every wait is bounded; every process a helper starts is ended by its destructor.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/testing/temp_dir.h"
#include "http/client.h"
#include "support/job_events.h"
#include "weights/weight_set.h"

namespace parsyn::e2e {

using nlohmann::json;
namespace fs = std::filesystem;

// A fresh directory parsyn-e2e-<random> under the system temp dir, removed on destruction unless PARSYN_KEEP_E2E is
// set.
class TempDir : public test_support::TempDir {
 public:
  TempDir() : test_support::TempDir("parsyn-e2e", "PARSYN_KEEP_E2E") {}
};

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed (also at the timeout)
  std::string output;  // stdout and stderr together
};
// Runs `parsyn ARGS...` to completion (SIGKILL at `timeout`).
CommandResult RunParsyn(const std::vector<std::string>& args, std::chrono::seconds timeout = std::chrono::seconds(120));
// Runs `parsyn-trainer ARGS...` likewise.
CommandResult RunTrainer(const std::vector<std::string>& args,
                         std::chrono::seconds timeout = std::chrono::seconds(120));

// A port on 127.0.0.1 that was free a moment ago.
int FreePort();

// `parsyn server` on 127.0.0.1:port with short heartbeat and poll timings; stderr goes to <data_dir>.log.
class Server {
 public:
  // `extra`: more `parsyn server` flags (e.g. --managed-workers 1).
  Server(fs::path data_dir, int port, std::vector<std::string> extra = {});
  ~Server();
  void Start();     // waits (bounded) until it prints that it listens; fails the test otherwise
  void Kill();      // SIGKILL, reaped
  int Terminate();  // SIGTERM, reaped: the exit status
  // The server speaks HTTPS (`extra` has --tls-cert/--tls-key for 127.0.0.1): url() is https://, and the probe and
  // Admin() trust `ca_file`. Call before Start().
  void UseTls(fs::path ca_file) { ca_file_ = std::move(ca_file); }
  std::string url() const {
    return (ca_file_.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") + std::to_string(port_);
  }
  std::string admin_key() const;
  const fs::path& data_dir() const { return data_dir_; }
  std::unique_ptr<http::Client> Admin() const;

 private:
  fs::path data_dir_;
  int port_;
  std::vector<std::string> extra_;
  fs::path ca_file_;
  pid_t pid_ = -1;
};

// `parsyn worker` with its own cache directory; stderr and stdout go to <cache_dir>.log.
class Worker {
 public:
  Worker(std::string server_url, std::string token, std::string name, fs::path cache_dir,
         std::vector<std::string> extra = {});
  ~Worker();
  // Variables ("NAME=value") the process gets besides this one's environment. Call before Start().
  void set_environment(std::vector<std::string> assignments) { environment_ = std::move(assignments); }
  void Start();
  void Kill();      // SIGKILL (its trainer child, if any, dies with it: SubprocessOptions::die_with_parent)
  int Terminate();  // SIGTERM, then wait (bounded): the exit status (-1 if it had to be killed)
  bool Exited();    // reaps without blocking
  std::string log() const;
  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }  // -1 when not started

 private:
  std::string server_url_, token_, name_;
  fs::path cache_dir_;
  std::vector<std::string> extra_;
  std::vector<std::string> environment_;
  pid_t pid_ = -1;
};

// Writes a small Llama model folder with `parsyn model init` (fails the test on errors).
void InitTinyLlama(const fs::path& dir, int hidden_size = 32);
// Uploads a model folder's files; returns the model id.
int64_t UploadModel(http::Client& admin, const fs::path& dir, const std::string& name);
// Uploads a dataset file; returns the dataset id.
int64_t UploadDataset(http::Client& admin, const fs::path& file);
struct Registered {
  int64_t id = 0;
  std::string token;
};
Registered RegisterWorker(http::Client& admin, const std::string& name, const std::string& kind = "own");
int64_t CreateJob(http::Client& admin, const json& spec);
// A federated job over the MLP of WriteSeparableCsv on own workers `worker_ids` (all of them needed each round,
// 120 s timeout, one failed round tolerated, seed 7): tests change on it what they exercise.
json TabularJobSpec(const std::string& name, int64_t dataset_id, int64_t model_id,
                    const std::vector<int64_t>& worker_ids, int rounds, int steps_per_round);
// Follow the job's events, reconnecting when the stream drops (a server restart), until it ends or `pred` accepts
// one (or `timeout`): test_support::WaitForJobEnd / WaitForJobEvent.
inline json WaitForJobEnd(http::Client& admin, int64_t job_id, std::chrono::seconds timeout) {
  return test_support::WaitForJobEnd(admin, job_id, timeout, test_support::OnStreamEnd::kReconnect);
}
inline bool WaitForEvent(http::Client& admin, int64_t job_id, const test_support::JobEventPredicate& pred,
                         std::chrono::seconds timeout) {
  return test_support::WaitForJobEvent(admin, job_id, pred, timeout, test_support::OnStreamEnd::kReconnect);
}
json Rounds(http::Client& admin, int64_t job_id);
// The job's committed training rounds (round >= 1), in order: one entry of Rounds each.
std::vector<json> CommittedRounds(http::Client& admin, int64_t job_id);

// JSONL rows {"text": ...} with a pattern a tiny model learns within a few dozen steps.
void WriteLearnableText(const fs::path& file, int rows);
// A CSV with two numeric features and a label that a small MLP separates.
void WriteSeparableCsv(const fs::path& file, int rows);

// The tensors of a safetensors file as float vectors (F32 and BF16 supported).
std::map<std::string, std::vector<double>> ReadTensors(const fs::path& file);
// Σ n_i w_i / Σ n_i, in double, over update files and their sample counts n_i.
std::map<std::string, std::vector<double>> SampleWeightedMean(const std::vector<std::pair<fs::path, double>>& updates);
// A securely aggregated global against its plain reference: every value of `actual` within 3 quantization steps
// (`step`, 2c / (2^bits - 1)) of `reference`'s, and some value of `reference` more than 30 steps from `initial`'s,
// so that the check bites.
void ExpectEqualUpToQuantization(const std::map<std::string, std::vector<double>>& reference,
                                 const std::map<std::string, std::vector<double>>& actual,
                                 const std::map<std::string, std::vector<double>>& initial, double step);
// The blob key prefix of a round attempt's files: jobs/<job>/rounds/<round, 6 digits>-a<attempt>.
std::string AttemptPrefix(int64_t job_id, int round, int attempt);
// The file's bytes; empty when it cannot be read.
std::string ReadWholeFile(const fs::path& path);
// Runs `parsyn-trainer run` on an evaluation-only copy of `task` (steps 0; its output goes to dir/eval-out.safetensors
// and dir/eval-result.json) and returns the result JSON, whose validation_before holds the metrics. Null JSON, with
// the test failed, when the trainer exits non-zero.
json RunEvaluationTask(const fs::path& dir, json task);

}  // namespace parsyn::e2e
