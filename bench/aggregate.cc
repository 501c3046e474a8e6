// bench_aggregate: streaming FedAvg (weights::WeightedMean) on K = 8 updates of 256 MiB, round after round as the
// coordinator aggregates (one mean Reset between rounds, the global held through the next round), against this
// machine's memory bandwidth and against the way Flower aggregates in numpy, all measured in the same run; then peak
// RSS for
// K = 2, 8, 32, each in a child process (this program re-executed with --rss K). `--all` adds fp64 and exact rows.
// Then (f) full-weight rounds: K = 8 updates of a >= 1 GiB model (fp32, then bf16) stored as safetensors files in the
// temp dir, aggregated the coordinator's way (read-only mapped, exact sums, waiting on disk and summed chunk by chunk
// at Finish, the result written to a file) in child processes (--full-weight), each in another arrival order:
// peak RSS (VmHWM) over the global's bytes, target <= 1.25, and the result's bits compared across the orders.
// `--orders N` sets how many orders (default 3); `--full-weight-only` skips (a)-(e); `--rows-only` runs (a)-(d) alone.
// Last, (g) LoRA adapters of ranks {4, 4, 8, 8, 16, 16}: peak RSS and time of the exact factored mean against FedAvg
// of the same adapters zero-padded (aggregate_lora.cc); `--lora-only` runs it alone.
//
// Memory traffic we cause is counted by phase in SteadyRoundTraffic (zero-filled fresh pages, validation,
// accumulation, Finish). The traffic ratio is (those bytes / time) over the bandwidth of a plain streaming loop a[i] +=
// s * b[i] over arrays of the update's size, run on the same number of threads.
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "aggregate_lora.h"
#include "base/testing/build_paths.h"
#include "weights/safetensors.h"
#include "weights/weight_set.h"
#include "weights/weighted_mean.h"

namespace {

using parsyn::weights::Accumulation;
using parsyn::weights::DType;
using parsyn::weights::DTypeSize;
using parsyn::weights::WeightedMean;
using parsyn::weights::WeightSet;

constexpr size_t kUpdateBytes = size_t{256} << 20;
constexpr int kTensors = 32;  // 8 MiB each: a mid-sized model's worth of tensors
constexpr int kK = 8;
constexpr double kGB = 1e9;
constexpr double kMiB = 1 << 20;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int NumThreads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)); }

size_t AccumulatorBytesPerElement(Accumulation mode) {
  switch (mode) {
    case Accumulation::kFloat32: return 4;
    case Accumulation::kFloat64: return 8;
    case Accumulation::kExact: return 16;
  }
  return 4;
}

// An update of kUpdateBytes in `dtype`, rewritten in place for each client, so a run holds one update at a time
// whatever K is.
struct Update {
  WeightSet set;
  DType dtype;
  // The largest |value|, as the coordinator knows it from the check each upload passes as it arrives
  // (SafetensorsStreamChecker), so the mean need not read the update for it.
  double max_magnitude = 0;

  explicit Update(DType d) : dtype(d) {
    const int64_t elements = static_cast<int64_t>(kUpdateBytes / kTensors / DTypeSize(d));
    for (int t = 0; t < kTensors; ++t) {
      if (!set.AddZeros("layers." + std::to_string(t) + ".weight", d, {elements}).ok()) std::abort();
    }
  }
  // Fills every value (deterministic, in [-0.5, 0.5)) for client k.
  void Fill(int k) {
    max_magnitude = 0.5;  // the values below lie in [-0.5, 0.5)
    for (const auto& t : set.tensors()) {
      const size_t n = static_cast<size_t>(t.numel());
      if (dtype == DType::kF32) {
        float* w = t.as<float>().data();
        for (size_t i = 0; i < n; ++i) w[i] = static_cast<float>((i * 2654435761u + k * 97u) % 1000) * 1e-3f - 0.5f;
      } else {
        uint16_t* w = t.as<uint16_t>().data();
        for (size_t i = 0; i < n; ++i) {
          w[i] = parsyn::weights::FloatToBf16(static_cast<float>((i * 2654435761u + k * 97u) % 1000) * 1e-3f - 0.5f);
        }
      }
    }
  }
  // A set viewing this update's bytes, to hand to AcceptOwned as the coordinator hands its received updates (this
  // Update outlives it). One 256 MiB update per batch (WeightedMeanOptions::max_deferred_bytes is 128 MiB), so no
  // batch reads the same bytes twice.
  WeightSet View() const {
    WeightSet view;
    for (const auto& t : set.tensors()) {
      if (!view.AddView(t.name, t.dtype, t.shape, t.data, nullptr).ok()) std::abort();
    }
    return view;
  }
  // Makes the buffer the next client's update by changing its first value per tensor: enough for the RSS runs,
  // where what matters is that K updates pass through one buffer, and cheaper than refilling 256 MiB each time.
  void Advance(int k) {
    for (const auto& t : set.tensors()) {
      if (dtype == DType::kF32) t.as<float>()[0] = 1e-3f * static_cast<float>(k % 100);
    }
  }
};

