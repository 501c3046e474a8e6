#include "weights/zstd_stream.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader, ZSTD_createDCtx_advanced (exported by Debian's libzstd)
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace parsyn::weights {
namespace {

std::string ZstdError(size_t code) { return ZSTD_getErrorName(code); }

// zstd's allocations go through here so the decoder's memory can be measured (peak_zstd_allocated_bytes).
struct AllocationCounter {
  uint64_t current = 0;
  uint64_t peak = 0;
};
constexpr size_t kAllocationHeader = 16;  // keeps malloc's 16-byte alignment

void* CountingAlloc(void* opaque, size_t size) {
  auto* counter = static_cast<AllocationCounter*>(opaque);
  auto* block = static_cast<std::byte*>(std::malloc(size + kAllocationHeader));
  if (block == nullptr) return nullptr;
  std::memcpy(block, &size, sizeof size);
  counter->current += size;
  counter->peak = std::max(counter->peak, counter->current);
  return block + kAllocationHeader;
}

void CountingFree(void* opaque, void* address) {
  if (address == nullptr) return;
  auto* block = static_cast<std::byte*>(address) - kAllocationHeader;
  size_t size;
  std::memcpy(&size, block, sizeof size);
  static_cast<AllocationCounter*>(opaque)->current -= size;
  std::free(block);
}

// Smallest windowLog whose window holds `bytes`, within zstd's bounds.
int WindowLogFor(uint64_t bytes) {
  const int log = bytes <= 1 ? 0 : 64 - std::countl_zero(bytes - 1);
  return std::clamp(log, ZSTD_WINDOWLOG_MIN, ZSTD_WINDOWLOG_MAX_64);
}

}  // namespace

struct ZstdCompressReader::Impl {
  ReadBytes raw;
  ZSTD_CCtx* cctx = nullptr;
  std::vector<std::byte> input = std::vector<std::byte>(ZSTD_CStreamInSize());
  ZSTD_inBuffer in{nullptr, 0, 0};
  bool raw_ended = false;
  bool done = false;
  std::optional<uint64_t> pledged;
  uint64_t consumed = 0;

  ~Impl() { ZSTD_freeCCtx(cctx); }
};

ZstdCompressReader::ZstdCompressReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ZstdCompressReader::~ZstdCompressReader() = default;

StatusOr<std::unique_ptr<ZstdCompressReader>> ZstdCompressReader::Create(ReadBytes raw, int level,
                                                                         std::optional<uint64_t> pledged_size) {
  if (level < 0 || level > kMaxZstdLevel) {
    return InvalidArgumentError("zstd level " + std::to_string(level) + " is outside 0.." +
                                std::to_string(kMaxZstdLevel));
  }
  auto impl = std::make_unique<Impl>();
  impl->raw = std::move(raw);
  impl->pledged = pledged_size;
  impl->cctx = ZSTD_createCCtx();
  if (impl->cctx == nullptr) return ResourceExhaustedError("cannot allocate a zstd compression context");
  size_t rc = ZSTD_CCtx_setParameter(impl->cctx, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(impl->cctx, ZSTD_c_checksumFlag, 1);
  if (!ZSTD_isError(rc) && pledged_size) rc = ZSTD_CCtx_setPledgedSrcSize(impl->cctx, *pledged_size);
  if (ZSTD_isError(rc)) return InternalError("configuring zstd: " + ZstdError(rc));
  return std::unique_ptr<ZstdCompressReader>(new ZstdCompressReader(std::move(impl)));
}

StatusOr<size_t> ZstdCompressReader::Read(std::span<std::byte> buffer) {
  Impl& s = *impl_;
  if (s.done || buffer.empty()) return 0;
  ZSTD_outBuffer out{buffer.data(), buffer.size(), 0};
  while (out.pos == 0) {
    if (s.in.pos == s.in.size && !s.raw_ended) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, s.raw(s.input));
      s.in = {s.input.data(), n, 0};
      s.consumed += n;
      if (n == 0) s.raw_ended = true;
      if (s.pledged && (s.consumed > *s.pledged || (s.raw_ended && s.consumed != *s.pledged))) {
        return InvalidArgumentError("zstd input is " + std::string(s.raw_ended ? "" : "at least ") +
                                    std::to_string(s.consumed) + " bytes, but " + std::to_string(*s.pledged) +
                                    " were pledged");
      }
    }
    const ZSTD_EndDirective mode = s.raw_ended ? ZSTD_e_end : ZSTD_e_continue;
    const size_t remaining = ZSTD_compressStream2(s.cctx, &out, &s.in, mode);
    if (ZSTD_isError(remaining)) return InternalError("zstd compression failed: " + ZstdError(remaining));
    if (s.raw_ended && remaining == 0) {
      s.done = true;
      break;
    }
  }
  return out.pos;
}

