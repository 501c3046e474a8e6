// bench_rounds: per-round coordinator overhead and peak RSS of a real `parsyn server`.
//
// For each K it starts `parsyn server` as a child process (fresh temp data dir, 127.0.0.1, a free port), uploads a
// dataset and a model config through the API, registers K workers and runs K scripted workers on threads of this
// process. Each worker answers every train task at once: it PUTs a prepared update (the job's LoRA layout, computed
// with weights/lora_layout.h from the same config; 20 MiB of fp32 by default) to the task's signed URL and reports it
// with the shard's sample count. It never trains and never downloads the global: what is measured is the coordinator.
//
// Per round: wall time (commit of round r-1, or the first task of round 1, to the round_committed event), the time to
// read K copies of the update once (plain read; fresh files in the page cache, as the server's uploads are when it
// reads them) and to hash them once (sha256), and overhead = round time - read time. Per K, after its server
// stopped: the time to move the same K updates over plain loopback TCP (a minimal sender/receiver pair, no HTTP, as
// many connections at once as the uploads; the median of three). The copies are the bench's own: the server deletes a
// round's updates once it is committed (the count left is printed, 0 when its deletes are done). floor = transfer +
// sha256 + read, and ratio = round wall / floor is the figure the targets (1.50 for 20 MiB updates, 2.00
// for K = 1000) are stated in; the last line names the run furthest above its target. Per K: the server's VmHWM (peak
// RSS) from /proc/PID/status, and its peak RssAnon (sampled): VmHWM counts the mapped update files (page cache),
// RssAnon is the server's own memory, what "flat in K beyond per-connection bookkeeping" is about.
//
// Also shown, for scale: a durable write of the round's bytes (write + fsync, rate sampled on a few of the copies),
// and "land": the time to write the K copies the floor reads (write(2) into new files, no fsync, as the server lands
// uploads), with wall / (floor + land). On these VMs the first write into fresh page-cache pages is slow (freed memory
// goes back to the host within seconds), and a round lands all its bytes so.
// The server writes updates without fsync (they are never read after a crash) and recycles them once their round is
// committed (their files become spares the next round's uploads write over), before most of their bytes reach the
// disk; each round's new global is written durably.
//
// Choices: uploads from this process are capped at --upload-concurrency at once (the server streams each upload on
// one of its pool threads; thousands at once would only queue); heartbeats are not sent (the server is started with a
// long heartbeat timeout, and long-polls and results refresh a session anyway); long-polls are held up to 290 s, so a
// worker is still in its first poll when a K=1000 round hands out its tasks (with 20 s polls, a worker that re-polled
// while the round was still assigning got dropped with "asked for a new task before reporting": a coordinator race,
// reported to its engineer). Each K's data dir is removed after it.
//
// Default sizes fit a ~7 minute run on a 2-core VM whose disk syncs ~50-500 MB/s: K=1000 runs 3 rounds with 2 MiB
// updates (2 GB a round; at 20 MiB it would write 20 GB per round); pass --update-mib 20,20,20,20 for the full size.
// K = 100 and 1000 run 3 rounds, so their median round is one after the first: a job's first round lands its
// uploads in fresh memory, later ones write over the spares of the round before (storage/directory_blob_store.h).
// Every round is printed.
//
// Metadata store: every K runs on SQLite (the default store); the Ks of --postgres-ks (default 5,100, the
// target's) run again, right after, on PostgreSQL (`parsyn server --metadata postgres://...`, a throwaway server
// started by storage/postgres_for_test.h, a fresh database per run). The last table compares the two: per-round
// overhead (round wall - read, the median round) on PostgreSQL / on SQLite, PASS when within 1.50 (the target); the
// coordinator's excess over the floor (wall - floor) is shown beside it. Without PostgreSQL binaries the PostgreSQL
// runs are left out, saying why. --postgres-ks none: SQLite only.
//
// --server-log-level debug keeps each server's log (its path is printed): the coordinator logs per-phase timings of
// every round at debug level (task assignment, update checks, accumulation, aggregation, commit).
//
// Trainers (rounds_trainers.h), first: --trainer-workers real `parsyn worker`s train one step a round with the
// built-in parsyn-trainer, then with an external trainer of the trainer contract that writes its update at once; the
// ratio of their median rounds is printed against its 1.20 target (--trainer-rounds 0 skips it).
//
// Usage: bench_rounds [--ks 5,100,5,1000] [--rounds 4,3,2,3] [--update-mib 20,20,2,2] [--upload-concurrency 16]
//                     [--postgres-ks 5,100|none] [--server-log-level warn] [--trainer-workers 4]
//                     [--trainer-rounds 4]
//                     [--server-bin PATH (default: the parsyn built beside this bench)]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/sha256.h"
#include "base/temp_file.h"
#include "base/testing/build_paths.h"
#include "fleet.h"
#include "http/client.h"
#include "rounds_trainers.h"
#include "storage/postgres_for_test.h"

