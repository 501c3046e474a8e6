// The loss table of bench_compression: what each codec costs in accuracy, measured on real training.
//
// Per task, small FedAvg runs per codec, in this process, all from the same initial global with the same steps and
// rounds, three training seeds per row (one for the rows without a target, and with --quick): each round every
// worker trains the round's global with the real trainer (RunTrainTask, the task file parsyn-trainer runs for a
// worker: the job's config, a per-round seed, one learning-rate schedule across rounds), its update goes through the
// codec as a worker and the coordinator would handle it (worker: EncodeUpdateInto with the delta against the global
// and the error-feedback residual it keeps between rounds, SerializeSafetensors, ZstdCompressReader; coordinator:
// ZstdDecompressReader bounded by MaxEncodedUpdateBytes, DecodeUpdate against the global, strictly checked) and the
// decoded updates are averaged with WeightedMean (fp32 sums, weights = examples seen). With a downlink codec
// (distributed.compression.global) the new global goes the same way down, as a delta from the global before with
// the coordinator's error feedback, and what it decodes to is the next round's global, as in a job. The final global
// is evaluated on the validation slice (steps 0), the one every worker's task holds out (same data, same
// split_seed). Bytes are what goes over the wire each way (the first round's global whole, zstd'd with the row's
// zstd); the fp32 reference is the plain safetensors image of the same globals and updates, which codec "none"
// sends.
#include "compression_loss.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "trainer/model_init.h"
#include "trainer/task.h"
#include "weights/safetensors.h"
#include "weights/update_codec.h"
#include "weights/weight_set.h"
#include "weights/weighted_mean.h"
#include "weights/zstd_stream.h"

namespace parsyn::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using weights::UpdateCodec;
using weights::WeightSet;

constexpr int kZstdLevel = 3;

// How one direction travels: the codec, as a delta from the global, zstd, error feedback.
struct Wire {
  UpdateCodec codec = UpdateCodec::kNone;
  bool delta = false;
  bool zstd = false;
  bool error_feedback = false;
};

struct Variant {
  const char* label;
  Wire up;  // the workers' updates
  // The globals the workers download (distributed.compression.global): kNone: whole (zstd'd with up.zstd); else a
  // delta from the global before, with the coordinator's error feedback, zstd'd with up.zstd. The first round's global
  // always travels whole.
  UpdateCodec down = UpdateCodec::kNone;
  // The targets (0: none for this row): the uploads' bytes over plain fp32 uploads; the bytes per round after the
  // first (down + up) over plain fp32 both ways. With either, the mean final loss within the plain row's seed spread.
  double max_up_ratio = 0;
  double max_total_ratio = 0;
  int seeds = 3;  // runs with different training seeds; the mean and spread of their final losses are printed
};

const Variant kVariants[] = {
    {"none (fp32)", {}},
    {"bf16", {UpdateCodec::kBf16}, UpdateCodec::kNone, 0, 0, 1},
    {"int8", {UpdateCodec::kInt8}, UpdateCodec::kNone, 0, 0, 1},
    {"int8+delta+zstd", {UpdateCodec::kInt8, true, true}, UpdateCodec::kNone, 0.25},
    {"int4+delta+EF", {UpdateCodec::kInt4, true, false, true}, UpdateCodec::kNone, 0.15},
    {"int4+delta+EF+zstd", {UpdateCodec::kInt4, true, true, true}, UpdateCodec::kNone, 0.15},
    {"down bf16 only", {}, UpdateCodec::kBf16, 0, 0, 1},
    {"both int8, zstd", {UpdateCodec::kInt8, true, true}, UpdateCodec::kInt8, 0, 0.30},
    {"both int4+EF, zstd", {UpdateCodec::kInt4, true, true, true}, UpdateCodec::kInt4, 0, 0.18},
};

struct Setup {
  std::string title;
  fs::path work;
  fs::path model_dir;
  fs::path data;
  json config;  // the job's config
  int workers = 2;
  int rounds = 3;
  int64_t steps = 10;  // per worker per round
  int threads = 1;
  bool quick = false;  // one seed per row
};

struct Outcome {
  std::vector<uint64_t> round_bytes;  // all workers' downloads and uploads, per round
  std::vector<uint64_t> fp32_bytes;   // the same in plain fp32 safetensors both ways, per round
  uint64_t up_bytes = 0;              // all workers' uploads, all rounds
  uint64_t up_fp32_bytes = 0;         // the same in plain fp32
  double final_loss = 0;
  double cpu_seconds = 0;
};

double CpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

[[noreturn]] void Die(const std::string& what, const Status& status) {
  std::fprintf(stderr, "bench_compression: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(StatusOr<T> result, const std::string& what) {
  if (!result.ok()) Die(what, result.status());
  return std::move(*result);
}

void Must(const Status& status, const std::string& what) {
  if (!status.ok()) Die(what, status);
}

// Runs one trainer task (the worker's task file format, protocol/trainer_task.h); returns its result JSON.
json RunTask(const Setup& s, const fs::path& initial, int64_t steps, uint64_t seed, int64_t schedule_start,
             const fs::path& output) {
  json task = {{"model_dir", s.model_dir.string()},
               {"data", s.data.string()},
               {"config", s.config},
               {"steps", steps},
               {"seed", seed},
               {"split_seed", 7},
               {"threads", s.threads},
               {"output", {{"weights", output.string()}, {"result", output.string() + ".json"}}}};
  if (!initial.empty()) task["initial_weights"] = initial.string();
  if (steps > 0) task["schedule"] = {{"start_step", schedule_start}, {"total_steps", s.rounds * s.steps}};
  trainer::TrainTask parsed = Must(trainer::ParseTrainTask(task, s.work), "trainer task");
  return Must(trainer::RunTrainTask(parsed, nullptr, std::stop_token()), "trainer task");
}

std::vector<std::byte> Drain(weights::ReadBytes read) {
  std::vector<std::byte> out;
  std::byte buffer[1 << 16];
  for (;;) {
    const size_t n = Must(read(buffer), "read");
    if (n == 0) return out;
    out.insert(out.end(), buffer, buffer + n);
  }
}

// One worker's side of the codec: what it keeps between rounds.
struct WorkerCodec {
  weights::EncodedUpdate encoded;  // its residual is the error-feedback state
  bool has_residual = false;
};

// Encodes `update` as a sender with `state` would send it, returns the bytes on the wire; `decoded` gets what the
// receiver reconstructs from them. Uploads: a worker sends its update against the round's global. Downloads: the
// coordinator sends the new global against the one before (its residual in `state`), and the global the workers
// get is `decoded`.
uint64_t SendThroughCodec(const Wire& v, const WeightSet& update, const WeightSet& global, WorkerCodec& state,
                          WeightSet& decoded) {
  std::vector<std::byte> image;
  if (v.codec == UpdateCodec::kNone) {
    image = weights::SerializeSafetensors(update);
  } else {
    weights::EncodeOptions options{.codec = v.codec};
    if (v.delta) options.delta_from = &global;
    if (v.error_feedback && state.has_residual) options.carried_residual = &state.encoded.residual;
    options.want_residual = v.error_feedback;
    Must(weights::EncodeUpdateInto(update, options, state.encoded), "encode");
    state.has_residual = v.error_feedback;
    image = weights::SerializeSafetensors(state.encoded.compressed);
  }
  std::vector<std::byte> wire = image;
  if (v.zstd) {
    auto compressor =
        Must(weights::ZstdCompressReader::Create(weights::ReadFromSpan(image), kZstdLevel, image.size()), "zstd");
    wire = Drain(weights::ReadFrom(*compressor));
  }
  // The coordinator's side: bounded decompression, then the strict decoder.
  const uint64_t limit = Must(weights::MaxEncodedUpdateBytes(global, v.codec), "limit");
  weights::ReadBytes body = weights::ReadFromSpan(wire);
  std::unique_ptr<weights::ZstdDecompressReader> decompressor;
  if (v.zstd) {
    decompressor = std::make_unique<weights::ZstdDecompressReader>(body, limit);
    body = weights::ReadFrom(*decompressor);
  }
  if (v.codec == UpdateCodec::kNone) {
    const std::vector<std::byte> bytes = Drain(body);
    decoded = Must(weights::ParseSafetensors(bytes), "plain update");
  } else {
    decoded = Must(weights::DecodeUpdate(body, global, {.codec = v.codec, .delta = v.delta}), "decode");
  }
  return wire.size();
}

// The bytes of a whole global on the way down: its plain image, zstd'd when `zstd`.
uint64_t WholeGlobalBytes(const WeightSet& global, bool zstd) {
  const std::vector<std::byte> image = weights::SerializeSafetensors(global);
  if (!zstd) return image.size();
  auto compressor =
      Must(weights::ZstdCompressReader::Create(weights::ReadFromSpan(image), kZstdLevel, image.size()), "zstd");
  return Drain(weights::ReadFrom(*compressor)).size();
}

Outcome RunFedAvg(const Setup& s, const Variant& v, const fs::path& initial_global, uint64_t seed_offset) {
  const double start = CpuSeconds();
  Outcome out;
  const fs::path dir = s.work / "run";
  fs::create_directories(dir);
  fs::path global_file = initial_global;
  WeightSet global = Must(weights::ReadSafetensorsFile(global_file), "initial global");
  std::vector<WorkerCodec> codecs(static_cast<size_t>(s.workers));
  WorkerCodec downlink;  // the coordinator's residual
  const Wire down{.codec = v.down, .delta = true, .zstd = v.up.zstd, .error_feedback = true};
  uint64_t download = WholeGlobalBytes(global, v.up.zstd);  // per worker: the first round's global travels whole
  for (int r = 0; r < s.rounds; ++r) {
    weights::WeightedMean mean(global);
    const uint64_t plain_global = weights::SerializeSafetensors(global).size();
    uint64_t round_bytes = download * s.workers, fp32_bytes = plain_global * s.workers;
    for (int k = 0; k < s.workers; ++k) {
      const fs::path update_file = dir / ("update-" + std::to_string(k) + ".safetensors");
      const json result = RunTask(s, global_file, s.steps, 1000 * (r + 1) + k + seed_offset, r * s.steps, update_file);
      const WeightSet update = Must(weights::ReadSafetensorsFile(update_file), "update");
      const uint64_t plain_update = weights::SerializeSafetensors(update).size();
      fp32_bytes += plain_update;
      out.up_fp32_bytes += plain_update;
      WeightSet decoded;
      const uint64_t sent = SendThroughCodec(v.up, update, global, codecs[k], decoded);
      round_bytes += sent;
      out.up_bytes += sent;
      Must(mean.Accept(decoded, result.value("examples_seen", 1.0)), "accept");
    }
    out.round_bytes.push_back(round_bytes);
    out.fp32_bytes.push_back(fp32_bytes);
    WeightSet next = Must(std::move(mean).Finish(), "finish");
    if (v.down == UpdateCodec::kNone) {
      global = std::move(next);
      download = WholeGlobalBytes(global, v.up.zstd);
    } else {
      WeightSet reconstructed;
      download = SendThroughCodec(down, next, global, downlink, reconstructed);
      global = std::move(reconstructed);  // what every worker rebuilds: the round's global
    }
    global_file = dir / ("global-" + std::to_string(r + 1) + ".safetensors");
    Must(weights::WriteSafetensorsFile(global, global_file), "write global");
  }
  const json eval = RunTask(s, global_file, 0, 1, 0, dir / "eval.safetensors");
  out.final_loss = eval.at("validation_before").at("loss").get<double>();
  out.cpu_seconds = CpuSeconds() - start;
  fs::remove_all(dir);
  return out;
}

std::string Kib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f", bytes / 1024.0);
  return text;
}