struct ZstdDecompressReader::Impl {
  ReadBytes compressed;
  uint64_t max_output;
  AllocationCounter allocations;
  ZSTD_DCtx* dctx = nullptr;
  Status setup_error;
  std::vector<std::byte> input = std::vector<std::byte>(ZSTD_DStreamInSize());
  size_t in_begin = 0, in_end = 0;  // unread input is input[in_begin, in_end)
  bool source_ended = false;
  bool at_frame_start = true;
  bool in_frame = false;  // input of an unfinished frame was consumed
  uint64_t input_total = 0;
  uint64_t produced = 0;

  ~Impl() { ZSTD_freeDCtx(dctx); }

  // Reads more input after the unread bytes (moved to the front first). False once the source has ended.
  StatusOr<bool> Refill() {
    if (source_ended) return false;
    if (in_begin > 0) {
      std::memmove(input.data(), input.data() + in_begin, in_end - in_begin);
      in_end -= in_begin;
      in_begin = 0;
    }
    if (in_end == input.size()) return true;
    PARSYN_ASSIGN_OR_RETURN(size_t n, compressed(std::span(input).subspan(in_end)));
    if (n == 0) {
      source_ended = true;
      return false;
    }
    in_end += n;
    input_total += n;
    return true;
  }

  Status Truncated() const {
    return InvalidArgumentError("zstd stream is truncated: it ends inside a frame, after " +
                                std::to_string(input_total) + " compressed bytes and " + std::to_string(produced) +
                                " bytes of output");
  }

  // At the start of a frame: refuses it from its header when it declares more content than the limit leaves.
  Status CheckFrameHeader() {
    while (true) {
      ZSTD_frameHeader header;
      const size_t rc = ZSTD_getFrameHeader(&header, input.data() + in_begin, in_end - in_begin);
      if (ZSTD_isError(rc)) return InvalidArgumentError("not a zstd stream: " + ZstdError(rc));
      if (rc == 0) {
        if (header.frameType == ZSTD_frame && header.frameContentSize != ZSTD_CONTENTSIZE_UNKNOWN &&
            header.frameContentSize > max_output - produced) {
          return InvalidArgumentError("zstd frame declares " + std::to_string(header.frameContentSize) +
                                      " bytes of content, more than the " + std::to_string(max_output - produced) +
                                      " bytes the limit of " + std::to_string(max_output) +
                                      " leaves: refused before expanding it");
        }
        return Status::Ok();
      }
      PARSYN_ASSIGN_OR_RETURN(bool more, Refill());
      if (!more) return Truncated();
    }
  }
};

ZstdDecompressReader::ZstdDecompressReader(ReadBytes compressed, uint64_t max_output_bytes)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.compressed = std::move(compressed);
  s.max_output = max_output_bytes;
  s.dctx = ZSTD_createDCtx_advanced({CountingAlloc, CountingFree, &s.allocations});
  if (s.dctx == nullptr) {
    s.setup_error = ResourceExhaustedError("cannot allocate a zstd decompression context");
    return;
  }
  // A frame's window beyond the limit (rounded up to a power of two) is refused before zstd allocates it.
  const size_t rc = ZSTD_DCtx_setParameter(s.dctx, ZSTD_d_windowLogMax, WindowLogFor(max_output_bytes));
  if (ZSTD_isError(rc)) s.setup_error = InternalError("configuring zstd: " + ZstdError(rc));
}

