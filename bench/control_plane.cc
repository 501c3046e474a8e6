// bench_control_plane: the coordinator's control plane at scale.
//
// For each N it starts `parsyn server` as a child process (fresh temp data dir, 127.0.0.1, connection caps off) and
// N simulated workers in ONE thread of this process (tests/support/sim_workers.h: an asynchronous client speaking the
// real protocol on one connection per worker: hello, long-polls, heartbeats only while "training" a task, uploads,
// results). Both raise their soft RLIMIT_NOFILE to the hard limit; one connection per worker on each side, so N needs
// about N + 128 descriptors per process (10,000 fit under the 20,000 hard limit of CI machines).
//
// Measured, per N:
//   - idle-connected (every worker holds its poll, no heartbeats): the server's CPU (fraction of one core,
//     utime+stime from /proc/PID/stat over an --idle-s window), its RSS, and RSS per connected worker (RSS now minus
//     RSS before the first hello, / N); then heartbeat p50/p99 of 1,000 probe heartbeats (for idle workers, on extra
//     connections) over 5 s while the fleet holds its polls.
//   - a job over all N workers on a 2.4 MB dataset (own mode, min = max = N, 2 rounds; each worker "trains" each task
//     for 1-2 s (--train-ms 1000), heartbeating on its connection every heartbeat interval (the server's, 5 s), then
//     returns a 64 KiB LoRA update): setup (job created -> the first task), task assignment latency p50/p99 of round
//     2 (round 1 committed -> each worker's task), the wall time of rounds 1 (first task -> commit) and 2 (commit 1
//     -> commit 2), heartbeat p99 during the job (probe heartbeats, 200/s on 8 connections driven by a thread of
//     their own, as the idle probes; and the server's own answer time for every heartbeat, the upper bound of its
//     /metrics bucket), and round 2's ratio to its floor: (round 2 wall - the longest
//     simulated training, 2 x train-ms) / floor, where floor = moving N x 64 KiB over plain loopback TCP (16
//     connections, no HTTP) + one sha256 pass over them + reading N 64 KiB files, measured after the server is gone.
//     Beside it, the request floor: 3N heartbeats (the cheapest authenticated worker call; a round's worker makes 3
//     calls, upload, result and poll) sent back to back on 256 connections after the job, and the round's ratio to
//     both floors together. And round 2's CPU, in cores (CPU seconds over wall seconds between the two commits'
//     events): the server's, its event loop thread's, this process's and the machine's, to tell a round bound by
//     the loop from one bound by the machine (the simulated workers share it), and the fraction of the round the
//     loop was runnable but waiting for a core (its /proc/PID/task/TID/schedstat). And the p99, during the job, of the
//     server's event-loop queue wait and of its timer tick's lateness (parsyn_event_loop_lag_seconds and
//     parsyn_timer_tick_lateness_seconds, bucket upper bounds), beside the probes' heartbeat p99.
// N beyond what the descriptors or the loopback port range (one server address: ip_local_port_range) allow is
// printed as skipped, with the reason.
//
// Usage: bench_control_plane [--workers 1000,5000,10000,50000] [--idle-s 10] [--train-ms 1000] [--server-bin PATH]
//                            [--server-log-level warn] [--details-dir DIR]
// --details-dir keeps, per N, the server's /metrics after the job (metrics-N.txt: its round-phase histograms) and
// the job's timeline as this process saw it (timeline-N.csv: ms since the job was created, what, round; for a probe
// heartbeat, its answer time in ms instead of a round), for profiling a slow round, and the server's log
// (server-N.log) unless --server-log-level is warn.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/fd_limit.h"
#include "base/sha256.h"
#include "base/temp_file.h"
#include "base/testing/build_paths.h"
#include "fleet.h"
#include "http/client.h"
#include "support/sim_workers.h"