// One row: the runs' bytes (the first run's; every seed sends the same sizes up to zstd's) and their final losses'
// mean and spread (max - min), against the plain row's runs with the same seeds; the plain row comes first and sets
// none_losses (one per seed).
void PrintRow(const Variant& v, const std::vector<Outcome>& runs, std::vector<double>& none_losses) {
  const Outcome& o = runs.front();
  double sum = 0, low = 1e30, high = -1e30, cpu = 0;
  for (const Outcome& r : runs) {
    sum += r.final_loss;
    low = std::min(low, r.final_loss);
    high = std::max(high, r.final_loss);
    cpu += r.cpu_seconds;
  }
  const double mean = sum / static_cast<double>(runs.size()), spread = high - low;
  if (v.up.codec == UpdateCodec::kNone && v.down == UpdateCodec::kNone) {
    none_losses.clear();
    for (const Outcome& r : runs) none_losses.push_back(r.final_loss);
  }
  // The plain row over the same seeds: its mean, and its spread over all of its seeds.
  double none_sum = 0;
  for (size_t i = 0; i < runs.size() && i < none_losses.size(); ++i) none_sum += none_losses[i];
  const double none_mean = none_sum / static_cast<double>(std::min(runs.size(), none_losses.size()));
  const auto [none_low, none_high] = std::minmax_element(none_losses.begin(), none_losses.end());
  const double none_spread = *none_high - *none_low;
  std::string rounds;
  uint64_t total = 0, fp32 = 0, later = 0, later_fp32 = 0;
  for (size_t r = 0; r < o.round_bytes.size(); ++r) {
    rounds += (rounds.empty() ? "" : " ") + Kib(o.round_bytes[r]);
    total += o.round_bytes[r];
    fp32 += o.fp32_bytes[r];
    if (r > 0) {
      later += o.round_bytes[r];
      later_fp32 += o.fp32_bytes[r];
    }
  }
  auto ratio = [](uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); };
  const double up_ratio = ratio(o.up_bytes, o.up_fp32_bytes), later_ratio = ratio(later, later_fp32);
  std::string verdict = "-";
  if ((v.max_up_ratio > 0 || v.max_total_ratio > 0) && runs.size() < 2) {
    verdict = "not judged: one seed has no spread";
  } else if (v.max_up_ratio > 0 || v.max_total_ratio > 0) {
    const bool bytes_ok = v.max_up_ratio > 0 ? up_ratio <= v.max_up_ratio : later_ratio <= v.max_total_ratio;
    const bool pass = bytes_ok && std::fabs(mean - none_mean) <= none_spread;
    char text[96];
    std::snprintf(text, sizeof text, "%s (%s <= %.2fx, loss within none's spread)", pass ? "PASS" : "MISS",
                  v.max_up_ratio > 0 ? "up" : "2nd..", v.max_up_ratio > 0 ? v.max_up_ratio : v.max_total_ratio);
    verdict = text;
  }
  char loss[48];
  std::snprintf(loss, sizeof loss, "%.4f (%.4f, %zux)", mean, spread, runs.size());
  std::printf("%-19s %-26s %6.3f %6.3f %6.3f %19s %+7.2f%%  %s (%.0f cpu-s)\n", v.label, rounds.c_str(), up_ratio,
              ratio(total, fp32), later_ratio, loss, 100 * (mean - none_mean) / none_mean, verdict.c_str(), cpu);
  std::fflush(stdout);
}

