// The bench fleet: what bench_rounds, bench_control_plane and bench_failover share to drive a real `parsyn server`
// over its protocol. The server as a child process on a free loopback port; the platform's setup through its API
// (dataset, model, workers, job) and a job's event stream; a scripted worker's hello and long-poll; /proc probes of
// the server (RSS, VmHWM, RssAnon, utime + stime, run-queue wait); and flags parsed by CLI11 as the CLI parses its own.
#pragma once

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/status.h"
#include "bench_support.h"
#include "http/client.h"

namespace parsyn::bench {

// ---- Flags

// Parses the command line as `parsyn` does (src/cli/main.cc): --help prints the options and exits 0; a usage error
// (unknown flag, missing or bad value) prints "<program>: <CLI11's message>" and where to read the usage, and exits 2.
void ParseFlags(CLI::App& app, int argc, char** argv);

// ---- The server

// `binary server --data-dir DIR --listen 127.0.0.1:0 --log-level LEVEL EXTRA...` as a child process whose stderr goes
// to DIR.log; the constructor returns once the server said where it listens (Die after 60 s). SIGTERM on destruction.
class ServerProcess {
 public:
  ServerProcess(std::filesystem::path data_dir, const std::string& binary, const std::string& log_level,
                const std::vector<std::string>& extra_args);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& url() const { return url_; }
  uint16_t port() const;
  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  std::string admin_key() const;
  // SIGKILL, at once (the process is reaped on destruction).
  void Kill() const;

 private:
  std::filesystem::path data_dir_;
  std::string log_;
  pid_t pid_ = -1;
  std::string url_;
};

// The role the coordinator at `url` gives in its /readyz ("leader", "standby"), "" when it does not answer.
std::string Role(const std::string& url);

// Polls Role(url) every `every` until it is `role`; false if it is not within `limit`.
bool WaitForRole(const std::string& url, std::string_view role, std::chrono::seconds limit,
                 std::chrono::milliseconds every = std::chrono::milliseconds(50));

// ---- The platform, through the admin API (each call Dies when the server does not answer as it should)

// A Llama config.json whose default LoRA adapters the benchmarks size through its dimensions.
struct LlamaShape {
  int hidden = 0;
  int intermediate = 0;
  int layers = 1;
  int heads = 4;
  int vocab = 32000;
  int max_positions = 2048;
};
std::string LlamaConfig(const LlamaShape& shape);

// An update with the exact LoRA layout (r = `lora_r`, the default target modules) of a job on `config`: round 1's
// adapters of that config, as safetensors.
struct LoraUpdate {
  std::vector<std::byte> image;
  std::string sha256;
  size_t tensors = 0;
};
LoraUpdate MakeLoraUpdate(const std::string& config, int lora_r);

// `n` JSONL rows {"text": "row i"}.
std::string TextRows(int n);

// Uploads `jsonl` as the dataset rows.jsonl; its id.
int64_t UploadDataset(http::Client& admin, std::string jsonl);

// Creates the model "bench-llama" from its config.json alone; its id.
int64_t CreateModel(http::Client& admin, std::string config_json);

struct RegisteredWorker {
  int64_t id = 0;
  std::string token;
};
// Registers `n` workers ("w0".., kind own) from up to 8 threads, each with its own connection made with `admin`.
std::vector<RegisteredWorker> RegisterWorkers(const http::ClientOptions& admin, int n);

// A LoRA job (seed 7) of `rounds` rounds of one step over exactly the workers `ids`, waiting for each of them
// (aggregation timeout 3600 s, fault tolerance 1).
nlohmann::json JobSpec(const std::string& name, int64_t dataset_id, int64_t model_id, int lora_r, int rounds,
                       const std::vector<int64_t>& ids);

// Creates the job; its id.
int64_t CreateJob(http::Client& admin, const nlohmann::json& spec);

// Reads job `job_id`'s events until its status is no longer queued or running, calling `on_commit` with each
// round_committed event's data as it arrives. The job's final status, or "events: <why>" when the stream failed.
std::string FollowJob(const http::ClientOptions& admin, int64_t job_id, std::chrono::minutes timeout,
                      const std::function<void(const nlohmann::json& committed)>& on_commit);

// ---- A scripted worker's calls

// POST /api/v1/worker/hello as a device named `device`: the session id.
StatusOr<std::string> Hello(http::Client& api, const std::string& device);

// GET /api/v1/worker/tasks/next, held by the server up to `wait_ms` (204: no task).
StatusOr<http::ClientResponse> PollTask(http::Client& api, const std::string& session, int wait_ms,
                                        http::CallOptions call = {});

// ---- /proc probes

class ProcProbe {
 public:
  explicit ProcProbe(pid_t pid) : pid_(pid) {}

  // A "Name:  N kB" field of /proc/PID/status in KiB (VmRSS, VmHWM, RssAnon); -1 where absent.
  long StatusKib(std::string_view field) const;
  // utime + stime in clock ticks: of the process (all its threads), or of its thread `tid`.
  long CpuTicks() const;
  long ThreadCpuTicks(pid_t tid) const;
  // The nanoseconds thread `tid` has spent runnable but waiting for a core (/proc/PID/task/TID/schedstat); -1 where
  // the kernel does not keep it.
  long long RunQueueWaitNs(pid_t tid) const;

 private:
  pid_t pid_;
};

// utime + stime, in clock ticks, of the stat file at `stat_path` (fields 14 and 15: /proc/PID/stat,
// /proc/PID/task/TID/stat, /proc/self/stat).
long CpuTicksOf(const std::string& stat_path);

// The machine's CPU ticks from /proc/stat's first line: busy (user, nice, system, irq, softirq, steal) and all (busy,
// idle, iowait).
struct MachineTicks {
  long busy = 0, all = 0;
};
MachineTicks ReadMachineTicks();

// The largest RssAnon of a process (its heap and stacks, not the file pages it maps) while this lives, sampled every
// 10 ms on a thread of its own.
class AnonRssPeak {
 public:
  explicit AnonRssPeak(pid_t pid);
  long kib() const { return peak_kib_; }

 private:
  std::atomic<long> peak_kib_{0};
  std::jthread sampler_;  // last: stopped and joined before peak_kib_ goes
};

}  // namespace parsyn::bench
