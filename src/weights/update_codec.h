// Compressed updates (docs/compression.md): bf16, int8 and int4 codecs for a worker's update, optionally as a delta
// against the round's global, with the quantisation residual for error feedback.
//
// A compressed update is a safetensors image whose `__metadata__` says how to decode it ("codec", "codec_version",
// "delta", "scheme") and whose tensors are derived from the global's layout alone: the decoder knows every name,
// dtype and shape to expect and refuses anything else. Decoding is streamed (the image is read once, front to back,
// in bounded chunks, e.g. straight out of a ZstdDecompressReader) into a WeightSet in the global's layout and dtypes;
// memory is the output plus a few chunks. Every defect is InvalidArgument naming the tensor and what is wrong.
// Functions here are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "base/status.h"
#include "weights/safetensors.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

// kNone is the plain update (the global's layout, uncompressed safetensors): it has no encoded form here, but
// MaxEncodedUpdateBytes covers it so one zstd limit rule serves every codec.
enum class UpdateCodec { kNone, kBf16, kInt8, kInt4 };
enum class QuantScheme { kSymmetric, kAffine };

// "none", "bf16", "int8", "int4"; the inverse refuses anything else, naming it.
std::string_view UpdateCodecName(UpdateCodec codec);
StatusOr<UpdateCodec> ParseUpdateCodec(std::string_view name);
// "symmetric", "affine".
std::string_view QuantSchemeName(QuantScheme scheme);

// Values per scale group at least: rows shorter than this share a scale with their neighbours (docs/compression.md).
inline constexpr int64_t kMinValuesPerScale = 64;

struct EncodeOptions {
  UpdateCodec codec = UpdateCodec::kInt8;
  QuantScheme scheme = QuantScheme::kSymmetric;  // int8/int4 only
  // Delta coding: the values encoded are update - *delta_from (the round's global, same layout).
  const WeightSet* delta_from = nullptr;
  // Error feedback: the previous round's residual (F32, the update's names and shapes), added to the values
  // before they are encoded.
  const WeightSet* carried_residual = nullptr;
  // Fill EncodedUpdate::residual.
  bool want_residual = false;
};

struct EncodedUpdate {
  WeightSet compressed;  // serialise with SerializeSafetensors
  // When asked for: x - decode(x) in fp32 for every value x that was encoded (update [- global] [+ carried]),
  // F32 in the update's names and shapes; decode(x) + residual == x exactly for bf16 and the symmetric schemes.
  WeightSet residual;
};

// Encodes `update` (F32, BF16 or F16 tensors, finite). InvalidArgument naming the tensor for another dtype, a
// non-finite value or delta, a layout that differs from delta_from's or the carried residual's, codec kNone, or an
// affine group whose range does not fit in fp32.
StatusOr<EncodedUpdate> EncodeUpdate(const WeightSet& update, const EncodeOptions& options);

// As EncodeUpdate, into `out`, reusing its buffers when they have the layout this encoding needs (a worker that
// encodes every round pays no fresh pages; bench/compression.cc); `out.residual` may be the carried residual
// itself (options.carried_residual == &out.residual): it is updated in place. Otherwise allocates. On error `out`
// holds partial results.
Status EncodeUpdateInto(const WeightSet& update, const EncodeOptions& options, EncodedUpdate& out);

// What the receiver expects; a compressed update that says otherwise is refused.
struct DecodeExpectations {
  std::optional<UpdateCodec> codec = std::nullopt;
  std::optional<bool> delta = std::nullopt;
  SafetensorsLimits limits = {};
};

// Reads a compressed update from `compressed` (to its end) and reconstructs it in `global`'s layout and dtypes:
// decoded values, plus global's when the update is a delta, rounded to the tensor's dtype (nearest even). Checks the
// metadata, every tensor's name, dtype, shape and size against what `global`'s layout implies, scales and zero
// points finite (scales >= 0), quantised values in range, padding nibbles zero, and every result finite.
StatusOr<WeightSet> DecodeUpdate(const ReadBytes& compressed, const WeightSet& global,
                                 const DecodeExpectations& expect = {});
// As DecodeUpdate, into `out`, which already has `global`'s layout (names, dtypes, shapes; InvalidArgument
// otherwise): a receiver that decodes update after update into one buffer pays no allocation and no page faults,
// which cost more than the decoding itself (bench/compression.cc). On error `out` holds partial results.
Status DecodeUpdateInto(const ReadBytes& compressed, const WeightSet& global, WeightSet& out,
                        const DecodeExpectations& expect = {});
// As DecodeUpdate for a delta-coded update, but yields the decoded delta itself (F32, global's names and shapes) for
// an aggregator that adds it to the global after averaging. InvalidArgument if the update is not a delta. Only
// `layout`'s names, dtypes and shapes are read.
StatusOr<WeightSet> DecodeUpdateDelta(const ReadBytes& compressed, const WeightSet& layout,
                                      const DecodeExpectations& expect = {});

// The most bytes a valid serialised update for `layout` can take with `codec` (kNone: the plain safetensors image):
// the exact data size (affine's, the larger scheme) plus a bound on the header. The limit to give
// ZstdDecompressReader for an upload.
StatusOr<uint64_t> MaxEncodedUpdateBytes(const WeightSet& layout, UpdateCodec codec);

}  // namespace parsyn::weights