void PrintTable(const Setup& s) {
  const fs::path initial = s.work / "global-0.safetensors";
  const json first = RunTask(s, "", 0, 1, 0, initial);
  const double initial_loss = first.at("validation_before").at("loss").get<double>();
  const WeightSet layout = Must(weights::ReadSafetensorsFile(initial), "initial global");
  int64_t params = 0;
  for (const auto& t : layout.tensors()) params += t.numel();
  std::printf("\n%s\n", s.title.c_str());
  std::printf(
      "%lld trainable parameters (%zu tensors), %d workers x %d rounds x %lld steps, %lld validation rows; "
      "initial validation loss %.4f\n",
      static_cast<long long>(params), layout.size(), s.workers, s.rounds, static_cast<long long>(s.steps),
      first.at("validation_before").at("num_examples").get<long long>(), initial_loss);
  std::printf("%-19s %-26s %6s %6s %6s %19s %8s  %s\n", "codec (up; down)", "KiB down+up per round", "up", "total",
              "2nd..", "final loss (spread)", "vs none", "target");
  std::vector<double> none_losses;
  for (const Variant& v : kVariants) {
    std::vector<Outcome> runs;
    for (int seed = 0; seed < (s.quick ? 1 : v.seeds); ++seed) runs.push_back(RunFedAvg(s, v, initial, 500 * seed));
    PrintRow(v, runs, none_losses);
  }
}

void WriteLines(const fs::path& file, const std::vector<std::string>& lines) {
  std::ofstream out(file);
  for (const std::string& line : lines) out << line << "\n";
}

