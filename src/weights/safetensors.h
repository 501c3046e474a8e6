// Strict safetensors reader and writer (https://github.com/huggingface/safetensors format):
//   8-byte little-endian header length N | N bytes of UTF-8 JSON header | data section.
//   Header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..}
//   with offsets relative to the start of the data section.
//
// The reader never crashes, never reads past the input and never allocates by a size it was told: it checks every
// field and rejects a malformed file with InvalidArgument naming the tensor and the rule (header length above the
// cap, invalid UTF-8 or JSON, duplicate keys, unknown dtype or field, bad shape, shape x dtype size != byte span,
// offsets that overlap, leave gaps, do not start at 0, or trailing bytes, too many tensors, non-string metadata), or
// DataLoss when the input is cut short (shorter than 8 bytes, header or tensor running past the end).
// Tensors come back in data-offset order; the writer writes them in the set's order, contiguously from offset 0.
// Functions here are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "weights/weight_set.h"

namespace parsyn::weights {

// A file starts with its header's length in bytes: a little-endian u64.
inline constexpr size_t kSafetensorsLengthPrefixBytes = 8;

struct SafetensorsLimits {
  uint64_t max_header_bytes = 16ull << 20;  // a header longer than this is rejected before it is read
  uint64_t max_tensors = 1'000'000;
};

// One tensor as a header describes it; offsets relative to the start of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// What a checked header says: the tensors (in data order) tile the data section exactly.
struct SafetensorsLayout {
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start;  // absolute offset of the data section
};

// Reads up to buffer.size() bytes from the current position into `buffer`; 0 only at the end (storage::ByteSource's
// Read has this shape).
using ReadBytes = std::function<StatusOr<size_t>(std::span<std::byte> buffer)>;

// Checks a file of `file_size` bytes by every rule of the reader without reading its tensor data: reads the 8-byte
// header length and then the header from the start of the file through `read` (at most 8 + max_header_bytes bytes
// in all, whatever the file's size) and checks every offset against `file_size`. For validating a large upload
// before it is accepted. Errors as ParseSafetensors; DataLoss when `read` ends before the header does.
StatusOr<SafetensorsLayout> ReadSafetensorsLayout(uint64_t file_size, const ReadBytes& read,
                                                  const SafetensorsLimits& limits = {});

// As ReadSafetensorsLayout for a stream whose length is not known up front (a decompressing stream): reads exactly
// the 8-byte header length and the header through `read`, leaving `read` at the start of the data section, and
// checks every rule except where the data section ends (tensors still tile it from offset 0 without gaps or
// overlaps; it ends where the last tensor does). The caller reads the tensors and checks the stream ends there.
StatusOr<SafetensorsLayout> ReadSafetensorsHeader(const ReadBytes& read, const SafetensorsLimits& limits = {});

// A sharded checkpoint's index, beside its shards in a model folder (the Hugging Face layout).
inline constexpr char kShardIndexFile[] = "model.safetensors.index.json";

// The shards of a sharded checkpoint from its model.safetensors.index.json: shard file name -> the tensors the
// index's "weight_map" places in it. InvalidArgument naming the entry for malformed JSON, a missing or empty
// "weight_map" object, a non-string file, or a shard name that is not a plain file name.
StatusOr<std::map<std::string, std::vector<std::string>>> ParseSafetensorsIndex(std::string_view index_json);

// Parses a whole safetensors image held in memory. The returned set copies the tensor bytes.
StatusOr<WeightSet> ParseSafetensors(std::span<const std::byte> bytes, const SafetensorsLimits& limits = {});

// Reads a file, memory-mapped: the returned set's tensors point into a private mapping (no copy; writes through the
// spans stay in this process). A tensor whose offset is not aligned to its element size is copied instead. Errors
// as ParseSafetensors, prefixed with the path; NotFound for a missing file, Unavailable for other I/O errors.
StatusOr<WeightSet> ReadSafetensorsFile(const std::filesystem::path& path, const SafetensorsLimits& limits = {});

// As ReadSafetensorsFile, but the mapping is shared and read-only: writing through a tensor's span faults. Its pages
// are the page cache's, not this process's private memory, so they can be dropped after use (WeightSet::ReleasePages)
// and read again on the next access: what the coordinator holds a round's updates in while they wait.
StatusOr<WeightSet> MapSafetensorsFileReadOnly(const std::filesystem::path& path, const SafetensorsLimits& limits = {});

// The start of SerializeSafetensors(set): the 8-byte length and the header; the tensors' bytes follow in set order.
// For writing the image as a stream without a copy of the weights.
std::string SafetensorsHeaderBytes(const WeightSet& set);

// The serialised image of `set` (header padded with spaces to a multiple of 8, tensors in the set's order).
std::vector<std::byte> SerializeSafetensors(const WeightSet& set);

// Writes `set` to `path` atomically: a temporary file beside it, fsync, rename (replacing any file there), fsync of
// the directory. NotFound if the directory does not exist, Unavailable on other I/O errors; no temp file is left.
Status WriteSafetensorsFile(const WeightSet& set, const std::filesystem::path& path);

}  // namespace parsyn::weights
