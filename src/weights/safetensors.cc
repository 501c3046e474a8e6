#include "weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "base/strings.h"

namespace parsyn::weights {
namespace {

using nlohmann::json;

// A valid header nests three levels deep (root object -> tensor object -> shape array); anything much deeper is
// malformed, and bounding it keeps a hostile header from costing memory in the duplicate-key tracker below.
constexpr int kMaxJsonDepth = 8;

// Index of the first byte that breaks UTF-8 (RFC 3629: no overlongs, no surrogates, <= U+10FFFF), or -1.
int64_t FirstInvalidUtf8(std::span<const std::byte> text) {
  const size_t n = text.size();
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  while (i < n) {
    const uint8_t c = at(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + length > n) return static_cast<int64_t>(i);
    if (at(i + 1) < lo || at(i + 1) > hi) return static_cast<int64_t>(i);
    for (size_t k = 2; k < length; ++k) {
      if (at(i + k) < 0x80 || at(i + k) > 0xbf) return static_cast<int64_t>(i);
    }
    i += length;
  }
  return -1;
}

// Thrown from the parse callback to stop parsing early; caught in ParseHeaderJson.
struct HeaderRejected {
  std::string message;
};

// Parses the header JSON, rejecting duplicate keys in any object (nlohmann keeps the last silently) and deep nesting.
StatusOr<json> ParseHeaderJson(std::span<const std::byte> header) {
  if (int64_t bad = FirstInvalidUtf8(header); bad >= 0) {
    return InvalidArgumentError("header is not valid UTF-8 (byte " + std::to_string(bad) + " of the header)");
  }
  // One set of keys per open object; arrays push an empty marker so depth is tracked for both.
  std::vector<std::set<std::string>> open_keys;
  json::parser_callback_t track = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (open_keys.size() >= kMaxJsonDepth) {
          throw HeaderRejected{"header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
        }
        open_keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open_keys.empty()) open_keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_keys.empty() && !open_keys.back().insert(key).second) {
          throw HeaderRejected{"header has duplicate key " + SingleQuoted(key)};
        }
        break;
      }
      case json::parse_event_t::value: break;
    }
    return true;
  };
  const char* begin = reinterpret_cast<const char*>(header.data());
  try {
    return json::parse(begin, begin + header.size(), track, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const HeaderRejected& rejected) {
    return InvalidArgumentError(rejected.message);
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("header is not valid JSON: ") + e.what());
  }
}

StatusOr<uint64_t> ReadUnsigned(const json& value, const std::string& what) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) return InvalidArgumentError(what + " is negative");
  return InvalidArgumentError(what + " is not an integer");
}

StatusOr<SafetensorsEntry> ParseSafetensorsEntry(const std::string& name, const json& spec) {
  if (name.empty()) return InvalidArgumentError("tensor name is empty");
  const std::string tensor = "tensor " + SingleQuoted(name);
  if (!spec.is_object()) return InvalidArgumentError(tensor + ": entry is not an object");
  for (const auto& [field, unused] : spec.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return InvalidArgumentError(tensor + ": unknown field " + SingleQuoted(field));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!spec.contains(field)) return InvalidArgumentError(tensor + ": missing field '" + field + "'");
  }
  SafetensorsEntry entry;
  entry.name = name;

  const json& dtype = spec.at("dtype");
  if (!dtype.is_string()) return InvalidArgumentError(tensor + ": dtype is not a string");
  auto parsed_dtype = ParseDType(dtype.get_ref<const std::string&>());
  if (!parsed_dtype.ok()) return parsed_dtype.status().WithContext(tensor);
  entry.dtype = *parsed_dtype;

  const json& shape = spec.at("shape");
  if (!shape.is_array()) return InvalidArgumentError(tensor + ": shape is not an array");
  for (size_t i = 0; i < shape.size(); ++i) {
    PARSYN_ASSIGN_OR_RETURN(uint64_t dim, ReadUnsigned(shape[i], tensor + ": shape[" + std::to_string(i) + "]"));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgumentError(tensor + ": shape[" + std::to_string(i) + "] overflows int64");
    }
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  auto numel = NumElements(entry.shape);
  if (!numel.ok()) return numel.status().WithContext(tensor);
  uint64_t size_bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(*numel), DTypeSize(entry.dtype), &size_bytes)) {
    return InvalidArgumentError(tensor + ": shape " + ShapeString(entry.shape) + " overflows 64-bit byte size");
  }

  const json& offsets = spec.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    return InvalidArgumentError(tensor + ": data_offsets is not an array of two integers");
  }
  PARSYN_ASSIGN_OR_RETURN(entry.begin, ReadUnsigned(offsets[0], tensor + ": data_offsets[0]"));
  PARSYN_ASSIGN_OR_RETURN(entry.end, ReadUnsigned(offsets[1], tensor + ": data_offsets[1]"));
  const std::string span_text = "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
  if (entry.end < entry.begin)
    return InvalidArgumentError(tensor + ": data_offsets " + span_text + " end before they begin");
  if (entry.end - entry.begin != size_bytes) {
    return InvalidArgumentError(tensor + " (" + std::string(DTypeName(entry.dtype)) + ", shape " +
                                ShapeString(entry.shape) + ") needs " + std::to_string(size_bytes) +
                                " bytes but data_offsets " + span_text + " span " +
                                std::to_string(entry.end - entry.begin));
  }
  return entry;
}

