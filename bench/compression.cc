// bench_compression: the update codecs (docs/compression.md) against this machine's streaming-copy bandwidth,
// measured in the same run, and the bytes each puts on the wire relative to fp32.
//
// Usage: bench_compression [MiB] [--no-loss | --loss-only] [--quick]
//   MiB: the fp32 size of the throughput rows' update (default 128); --no-loss / --loss-only: skip the loss table /
//   the throughput rows; --quick: the loss table on tiny models and few steps (checks the harness only).
// Throughput is GB/s of fp32 update consumed (encode) or produced (decode), on one thread, like the copy it is
// compared with: a memcpy of the same fp32 buffer into a second, already faulted-in one (best of a few passes).
// Times are this process's CPU time (user + system, page faults included), not wall time: on a shared machine the
// wall clock measures the neighbours. A second baseline, "clone", copies into freshly allocated tensors
// (WeightSet::Clone), which is what any decode that materialises an update pays at least. Encode is EncodeUpdateInto
// reusing the previous call's buffers (the residual carried in place), "fresh" EncodeUpdate, which allocates them;
// decode is DecodeUpdateInto streaming the serialised image into
// a reused WeightSet in the global's layout, "fresh" is DecodeUpdate, which allocates it (page faults included).
// zstd rows compress or decompress the serialised image given in their label, streamed in chunks (decode: a
// ZstdDecompressReader into a reused buffer; fresh: ZstdDecompress into a growing vector).
//
// Two update sets: "weights" (random-ish values ~ N(0, 0.02) with per-row scales, sent as full weights) and
// "delta" (global + N(0, 1e-3) noise, sent as a delta against the global: small values, as after one round of
// fine-tuning). Then, where the trainer is built, the loss table (compression_loss.cc): per-round wire bytes and final
// validation loss per codec for the demo's LoRA task and a full fine-tune of a small Llama.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compression_loss.h"
#include "weights/safetensors.h"
#include "weights/update_codec.h"
#include "weights/weight_set.h"
#include "weights/zstd_stream.h"

namespace {

using parsyn::weights::DecodeUpdate;
using parsyn::weights::DType;
using parsyn::weights::EncodeOptions;
using parsyn::weights::EncodeUpdate;
using parsyn::weights::QuantScheme;
using parsyn::weights::ReadFromSpan;
using parsyn::weights::SerializeSafetensors;
using parsyn::weights::UpdateCodec;
using parsyn::weights::WeightSet;

constexpr double kGB = 1e9;

double Now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

template <typename T>
T Check(parsyn::StatusOr<T> result, const char* what) {
  if (!result.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, result.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*result);
}

// Best seconds of `reps` runs of `fn`.
double Best(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double start = Now();
    fn();
    best = std::min(best, Now() - start);
  }
  return best;
}

// Tensors of [rows, 4096] plus a few 1-D ones, `bytes` of fp32 in all; values ~ N(0, sigma) scaled per row.
WeightSet MakeSet(size_t bytes, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::uniform_real_distribution<float> row_scale(0.5f, 2.0f);
  WeightSet set;
  constexpr int64_t kCols = 4096;
  constexpr int64_t kRows = 1024;
  const size_t tensors = std::max<size_t>(1, bytes / (kRows * kCols * 4));
  for (size_t t = 0; t < tensors; ++t) {
    auto data = Check(set.AddZeros("layers." + std::to_string(t) + ".weight", DType::kF32, {kRows, kCols}), "add");
    float* w = reinterpret_cast<float*>(data.data());
    for (int64_t r = 0; r < kRows; ++r) {
      const float s = row_scale(rng);
      for (int64_t c = 0; c < kCols; ++c) w[r * kCols + c] = s * normal(rng);
    }
    auto norm = Check(set.AddZeros("layers." + std::to_string(t) + ".norm", DType::kF32, {kCols}), "add");
    float* n = reinterpret_cast<float*>(norm.data());
    for (int64_t c = 0; c < kCols; ++c) n[c] = 1.0f + normal(rng);
  }
  return set;
}

// A second buffer the size of the update, copied into by memcpy: the streaming-copy baseline.
double CopyBytesPerSecond(const WeightSet& set, int reps) {
  std::vector<std::byte> target(set.total_bytes());
  std::memset(target.data(), 1, target.size());  // fault the pages in before timing
  const double seconds = Best(reps, [&] {
    size_t offset = 0;
    for (const auto& t : set.tensors()) {
      std::memcpy(target.data() + offset, t.data.data(), t.data.size());
      offset += t.data.size();
    }
  });
  if (target[target.size() / 2] == std::byte{0x7f}) std::puts("");  // keeps the copy observable
  return set.total_bytes() / seconds;
}

constexpr int kReps = 3;  // each figure is the best of this many runs

struct Row {
  std::string label;
  double encode = 0, encode_fresh = 0, decode = 0, decode_fresh = 0;  // bytes of fp32 per second
  double ratio_weights = 0, ratio_delta = 0;
};

}  // namespace