// Bandwidth in bytes/s of a plain a[i] += s * b[i] over two float arrays of kUpdateBytes, on NumThreads() threads,
// counting 3 transfers per element (read a, read b, write a): sustained over `passes` passes after a warm-up, like
// the aggregation it is compared with (a best-of-few on a shared machine would pick a quiet moment instead). The
// arrays are allocated as the aggregation's buffers are (WeightSet::AddZeros: huge pages where the kernel gives them),
// so both sides of the ratio see the same page sizes.
class StreamLoop {
 public:
  StreamLoop() {
    a_ = arrays_.AddZeros("a", DType::kF32, {static_cast<int64_t>(kUpdateBytes / sizeof(float))}).value();
    b_ = arrays_.AddZeros("b", DType::kF32, {static_cast<int64_t>(kUpdateBytes / sizeof(float))}).value();
    std::fill_n(reinterpret_cast<float*>(a_.data()), kUpdateBytes / sizeof(float), 1.0f);
    std::fill_n(reinterpret_cast<float*>(b_.data()), kUpdateBytes / sizeof(float), 2.0f);
    Pass();
  }

  double BytesPerSecond(int passes) {
    const double start = Now();
    for (int p = 0; p < passes; ++p) Pass();
    const double seconds = Now() - start;
    if (reinterpret_cast<const float*>(a_.data())[kUpdateBytes / 8] < 0) std::puts("");  // keeps the result observable
    return passes * 3.0 * kUpdateBytes / seconds;
  }

 private:
  void Pass() {
    const int threads = NumThreads();
    const size_t n = kUpdateBytes / sizeof(float);
    std::vector<std::jthread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([this, t, threads, n] {
        const size_t begin = n * t / threads, end = n * (t + 1) / threads;
        float* __restrict pa = reinterpret_cast<float*>(a_.data());
        const float* __restrict pb = reinterpret_cast<const float*>(b_.data());
        for (size_t i = begin; i < end; ++i) pa[i] += 0.5f * pb[i];
      });
    }
  }

  WeightSet arrays_;
  std::span<std::byte> a_, b_;
};

// One round's seconds and the stream bandwidth measured just before it.
struct RoundTiming {
  double seconds;
  double stream;
};