ZstdDecompressReader::~ZstdDecompressReader() = default;

uint64_t ZstdDecompressReader::bytes_out() const { return impl_->produced; }
uint64_t ZstdDecompressReader::peak_zstd_allocated_bytes() const { return impl_->allocations.peak; }

StatusOr<size_t> ZstdDecompressReader::Read(std::span<std::byte> buffer) {
  Impl& s = *impl_;
  PARSYN_RETURN_IF_ERROR(s.setup_error);
  if (buffer.empty()) return 0;
  while (true) {
    if (s.in_begin == s.in_end) {
      PARSYN_ASSIGN_OR_RETURN(bool more, s.Refill());
      if (!more) {
        if (s.in_frame) return s.Truncated();
        if (s.input_total == 0) return InvalidArgumentError("zstd stream is empty: it holds no frame");
        return 0;
      }
    }
    if (s.at_frame_start) {
      s.in_frame = true;
      PARSYN_RETURN_IF_ERROR(s.CheckFrameHeader());
      s.at_frame_start = false;
    }
    // Room for one byte past the limit, so a frame that runs past it is caught by its first extra byte.
    const uint64_t allowed = s.max_output - s.produced;
    const size_t room = allowed >= buffer.size() ? buffer.size() : static_cast<size_t>(allowed) + 1;
    ZSTD_outBuffer out{buffer.data(), room, 0};
    ZSTD_inBuffer in{s.input.data(), s.in_end, s.in_begin};
    const size_t rc = ZSTD_decompressStream(s.dctx, &out, &in);
    s.in_begin = in.pos;
    if (ZSTD_isError(rc)) {
      if (ZSTD_getErrorCode(rc) == ZSTD_error_frameParameter_windowTooLarge) {
        return InvalidArgumentError("zstd frame's window is larger than the limit of " + std::to_string(s.max_output) +
                                    " bytes allows: refused before expanding it");
      }
      return InvalidArgumentError("zstd stream is corrupt: " + ZstdError(rc));
    }
    s.produced += out.pos;
    if (s.produced > s.max_output) {
      return InvalidArgumentError("zstd stream expands past the limit of " + std::to_string(s.max_output) + " bytes");
    }
    if (rc == 0) {  // a frame ended; another may follow
      s.in_frame = false;
      s.at_frame_start = true;
    }
    if (out.pos > 0) return out.pos;
  }
}

ReadBytes ReadFromSpan(std::span<const std::byte> bytes) {
  return [bytes, offset = size_t{0}](std::span<std::byte> buffer) mutable -> StatusOr<size_t> {
    const size_t n = std::min(buffer.size(), bytes.size() - offset);
    if (n > 0) std::memcpy(buffer.data(), bytes.data() + offset, n);
    offset += n;
    return n;
  };
}

namespace {

template <typename Reader>
StatusOr<std::vector<std::byte>> ReadToEnd(Reader& reader, size_t chunk) {
  std::vector<std::byte> out;
  while (true) {
    const size_t old = out.size();
    out.resize(old + chunk);
    auto n = reader.Read(std::span(out).subspan(old));
    if (!n.ok()) return n.status();
    out.resize(old + *n);
    if (*n == 0) return out;
  }
}

}  // namespace

StatusOr<std::vector<std::byte>> ZstdCompress(std::span<const std::byte> raw, int level) {
  PARSYN_ASSIGN_OR_RETURN(auto reader, ZstdCompressReader::Create(ReadFromSpan(raw), level, raw.size()));
  return ReadToEnd(*reader, ZSTD_CStreamOutSize());
}

StatusOr<std::vector<std::byte>> ZstdDecompress(std::span<const std::byte> compressed, uint64_t max_output_bytes) {
  ZstdDecompressReader reader(ReadFromSpan(compressed), max_output_bytes);
  return ReadToEnd(reader, ZSTD_DStreamOutSize());
}

}  // namespace parsyn::weights
