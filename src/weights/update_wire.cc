#include "weights/update_wire.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weights/safetensors.h"
#include "weights/zstd_stream.h"

namespace parsyn::weights {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

StatusOr<File> OpenFile(const fs::path& path, const char* mode) {
  File f(std::fopen(path.c_str(), mode));
  if (!f) {
    const int err = errno;
    if (err == ENOENT && mode[0] == 'r') return NotFoundError(path.string() + ": no such file");
    return UnavailableError("cannot open " + path.string() + ": " + std::strerror(err));
  }
  return f;
}

// A ReadBytes over an open file; the file must outlive it.
ReadBytes ReadFromFile(std::FILE* file, const fs::path& path) {
  return [file, path](std::span<std::byte> buffer) -> StatusOr<size_t> {
    const size_t n = std::fread(buffer.data(), 1, buffer.size(), file);
    if (n < buffer.size() && std::ferror(file)) return UnavailableError("reading " + path.string() + " failed");
    return n;
  };
}

// Copies everything `read` yields into `out_file`; removes it on error.
Status PumpToFile(const ReadBytes& read, const fs::path& out_file) {
  Status written = [&]() -> Status {
    PARSYN_ASSIGN_OR_RETURN(File out, OpenFile(out_file, "wb"));
    std::vector<std::byte> buffer(kChunkBytes);
    while (true) {
      PARSYN_ASSIGN_OR_RETURN(size_t n, read(buffer));
      if (n == 0) break;
      if (std::fwrite(buffer.data(), 1, n, out.get()) != n) {
        return UnavailableError("writing " + out_file.string() + " failed: " + std::strerror(errno));
      }
    }
    if (std::fflush(out.get()) != 0) return UnavailableError("writing " + out_file.string() + " failed");
    return Status::Ok();
  }();
  if (!written.ok()) {
    std::error_code ignored;
    fs::remove(out_file, ignored);
  }
  return written;
}

Status CompressToFile(ReadBytes raw, uint64_t raw_size, int level, const fs::path& out_file) {
  PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<ZstdCompressReader> zstd,
                          ZstdCompressReader::Create(std::move(raw), level, raw_size));
  return PumpToFile(ReadFrom(*zstd), out_file);
}

// The carried residual when it fits this update (F32, the update's names and shapes), else nothing: a residual of
// another layout (the job's model changed, a file from elsewhere) is dropped and error feedback starts from zero.
std::optional<WeightSet> LoadCarriedResidual(const fs::path& residual_file, const WeightSet& update) {
  std::error_code ec;
  if (residual_file.empty() || !fs::exists(residual_file, ec)) return std::nullopt;
  StatusOr<WeightSet> carried = ReadSafetensorsFile(residual_file);
  if (!carried.ok() || carried->size() != update.size()) return std::nullopt;
  for (size_t i = 0; i < update.size(); ++i) {
    const Tensor& want = update[i];
    const Tensor& got = (*carried)[i];
    if (got.name != want.name || got.shape != want.shape || got.dtype != DType::kF32) return std::nullopt;
  }
  return std::move(*carried);
}

}  // namespace

Status EncodeUpdateFileForWire(const fs::path& update_file, const WeightSet& global, const WireEncoding& encoding,
                               const fs::path& residual_file, const fs::path& out_file) {
  if (encoding.codec == UpdateCodec::kNone) {
    PARSYN_ASSIGN_OR_RETURN(File in, OpenFile(update_file, "rb"));
    if (encoding.zstd_level == 0) return PumpToFile(ReadFromFile(in.get(), update_file), out_file);
    std::error_code ec;
    const uint64_t size = fs::file_size(update_file, ec);
    if (ec) return UnavailableError("cannot stat " + update_file.string() + ": " + ec.message());
    return CompressToFile(ReadFromFile(in.get(), update_file), size, encoding.zstd_level, out_file);
  }
  PARSYN_ASSIGN_OR_RETURN(WeightSet update, ReadSafetensorsFile(update_file));
  return EncodeSetForWire(update, global, encoding, residual_file, out_file);
}