Status CheckFileHoldsLengthPrefix(uint64_t file_size) {
  if (file_size >= kSafetensorsLengthPrefixBytes) return Status::Ok();
  return DataLossError("file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
}

// The header length the 8-byte prefix gives, checked against the cap and the file's size.
StatusOr<uint64_t> HeaderLength(std::span<const std::byte, kSafetensorsLengthPrefixBytes> prefix, uint64_t file_size,
                                const SafetensorsLimits& limits) {
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < kSafetensorsLengthPrefixBytes; ++i)
    header_bytes |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  if (header_bytes > limits.max_header_bytes) {
    return InvalidArgumentError("header length " + std::to_string(header_bytes) + " exceeds the cap of " +
                                std::to_string(limits.max_header_bytes) + " bytes");
  }
  if (header_bytes > file_size - kSafetensorsLengthPrefixBytes) {
    return DataLossError("header length " + std::to_string(header_bytes) + " runs past the end of the file (" +
                         std::to_string(file_size) + " bytes)");
  }
  return header_bytes;
}

// Validates the layout of a file of `file_size` bytes from its header (the `header_bytes` bytes after the length
// prefix); touches no tensor bytes. Without a file size, the data section ends where the last tensor does.
StatusOr<SafetensorsLayout> ParseLayout(std::span<const std::byte> header_text, std::optional<uint64_t> file_size,
                                        const SafetensorsLimits& limits) {
  const uint64_t header_bytes = header_text.size();
  PARSYN_ASSIGN_OR_RETURN(json header, ParseHeaderJson(header_text));
  if (!header.is_object()) return InvalidArgumentError("header is not a JSON object");

  SafetensorsLayout parsed;
  parsed.data_start = kSafetensorsLengthPrefixBytes + header_bytes;
  const uint64_t data_bytes =
      file_size ? *file_size - parsed.data_start : std::numeric_limits<uint64_t>::max() - parsed.data_start;
  const size_t num_tensors = header.size() - (header.contains("__metadata__") ? 1 : 0);
  if (num_tensors > limits.max_tensors) {
    return InvalidArgumentError("header lists " + std::to_string(num_tensors) + " tensors, more than the cap of " +
                                std::to_string(limits.max_tensors));
  }
  parsed.tensors.reserve(num_tensors);
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return InvalidArgumentError("__metadata__ is not an object");
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          return InvalidArgumentError("__metadata__ value for " + SingleQuoted(meta_key) + " is not a string");
        }
        parsed.metadata.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    PARSYN_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseSafetensorsEntry(key, value));
    if (entry.end > data_bytes) {
      return DataLossError("tensor " + SingleQuoted(key) + ": data_offsets [" + std::to_string(entry.begin) + ", " +
                           std::to_string(entry.end) + "] run past the end of the data section (" +
                           std::to_string(data_bytes) + " bytes)");
    }
    parsed.tensors.push_back(std::move(entry));
  }

  // The tensors must tile the data section exactly: sorted by offset, the first starts at 0, each starts where the
  // previous ends, the last ends at the end of the file.
  std::sort(parsed.tensors.begin(), parsed.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : parsed.tensors) {
    const std::string span_text = "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
    if (entry.begin < cursor) {
      return InvalidArgumentError("tensor " + SingleQuoted(entry.name) + ": data_offsets " + span_text +
                                  " overlap tensor " + SingleQuoted(previous->name) + " [" +
                                  std::to_string(previous->begin) + ", " + std::to_string(previous->end) + "]");
    }
    if (entry.begin > cursor) {
      if (previous == nullptr) {
        return InvalidArgumentError("tensor " + SingleQuoted(entry.name) + ": data_offsets " + span_text +
                                    " leave a gap: the first tensor must start at offset 0");
      }
      return InvalidArgumentError("tensor " + SingleQuoted(entry.name) + ": data_offsets " + span_text +
                                  " leave a gap of " + std::to_string(entry.begin - cursor) + " bytes after tensor " +
                                  SingleQuoted(previous->name));
    }
    cursor = entry.end;
    previous = &entry;
  }
  if (file_size && cursor != data_bytes) {
    return InvalidArgumentError(std::to_string(data_bytes - cursor) + " trailing bytes after the last tensor" +
                                (previous ? " " + SingleQuoted(previous->name) : std::string()));
  }
  return parsed;
}