namespace {

using nlohmann::json;
using parsyn::StatusOr;
using parsyn::bench::Clock;
using parsyn::bench::Die;
using parsyn::bench::Must;
using parsyn::bench::ProcProbe;
using parsyn::bench::ReadText;
using parsyn::bench::Seconds;
using parsyn::bench::ServerProcess;
using parsyn::bench::TimeLoopbackTransfer;
namespace fs = std::filesystem;
namespace http = parsyn::http;
namespace bench = parsyn::bench;
using parsyn::test_support::SimWorkers;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t at = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[at];
}

// A model whose default LoRA adapters (q_proj and v_proj, r = 16) are 64 KiB of fp32: A (16, 256) and B (256, 16)
// for each of the two, one layer.
std::string ModelConfig() { return bench::LlamaConfig({.hidden = 256, .intermediate = 688, .layers = 1, .heads = 4}); }
constexpr int kLoraR = 16;

// CPU time, in clock ticks, of what shares this machine during a round: the server (all its threads), its event
// loop (the main thread: `parsyn server` runs the io_context there), this process (the simulated workers), and the
// machine (busy and all, from /proc/stat's first line); and how long the loop waited for a core.
struct CpuUse {
  long server = 0, loop = 0, bench = 0, machine_busy = 0, machine_all = 0;
  long long loop_wait_ns = -1;
};
CpuUse SampleCpu(pid_t server) {
  const ProcProbe probe(server);
  const bench::MachineTicks machine = bench::ReadMachineTicks();
  return {.server = probe.CpuTicks(),
          .loop = probe.ThreadCpuTicks(server),
          .bench = bench::CpuTicksOf("/proc/self/stat"),
          .machine_busy = machine.busy,
          .machine_all = machine.all,
          .loop_wait_ns = probe.RunQueueWaitNs(server)};
}

// The server's flags besides data dir, listen address and log level. A simulated worker uploads on its one
// connection (a real one uploads on its blob connection and heartbeats meanwhile), so no heartbeat can go while its
// upload waits for the server: the heartbeat timeout is set beyond the longest such wait.
const std::vector<std::string> kServerFlags = {
    "--max-poll-wait-ms", "300000", "--heartbeat-timeout-ms",        "600000",
    "--max-connections",  "0",      "--max-connections-per-address", "0"};

struct Update {
  std::string bytes;
  std::string sha256;
};

Update PrepareUpdate() {
  const bench::LoraUpdate update = bench::MakeLoraUpdate(ModelConfig(), kLoraR);
  return {.bytes = std::string(reinterpret_cast<const char*>(update.image.data()), update.image.size()),
          .sha256 = update.sha256};
}

// The loopback ports one client address can use to reach one server address (net.ipv4.ip_local_port_range).
int LoopbackPorts() {
  std::istringstream range(ReadText("/proc/sys/net/ipv4/ip_local_port_range"));
  int low = 0, high = 0;
  if (!(range >> low >> high) || high < low) return 28'232;  // Linux's default 32768-60999
  return high - low + 1;
}

// The least a round of `count` updates could cost here: move their bytes, hash them once, read them once. Seconds.
double RoundFloorSeconds(const std::string& update, int count, const fs::path& scratch) {
  const double transfer_s = TimeLoopbackTransfer(update, count, 16);
  const auto sha_start = Clock::now();
  for (int i = 0; i < count; ++i) (void)parsyn::Sha256Hex(update);
  const double sha_s = Seconds(Clock::now() - sha_start);
  const fs::path file = scratch / "update.safetensors";
  {
    std::ofstream out(file, std::ios::binary);
    out << update;
  }
  std::vector<char> buf(size_t{1} << 20);
  const auto read_start = Clock::now();
  for (int i = 0; i < count; ++i) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) Die("cannot read " + file.string());
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
    ::close(fd);
  }
  const double read_s = Seconds(Clock::now() - read_start);
  std::error_code ec;
  fs::remove(file, ec);
  return transfer_s + sha_s + read_s;
}