Status EncodeSetForWire(const WeightSet& update, const WeightSet& global, const WireEncoding& encoding,
                        const fs::path& residual_file, const fs::path& out_file) {
  if (encoding.codec == UpdateCodec::kNone) return InvalidArgumentError("EncodeSetForWire needs a codec");
  std::optional<WeightSet> carried;
  if (encoding.error_feedback) carried = LoadCarriedResidual(residual_file, update);
  EncodeOptions options{.codec = encoding.codec,
                        .scheme = QuantScheme::kSymmetric,
                        .delta_from = encoding.delta ? &global : nullptr,
                        .carried_residual = carried ? &*carried : nullptr,
                        .want_residual = encoding.error_feedback};
  PARSYN_ASSIGN_OR_RETURN(EncodedUpdate encoded, EncodeUpdate(update, options));
  const std::vector<std::byte> image = SerializeSafetensors(encoded.compressed);
  if (encoding.zstd_level > 0) {
    PARSYN_RETURN_IF_ERROR(CompressToFile(ReadFromSpan(image), image.size(), encoding.zstd_level, out_file));
  } else {
    PARSYN_RETURN_IF_ERROR(PumpToFile(ReadFromSpan(image), out_file));
  }
  // Only once the update is written: a failed encoding leaves the carried residual for the next round.
  if (encoding.error_feedback) PARSYN_RETURN_IF_ERROR(WriteSafetensorsFile(encoded.residual, residual_file));
  return Status::Ok();
}

StatusOr<WeightSet> DecodeUpdateFileFromWire(const fs::path& wire_file, const WeightSet& global,
                                             const WireEncoding& encoding) {
  if (encoding.plain()) return ReadSafetensorsFile(wire_file);
  PARSYN_ASSIGN_OR_RETURN(File in, OpenFile(wire_file, "rb"));
  ReadBytes source = ReadFromFile(in.get(), wire_file);
  PARSYN_ASSIGN_OR_RETURN(const uint64_t limit, MaxEncodedUpdateBytes(global, encoding.codec));
  std::optional<ZstdDecompressReader> zstd;
  if (encoding.zstd_level > 0) {
    zstd.emplace(std::move(source), limit);
    source = ReadFrom(*zstd);
  }
  if (encoding.codec != UpdateCodec::kNone) {
    return DecodeUpdate(source, global, {.codec = encoding.codec, .delta = encoding.delta});
  }
  // A plain update under zstd: its image (bounded by the limit above) parsed as any update.
  std::vector<std::byte> image;
  while (true) {
    const size_t used = image.size();
    image.resize(used + kChunkBytes);
    StatusOr<size_t> n = source(std::span(image).subspan(used));
    if (!n.ok()) return n.status();
    image.resize(used + *n);
    if (*n == 0) break;
  }
  return ParseSafetensors(image);
}

Status WriteGlobalFromDelta(const fs::path& delta_file, const WeightSet& base, const WireEncoding& encoding,
                            const std::map<std::string, std::string>& metadata, const fs::path& out_file) {
  if (encoding.codec == UpdateCodec::kNone || !encoding.delta) {
    return InvalidArgumentError("a global delta needs a codec and delta coding");
  }
  PARSYN_ASSIGN_OR_RETURN(WeightSet global, DecodeUpdateFileFromWire(delta_file, base, encoding));
  global.metadata() = metadata;
  return WriteSafetensorsFile(global, out_file);
}

StatusOr<uint64_t> ZstdCompressFile(const fs::path& in_file, const fs::path& out_file, int level) {
  PARSYN_ASSIGN_OR_RETURN(File in, OpenFile(in_file, "rb"));
  std::error_code ec;
  const uint64_t size = fs::file_size(in_file, ec);
  if (ec) return UnavailableError("cannot stat " + in_file.string() + ": " + ec.message());
  PARSYN_RETURN_IF_ERROR(CompressToFile(ReadFromFile(in.get(), in_file), size, level, out_file));
  const uint64_t compressed = fs::file_size(out_file, ec);
  if (ec) return UnavailableError("cannot stat " + out_file.string() + ": " + ec.message());
  return compressed;
}

Status ZstdDecompressFile(const fs::path& in_file, const fs::path& out_file, uint64_t max_output_bytes) {
  PARSYN_ASSIGN_OR_RETURN(File in, OpenFile(in_file, "rb"));
  ZstdDecompressReader zstd(ReadFromFile(in.get(), in_file), max_output_bytes);
  return PumpToFile(ReadFrom(zstd), out_file);
}

}  // namespace parsyn::weights