// The coordinator's way of aggregating round after round (strategy::RoundAggregation): one mean kept across rounds
// and Reset between them, each round's result (the new global) held through the next round. Each round (Reset or
// construction, K accepts, Finish) is timed right after a measurement of the stream bandwidth, so a change of load
// on a shared machine affects both sides of that round's ratio alike. The first round is the one that allocates.
std::vector<RoundTiming> TimeRounds(Update& update, Accumulation mode, int K, int rounds, StreamLoop& stream_loop) {
  std::vector<RoundTiming> timings;
  std::optional<WeightedMean> mean;
  std::optional<WeightSet> global;
  for (int r = 0; r < rounds; ++r) {
    const double stream = stream_loop.BytesPerSecond(4);
    const double start = Now();
    if (mean) {
      mean->Reset();
    } else {
      mean.emplace(update.set, parsyn::weights::WeightedMeanOptions{.accumulation = mode});
    }
    for (int k = 0; k < K; ++k) {
      parsyn::Status s = mean->AcceptOwned(update.View(), 100 + 10 * k, update.max_magnitude);
      if (!s.ok()) {
        std::fprintf(stderr, "Accept failed: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    auto result = std::move(*mean).Finish();
    if (!result.ok()) std::exit(1);
    timings.push_back({Now() - start, stream});
    global = std::move(*result);  // the round before's global goes now, as the coordinator lets it go
  }
  return timings;
}

// Runs the numpy (Flower-style) baseline; returns its seconds, or a negative value if it could not run.
double NumpySeconds(const char* dtype, size_t tensor_elements) {
  const std::string command = std::string("/usr/bin/python3 ") +
                              parsyn::test_support::SourcePath("bench/aggregate_numpy.py") + " --dtype " + dtype +
                              " --tensors " + std::to_string(kTensors) + " --tensor-elements " +
                              std::to_string(tensor_elements) + " --k " + std::to_string(kK);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return -1;
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  if (::pclose(pipe) != 0) return -1;
  try {
    return nlohmann::json::parse(output).at("seconds").get<double>();
  } catch (const nlohmann::json::exception&) {
    return -1;
  }
}

// Child mode: aggregate K fp32 updates generated one at a time, then print peak RSS in KiB.
int RssChild(int K) {
  Update update(DType::kF32);
  update.Fill(0);
  WeightedMean mean(update.set);
  for (int k = 0; k < K; ++k) {
    update.Advance(k);
    if (!mean.Accept(update.set, 1 + k).ok()) return 1;
  }
  if (!std::move(mean).Finish().ok()) return 1;
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf("%ld\n", usage.ru_maxrss);
  return 0;
}

double PeakRssMiB(const std::string& self, int K) {
  FILE* pipe = ::popen(("'" + self + "' --rss " + std::to_string(K)).c_str(), "r");
  if (!pipe) return -1;
  long kib = -1;
  if (std::fscanf(pipe, "%ld", &kib) != 1) kib = -1;
  if (::pclose(pipe) != 0) return -1;
  return kib / 1024.0;
}

// ---- (f) full-weight rounds from files ----

constexpr uint64_t kFullWeightBytes = uint64_t{1} << 30;  // the model (global) size

// A line of /proc/self/status in KiB ("VmHWM", "VmRSS").
long StatusKiB(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stol(line.substr(prefix.size()));
  }
  return -1;
}

// A 64-bit hash of every tensor's bytes, to compare results across orders (not cryptographic; fast).
uint64_t HashOf(const WeightSet& set) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& t : set.tensors()) {
    const auto* words = reinterpret_cast<const uint64_t*>(t.data.data());
    const size_t n = t.data.size() / 8;
    for (size_t i = 0; i < n; ++i) h = (h ^ words[i]) * 1099511628211ull;
    for (size_t i = n * 8; i < t.data.size(); ++i) h = (h ^ static_cast<uint8_t>(t.data[i])) * 1099511628211ull;
  }
  return h;
}

std::filesystem::path UpdatePath(const std::filesystem::path& dir, int k) {
  return dir / ("update_" + std::to_string(k) + ".safetensors");
}