// A JSONL dataset of 4 rows per worker (one shard each), padded to about `bytes` in all.
std::string Dataset(int n, size_t bytes) {
  const size_t rows = 4 * static_cast<size_t>(n);
  const size_t per_row = std::max<size_t>(24, bytes / rows);
  std::string out;
  out.reserve(rows * per_row);
  for (size_t i = 0; i < rows; ++i) {
    std::string text = "row " + std::to_string(i) + " ";
    const size_t framing = std::string("{\"text\": \"\"}\n").size();
    if (text.size() + framing < per_row) text.append(per_row - framing - text.size(), 'x');
    out += "{\"text\": \"" + text + "\"}\n";
  }
  return out;
}
constexpr size_t kDatasetBytes = 2'400'000;
constexpr int kJobProbesPerSecond = 200;
constexpr int kRequestFloorConnections = 256;

// The server's /metrics text ("" when it cannot be read).
std::string MetricsText(http::Client& admin) {
  auto got = admin.Send(http::Method::kGet, "/metrics", "", "");
  return got.ok() && got->status == 200 ? got->body : "";
}

// The cumulative buckets (upper bound in seconds -> count) of histogram `family` in a /metrics text, over its
// series whose labels contain `labels` ("" for all).
std::map<double, double> HistogramBuckets(const std::string& metrics_text, const std::string& family,
                                          std::string_view labels) {
  std::map<double, double> buckets;
  std::istringstream lines(metrics_text);
  const std::string prefix = family + "_bucket{";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0 || line.find(labels) == std::string::npos) continue;
    const size_t le = line.find("le=\"");
    const size_t close = line.find("\"}", le);
    if (le == std::string::npos || close == std::string::npos) continue;
    const std::string bound = line.substr(le + 4, close - le - 4);
    buckets[bound == "+Inf" ? 1e300 : std::stod(bound)] += std::stod(line.substr(close + 2));
  }
  return buckets;
}

// Heartbeats' answer times in the server: its request-duration histogram for that route.
std::map<double, double> HeartbeatBuckets(const std::string& metrics_text) {
  return HistogramBuckets(metrics_text, "parsyn_http_request_duration_seconds", "route=\"/api/v1/worker/heartbeat\"");
}
// A handler's wait in the server's event-loop queue (parsyn_event_loop_lag_seconds), and how late its 100 ms timer
// tick ran (parsyn_timer_tick_lateness_seconds).
std::map<double, double> LoopLagBuckets(const std::string& metrics_text) {
  return HistogramBuckets(metrics_text, "parsyn_event_loop_lag_seconds", "");
}
std::map<double, double> TickLatenessBuckets(const std::string& metrics_text) {
  return HistogramBuckets(metrics_text, "parsyn_timer_tick_lateness_seconds", "");
}

// p99 of what was observed between two readings of a histogram's buckets, as the upper bound of its bucket (ms).
double BucketP99Ms(const std::map<double, double>& before, const std::map<double, double>& after) {
  if (after.empty()) return 0;
  const double total = after.rbegin()->second - (before.empty() ? 0 : before.rbegin()->second);
  if (total <= 0) return 0;
  for (const auto& [bound, count] : after) {
    const auto was = before.find(bound);
    if (count - (was == before.end() ? 0 : was->second) >= 0.99 * total) return bound * 1000;
  }
  return 0;
}

struct Figures {
  int n = 0;
  double hello_s = 0;
  double idle_cores = 0;
  double idle_rss_mb = 0;
  double rss_per_worker_kb = 0;
  double hb_idle_p50 = 0, hb_idle_p99 = 0;
  size_t hb_idle_count = 0;
  double setup_s = 0;
  double assign_p50 = 0, assign_p99 = 0;
  double round1_s = 0, round2_s = 0;
  double floor_s = 0;
  double round2_ratio = 0;       // (round2_s - the longest simulated training) / floor_s
  double request_floor_s = 0;    // 3N heartbeats back to back on 256 connections
  double round2_ratio_both = 0;  // (round2_s - the longest simulated training) / (floor_s + request_floor_s)
  double hb_round_p99 = 0;       // probe heartbeats during the job
  size_t hb_round_count = 0;
  double hb_round_server_p99 = 0;  // the server's own answer time (its /metrics histogram): a bucket's upper bound
  double loop_lag_p99 = 0;         // the server's event-loop lag during the job (its /metrics histogram), the same way
  double tick_lateness_p99 = 0;    // and its timer tick's lateness
  // Round 2's CPU, in cores (CPU seconds / wall seconds): the server, its event loop, this process, the machine.
  double round2_server_cores = 0, round2_loop_cores = 0, round2_bench_cores = 0, round2_machine_cores = 0;
  double round2_loop_waiting = -1;  // the fraction of round 2 its event loop was runnable but had no core; -1: unknown
  std::string outcome;
  int errors = 0;
};