// Validates a whole image held in memory.
StatusOr<SafetensorsLayout> ParseImageLayout(std::span<const std::byte> image, const SafetensorsLimits& limits) {
  PARSYN_RETURN_IF_ERROR(CheckFileHoldsLengthPrefix(image.size()));
  PARSYN_ASSIGN_OR_RETURN(uint64_t header_bytes,
                          HeaderLength(image.first<kSafetensorsLengthPrefixBytes>(), image.size(), limits));
  return ParseLayout(image.subspan(kSafetensorsLengthPrefixBytes, header_bytes), image.size(), limits);
}

// The JSON header, padded with spaces to a multiple of 8 bytes so the data section starts aligned.
std::string BuildHeader(const WeightSet& set) {
  json header = json::object();
  if (!set.metadata().empty()) header["__metadata__"] = set.metadata();
  uint64_t offset = 0;
  for (const Tensor& t : set.tensors()) {
    header[t.name] = {
        {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  // Names that are not valid UTF-8 cannot be represented in JSON; they are written with U+FFFD replacements.
  std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::array<std::byte, kSafetensorsLengthPrefixBytes> LengthPrefix(uint64_t header_bytes) {
  std::array<std::byte, kSafetensorsLengthPrefixBytes> prefix;
  for (size_t i = 0; i < kSafetensorsLengthPrefixBytes; ++i)
    prefix[i] = static_cast<std::byte>(header_bytes >> (8 * i));
  return prefix;
}

Status ErrnoError(const std::string& what, const std::filesystem::path& path) {
  const int err = errno;
  if (err == ENOENT) return NotFoundError(what + " " + path.string() + ": " + std::strerror(err));
  return UnavailableError(what + " " + path.string() + ": " + std::strerror(err));
}

Status WriteAll(int fd, const void* data, size_t size, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("writing", path);
    }
    p += written;
    size -= static_cast<size_t>(written);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<SafetensorsLayout> ReadSafetensorsLayout(uint64_t file_size, const ReadBytes& read,
                                                  const SafetensorsLimits& limits) {
  PARSYN_RETURN_IF_ERROR(CheckFileHoldsLengthPrefix(file_size));
  // Fills `out` from the file; the caller's file size promised these bytes.
  auto read_exactly = [&](std::span<std::byte> out) -> Status {
    size_t filled = 0;
    while (filled < out.size()) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, read(out.subspan(filled)));
      if (n == 0) {
        return DataLossError("file ends after " + std::to_string(kSafetensorsLengthPrefixBytes + filled) +
                             " bytes, before the header does (the file size was given as " + std::to_string(file_size) +
                             ")");
      }
      filled += n;
    }
    return Status::Ok();
  };
  std::array<std::byte, kSafetensorsLengthPrefixBytes> prefix;
  PARSYN_RETURN_IF_ERROR(read_exactly(prefix));
  PARSYN_ASSIGN_OR_RETURN(uint64_t header_bytes, HeaderLength(prefix, file_size, limits));
  std::vector<std::byte> header(header_bytes);  // bounded by limits.max_header_bytes
  PARSYN_RETURN_IF_ERROR(read_exactly(header));
  return ParseLayout(header, file_size, limits);
}

StatusOr<SafetensorsLayout> ReadSafetensorsHeader(const ReadBytes& read, const SafetensorsLimits& limits) {
  // Fills `out` from the stream; DataLoss when it ends first.
  auto read_exactly = [&](std::span<std::byte> out, uint64_t before) -> Status {
    size_t filled = 0;
    while (filled < out.size()) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, read(out.subspan(filled)));
      if (n == 0) {
        return DataLossError("stream ends after " + std::to_string(before + filled) + " bytes, before the header does");
      }
      filled += n;
    }
    return Status::Ok();
  };
  std::array<std::byte, kSafetensorsLengthPrefixBytes> prefix;
  PARSYN_RETURN_IF_ERROR(read_exactly(prefix, 0));
  PARSYN_ASSIGN_OR_RETURN(uint64_t header_bytes, HeaderLength(prefix, std::numeric_limits<uint64_t>::max(), limits));
  std::vector<std::byte> header(header_bytes);  // bounded by limits.max_header_bytes
  PARSYN_RETURN_IF_ERROR(read_exactly(header, kSafetensorsLengthPrefixBytes));
  return ParseLayout(header, std::nullopt, limits);
}