// Child: aggregates the K update files in `dir` in the arrival order drawn from `order_seed` (0: as numbered), as
// the coordinator does (strategy::FedAvg's default: exact sums), writes the result to dir/global.safetensors, and
// prints "peak_kib accept_s finish_s write_s hash waited_on_disk cpu_s rss_after_accept_kib".
int FullWeightChild(const std::filesystem::path& dir, int order_seed) {
  std::vector<int> order(kK);
  std::iota(order.begin(), order.end(), 0);
  if (order_seed != 0) {
    std::mt19937 rng(static_cast<uint32_t>(order_seed));
    std::shuffle(order.begin(), order.end(), rng);
  }
  auto layout = parsyn::weights::MapSafetensorsFileReadOnly(UpdatePath(dir, 0));  // only its layout is read
  if (!layout.ok()) return 1;
  WeightedMean mean(*layout, {.accumulation = Accumulation::kExact});
  layout = WeightSet();
  double start = Now();
  for (int k : order) {
    auto update = parsyn::weights::MapSafetensorsFileReadOnly(UpdatePath(dir, k));
    if (!update.ok() || !mean.AcceptOwned(std::move(*update), 100 + 10 * k).ok()) return 1;
    mean.AddKept();  // as the coordinator does when no other update is on its way
  }
  const double accept_s = Now() - start;
  const long accept_rss_kib = StatusKiB("VmRSS");  // every update in, none of them resident
  const bool waited = mean.waiting_on_disk();
  start = Now();
  auto result = std::move(mean).Finish();
  if (!result.ok()) return 1;
  const double finish_s = Now() - start;
  start = Now();
  if (!parsyn::weights::WriteSafetensorsFile(*result, dir / "global.safetensors").ok()) return 1;
  const double write_s = Now() - start;
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double cpu_s =
      usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  std::printf("%ld %.2f %.2f %.2f %016llx %d %.2f %ld\n", StatusKiB("VmHWM"), accept_s, finish_s, write_s,
              static_cast<unsigned long long>(HashOf(*result)), waited ? 1 : 0, cpu_s, accept_rss_kib);
  return 0;
}

// Writes K update files of `bytes` in `dtype` (32 tensors) into `dir`: one buffer, rewritten in part per client.
bool WriteUpdateFiles(const std::filesystem::path& dir, DType dtype, uint64_t bytes) {
  WeightSet set;
  const int64_t elements = static_cast<int64_t>(bytes / kTensors / DTypeSize(dtype));
  for (int t = 0; t < kTensors; ++t) {
    if (!set.AddZeros("layers." + std::to_string(t) + ".weight", dtype, {elements}).ok()) return false;
  }
  for (int k = 0; k < kK; ++k) {
    for (const auto& t : set.tensors()) {
      const size_t n = static_cast<size_t>(t.numel());
      // Every value differs between clients; 1/1000 steps in [-0.5, 0.5) (exact sums make the order irrelevant,
      // float sums would not be).
      for (size_t i = 0; i < n; ++i) {
        const float v = static_cast<float>((i * 2654435761u + static_cast<size_t>(k) * 7919u) % 1000) * 1e-3f - 0.5f;
        if (dtype == DType::kF32) {
          t.as<float>()[i] = v;
        } else {
          t.as<uint16_t>()[i] = parsyn::weights::FloatToBf16(v);
        }
      }
    }
    if (!parsyn::weights::WriteSafetensorsFile(set, UpdatePath(dir, k)).ok()) return false;
  }
  return true;
}

struct FullWeightRun {
  double ratio = 0;
  bool identical = false;
  bool ran = false;
};