// The dataset (kDatasetBytes), the model and N registered workers on `server`, through its admin API.
struct Platform {
  http::ClientOptions admin;
  int64_t dataset_id = 0;
  int64_t model_id = 0;
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
};

Platform SetUpPlatform(const ServerProcess& server, int n) {
  Platform p;
  p.admin.base_url = server.url();
  p.admin.bearer_token = server.admin_key();
  p.admin.timeout = std::chrono::minutes(10);
  p.admin.max_attempts = 1;
  http::Client admin(p.admin);
  p.dataset_id = bench::UploadDataset(admin, Dataset(n, kDatasetBytes));
  p.model_id = bench::CreateModel(admin, ModelConfig());
  for (const bench::RegisteredWorker& w : bench::RegisterWorkers(p.admin, n)) {
    p.ids.push_back(w.id);
    p.tokens.push_back(w.token);
  }
  return p;
}

// Starts the simulated workers and waits for every hello (Die after 10 minutes); then, while each holds its poll, the
// server's CPU over the idle window, its RSS, and heartbeat latency of probes on connections of their own.
void MeasureIdle(Figures& fig, SimWorkers& workers, const ProcProbe& server, int idle_s) {
  const int n = fig.n;
  const long rss_before_kib = server.StatusKib("VmRSS");
  const auto hello_start = Clock::now();
  workers.Start();
  const auto hello_deadline = Clock::now() + std::chrono::minutes(10);
  while (workers.hellos() < n && Clock::now() < hello_deadline) {
    if (workers.error_count() > 0) Die("a worker failed before the job: " + workers.errors().front());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (workers.hellos() < n) Die("only " + std::to_string(workers.hellos()) + " of " + std::to_string(n) + " hellos");
  fig.hello_s = Seconds(Clock::now() - hello_start);

  // A moment for the last hellos' polls to open, then the idle window: every worker holds its poll, and nothing
  // else goes on (idle workers send no heartbeats).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const long ticks0 = server.CpuTicks();
  const auto idle_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(idle_s));
  const long ticks1 = server.CpuTicks();
  const auto idle_end = Clock::now();
  fig.idle_cores = static_cast<double>(ticks1 - ticks0) / static_cast<double>(::sysconf(_SC_CLK_TCK)) /
                   Seconds(idle_end - idle_start);
  const long rss_idle_kib = server.StatusKib("VmRSS");
  fig.idle_rss_mb = static_cast<double>(rss_idle_kib) / 1024.0;
  fig.rss_per_worker_kb = static_cast<double>(rss_idle_kib - rss_before_kib) / n;
  // Heartbeats while the fleet holds its polls: probes for idle workers on connections of their own.
  constexpr int kProbes = 1000;
  const auto probe_start = Clock::now();
  workers.ProbeHeartbeats(kProbes, std::chrono::seconds(5));
  while (workers.heartbeats().size() < kProbes && Clock::now() < probe_start + std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<double> ms;
  for (const SimWorkers::Sample& s : workers.heartbeats()) ms.push_back(s.ms);
  fig.hb_idle_count = ms.size();
  fig.hb_idle_p50 = Percentile(ms, 0.50);
  fig.hb_idle_p99 = Percentile(ms, 0.99);
}

// What the job left to compute figures from.
struct JobRun {
  int64_t job_id = 0;
  Clock::time_point start, end;
  std::map<int, Clock::time_point> committed;  // when the server committed each round
  std::map<int, CpuUse> cpu_at_commit;         // when the commit's event arrived
  std::vector<SimWorkers::TaskSeen> tasks;
  std::vector<SimWorkers::Sample> beats, uploads, results;
};

// The job over all N workers, with probe heartbeats on a thread of their own, until it ends; then the request floor
// and what the workers saw. Fills the figures read from the server's /metrics and the outcome.
JobRun RunJob(Figures& fig, const Platform& p, SimWorkers& workers, pid_t server, const fs::path& details_dir) {
  const int n = fig.n;
  http::Client admin(p.admin);
  const json spec = bench::JobSpec("bench-n" + std::to_string(n), p.dataset_id, p.model_id, kLoraR, 2, p.ids);
  const std::string metrics_before = MetricsText(admin);
  workers.StartProbing(kJobProbesPerSecond);
  JobRun job;
  job.start = Clock::now();
  job.job_id = bench::CreateJob(admin, spec);
  fig.outcome = bench::FollowJob(p.admin, job.job_id, std::chrono::minutes(60), [&](const json& d) {
    // When the server committed (its clock is this machine's), not when the event got here: the stream can lag a
    // busy round by seconds.
    const int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const auto lag = std::chrono::milliseconds(std::max<int64_t>(0, now_ms - d.value("time_ms", now_ms)));
    job.committed[d["round"].get<int>()] = Clock::now() - lag;
    job.cpu_at_commit[d["round"].get<int>()] = SampleCpu(server);
  });
  job.end = Clock::now();
  const std::string metrics_after = MetricsText(admin);
  fig.hb_round_server_p99 = BucketP99Ms(HeartbeatBuckets(metrics_before), HeartbeatBuckets(metrics_after));
  fig.loop_lag_p99 = BucketP99Ms(LoopLagBuckets(metrics_before), LoopLagBuckets(metrics_after));
  fig.tick_lateness_p99 = BucketP99Ms(TickLatenessBuckets(metrics_before), TickLatenessBuckets(metrics_after));
  if (!details_dir.empty()) {
    std::ofstream(details_dir / ("metrics-" + std::to_string(n) + ".txt")) << metrics_after;
  }
  job.tasks = workers.tasks();
  workers.StopProbing();
  job.beats = workers.probe_heartbeats();
  fig.request_floor_s = workers.HeartbeatBurstSeconds(3 * n, kRequestFloorConnections);
  job.uploads = workers.uploads();
  job.results = workers.accepted_results();
  fig.errors = workers.error_count();
  for (const std::string& e : workers.errors()) std::fprintf(stderr, "  N=%d worker error: %s\n", n, e.c_str());
  workers.Stop();
  return job;
}

// Setup, task assignment of round 2, the rounds' wall times, and round 2's CPU.
void AddJobFigures(Figures& fig, const JobRun& job) {
  Clock::time_point first_task = job.end;
  std::vector<double> assign_ms;
  const auto commit = [&](int round) { return job.committed.at(round); };
  for (const SimWorkers::TaskSeen& t : job.tasks) {
    if (t.job_id != job.job_id || t.kind != "train") continue;
    if (t.round == 1) first_task = std::min(first_task, t.at);
    if (t.round == 2 && job.committed.contains(1)) {
      assign_ms.push_back(std::chrono::duration<double, std::milli>(t.at - commit(1)).count());
    }
  }
  fig.setup_s = Seconds(first_task - job.start);
  fig.assign_p50 = Percentile(assign_ms, 0.50);
  fig.assign_p99 = Percentile(assign_ms, 0.99);
  if (job.committed.contains(1)) fig.round1_s = Seconds(commit(1) - first_task);
  if (job.committed.contains(1) && job.committed.contains(2)) fig.round2_s = Seconds(commit(2) - commit(1));
  if (!job.cpu_at_commit.contains(1) || !job.cpu_at_commit.contains(2)) return;
  const CpuUse& a = job.cpu_at_commit.at(1);
  const CpuUse& b = job.cpu_at_commit.at(2);
  // Ticks over the same span between the two samples: the machine's all-CPU ticks are cores x wall.
  const double cores = static_cast<double>(std::thread::hardware_concurrency());
  const double span = static_cast<double>(b.machine_all - a.machine_all) / cores;
  if (span <= 0) return;
  fig.round2_server_cores = static_cast<double>(b.server - a.server) / span;
  fig.round2_loop_cores = static_cast<double>(b.loop - a.loop) / span;
  fig.round2_bench_cores = static_cast<double>(b.bench - a.bench) / span;
  fig.round2_machine_cores = static_cast<double>(b.machine_busy - a.machine_busy) / span;
  if (a.loop_wait_ns >= 0 && b.loop_wait_ns >= 0) {
    const double wall_s = span / static_cast<double>(::sysconf(_SC_CLK_TCK));
    fig.round2_loop_waiting = static_cast<double>(b.loop_wait_ns - a.loop_wait_ns) / 1e9 / wall_s;
  }
}

// timeline-N.csv: ms since the job was created, what, round (for a probe heartbeat, its answer time in ms).
void WriteTimeline(const fs::path& file, const JobRun& job) {
  std::ofstream timeline(file);
  auto ms = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - job.start).count(); };
  timeline << "ms,what,round\n";
  for (const SimWorkers::TaskSeen& t : job.tasks) timeline << ms(t.at) << ",task_" << t.kind << "," << t.round << "\n";
  for (const auto& [round, at] : job.committed) timeline << ms(at) << ",committed," << round << "\n";
  // An upload's or result's round is not kept: sent and answered times tell the rounds apart.
  for (const SimWorkers::Sample& u : job.uploads)
    timeline << ms(u.at) << ",upload_sent,\n" << ms(u.at) + u.ms << ",upload_stored,\n";
  for (const SimWorkers::Sample& r : job.results)
    timeline << ms(r.at) << ",result_sent,\n" << ms(r.at) + r.ms << ",result_accepted,\n";
  // A probe heartbeat's answer time, in the round column: when and how slow the loop answered.
  for (const SimWorkers::Sample& b : job.beats) {
    if (b.at >= job.start && b.at < job.end) timeline << ms(b.at) << ",probe_heartbeat," << b.ms << "\n";
  }
}