StatusOr<std::map<std::string, std::vector<std::string>>> ParseSafetensorsIndex(std::string_view index_json) {
  const json index = json::parse(index_json, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) return InvalidArgumentError("is not a JSON object");
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object() || weight_map->empty()) {
    return InvalidArgumentError("lacks a non-empty 'weight_map' object (tensor name -> shard file)");
  }
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (const auto& [name, file] : weight_map->items()) {
    if (!file.is_string()) return InvalidArgumentError("weight_map['" + name + "'] is not a string");
    const std::string& file_name = file.get_ref<const std::string&>();
    if (file_name.empty() || file_name.find('/') != std::string::npos || file_name.find("..") != std::string::npos) {
      return InvalidArgumentError("shard name '" + file_name + "' must be a plain file name");
    }
    names_by_file[file_name].push_back(name);
  }
  return names_by_file;
}

StatusOr<WeightSet> ParseSafetensors(std::span<const std::byte> bytes, const SafetensorsLimits& limits) {
  PARSYN_ASSIGN_OR_RETURN(SafetensorsLayout parsed, ParseImageLayout(bytes, limits));
  WeightSet set;
  set.metadata() = std::move(parsed.metadata);
  for (SafetensorsEntry& entry : parsed.tensors) {
    auto data = bytes.subspan(parsed.data_start + entry.begin, entry.end - entry.begin);
    PARSYN_RETURN_IF_ERROR(set.Add(std::move(entry.name), entry.dtype, std::move(entry.shape), data));
  }
  return set;
}