namespace {

using nlohmann::json;
using parsyn::StatusOr;
using parsyn::bench::AnonRssPeak;
using parsyn::bench::Clock;
using parsyn::bench::Die;
using parsyn::bench::Must;
using parsyn::bench::ProcProbe;
using parsyn::bench::ReadText;
using parsyn::bench::Seconds;
using parsyn::bench::ServerProcess;
namespace fs = std::filesystem;
namespace http = parsyn::http;
namespace bench = parsyn::bench;

std::vector<char> ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A model config whose default LoRA adapters (q_proj and v_proj, r = 16) are `mib` MiB of fp32: per layer
// q and v each have A (r, hidden) and B (hidden, r), i.e. 4 * r * hidden floats = 1 MiB at hidden 4096.
std::string ModelConfig(int mib) {
  return bench::LlamaConfig({.hidden = 4096, .intermediate = 11008, .layers = mib, .heads = 32});
}
constexpr int kLoraR = 16;

// The server's flags besides data dir, listen address and log level. Every simulated worker connects from
// 127.0.0.1, so the per-address connection cap is off (K = 1000 holds more than its default).
const std::vector<std::string> kServerFlags = {
    "--heartbeat-timeout-ms", "3600000", "--max-poll-wait-ms", "300000", "--max-connections-per-address", "0"};

// What the workers saw, shared between their threads.
struct Observations {
  std::mutex mu;
  // Per train round, as the workers saw it: the phases of the round time.
  struct RoundTimes {
    Clock::time_point first_task;   // first task received by any worker
    Clock::time_point last_task;    // last task received
    Clock::time_point last_upload;  // last update PUT answered
    Clock::time_point last_result;  // last result POST answered
    double upload_s_max = 0;        // the slowest single PUT
  };
  std::map<int, RoundTimes> rounds;
  std::vector<std::string> errors;
  std::atomic<int> hellos{0};

  void NoteTask(int round) {
    std::lock_guard lock(mu);
    const auto now = Clock::now();
    if (!rounds.contains(round)) rounds[round].first_task = now;
    rounds[round].last_task = now;
  }
  void NoteUpload(int round, Clock::time_point start) {
    const auto now = Clock::now();
    std::lock_guard lock(mu);
    RoundTimes& r = rounds[round];
    r.last_upload = std::max(r.last_upload, now);
    r.upload_s_max = std::max(r.upload_s_max, Seconds(now - start));
  }
  void NoteResult(int round) {
    const auto now = Clock::now();
    std::lock_guard lock(mu);
    RoundTimes& r = rounds[round];
    r.last_result = std::max(r.last_result, now);
  }
  void NoteError(std::string e) {
    std::lock_guard lock(mu);
    if (errors.size() < 20) errors.push_back(std::move(e));
  }
};

// An update file with the exact LoRA layout of a job on `config` (round 1's adapters of that config).
struct PreparedUpdate {
  int mib = 0;
  fs::path config_file;
  fs::path file;
  std::string sha256;
  uint64_t size_bytes = 0;
  size_t tensors = 0;
};

PreparedUpdate PrepareUpdate(const fs::path& dir, int mib) {
  PreparedUpdate u;
  u.mib = mib;
  fs::create_directories(dir);
  const std::string config = ModelConfig(mib);
  u.config_file = dir / "config.json";
  std::ofstream(u.config_file) << config;
  const bench::LoraUpdate update = bench::MakeLoraUpdate(config, kLoraR);
  u.file = dir / "update.safetensors";
  std::ofstream out(u.file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(update.image.data()), static_cast<std::streamsize>(update.image.size()));
  u.sha256 = update.sha256;
  u.size_bytes = update.image.size();
  u.tensors = update.tensors;
  return u;
}

// Caps the uploads in flight. Not std::counting_semaphore: libstdc++'s release wakes every waiter, and ~1,000 worker
// threads woken per upload, each spinning on sched_yield before sleeping again, took ~6% of the machine's CPU
// from the server during K = 1000 rounds (perf).
class UploadSlots {
 public:
  explicit UploadSlots(int slots) : free_(slots) {}
  void Acquire() {
    std::unique_lock lock(mu_);
    freed_.wait(lock, [this] { return free_ > 0; });
    --free_;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      ++free_;
    }
    freed_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable freed_;
  int free_;
};

struct WorkerSetup {
  std::string url;
  std::string token;
  fs::path update_file;
  std::string update_sha256;
  UploadSlots* upload_slots;
  Observations* seen;
};

// Answers a train task of `round` with the prepared update: PUT to the task's signed URL, then the update's fields
// in `result`. False when the upload failed (noted in w.seen).
bool UploadUpdate(const WorkerSetup& w, http::Client& blobs, const json& task, int round, json& result) {
  w.seen->NoteTask(round);
  w.upload_slots->Acquire();
  const auto put_start = Clock::now();
  auto put = blobs.UploadFile(http::Method::kPut, task["update_upload"]["url"].get<std::string>(), w.update_file);
  w.upload_slots->Release();
  if (!put.ok() || put->status != 201) {
    w.seen->NoteError("upload: " +
                      (put.ok() ? std::to_string(put->status) + " " + put->body : put.status().ToString()));
    return false;
  }
  w.seen->NoteUpload(round, put_start);
  result["blob_key"] = task["update_upload"]["blob_key"];
  result["sha256"] = w.update_sha256;
  result["sample_count"] = task["data"]["train_rows"];
  result["train_loss"] = 1.0;
  return true;
}

// One scripted worker: hello, then long-poll; every train task is answered with the prepared update at once.
void RunWorker(const WorkerSetup& w, std::stop_token stop) {
  http::ClientOptions options;
  options.base_url = w.url;
  options.bearer_token = w.token;
  options.timeout = std::chrono::minutes(10);
  options.stall_timeout = std::chrono::minutes(10);
  options.max_attempts = 1;
  http::Client api(options);
  http::ClientOptions blob_options = options;
  blob_options.base_url.clear();
  blob_options.bearer_token.clear();  // signed URLs carry their own credential
  http::Client blobs(blob_options);

  StatusOr<std::string> hello = bench::Hello(api, "cpu (bench_rounds)");
  if (!hello.ok()) {
    w.seen->NoteError("hello: " + hello.status().ToString());
    return;
  }
  const std::string session = *hello;
  // The blob client's libcurl handle is made now, not at the round's first upload: curl_easy_init takes a global
  // spin lock, and 1,000 threads making handles mid-round spun on it for ~6% of the machine (perf).
  auto warm = blobs.Get(w.url + "/healthz");
  if (!warm.ok()) {
    w.seen->NoteError("healthz: " + warm.status().ToString());
    return;
  }
  w.seen->hellos++;
  http::CallOptions poll_call;
  poll_call.stop = stop;
  poll_call.timeout = std::chrono::seconds(320);
  while (!stop.stop_requested()) {
    auto res = bench::PollTask(api, session, 290000, poll_call);
    if (!res.ok()) {
      if (!stop.stop_requested()) w.seen->NoteError("poll: " + res.status().ToString());
      break;
    }
    if (res->status == 204) continue;
    auto task = res->Json();
    if (!task.ok()) {
      w.seen->NoteError("task: " + task.status().ToString());
      break;
    }
    const int round = (*task)["round"];
    json result = {{"session_id", session},  {"job_id", (*task)["job_id"]},
                   {"round", round},         {"attempt", (*task)["attempt"]},
                   {"validation_loss", 1.0}, {"validation_samples", (*task)["data"]["validation_rows"]}};
    if ((*task)["kind"] == "train" && !UploadUpdate(w, blobs, *task, round, result)) continue;
    auto answer = api.PostJson("/api/v1/worker/result", result);
    if (!answer.ok()) w.seen->NoteError("result: " + answer.status().ToString());
    if ((*task)["kind"] == "train") w.seen->NoteResult(round);
  }
  api.PostJson("/api/v1/worker/goodbye", {{"session_id", session}}).status().IgnoreError();
}

struct ReadTimes {
  double plain_s = 0;
  double sha256_s = 0;
  uint64_t bytes = 0;
  int files = 0;
};

// Reads every file in `dir` once with plain read(2), then once through sha256.
ReadTimes TimeReads(const fs::path& dir) {
  ReadTimes t;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    // Only the updates: the store keeps a "<key>#sha256" sidecar beside each blob.
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  t.files = static_cast<int>(files.size());
  std::vector<char> buf(size_t{1} << 20);
  const auto plain_start = Clock::now();
  for (const fs::path& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) t.bytes += static_cast<uint64_t>(n);
    ::close(fd);
  }
  t.plain_s = Seconds(Clock::now() - plain_start);
  const auto sha_start = Clock::now();
  for (const fs::path& f : files) (void)parsyn::Sha256File(f);
  t.sha256_s = Seconds(Clock::now() - sha_start);
  return t;
}