int ThroughputRows(size_t mib);

int main(int argc, char** argv) {
  size_t mib = 128;
  bool throughput = true, loss = true;
  parsyn::bench::LossTableOptions loss_options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-loss") {
      loss = false;
    } else if (arg == "--loss-only") {
      throughput = false;
    } else if (arg == "--quick") {
      loss_options.quick = true;
    } else if (!arg.empty() && std::isdigit(static_cast<unsigned char>(arg[0]))) {
      mib = std::strtoul(arg.c_str(), nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: bench_compression [MiB] [--no-loss | --loss-only] [--quick]\n");
      return 2;
    }
  }
  if (throughput && ThroughputRows(mib) != 0) return 1;
#if PARSYN_BENCH_LOSS_TABLE
  if (loss) return parsyn::bench::PrintLossTables(loss_options);
#else
  if (loss) std::printf("\nloss table: not built (needs the trainer, PARSYN_WITH_TORCH)\n");
#endif
  return 0;
}

namespace {

// The update codecs' rows: encode and decode into reused buffers and into fresh ones, and the wire bytes of the
// weights and of a delta from `global`.
std::vector<Row> CodecRows(const WeightSet& weights, const WeightSet& global, const WeightSet& delta_update) {
  const double fp32 = static_cast<double>(weights.total_bytes());
  struct Codec {
    const char* label;
    UpdateCodec codec;
    QuantScheme scheme;
    bool residual;
  };
  const Codec codecs[] = {
      {"bf16", UpdateCodec::kBf16, QuantScheme::kSymmetric, false},
      {"int8 symmetric", UpdateCodec::kInt8, QuantScheme::kSymmetric, false},
      {"int8 affine", UpdateCodec::kInt8, QuantScheme::kAffine, false},
      {"int4 symmetric", UpdateCodec::kInt4, QuantScheme::kSymmetric, false},
      {"int4 + residual", UpdateCodec::kInt4, QuantScheme::kSymmetric, true},
  };
  std::vector<Row> rows;
  WeightSet reused = weights.Clone();
  for (const Codec& c : codecs) {
    Row row{.label = c.label};
    const EncodeOptions options{.codec = c.codec, .scheme = c.scheme, .want_residual = c.residual};
    parsyn::weights::EncodedUpdate encoded;
    row.encode = fp32 / Best(kReps, [&] {
                   EncodeOptions carried = options;
                   if (c.residual && encoded.residual.size() > 0) carried.carried_residual = &encoded.residual;
                   if (!parsyn::weights::EncodeUpdateInto(weights, carried, encoded).ok()) std::exit(1);
                 });
    row.encode_fresh = fp32 / Best(kReps, [&] { Check(EncodeUpdate(weights, options), "encode"); });
    const auto image = SerializeSafetensors(Check(EncodeUpdate(weights, options), "encode").compressed);
    row.decode = fp32 / Best(kReps, [&] {
                   const parsyn::Status status =
                       parsyn::weights::DecodeUpdateInto(ReadFromSpan(image), weights, reused);
                   if (!status.ok()) std::exit(1);
                 });
    row.decode_fresh = fp32 / Best(kReps, [&] { Check(DecodeUpdate(ReadFromSpan(image), weights), "decode"); });
    row.ratio_weights = image.size() / fp32;
    EncodeOptions delta_options = options;
    delta_options.delta_from = &global;
    const auto delta_image =
        SerializeSafetensors(Check(EncodeUpdate(delta_update, delta_options), "encode").compressed);
    row.ratio_delta = delta_image.size() / fp32;
    rows.push_back(row);
  }
  return rows;
}

// zstd on serialised images, streamed: the plain fp32 update, and the int8/int4 images.
std::vector<Row> ZstdRows(const WeightSet& weights, const WeightSet& global, const WeightSet& delta_update) {
  const double fp32 = static_cast<double>(weights.total_bytes());
  auto weights_image = [&](UpdateCodec codec) {
    return SerializeSafetensors(Check(EncodeUpdate(weights, {.codec = codec}), "encode").compressed);
  };
  auto delta_image = [&](UpdateCodec codec) {
    return SerializeSafetensors(
        Check(EncodeUpdate(delta_update, {.codec = codec, .delta_from = &global}), "encode").compressed);
  };
  struct ZstdCase {
    std::string label;
    std::vector<std::byte> weights_image, delta_image;
    int level;
  };
  std::vector<ZstdCase> zstd_cases;
  zstd_cases.push_back({"fp32 + zstd-1", SerializeSafetensors(weights), SerializeSafetensors(delta_update), 1});
  zstd_cases.push_back({"fp32 + zstd-3", SerializeSafetensors(weights), SerializeSafetensors(delta_update), 3});
  zstd_cases.push_back({"int8 + zstd-1", weights_image(UpdateCodec::kInt8), delta_image(UpdateCodec::kInt8), 1});
  zstd_cases.push_back({"int8 + zstd-3", weights_image(UpdateCodec::kInt8), delta_image(UpdateCodec::kInt8), 3});
  zstd_cases.push_back({"int4 + zstd-1", weights_image(UpdateCodec::kInt4), delta_image(UpdateCodec::kInt4), 1});
  zstd_cases.push_back({"int4 + zstd-3", weights_image(UpdateCodec::kInt4), delta_image(UpdateCodec::kInt4), 3});
  std::vector<Row> rows;
  for (const ZstdCase& z : zstd_cases) {
    Row row{.label = z.label};
    std::vector<std::byte> compressed;
    row.encode = fp32 / Best(kReps, [&] {
                   compressed = Check(parsyn::weights::ZstdCompress(z.weights_image, z.level), "zstd");
                 });
    row.encode_fresh = row.encode;
    std::vector<std::byte> out(z.weights_image.size());
    row.decode = fp32 / Best(kReps, [&] {
                   parsyn::weights::ZstdDecompressReader reader(ReadFromSpan(compressed), out.size());
                   size_t filled = 0;
                   while (filled < out.size()) filled += Check(reader.Read(std::span(out).subspan(filled)), "unzstd");
                 });
    row.decode_fresh = fp32 / Best(kReps, [&] {
                         Check(parsyn::weights::ZstdDecompress(compressed, z.weights_image.size()), "unzstd");
                       });
    row.ratio_weights = compressed.size() / fp32;
    row.ratio_delta = Check(parsyn::weights::ZstdCompress(z.delta_image, z.level), "zstd").size() / fp32;
    rows.push_back(row);
  }
  return rows;
}

void PrintRows(double copy, double clone, const std::vector<Row>& rows) {
  std::printf("%-16s %6s %6s %6s %7s %6s %6s %9s %9s\n", "", "encode", "", "fresh", "decode", "", "fresh", "wire",
              "wire");
  std::printf("%-16s %6s %6s %6s %7s %6s %6s %9s %9s\n", "", "GB/s", "x copy", "x copy", "GB/s", "x copy", "x copy",
              "(weights)", "(delta)");
  std::printf("%-16s %6.2f %6s %6s %7.2f %6s %6s %9s %9s\n", "copy (memcpy)", copy / kGB, "1.00", "-", copy / kGB,
              "1.00", "-", "1.000", "1.000");
  std::printf("%-16s %6.2f %6.2f %6s %7.2f %6.2f %6s %9s %9s\n", "clone (alloc+cp)", clone / kGB, clone / copy, "-",
              clone / kGB, clone / copy, "-", "1.000", "1.000");
  for (const Row& r : rows) {
    std::printf("%-16s %6.2f %6.2f %6.2f %7.2f %6.2f %6.2f %9.3f %9.3f\n", r.label.c_str(), r.encode / kGB,
                r.encode / copy, r.encode_fresh / copy, r.decode / kGB, r.decode / copy, r.decode_fresh / copy,
                r.ratio_weights, r.ratio_delta);
  }
}

}  // namespace