namespace {

// ReadSafetensorsFile (private, writable mapping) or MapSafetensorsFileReadOnly (shared, read-only).
StatusOr<WeightSet> MapSafetensorsFile(const std::filesystem::path& path, const SafetensorsLimits& limits,
                                       bool read_only) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("opening", path);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    Status error = ErrnoError("stat of", path);
    ::close(fd);
    return error;
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path.string() + " is not a regular file");
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size < kSafetensorsLengthPrefixBytes) {
    ::close(fd);
    return DataLossError(path.string() + ": file is " + std::to_string(size) +
                         " bytes, too short for the 8-byte header length");
  }
  // Private and writable: callers get mutable spans; writes stay in this process (copy-on-write), never the file.
  // Read-only and shared: the pages are the page cache's, so they can be dropped and read again (ReleasePages).
  void* mapping = read_only ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0)
                            : ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (mapping == MAP_FAILED) {
    errno = map_errno;
    return ErrnoError("mapping", path);
  }
  std::shared_ptr<void> backing(mapping, [size](void* p) { ::munmap(p, size); });
  std::span<std::byte> image(static_cast<std::byte*>(mapping), size);

  auto parsed = ParseImageLayout(image, limits);
  if (!parsed.ok()) return parsed.status().WithContext(path.string());
  WeightSet set;
  set.metadata() = std::move(parsed->metadata);
  for (SafetensorsEntry& entry : parsed->tensors) {
    auto data = image.subspan(parsed->data_start + entry.begin, entry.end - entry.begin);
    // The format does not promise aligned offsets; a misaligned tensor is copied so typed views stay valid.
    const bool aligned = reinterpret_cast<uintptr_t>(data.data()) % DTypeSize(entry.dtype) == 0;
    Status added = aligned ? set.AddView(std::move(entry.name), entry.dtype, std::move(entry.shape), data, backing)
                           : set.Add(std::move(entry.name), entry.dtype, std::move(entry.shape), data);
    if (!added.ok()) return added.WithContext(path.string());
  }
  if (read_only) set.AddReadOnlyMapping(image);
  return set;
}

}  // namespace

StatusOr<WeightSet> ReadSafetensorsFile(const std::filesystem::path& path, const SafetensorsLimits& limits) {
  return MapSafetensorsFile(path, limits, /*read_only=*/false);
}

StatusOr<WeightSet> MapSafetensorsFileReadOnly(const std::filesystem::path& path, const SafetensorsLimits& limits) {
  return MapSafetensorsFile(path, limits, /*read_only=*/true);
}

std::string SafetensorsHeaderBytes(const WeightSet& set) {
  const std::string header = BuildHeader(set);
  const auto prefix = LengthPrefix(header.size());
  return std::string(reinterpret_cast<const char*>(prefix.data()), prefix.size()) + header;
}

std::vector<std::byte> SerializeSafetensors(const WeightSet& set) {
  const std::string header = BuildHeader(set);
  std::vector<std::byte> image;
  image.reserve(kSafetensorsLengthPrefixBytes + header.size() + set.total_bytes());
  auto prefix = LengthPrefix(header.size());
  image.insert(image.end(), prefix.begin(), prefix.end());
  const auto* header_bytes = reinterpret_cast<const std::byte*>(header.data());
  image.insert(image.end(), header_bytes, header_bytes + header.size());
  for (const Tensor& t : set.tensors()) image.insert(image.end(), t.data.begin(), t.data.end());
  return image;
}

Status WriteSafetensorsFile(const WeightSet& set, const std::filesystem::path& path) {
  static std::atomic<uint64_t> temp_counter{0};
  std::filesystem::path temp = path;
  temp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating", temp);

  // Streams tensors straight from the set, so writing needs no second copy of the weights in memory.
  auto write_and_sync = [&]() -> Status {
    const std::string header = BuildHeader(set);
    auto prefix = LengthPrefix(header.size());
    PARSYN_RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), temp));
    PARSYN_RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), temp));
    for (const Tensor& t : set.tensors()) PARSYN_RETURN_IF_ERROR(WriteAll(fd, t.data.data(), t.data.size(), temp));
    if (::fsync(fd) != 0) return ErrnoError("syncing", temp);
    return Status::Ok();
  };
  Status written = write_and_sync();
  if (::close(fd) != 0 && written.ok()) written = ErrnoError("closing", temp);
  if (written.ok() && ::rename(temp.c_str(), path.c_str()) != 0) written = ErrnoError("renaming onto", path);
  if (!written.ok()) {
    ::unlink(temp.c_str());  // best effort; the error being returned is the one that matters
    return written;
  }
  // Make the rename itself durable.
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::Ok();
}

}  // namespace parsyn::weights