// Bytes per second of write + fsync of copies of (up to) `sample` files of `dir`, written into `scratch`.
double DurableWriteRate(const fs::path& dir, const fs::path& scratch, int sample) {
  std::vector<char> buf(size_t{1} << 20);
  uint64_t bytes = 0;
  const auto start = Clock::now();
  std::error_code ec;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".safetensors" || n++ >= sample) continue;
    int in = ::open(e.path().c_str(), O_RDONLY);
    int out = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in >= 0 && out >= 0) {
      for (ssize_t r; (r = ::read(in, buf.data(), buf.size())) > 0;) {
        if (::write(out, buf.data(), static_cast<size_t>(r)) != r) break;
        bytes += static_cast<uint64_t>(r);
      }
      ::fsync(out);
    }
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
  }
  fs::remove(scratch, ec);
  const double s = Seconds(Clock::now() - start);
  return s > 0 ? static_cast<double>(bytes) / s : 0.0;
}

// Writes `k` copies of `bytes` into new files in `dir` (created), with write(2) and no fsync, as the server lands
// uploads; returns the seconds taken. Not part of the floor: shown beside it because on a VM whose freed memory goes
// back to the host (virtio-balloon free page reporting) the first write into fresh page-cache pages runs at a
// fraction of a write into pages in use (dd here: 0.3-0.7 GB/s against 7 GB/s), and a round lands every byte so.
double LandCopies(const std::vector<char>& bytes, int k, const fs::path& dir) {
  fs::create_directories(dir);
  const auto start = Clock::now();
  for (int i = 0; i < k; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "w%d.safetensors", i);
    const int fd = ::open((dir / name).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) Die("creating " + (dir / name).string() + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) Die("writing " + (dir / name).string() + ": " + std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  return Seconds(Clock::now() - start);
}

struct RoundFigures {
  int round = 0;
  double wall_s = 0;
  // Phases from the first task of the round: all updates uploaded, all results answered (the commit is wall_s).
  double tasks_s = 0;
  double uploaded_s = 0;
  double results_s = 0;
  double upload_max_s = 0;
  ReadTimes read;
};

struct KFigures {
  std::string store = "sqlite";  // the metadata store: sqlite or postgres
  int k = 0;
  int rounds = 0;
  int update_mib = 0;
  double write_bytes_per_s = 0;  // durable write rate sampled on round 1's files
  double transfer_s = 0;         // K updates over loopback TCP, no HTTP (TimeLoopbackTransfer)
  double land_s = 0;             // writing K copies into new files, no fsync (LandCopies)
  double setup_s = 0;
  long idle_rss_kib = 0;
  long hwm_kib = 0;
  long peak_anon_kib = 0;  // AnonRssPeak over the job
  std::vector<RoundFigures> per_round;
  int update_files_left = 0;  // in the server's blob directory when the job ended (it deletes committed rounds')
  std::string outcome;
  std::string kept_log;  // the server's log, when kept (--server-log-level other than warn)
};

// The least a round of `f` could cost on this machine: move its bytes, hash them once, read them once.
double FloorSeconds(const KFigures& f, const RoundFigures& r) {
  return std::max(f.transfer_s + r.read.sha256_s + r.read.plain_s, 1e-9);
}

struct ServerChoice {
  std::string binary = parsyn::test_support::BuildPath("parsyn");
  std::string log_level = "warn";
};
// A K run's server, set up through its API: the dataset, the model (the update's config) and K registered workers.
struct Platform {
  std::unique_ptr<ServerProcess> server;
  http::ClientOptions admin;
  int64_t dataset_id = 0;
  int64_t model_id = 0;
  std::vector<bench::RegisteredWorker> workers;
};

// `metadata_uri`: "" for SQLite in the data dir, else a postgres:// URL.
Platform SetUpPlatform(const fs::path& data_dir, int k, const PreparedUpdate& update, const ServerChoice& server_choice,
                       const std::string& metadata_uri) {
  std::vector<std::string> server_flags = kServerFlags;
  if (!metadata_uri.empty()) server_flags.insert(server_flags.end(), {"--metadata", metadata_uri});
  Platform p;
  p.server = std::make_unique<ServerProcess>(data_dir, server_choice.binary, server_choice.log_level, server_flags);
  p.admin.base_url = p.server->url();
  p.admin.bearer_token = p.server->admin_key();
  p.admin.timeout = std::chrono::minutes(2);
  p.admin.max_attempts = 1;
  // On PostgreSQL the server first wins the leader lease (a standby answers 503): wait for /readyz to say leader.
  if (!bench::WaitForRole(p.server->url(), "leader", std::chrono::seconds(60), std::chrono::milliseconds(100))) {
    Die("the server did not become the leader within 60 s; see its log");
  }
  http::Client admin(p.admin);
  p.dataset_id = bench::UploadDataset(admin, bench::TextRows(std::max(64, 4 * k)));
  p.model_id = bench::CreateModel(admin, ReadText(update.config_file));
  p.workers = bench::RegisterWorkers(p.admin, k);  // a few threads, each with its own connection
  return p;
}

// Starts a scripted worker per setup on a thread of its own; returns once each said hello (Die after 2 minutes).
std::vector<std::jthread> StartWorkers(const std::vector<WorkerSetup>& setups, Observations& seen) {
  const int k = static_cast<int>(setups.size());
  std::vector<std::jthread> workers;
  workers.reserve(setups.size());
  for (const WorkerSetup& setup : setups) {
    workers.emplace_back([&setup](std::stop_token stop) { RunWorker(setup, stop); });
  }
  const auto hello_deadline = Clock::now() + std::chrono::minutes(2);
  while (seen.hellos < k && Clock::now() < hello_deadline) {
    {
      std::lock_guard lock(seen.mu);
      if (!seen.errors.empty()) Die("worker failed before the job: " + seen.errors.front());
    }
    // Hellos are remote calls on K threads with nothing to wait on but their count.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (seen.hellos < k) Die("only " + std::to_string(seen.hellos.load()) + " of " + std::to_string(k) + " said hello");
  return workers;
}

// Each committed round's wall time (from the commit of the round before, or round 1's first task) and its phases.
void AddRoundTimes(KFigures& fig, const std::map<int, Clock::time_point>& committed, Observations& seen) {
  for (const auto& [round, end] : committed) {
    Clock::time_point start;
    Observations::RoundTimes phases;
    {
      std::lock_guard lock(seen.mu);
      auto it = seen.rounds.find(round);
      if (it == seen.rounds.end()) continue;
      phases = it->second;
    }
    if (round == 1) {
      start = phases.first_task;
    } else {
      auto prev = committed.find(round - 1);
      if (prev == committed.end()) continue;
      start = prev->second;
    }
    RoundFigures r;
    r.round = round;
    r.wall_s = Seconds(end - start);
    r.tasks_s = Seconds(phases.last_task - phases.first_task);
    r.uploaded_s = Seconds(phases.last_upload - phases.first_task);
    r.results_s = Seconds(phases.last_result - phases.first_task);
    r.upload_max_s = phases.upload_s_max;
    fig.per_round.push_back(r);
  }
}

// The server deletes a round's updates once it is committed: count what is left (nothing, once its background
// deletes are done).
int UpdateFilesLeft(const fs::path& data_dir, int64_t job_id, const std::map<int, int>& committed_attempt) {
  int left = 0;
  for (const auto& [round, attempt] : committed_attempt) {
    char prefix[64];
    std::snprintf(prefix, sizeof(prefix), "%06d-a%d", round, attempt);
    const fs::path updates = data_dir / "blobs" / "jobs" / std::to_string(job_id) / "rounds" / prefix / "updates";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(updates, ec)) left += e.is_regular_file() ? 1 : 0;
  }
  return left;
}

// Measured after the server is gone, so the floor has the machine to itself as the round had: the transfer, then
// per round a plain read and a sha256 pass over K fresh copies of the update (in the page cache, as the server's
// were when it read them).
void MeasureFloor(KFigures& fig, const PreparedUpdate& update, int upload_concurrency, const fs::path& data_dir,
                  const fs::path& root) {
  // The transfer is the median of three (one run of it, alone, was sometimes 3x the others).
  const auto update_bytes = ReadBytes(update.file);
  std::vector<double> transfers;
  for (int i = 0; i < 3; ++i) {
    transfers.push_back(parsyn::bench::TimeLoopbackTransfer(update_bytes, fig.k, upload_concurrency));
  }
  std::sort(transfers.begin(), transfers.end());
  fig.transfer_s = transfers[1];
  const fs::path copies = data_dir / "floor-copies";
  fig.land_s = LandCopies(update_bytes, fig.k, copies);
  for (RoundFigures& r : fig.per_round) r.read = TimeReads(copies);
  fig.write_bytes_per_s = DurableWriteRate(copies, root / "write-sample", 4);
}

// `metadata_uri`: "" for SQLite in the data dir, else a postgres:// URL.
KFigures RunOneK(int k, int rounds, const fs::path& root, const PreparedUpdate& update, int upload_concurrency,
                 const ServerChoice& server_choice, const std::string& metadata_uri = "") {
  KFigures fig;
  fig.store = metadata_uri.empty() ? "sqlite" : "postgres";
  fig.k = k;
  fig.rounds = rounds;
  fig.update_mib = update.mib;
  const fs::path data_dir = root / ("k" + std::to_string(k) + "-" + fig.store);
  fs::create_directories(data_dir);
  const auto setup_start = Clock::now();
  Platform platform = SetUpPlatform(data_dir, k, update, server_choice, metadata_uri);
  const ProcProbe probe(platform.server->pid());

  Observations seen;
  UploadSlots upload_slots(upload_concurrency);
  std::vector<WorkerSetup> setups;
  std::vector<int64_t> ids;
  for (const bench::RegisteredWorker& w : platform.workers) {
    ids.push_back(w.id);
    setups.push_back({.url = platform.server->url(),
                      .token = w.token,
                      .update_file = update.file,
                      .update_sha256 = update.sha256,
                      .upload_slots = &upload_slots,
                      .seen = &seen});
  }
  std::vector<std::jthread> workers = StartWorkers(setups, seen);
  fig.idle_rss_kib = probe.StatusKib("VmRSS");

  http::Client admin(platform.admin);
  const int64_t job_id = bench::CreateJob(admin, bench::JobSpec("bench-k" + std::to_string(k), platform.dataset_id,
                                                                platform.model_id, kLoraR, rounds, ids));
  fig.setup_s = Seconds(Clock::now() - setup_start);
  const AnonRssPeak anon_peak(platform.server->pid());

  // The job's events: round commits (timed here) until a terminal status.
  std::map<int, Clock::time_point> committed;
  std::map<int, int> committed_attempt;
  fig.outcome = bench::FollowJob(platform.admin, job_id, std::chrono::minutes(10), [&](const json& d) {
    committed[d["round"].get<int>()] = Clock::now();
    committed_attempt[d["round"].get<int>()] = d["attempt"].get<int>();
  });
  fig.hwm_kib = probe.StatusKib("VmHWM");
  fig.peak_anon_kib = anon_peak.kib();
  for (auto& w : workers) w.request_stop();
  workers.clear();  // joins; each worker says goodbye

  {
    std::lock_guard lock(seen.mu);
    for (const std::string& e : seen.errors) std::fprintf(stderr, "  K=%d worker error: %s\n", k, e.c_str());
  }
  AddRoundTimes(fig, committed, seen);
  fig.update_files_left = UpdateFilesLeft(data_dir, job_id, committed_attempt);
  platform.server.reset();
  MeasureFloor(fig, update, upload_concurrency, data_dir, root);
  std::error_code ec;
  fs::remove_all(data_dir, ec);
  if (server_choice.log_level == "warn") {
    fs::remove(data_dir.string() + ".log", ec);
  } else {
    fig.kept_log = data_dir.string() + ".log";
  }
  return fig;
}

}  // namespace

