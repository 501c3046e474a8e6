// A job's compression settings applied to files: what a worker uploads and what the coordinator reads back
// (docs/compression.md, "In jobs"). A thin layer over update_codec.h and zstd_stream.h: the codec, optionally as a
// delta against the round's global, optionally with error feedback (the residual kept in a file between rounds),
// then zstd; and the inverse, streamed and bounded, into the update's ordinary form (the global's layout and dtypes).
// Functions here are safe to call from several threads at once (on different files).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "base/status.h"
#include "weights/update_codec.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

struct WireEncoding {
  UpdateCodec codec = UpdateCodec::kNone;
  bool delta = false;           // codec other than kNone only
  int zstd_level = 0;           // 0: no zstd; 1..19: zstd at that level
  bool error_feedback = false;  // lossy codecs only

  bool plain() const { return codec == UpdateCodec::kNone && zstd_level == 0; }
  friend bool operator==(const WireEncoding&, const WireEncoding&) = default;
};

// Writes `update_file` (the trainer's update: safetensors in the global's layout) as `encoding` says into `out_file`.
// `global` is the round's global (the delta's base). With error feedback, `residual_file` holds the residual carried
// from the previous round (absent, unreadable or of another layout: starts from zero) and is replaced by this
// round's. InvalidArgument for an update the codec refuses (a non-finite value), naming the tensor.
Status EncodeUpdateFileForWire(const std::filesystem::path& update_file, const WeightSet& global,
                               const WireEncoding& encoding, const std::filesystem::path& residual_file,
                               const std::filesystem::path& out_file);

// As EncodeUpdateFileForWire for an update in memory, with a codec (InvalidArgument for kNone).
Status EncodeSetForWire(const WeightSet& update, const WeightSet& global, const WireEncoding& encoding,
                        const std::filesystem::path& residual_file, const std::filesystem::path& out_file);

// Reads an uploaded update written by EncodeUpdateFileForWire back into its ordinary form (the global's layout and
// dtypes; a delta is added to `global`). Streamed: zstd is decompressed with the limit MaxEncodedUpdateBytes(global,
// codec), so a frame declaring more is refused before any of it is expanded, straight into the decoder. Every defect
// of the bytes is InvalidArgument naming it; I/O errors are Unavailable.
StatusOr<WeightSet> DecodeUpdateFileFromWire(const std::filesystem::path& wire_file, const WeightSet& global,
                                             const WireEncoding& encoding);

// The downlink (docs/compression.md, "Downlink"): a global sent as a delta from `base`, the global before it. The
// coordinator encodes the new global with EncodeSetForWire (`base` as the delta's base, its own error-feedback
// residual), and both it and the worker write the global the delta stands for with this: base + the decoded delta
// (DecodeUpdateFileFromWire: every value checked finite), given `metadata` as its __metadata__, written with
// WriteSafetensorsFile. The same code on the same bytes, so the file's sha256 is the one the coordinator stored.
// InvalidArgument for an encoding without a codec or delta coding, and DecodeUpdateFileFromWire's errors.
Status WriteGlobalFromDelta(const std::filesystem::path& delta_file, const WeightSet& base,
                            const WireEncoding& encoding, const std::map<std::string, std::string>& metadata,
                            const std::filesystem::path& out_file);

// zstd over whole files, streamed (a global a worker downloads). Compress returns the frame's size; the frame
// declares the content size. Decompress refuses (InvalidArgument) output past max_output_bytes, before expanding it
// where the frame declares its size; `out_file` is removed on any error.
StatusOr<uint64_t> ZstdCompressFile(const std::filesystem::path& in_file, const std::filesystem::path& out_file,
                                    int level);
Status ZstdDecompressFile(const std::filesystem::path& in_file, const std::filesystem::path& out_file,
                          uint64_t max_output_bytes);

}  // namespace parsyn::weights