Figures RunOne(int n, const fs::path& root, const Update& update, const std::string& binary,
               const std::string& log_level, int idle_s, std::chrono::milliseconds train_time,
               const fs::path& details_dir) {
  Figures fig;
  fig.n = n;
  const fs::path data_dir = root / ("n" + std::to_string(n));
  fs::create_directories(data_dir);
  ServerProcess server(data_dir, binary, log_level, kServerFlags);
  const Platform platform = SetUpPlatform(server, n);
  SimWorkers workers({.port = server.port(),
                      .tokens = platform.tokens,
                      .update = update.bytes,
                      .update_sha256 = update.sha256,
                      .train_time = train_time});
  MeasureIdle(fig, workers, ProcProbe(server.pid()), idle_s);
  // Printed now too: a job that never ends (the bench waits for it) leaves these figures standing.
  std::printf("%7d idle: hello %.1f s, %.3f core, RSS %.1f MB (%.0f B/worker), probe heartbeats p50/p99 %.2f/%.2f ms\n",
              n, fig.hello_s, fig.idle_cores, fig.idle_rss_mb, fig.rss_per_worker_kb * 1024, fig.hb_idle_p50,
              fig.hb_idle_p99);
  std::fflush(stdout);

  const JobRun job = RunJob(fig, platform, workers, server.pid(), details_dir);
  AddJobFigures(fig, job);
  std::vector<double> round_beats;
  for (const SimWorkers::Sample& s : job.beats) {
    if (s.at >= job.start && s.at < job.end) round_beats.push_back(s.ms);
  }
  fig.hb_round_count = round_beats.size();
  if (!details_dir.empty()) WriteTimeline(details_dir / ("timeline-" + std::to_string(n) + ".csv"), job);
  fig.hb_round_p99 = Percentile(round_beats, 0.99);
  // The data dir stays until the last N is done (main removes the root): this machine's ext4 has no journal, and
  // there each new inode skips every inode freed in the last 60-360 s (the kernel's recently_deleted check, one
  // buffer-cache lookup each), so deleting one run's ~30,000 files made the next run's setup and uploads slower
  // (setup 4.2 s -> 11.1 s, 3.4% of all samples in recently_deleted).
  std::error_code ec;
  if (log_level == "warn") {
    fs::remove(server.log(), ec);
  } else if (!details_dir.empty()) {
    fs::copy_file(server.log(), details_dir / ("server-" + std::to_string(n) + ".log"),
                  fs::copy_options::overwrite_existing, ec);
  }
  return fig;
}

}  // namespace