int ThroughputRows(size_t mib) {
  const size_t bytes = mib << 20;
  const WeightSet weights = MakeSet(bytes, 0.02f, 1);
  const WeightSet global = MakeSet(bytes, 0.02f, 2);
  WeightSet delta_update = global.Clone();
  {
    const WeightSet noise = MakeSet(bytes, 1e-3f, 3);
    for (size_t k = 0; k < global.size(); ++k) {
      float* u = delta_update[k].as<float>().data();
      const float* n = noise[k].as<float>().data();
      for (int64_t i = 0; i < global[k].numel(); ++i) u[i] += n[i];
    }
  }
  const double fp32 = static_cast<double>(weights.total_bytes());
  std::printf("bench_compression: an update of %.0f MiB fp32 (%zu tensors), one thread, CPU time; copy = memcpy of\n",
              fp32 / (1 << 20), weights.size());
  std::printf(
      "the same buffer measured now; x copy = throughput / copy bandwidth (target >= 0.5); wire = bytes / fp32.\n\n");
  const double copy = CopyBytesPerSecond(weights, 5);
  const double clone = fp32 / Best(kReps, [&] { WeightSet copy = weights.Clone(); });
  std::vector<Row> rows = CodecRows(weights, global, delta_update);
  std::vector<Row> zstd_rows = ZstdRows(weights, global, delta_update);
  rows.insert(rows.end(), zstd_rows.begin(), zstd_rows.end());
  const double copy_after = CopyBytesPerSecond(weights, 5);
  PrintRows(copy, clone, rows);
  std::printf("\ncopy bandwidth measured again after the rows: %.2f GB/s (%.0f%% of the first)\n", copy_after / kGB,
              100 * copy_after / copy);
  std::printf("zstd rows: GB/s of the fp32 update's size through compress / decompress of the labelled image.\n");
  return 0;
}
