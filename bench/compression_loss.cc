// The loss table of bench_compression: what each codec costs in accuracy, measured on real training.
//
// Per task, one small FedAvg run per codec, in this process, all from the same initial global with the same seeds,
// steps and rounds: each round every worker trains the round's global with the real trainer (RunTrainTask, the task
// file parsyn-trainer runs for a worker: the job's config, a per-round seed, one learning-rate schedule across
// rounds), its update goes through the codec as a worker and the coordinator would handle it (worker: EncodeUpdateInto
// with the delta against the global and the error-feedback residual it keeps between rounds, SerializeSafetensors,
// ZstdCompressReader; coordinator: ZstdDecompressReader bounded by MaxEncodedUpdateBytes, DecodeUpdate against the
// global, strictly checked) and the decoded updates are averaged with WeightedMean (fp32 sums, weights = examples
// seen). The final global is evaluated on the validation slice (steps 0), the one every worker's task holds out
// (same data, same split_seed). Wire bytes are the upload's bytes (what goes in the HTTP body); the fp32 reference is
// the plain safetensors image of the same update, which is what codec "none" sends.
#include "compression_loss.h"

#include <unistd.h>

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

struct Variant {
  const char* label;
  UpdateCodec codec;
  bool delta;
  bool zstd;
  bool error_feedback;
  // The targets (0: none for this row).
  double max_ratio;
  double max_loss_change;
  // Added to every training seed: the reference row, uncompressed with other seeds, shows how far the final loss
  // moves when only the batches' order changes (the scale against which the codecs' changes are read).
  uint64_t seed_offset = 0;
};

const Variant kVariants[] = {
    {"none (fp32)", UpdateCodec::kNone, false, false, false, 0, 0},
    {"bf16", UpdateCodec::kBf16, false, false, false, 0, 0},
    {"int8", UpdateCodec::kInt8, false, false, false, 0, 0},
    {"int8+delta+zstd", UpdateCodec::kInt8, true, true, false, 0.25, 0.01},
    {"int4+delta+EF", UpdateCodec::kInt4, true, false, true, 0.15, 0.02},
    {"int4+delta+EF+zstd", UpdateCodec::kInt4, true, true, true, 0.15, 0.02},
    {"none, other seeds", UpdateCodec::kNone, false, false, false, 0, 0, 500},
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
};

struct Outcome {
  std::vector<uint64_t> round_bytes;  // all workers' uploads, per round
  uint64_t fp32_bytes = 0;            // all workers' uploads in plain fp32, all rounds
  uint64_t wire_bytes = 0;
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

// Encodes `update` as worker `state` would send it, returns the upload's bytes; `decoded` gets what the coordinator
// reconstructs from them.
uint64_t SendThroughCodec(const Variant& v, const WeightSet& update, const WeightSet& global, WorkerCodec& state,
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

Outcome RunFedAvg(const Setup& s, const Variant& v, const fs::path& initial_global) {
  const double start = CpuSeconds();
  Outcome out;
  const fs::path dir = s.work / "run";
  fs::create_directories(dir);
  fs::path global_file = initial_global;
  WeightSet global = Must(weights::ReadSafetensorsFile(global_file), "initial global");
  std::vector<WorkerCodec> codecs(static_cast<size_t>(s.workers));
  for (int r = 0; r < s.rounds; ++r) {
    weights::WeightedMean mean(global);
    uint64_t round_bytes = 0;
    for (int k = 0; k < s.workers; ++k) {
      const fs::path update_file = dir / ("update-" + std::to_string(k) + ".safetensors");
      const json result =
          RunTask(s, global_file, s.steps, 1000 * (r + 1) + k + v.seed_offset, r * s.steps, update_file);
      const WeightSet update = Must(weights::ReadSafetensorsFile(update_file), "update");
      out.fp32_bytes += weights::SerializeSafetensors(update).size();
      WeightSet decoded;
      round_bytes += SendThroughCodec(v, update, global, codecs[k], decoded);
      Must(mean.Accept(decoded, result.value("examples_seen", 1.0)), "accept");
    }
    out.round_bytes.push_back(round_bytes);
    out.wire_bytes += round_bytes;
    global = Must(std::move(mean).Finish(), "finish");
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
  std::printf("%-19s %-26s %8s %10s %8s  %-24s\n", "codec", "KiB uploaded per round", "x fp32", "final loss", "vs none",
              "target");
  double none_loss = 0;
  for (const Variant& v : kVariants) {
    const Outcome o = RunFedAvg(s, v, initial);
    if (v.codec == UpdateCodec::kNone && v.seed_offset == 0) none_loss = o.final_loss;
    std::string rounds;
    for (uint64_t b : o.round_bytes) rounds += (rounds.empty() ? "" : " ") + Kib(b);
    const double ratio = static_cast<double>(o.wire_bytes) / static_cast<double>(o.fp32_bytes);
    const double change = (o.final_loss - none_loss) / none_loss;
    std::string verdict = "-";
    if (v.max_ratio > 0) {
      const bool pass = ratio <= v.max_ratio && std::fabs(change) <= v.max_loss_change;
      char text[64];
      std::snprintf(text, sizeof text, "%s (<=%.2fx, +-%.0f%%)", pass ? "PASS" : "MISS", v.max_ratio,
                    100 * v.max_loss_change);
      verdict = text;
    }
    std::printf("%-19s %-26s %8.4f %10.4f %+7.2f%%  %-24s (%.0f cpu-s)\n", v.label, rounds.c_str(), ratio, o.final_loss,
                100 * change, verdict.c_str(), o.cpu_seconds);
    std::fflush(stdout);
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
      "\nLoss table: one in-process FedAvg run per codec (real trainer, same initial global, seeds, steps and "
      "rounds);\nbytes = the workers' uploads as sent (x fp32: over the plain fp32 safetensors of the same "
      "updates);\nloss = validation loss of the final global; vs none = its change relative to codec none.\n");

  DemoLoraTable(work, options);
  FullFineTuneTable(work, options);
  std::error_code ec;
  fs::remove_all(work, ec);
  return 0;
}

}  // namespace parsyn::bench