namespace {

struct Options {
  std::vector<int> ns = {1000, 5000, 10000, 50000};
  int idle_s = 10;
  int train_ms = 1000;
  std::string binary = parsyn::test_support::BuildPath("parsyn");
  std::string log_level = "warn";
  fs::path details_dir;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  CLI::App app{
      "bench_control_plane: the coordinator's control plane with N simulated workers on a real `parsyn "
      "server` (see the header of bench/control_plane.cc)"};
  app.add_option("--workers", o.ns, "comma-separated N: simulated workers per run")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--idle-s", o.idle_s, "seconds of the idle window")->capture_default_str();
  app.add_option("--train-ms", o.train_ms, "simulated training per task: train-ms to twice that")
      ->capture_default_str();
  app.add_option("--server-bin", o.binary, "the parsyn binary to run (default: the one built beside this bench)");
  app.add_option("--server-log-level", o.log_level, "the server's log level (kept in --details-dir unless warn)")
      ->capture_default_str();
  app.add_option("--details-dir", o.details_dir,
                 "keep per N the server's /metrics after the job, the job's timeline and the server's log here");
  bench::ParseFlags(app, argc, argv);
  if (!o.details_dir.empty()) fs::create_directories(o.details_dir);
  return o;
}

// Why N workers cannot run here ("" when they can): one connection per worker in each process (server and this
// one), plus the probes, admin calls and a margin; and one loopback port per connection to one server address.
std::string SkipReason(int n, const parsyn::OpenFilesLimit& fds, int ports) {
  const uint64_t need = static_cast<uint64_t>(n) + 128;
  std::string why;
  if (need > fds.after) {
    why = "needs ~" + std::to_string(need) + " file descriptors in each process, RLIMIT_NOFILE is " +
          std::to_string(fds.after) + " (the hard limit; raising it needs CAP_SYS_RESOURCE)";
  }
  if (n > ports) {
    why += (why.empty() ? "" : "; ") + std::string("needs ") + std::to_string(n) +
           " loopback connections to one server address, the ephemeral port range has " + std::to_string(ports);
  }
  return why;
}

void PrintHeader(const Update& update, const parsyn::OpenFilesLimit& fds, int ports, const Options& o) {
  std::printf(
      "bench_control_plane: %zu-byte updates (LoRA r=%d), %.1f MB dataset, one connection per worker, RLIMIT_NOFILE "
      "%lu (hard %lu), %d loopback ports, idle window %d s, training %lld-%lld ms per task\n",
      update.bytes.size(), kLoraR, static_cast<double>(kDatasetBytes) / 1e6, static_cast<unsigned long>(fds.after),
      static_cast<unsigned long>(fds.hard), ports, o.idle_s, static_cast<long long>(o.train_ms),
      static_cast<long long>(2 * o.train_ms));
  std::printf("%7s %8s %10s %9s %10s %16s %8s %18s %9s %9s %8s %6s %11s %10s %18s %10s %s\n", "N", "hello s",
              "idle core", "RSS MB", "B/worker", "hb p50/p99 ms", "setup s", "assign p50/p99 ms", "round1 s",
              "round2 s", "floor s", "ratio", "req floor s", "ratio both", "probe hb p99 (job)", "server hb p99",
              "job (errors)");
  std::fflush(stdout);
}

void PrintRow(const Figures& f) {
  std::printf(
      "%7d %8.1f %10.3f %9.1f %10.0f %7.2f/%-8.2f %8.1f %8.0f/%-9.0f %9.2f %9.2f %8.3f %6.2f %11.2f %10.2f %10.2f "
      "(%5zu) %10.0f %s (%d)\n",
      f.n, f.hello_s, f.idle_cores, f.idle_rss_mb, f.rss_per_worker_kb * 1024, f.hb_idle_p50, f.hb_idle_p99, f.setup_s,
      f.assign_p50, f.assign_p99, f.round1_s, f.round2_s, f.floor_s, f.round2_ratio, f.request_floor_s,
      f.round2_ratio_both, f.hb_round_p99, f.hb_round_count, f.hb_round_server_p99, f.outcome.c_str(), f.errors);
  std::printf(
      "%7d in the job, p99: event loop queue wait <= %.0f ms, timer tick late by <= %.0f ms; round 2 CPU, cores: "
      "server %.2f (its event loop %.2f, and waiting for a core %.2f of the time), simulated workers %.2f, machine "
      "%.2f busy of %u\n",
      f.n, f.loop_lag_p99, f.tick_lateness_p99, f.round2_server_cores, f.round2_loop_cores, f.round2_loop_waiting,
      f.round2_bench_cores, f.round2_machine_cores, std::thread::hardware_concurrency());
  std::fflush(stdout);
}

void PrintFooter(const std::vector<Figures>& done, std::chrono::milliseconds train_time) {
  std::printf(
      "\n(hb p50/p99: 1,000 probe heartbeats while every worker holds its poll; probe hb p99 (job): heartbeats sent "
      "at 200/s during the job from a thread of their own, ms (count); server hb p99: every heartbeat's answer time "
      "in the server during the job (the upper bound of its /metrics bucket); ratio: (round 2 wall - %lld ms of "
      "simulated training) / floor, floor = loopback transfer + sha256 + read of N updates; req floor: 3N heartbeats "
      "back to back on 256 connections; ratio both: the same work / (floor + req floor); round 2 CPU: CPU seconds / "
      "wall seconds between the two commits' events, of the server, its event loop thread, this process and the "
      "whole machine; waiting for a core: the loop's run-queue wait / wall seconds)\n",
      static_cast<long long>(2 * train_time.count()));
  for (const Figures& f : done) {
    if (f.n < 10'000) continue;
    std::printf(
        "bench_control_plane: N=%d: setup %.1f s (target 5.0), round 2 ratio %.2f (target 2.00; %.2f to the byte and "
        "request floors together), heartbeat p99 in the job %.1f ms (probes), <= %.0f ms in the server (target 50)\n",
        f.n, f.setup_s, f.round2_ratio, f.round2_ratio_both, f.hb_round_p99, f.hb_round_server_p99);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = ParseOptions(argc, argv);
  const std::chrono::milliseconds train_time{o.train_ms};
  const parsyn::OpenFilesLimit fds = Must(parsyn::RaiseOpenFilesLimit(), "raising RLIMIT_NOFILE");
  const int ports = LoopbackPorts();
  const fs::path root = Must(parsyn::CreateTempDir(fs::temp_directory_path(), "parsyn-bench-cp"), "temp dir");
  const Update update = PrepareUpdate();
  PrintHeader(update, fds, ports, o);
  std::vector<Figures> done;
  for (int n : o.ns) {
    if (const std::string why = SkipReason(n, fds, ports); !why.empty()) {
      std::printf("%7d skipped: %s\n", n, why.c_str());
      std::fflush(stdout);
      continue;
    }
    Figures f = RunOne(n, root, update, o.binary, o.log_level, o.idle_s, train_time, o.details_dir);
    // Measured after the server is gone, so the floor has the machine to itself as the round had.
    f.floor_s = RoundFloorSeconds(update.bytes, n, root);
    if (f.round2_s > 0) {
      const double work_s = std::max(0.0, f.round2_s - 2 * Seconds(train_time));
      f.round2_ratio = work_s / f.floor_s;
      f.round2_ratio_both = work_s / (f.floor_s + f.request_floor_s);
    }
    PrintRow(f);
    done.push_back(f);
  }
  PrintFooter(done, train_time);
  std::error_code ec;
  fs::remove_all(root, ec);
  return 0;
}