// (a) The demo's task (src/cli/demo_command.cc): its model, data and LoRA config.
void DemoLoraTable(const fs::path& work, const LossTableOptions& options) {
  Setup s;
  s.title = "(a) demo LoRA task: Llama hidden 64, 2 layers, LoRA r 8 on all projections, bf16 autocast";
  s.work = work / "lora";
  s.model_dir = s.work / "model";
  Must(trainer::InitModelFolder(s.model_dir, {.hidden_size = 64,
                                              .num_hidden_layers = 2,
                                              .num_attention_heads = 4,
                                              .max_position_embeddings = 128,
                                              .seed = 5}),
       "model init");
  const std::pair<const char*, const char*> facts[] = {{"banana", "yellow"}, {"grass", "green"}, {"sky", "blue"},
                                                       {"snow", "white"},    {"coal", "black"},  {"tomato", "red"},
                                                       {"carrot", "orange"}, {"plum", "purple"}};
  std::mt19937 rng(11);
  std::vector<std::string> lines;
  for (int i = 0; i < 480; ++i) {
    const auto& [thing, color] = facts[rng() % std::size(facts)];
    lines.push_back(
        json{{"prompt", std::string("what color is ") + thing + "?"}, {"completion", std::string(" ") + color}}.dump());
  }
  s.data = s.work / "instructions.jsonl";
  WriteLines(s.data, lines);
  s.config = {{"batch_size", 16},
              {"learning_rate", 1e-2},
              {"mixed_precision", "bf16"},
              {"use_peft", true},
              {"lora_r", 8},
              {"lora_alpha", 16},
              {"lora_dropout", 0.0},
              {"max_seq_len", 32},
              {"lora_target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}},
              {"lr_scheduler", "constant"},
              {"validation_fraction", 0.1}};
  s.workers = 3;
  s.rounds = options.quick ? 2 : 4;
  s.steps = options.quick ? 2 : 10;
  s.quick = options.quick;
  PrintTable(s);
}

// (b) Full fine-tune of a small Llama (every weight trains and travels).
void FullFineTuneTable(const fs::path& work, const LossTableOptions& options) {
  Setup s;
  s.work = work / "full";
  s.model_dir = s.work / "model";
  trainer::ModelInitOptions init{
      .hidden_size = 384, .num_hidden_layers = 12, .num_attention_heads = 6, .max_position_embeddings = 64, .seed = 3};
  if (options.quick) init = {.hidden_size = 64, .num_hidden_layers = 2, .num_attention_heads = 4, .seed = 3};
  Must(trainer::InitModelFolder(s.model_dir, init), "model init");
  std::mt19937 rng(1);
  std::vector<std::string> lines;
  for (int i = 0; i < 400; ++i) {
    const int a = static_cast<int>(rng() % 10), b = static_cast<int>(rng() % 10);
    lines.push_back(json{{"prompt", "add " + std::to_string(a) + " and " + std::to_string(b) + ":"},
                         {"completion", " " + std::to_string(a + b)}}
                        .dump());
  }
  s.data = s.work / "arithmetic.jsonl";
  WriteLines(s.data, lines);
  s.config = {{"batch_size", 8},   {"learning_rate", 1e-3},      {"mixed_precision", "no"},   {"use_peft", false},
              {"max_seq_len", 32}, {"lr_scheduler", "constant"}, {"validation_fraction", 0.1}};
  s.workers = 2;
  s.rounds = options.quick ? 2 : 3;
  s.steps = options.quick ? 2 : 6;
  s.quick = options.quick;
  s.title = "(b) full fine-tune: Llama hidden " + std::to_string(init.hidden_size) + ", " +
            std::to_string(init.num_hidden_layers) + " layers, byte-level vocabulary, fp32, arithmetic prompts";
  PrintTable(s);
}

}  // namespace

int PrintLossTables(const LossTableOptions& options) {
  char pattern[] = "/tmp/bench-compression-XXXXXX";
  if (!mkdtemp(pattern)) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path work = pattern;
  std::printf(
      "\nLoss table: in-process FedAvg runs per codec (real trainer, same initial global, steps and rounds; 3 "
      "training seeds where a row has a target);\nKiB = what the workers downloaded and uploaded per round, as sent; "
      "up, total, 2nd.. = over plain fp32 both ways: the uploads, every round, the rounds after the first\n(whose "
      "global travels whole); loss = validation loss of the final global, mean over the seeds (max - min); vs none = "
      "the mean's change from codec none's over the same seeds.\n");

  DemoLoraTable(work, options);
  FullFineTuneTable(work, options);
  std::error_code ec;
  fs::remove_all(work, ec);
  return 0;
}

}  // namespace parsyn::bench