namespace {

struct Options {
  // K=5 runs twice: at 20 MiB (the target's size) and at 2 MiB, the baseline K=1000's RSS growth is measured from.
  std::vector<int> ks = {5, 100, 5, 1000};
  std::vector<int> rounds = {4, 3, 2, 3};
  std::vector<int> update_mib = {20, 20, 2, 2};
  int upload_concurrency = 16;
  std::vector<int> postgres_ks = {5, 100};
  int trainer_workers = 4;
  int trainer_rounds = 4;  // 0: no trainer run
  ServerChoice server_choice;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  std::string postgres_ks = "5,100";
  CLI::App app{
      "bench_rounds: per-round coordinator overhead and peak RSS of a real `parsyn server` with K scripted "
      "workers (see the header of bench/rounds.cc)"};
  app.add_option("--ks", o.ks, "comma-separated K: scripted workers per run")->delimiter(',')->capture_default_str();
  app.add_option("--rounds", o.rounds, "rounds per K (the last repeats for the Ks beyond the list)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--update-mib", o.update_mib, "update MiB per K (the last repeats for the Ks beyond the list)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--upload-concurrency", o.upload_concurrency, "uploads from this process at once")
      ->capture_default_str();
  app.add_option("--postgres-ks", postgres_ks, "the Ks run again on PostgreSQL, or none")
      ->check(CLI::Validator(
          [](std::string& v) {
            if (v == "none") return std::string();
            for (size_t at = 0; at <= v.size();) {
              const size_t comma = std::min(v.find(',', at), v.size());
              if (comma == at || v.find_first_not_of("0123456789", at) < comma) return "not 'none' or K,K,...: " + v;
              at = comma + 1;
            }
            return std::string();
          },
          "K,K,...|none"))
      ->capture_default_str();
  app.add_option("--server-log-level", o.server_choice.log_level,
                 "the servers' log level; other than warn, their logs are kept (debug: per-phase round timings)")
      ->capture_default_str();
  app.add_option("--trainer-workers", o.trainer_workers, "real `parsyn worker`s in the trainer run")
      ->capture_default_str();
  app.add_option("--trainer-rounds", o.trainer_rounds, "rounds of the trainer run (0: none)")->capture_default_str();
  app.add_option("--server-bin", o.server_choice.binary,
                 "the parsyn binary to run (default: the one built beside "
                 "this bench)");
  bench::ParseFlags(app, argc, argv);
  o.postgres_ks = postgres_ks == "none" ? std::vector<int>{} : bench::ParseInts(postgres_ks);
  if (o.rounds.size() < o.ks.size()) o.rounds.resize(o.ks.size(), o.rounds.empty() ? 1 : o.rounds.back());
  if (o.update_mib.size() < o.ks.size()) {
    o.update_mib.resize(o.ks.size(), o.update_mib.empty() ? 20 : o.update_mib.back());
  }
  return o;
}

void PrintKRun(const KFigures& f, const PreparedUpdate& update, double total_s, int upload_concurrency) {
  std::printf(
      "\nK=%d on %s: update %.2f MiB (%zu tensors), %d rounds, job %s, setup %.1f s, total %.1f s; durable write "
      "%.0f MB/s; update files left on the server %d\n",
      f.k, f.store.c_str(), static_cast<double>(update.size_bytes) / (1 << 20), update.tensors, f.rounds,
      f.outcome.c_str(), f.setup_s, total_s, f.write_bytes_per_s / 1e6, f.update_files_left);
  if (!f.kept_log.empty()) std::printf("  server log: %s\n", f.kept_log.c_str());
  std::printf("  loopback TCP transfer of the round's bytes (no HTTP, %d at once): %.1f ms\n",
              std::min(f.k, upload_concurrency), f.transfer_s * 1e3);
  std::printf("  landing the round's bytes in new files (write, no fsync; not in the floor): %.1f ms\n",
              f.land_s * 1e3);
  std::printf("  %-6s %10s %12s %10s %12s %14s %16s %10s %7s   %s\n", "round", "wall ms", "read ms", "sha ms",
              "read GiB/s", "overhead ms", "write+fsync ms", "floor ms", "ratio",
              "from first task: all tasks in / uploaded / results answered; slowest PUT");
  for (const RoundFigures& r : f.per_round) {
    const double write_ms =
        f.write_bytes_per_s > 0 ? static_cast<double>(r.read.bytes) / f.write_bytes_per_s * 1e3 : 0.0;
    const double floor_s = FloorSeconds(f, r);
    std::printf("  %-6d %10.1f %12.1f %10.1f %12.2f %14.1f %16.1f %10.1f %7.2f   %.0f / %.0f / %.0f; %.0f ms\n",
                r.round, r.wall_s * 1e3, r.read.plain_s * 1e3, r.read.sha256_s * 1e3,
                r.read.plain_s > 0 ? static_cast<double>(r.read.bytes) / (1 << 30) / r.read.plain_s : 0.0,
                (r.wall_s - r.read.plain_s) * 1e3, write_ms, floor_s * 1e3, r.wall_s / floor_s, r.tasks_s * 1e3,
                r.uploaded_s * 1e3, r.results_s * 1e3, r.upload_max_s * 1e3);
  }
  std::fflush(stdout);
}

// The median round of a run by ratio (round wall / floor).
RoundFigures MedianRound(const KFigures& f) {
  std::vector<RoundFigures> rs = f.per_round;
  std::sort(rs.begin(), rs.end(), [&f](const RoundFigures& a, const RoundFigures& b) {
    return a.wall_s / FloorSeconds(f, a) < b.wall_s / FloorSeconds(f, b);
  });
  return rs[rs.size() / 2];
}

void PrintSummary(const std::vector<KFigures>& all) {
  std::printf(
      "\nSummary (floor = loopback TCP transfer + one sha256 pass + one plain read of the round's bytes, measured in\n"
      "this run at the same K; ratio = round wall time / floor; median round by ratio; land = writing the round's\n"
      "bytes into new files without fsync, as the server lands uploads, shown beside the floor with wall / (floor +\n"
      "land))\n");
  std::printf("  %-6s %-8s %6s %8s %12s %12s %10s %10s %12s %15s %10s %12s %15s %7s %7s\n", "K", "store", "MiB",
              "rounds", "round ms", "transfer ms", "sha ms", "read ms", "floor ms", "write+fsync ms", "land ms",
              "wall/(f+l)", "server HWM MiB", "ratio", "target");
  // The last line names the row furthest above its target (ratio over target): 1.50 for 20 MiB updates (K = 5 and
  // 100), 2.00 for K >= 1000; the 2 MiB K = 5 run, there as K = 1000's memory baseline, has none.
  auto target_of = [](const KFigures& f) -> double { return f.k >= 1000 ? 2.0 : f.update_mib >= 20 ? 1.5 : 0.0; };
  double worst_ratio = 0, worst_target = 0;
  int worst_k = 0;
  for (const KFigures& f : all) {
    if (f.per_round.empty()) continue;
    const RoundFigures mid = MedianRound(f);
    const double floor_s = FloorSeconds(f, mid);
    const double ratio = mid.wall_s / floor_s;
    const double target = target_of(f);
    if (target > 0 && (worst_target == 0 || ratio / target > worst_ratio / worst_target)) {
      worst_ratio = ratio;
      worst_target = target;
      worst_k = f.k;
    }
    const double write_ms =
        f.write_bytes_per_s > 0 ? static_cast<double>(mid.read.bytes) / f.write_bytes_per_s * 1e3 : 0.0;
    char target_text[16] = "-";
    if (target > 0) std::snprintf(target_text, sizeof(target_text), "%.2f", target);
    std::printf("  %-6d %-8s %6d %8zu %12.1f %12.1f %10.1f %10.1f %12.1f %15.1f %10.1f %12.2f %15.1f %7.2f %7s\n", f.k,
                f.store.c_str(), f.update_mib, f.per_round.size(), mid.wall_s * 1e3, f.transfer_s * 1e3,
                mid.read.sha256_s * 1e3, mid.read.plain_s * 1e3, floor_s * 1e3, write_ms, f.land_s * 1e3,
                mid.wall_s / (floor_s + f.land_s), static_cast<double>(f.hwm_kib) / 1024, ratio, target_text);
  }
  if (worst_target > 0) {
    std::printf("bench_rounds: worst ratio %.2f at K=%d (target %.2f)\n", worst_ratio, worst_k, worst_target);
  } else {
    std::printf("bench_rounds: no run with a target (20 MiB updates, or K >= 1000)\n");
  }
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Per-round overhead (round wall - read) and excess (round wall - floor) of a run's median round.
double MedianOverhead(const KFigures& f) {
  std::vector<double> v;
  for (const RoundFigures& r : f.per_round) v.push_back(r.wall_s - r.read.plain_s);
  return Median(v);
}
double MedianExcess(const KFigures& f) {
  std::vector<double> v;
  for (const RoundFigures& r : f.per_round) v.push_back(r.wall_s - FloorSeconds(f, r));
  return Median(v);
}

// PostgreSQL vs SQLite, same run, same K (target: per-round overhead within 1.5x of SQLite's).
void PrintStoreComparison(const std::vector<KFigures>& all, const std::vector<std::pair<size_t, size_t>>& store_pairs,
                          const std::string& postgres_missing) {
  std::printf(
      "\nPostgreSQL vs SQLite (overhead = round wall - read of the round's files, median round; excess = round wall -\n"
      "floor, the coordinator's own share; target: PostgreSQL's overhead within 1.50x of SQLite's)\n");
  if (store_pairs.empty()) {
    std::printf("  no PostgreSQL runs%s%s\n", postgres_missing.empty() ? "" : ": ", postgres_missing.c_str());
  } else {
    std::printf("  %-6s %6s %18s %18s %7s %16s %16s %7s  %s\n", "K", "MiB", "sqlite overhead ms",
                "postgres overhead ms", "ratio", "sqlite excess ms", "postgres excess ms", "ratio", "verdict");
  }
  for (const auto& [sqlite_at, postgres_at] : store_pairs) {
    const KFigures& s = all[sqlite_at];
    const KFigures& p = all[postgres_at];
    const double so = MedianOverhead(s), po = MedianOverhead(p), se = MedianExcess(s), pe = MedianExcess(p);
    const double ratio = so > 0 ? po / so : 0.0;
    const bool complete = !s.per_round.empty() && !p.per_round.empty() && p.outcome == "succeeded";
    std::printf("  %-6d %6d %18.1f %18.1f %7.2f %16.1f %16.1f %7.2f  %s\n", s.k, s.update_mib, so * 1e3, po * 1e3,
                ratio, se * 1e3, pe * 1e3, se > 0 ? pe / se : 0.0,
                !complete      ? "MISS (a run did not finish)"
                : ratio <= 1.5 ? "PASS"
                               : "MISS");
  }
}

void PrintRssTable(const std::vector<KFigures>& all) {
  std::printf(
      "\nPeak RSS vs K (target: no growth beyond per-connection bookkeeping; growth is measured against the\n"
      "smallest K run with the same update size and store; HWM counts the update files the server maps, page cache;\n"
      "anon is its own memory, RssAnon sampled every 10 ms during the job)\n");
  std::printf("  %-6s %-8s %6s %16s %16s %26s %15s %27s\n", "K", "store", "MiB", "idle RSS MiB", "peak (HWM) MiB",
              "HWM growth KiB/worker", "peak anon MiB", "anon growth KiB/worker");
  for (const KFigures& f : all) {
    const KFigures* base = nullptr;
    for (const KFigures& b : all) {
      if (b.store == f.store && b.update_mib == f.update_mib && b.k < f.k && (base == nullptr || b.k < base->k)) {
        base = &b;
      }
    }
    std::string growth = "-", anon_growth = "-";
    if (base != nullptr) {
      const std::string vs = " (vs K=" + std::to_string(base->k) + ")";
      growth = std::to_string((f.hwm_kib - base->hwm_kib) / (f.k - base->k)) + vs;
      anon_growth = std::to_string((f.peak_anon_kib - base->peak_anon_kib) / (f.k - base->k)) + vs;
    }
    std::printf("  %-6d %-8s %6d %16.1f %16.1f %26s %15.1f %27s\n", f.k, f.store.c_str(), f.update_mib,
                static_cast<double>(f.idle_rss_kib) / 1024, static_cast<double>(f.hwm_kib) / 1024, growth.c_str(),
                static_cast<double>(f.peak_anon_kib) / 1024, anon_growth.c_str());
  }
}

// PostgreSQL for the --postgres-ks runs: one throwaway server, a database per run; null (and why, printed) when it
// cannot start.
std::unique_ptr<parsyn::storage::PostgresForTest> StartPostgres(const std::vector<int>& postgres_ks,
                                                                std::string& missing) {
  if (postgres_ks.empty()) return nullptr;
  StatusOr<std::unique_ptr<parsyn::storage::PostgresForTest>> started = parsyn::storage::PostgresForTest::Start();
  if (started.ok()) return std::move(*started);
  missing = started.status().ToString();
  std::printf("PostgreSQL runs left out: %s\n", missing.c_str());
  return nullptr;
}

// Every K of the options on SQLite, each of --postgres-ks again right after on PostgreSQL; the figures, and the
// (SQLite, PostgreSQL) pairs among them.
std::vector<KFigures> RunAllKs(const Options& o, const fs::path& root, parsyn::storage::PostgresForTest* postgres,
                               std::vector<std::pair<size_t, size_t>>& store_pairs) {
  std::vector<KFigures> all;
  for (size_t i = 0; i < o.ks.size(); ++i) {
    const PreparedUpdate update = PrepareUpdate(root / ("update-" + std::to_string(o.update_mib[i])), o.update_mib[i]);
    std::vector<std::string> metadata_uris = {""};
    const bool on_postgres =
        postgres != nullptr && std::find(o.postgres_ks.begin(), o.postgres_ks.end(), o.ks[i]) != o.postgres_ks.end();
    if (on_postgres) metadata_uris.push_back(Must(postgres->NewDatabase(), "PostgreSQL database"));
    for (const std::string& metadata_uri : metadata_uris) {
      const auto start = Clock::now();
      all.push_back(RunOneK(o.ks[i], o.rounds[i], root, update, o.upload_concurrency, o.server_choice, metadata_uri));
      if (!metadata_uri.empty()) store_pairs.emplace_back(all.size() - 2, all.size() - 1);
      PrintKRun(all.back(), update, Seconds(Clock::now() - start), o.upload_concurrency);
    }
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);

  // Two connections per worker in this process, one per worker (plus files) in the server, which inherits this limit.
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &nofile);

  StatusOr<fs::path> made = parsyn::CreateTempDir(fs::temp_directory_path(), "parsyn-bench-rounds");
  if (!made.ok()) Die(made.status().ToString());
  const fs::path root = *made;

  std::printf(
      "bench_rounds: LoRA r=%d on q_proj/v_proj, fp32 updates; uploads from this process capped at %d at "
      "once; RLIMIT_NOFILE %lu (the server inherits it)\n",
      kLoraR, o.upload_concurrency, static_cast<unsigned long>(nofile.rlim_cur));
  std::fflush(stdout);

  // First the trainers' run (rounds_trainers.h), so that the last line stays the scripted runs' worst ratio.
  if (o.trainer_rounds >= 2) {
    parsyn::bench::RunTrainerRounds(o.server_choice.binary, root, o.trainer_workers, o.trainer_rounds);
  }

  std::string postgres_missing;
  const std::unique_ptr<parsyn::storage::PostgresForTest> postgres = StartPostgres(o.postgres_ks, postgres_missing);
  // SQLite figures, and the PostgreSQL runs beside them (same K, rounds and update, right after).
  std::vector<std::pair<size_t, size_t>> store_pairs;
  const std::vector<KFigures> all = RunAllKs(o, root, postgres.get(), store_pairs);

  PrintSummary(all);
  PrintStoreComparison(all, store_pairs, postgres_missing);
  PrintRssTable(all);
  std::error_code ec;
  if (o.server_choice.log_level == "warn") {
    fs::remove_all(root, ec);
  } else {
    for (const KFigures& f : all) {
      if (!f.kept_log.empty()) {
        std::printf("server log of K=%d (%s) kept: %s\n", f.k, f.store.c_str(), f.kept_log.c_str());
      }
    }
  }
  return 0;
}