FullWeightRun FullWeight(const std::string& self, DType dtype, int orders) {
  FullWeightRun run;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("parsyn_bench_full_weight_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // K updates and the result must fit on disk; else the largest power-of-two size that does, said so.
  const uint64_t free_bytes = std::filesystem::space(dir).available;
  uint64_t bytes = kFullWeightBytes;
  while (bytes > (uint64_t{64} << 20) && (kK + 2) * bytes > free_bytes) bytes /= 2;
  const char* name = dtype == DType::kF32 ? "fp32" : "bf16";
  std::printf("  %s model of %.2f GiB (%s), K=%d updates on disk in %s%s\n", name, bytes / (kMiB * 1024),
              dtype == DType::kF32 ? "256 Mi parameters" : "512 Mi parameters", kK, dir.c_str(),
              bytes < kFullWeightBytes ? " (NOT 1 GiB: the temp dir has too little free space)" : "");
  if (!WriteUpdateFiles(dir, dtype, bytes)) {
    std::printf("  writing the update files failed\n");
    std::filesystem::remove_all(dir);
    return run;
  }
  std::printf("  %-7s %12s %9s %12s %9s %9s %9s %9s  %s\n", "order", "peak RSS", "ratio", "RSS after K", "accept s",
              "finish s", "write s", "CPU s", "result hash");
  std::string first_hash;
  run.identical = true;
  for (int o = 0; o < orders; ++o) {
    FILE* pipe = ::popen(("'" + self + "' --full-weight '" + dir.string() + "' " + std::to_string(o)).c_str(), "r");
    long kib = -1;
    double accept_s = 0, finish_s = 0, write_s = 0, cpu_s = 0;
    long accepted_kib = 0;
    char hash[32] = {};
    int waited = 0;
    const int fields = pipe ? std::fscanf(pipe, "%ld %lf %lf %lf %31s %d %lf %ld", &kib, &accept_s, &finish_s, &write_s,
                                          hash, &waited, &cpu_s, &accepted_kib)
                            : 0;
    if (!pipe || ::pclose(pipe) != 0 || fields != 8) {
      std::printf("  order %d: the child failed\n", o);
      run.identical = false;
      continue;
    }
    const double ratio = kib * 1024.0 / static_cast<double>(bytes);
    run.ratio = std::max(run.ratio, ratio);
    if (o == 0) first_hash = hash;
    run.identical = run.identical && first_hash == hash;
    std::printf("  #%-6d %8.0f MiB %9.3f %8.0f MiB %9.2f %9.2f %9.2f %9.2f  %s%s\n", o, kib / 1024.0, ratio,
                accepted_kib / 1024.0, accept_s, finish_s, write_s, cpu_s, hash,
                waited ? "" : " (did NOT wait on disk)");
    std::fflush(stdout);
  }
  run.ran = true;
  std::filesystem::remove_all(dir);
  return run;
}

// (f): fp32 then bf16; prints the ratios and the verdict line. Returns the exit status.
int FullWeightSection(const std::string& self, int orders) {
  std::printf(
      "(f) full-weight rounds: peak RSS of the aggregating process over the global's bytes, K=%d, exact sums,\n"
      "    %d arrival orders each (child processes)\n",
      kK, orders);
  const FullWeightRun fp32 = FullWeight(self, DType::kF32, orders);
  const FullWeightRun bf16 = FullWeight(self, DType::kBF16, orders);
  auto verdict = [](const FullWeightRun& r) { return r.ran && r.ratio <= 1.25 ? "ok" : "MISSED"; };
  std::printf(
      "full-weight: fp32 ratio %.3f %s, bf16 ratio %.3f %s (target 1.25); results bit-identical across %d "
      "orders: fp32 %s, bf16 %s\n",
      fp32.ratio, verdict(fp32), bf16.ratio, verdict(bf16), orders, fp32.identical ? "yes" : "NO",
      bf16.identical ? "yes" : "NO");
  return fp32.ran && bf16.ran ? 0 : 1;
}

struct Row {
  const char* label;
  DType dtype;
  Accumulation mode;
  const char* numpy_dtype;  // nullptr: no baseline for this row
};

// The figures the targets line judges: (c) traffic / stream bandwidth and (d) the speed-up over numpy, per dtype.
struct Targets {
  double fp32_ratio = 0, fp32_speedup = 0, bf16_ratio = 0, bf16_speedup = 0;
};

// Rounds per row: the first allocates the mean's buffers; the others are the coordinator's steady state.
constexpr int kRounds = 7;

// The median over the rounds after the first.
template <typename Of>
double SteadyMedian(const std::vector<RoundTiming>& rounds, Of of) {
  std::vector<double> values;
  for (size_t r = 1; r < rounds.size(); ++r) values.push_back(of(rounds[r]));
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Bytes one steady round moves between the cores and memory, by phase:
// - accumulation reads each update once (its magnitude is known: no pass to validate it) and reads + writes the
//   sums, except that the first update only writes them;
// - Finish reads the sums and writes the result (in place for fp32 sums of F32 tensors);
// - a store to a cache line the loop did not read first (the first update's sums, a result in a buffer of its own)
//   reads the line before writing it (read for ownership): two transfers, where the stream loop's a[i] += ... has
//   none of these;
// - the kernel zero-fills fresh pages. A round allocates nothing when the mean keeps its sums (up to
//   max_whole_sums_bytes) and reuses the buffer of the global before last; sums larger than that are freed at Reset,
//   so such a round allocates the sums and the result anew.
double SteadyRoundTraffic(const Row& row) {
  const double U = static_cast<double>(kUpdateBytes);
  const double elements = static_cast<double>(kUpdateBytes / DTypeSize(row.dtype));
  const double acc = elements * AccumulatorBytesPerElement(row.mode);
  const bool in_place = row.mode == Accumulation::kFloat32 && row.dtype == DType::kF32;
  const bool sums_freed = acc > static_cast<double>(parsyn::weights::WeightedMeanOptions{}.max_whole_sums_bytes);
  const double zero_fill = sums_freed ? acc + (in_place ? 0 : U) : 0;
  const double accumulate = kK * U + 2.0 * acc + (kK - 1) * 2.0 * acc;
  const double finish = in_place ? 2.0 * acc : acc + 2.0 * U;
  return zero_fill + accumulate + finish;
}

// One row of the table: kRounds aggregations of kK updates of the row's dtype and accumulation, the coordinator's
// way, each with the stream bandwidth measured beside it (TimeRounds), and, for the rows that have one, the numpy
// baseline, compared with the steady round: what each system takes per round of a running job (numpy allocates its
// arrays on each call; the mean allocates in its first round only). The first round is printed beside it.
void PrintRow(const Row& row, StreamLoop& stream_loop, Targets& targets) {
  Update update(row.dtype);
  update.Fill(0);
  const std::vector<RoundTiming> rounds = TimeRounds(update, row.mode, kK, kRounds, stream_loop);
  const double traffic = SteadyRoundTraffic(row);
  const double bytes_in = kK * static_cast<double>(kUpdateBytes);
  // (c) is the median of the rounds' own ratios; (a) and (b) the medians of their figures.
  const double ratio = SteadyMedian(rounds, [traffic](const RoundTiming& r) { return traffic / r.seconds / r.stream; });
  const double seconds = SteadyMedian(rounds, [](const RoundTiming& r) { return r.seconds; });
  const double stream = SteadyMedian(rounds, [](const RoundTiming& r) { return r.stream; });
  std::printf("%-24s %10.2f %10.2f %10.2f %9.2f %10.2f", row.label, bytes_in / seconds / kGB, traffic / seconds / kGB,
              stream / kGB, ratio, bytes_in / rounds.front().seconds / kGB);
  if (row.numpy_dtype) {
    const double elements = static_cast<double>(kUpdateBytes / DTypeSize(row.dtype));
    const double numpy = NumpySeconds(row.numpy_dtype, static_cast<size_t>(elements) / kTensors);
    if (numpy > 0) {
      const double speedup = numpy / seconds;
      std::printf(" %10.2f %8.1fx\n", bytes_in / numpy / kGB, speedup);
      (row.dtype == DType::kF32 ? targets.fp32_speedup : targets.bf16_speedup) = speedup;
    } else {
      std::printf(" %10s %9s\n", "failed", "-");
    }
    (row.dtype == DType::kF32 ? targets.fp32_ratio : targets.bf16_ratio) = ratio;
  } else {
    std::printf(" %10s %9s\n", "-", "-");
  }
}

// (e): peak RSS for K = 2, 8, 32 updates, each in a child process. The smallest and the largest.
std::pair<double, double> PrintPeakRss(const char* self) {
  std::printf("\n(e) peak RSS, fp32 updates of %zu MiB passed one at a time through one buffer (child processes):\n",
              kUpdateBytes >> 20);
  double rss_min = 1e30, rss_max = 0;
  for (int K : {2, 8, 32}) {
    const double mib = PeakRssMiB(self, K);
    std::printf("  K=%-3d %8.0f MiB\n", K, mib);
    rss_min = std::min(rss_min, mib);
    rss_max = std::max(rss_max, mib);
  }
  std::printf("  (expected: accumulator %zu MiB, which becomes the result, + one update %zu MiB, whatever K)\n\n",
              kUpdateBytes >> 20, kUpdateBytes >> 20);
  return {rss_min, rss_max};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--rss") == 0) return RssChild(std::atoi(argv[2]));
  if (argc == 4 && std::strcmp(argv[1], "--full-weight") == 0) return FullWeightChild(argv[2], std::atoi(argv[3]));
  if (argc == 3 && std::strcmp(argv[1], "--lora") == 0) return parsyn::bench::LoraRanksChild(argv[2]);

  bool all_rows = false, full_weight_only = false, rows_only = false, lora_only = false;
  int orders = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--all") == 0) all_rows = true;
    if (std::strcmp(argv[i], "--full-weight-only") == 0) full_weight_only = true;
    if (std::strcmp(argv[i], "--rows-only") == 0) rows_only = true;
    if (std::strcmp(argv[i], "--lora-only") == 0) lora_only = true;
    if (std::strcmp(argv[i], "--orders") == 0 && i + 1 < argc) orders = std::max(1, std::atoi(argv[++i]));
  }
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 1;
  if (lora_only) {
    parsyn::bench::LoraRanksSection(self);
    return 0;
  }
  if (full_weight_only) return FullWeightSection(self, orders);
  const int threads = NumThreads();
  std::printf("bench_aggregate: K=%d updates of %zu MiB (%d tensors each), %d threads\n", kK, kUpdateBytes >> 20,
              kTensors, threads);
  std::printf(
      "%d rounds per row, the coordinator's way (one mean, Reset between rounds, each global held through the next\n"
      "round); (a) and (c) are the median round after the first, which allocates\n"
      "(b) is a plain a[i] += s*b[i] over 2 x %zu MiB on the same threads, measured beside each row\n\n",
      kRounds, kUpdateBytes >> 20);
  StreamLoop stream_loop;

  const Row rows[] = {
      {"fp32 updates, fp32 sum", DType::kF32, Accumulation::kFloat32, "f32"},
      {"bf16 updates, fp32 sum", DType::kBF16, Accumulation::kFloat32, "bf16"},
      {"fp32 updates, fp64 sum", DType::kF32, Accumulation::kFloat64, nullptr},
      {"fp32 updates, exact sum", DType::kF32, Accumulation::kExact, nullptr},
  };
  std::printf("%-24s %10s %10s %10s %9s %10s %10s %9s\n", "", "(a) GB/s", "traffic", "(b) stream", "(c) ratio",
              "1st round", "(d) numpy", "speed-up");
  std::printf("%-24s %10s %10s %10s %9s %10s %10s %9s\n", "", "consumed", "GB/s", "GB/s", "to (b)", "GB/s", "GB/s", "");
  Targets targets;
  for (const Row& row : rows) {
    if (!row.numpy_dtype && !all_rows) continue;
    PrintRow(row, stream_loop, targets);
    std::fflush(stdout);
  }
  if (rows_only) {
    std::printf("targets: (c) fp32 >= 0.8: %.2f %s, bf16 >= 0.7: %.2f %s\n", targets.fp32_ratio,
                targets.fp32_ratio >= 0.8 ? "ok" : "MISSED", targets.bf16_ratio,
                targets.bf16_ratio >= 0.7 ? "ok" : "MISSED");
    return 0;
  }
  const auto [rss_min, rss_max] = PrintPeakRss(self);

  std::printf(
      "targets: (c) fp32 >= 0.8: %.2f %s, bf16 >= 0.7: %.2f %s | (d) >= 5x: fp32 %.1fx %s, bf16 %.1fx %s | "
      "(e) flat: %.0f..%.0f MiB %s\n",
      targets.fp32_ratio, targets.fp32_ratio >= 0.8 ? "ok" : "MISSED", targets.bf16_ratio,
      targets.bf16_ratio >= 0.7 ? "ok" : "MISSED", targets.fp32_speedup, targets.fp32_speedup >= 5 ? "ok" : "MISSED",
      targets.bf16_speedup, targets.bf16_speedup >= 5 ? "ok" : "MISSED", rss_min, rss_max,
      rss_max <= rss_min * 1.05 ? "ok" : "MISSED");
  std::printf("\n");
  const int full_weight = FullWeightSection(self, orders);
  parsyn::bench::LoraRanksSection(self);
  return full_weight;
}
