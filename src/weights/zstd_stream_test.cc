#include "weights/zstd_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace parsyn::weights {
namespace {

// zstd's decompression context, allocated whatever the input (about 95 KiB in zstd 1.5): the fixed part of the
// decoder's memory, on top of the window the limit caps.
constexpr uint64_t kZstdContextBytes = 128 << 10;

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Half random, half runs: compressible, but not trivially.
std::vector<std::byte> MixedBytes(size_t n, uint32_t seed) {
  std::vector<std::byte> out = RandomBytes(n, seed);
  for (size_t i = 0; i < n; ++i) {
    if ((i / 1000) % 2 == 0) out[i] = static_cast<std::byte>(i / 1000);
  }
  return out;
}

// Reads everything `reader` yields through a buffer of `chunk` bytes.
StatusOr<std::vector<std::byte>> Drain(ZstdDecompressReader& reader, size_t chunk) {
  std::vector<std::byte> out, buffer(chunk);
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(size_t n, reader.Read(buffer));
    if (n == 0) return out;
    out.insert(out.end(), buffer.begin(), buffer.begin() + n);
  }
}

// A frame that does not record its content size: compressed through the streaming reader without a pledged size.
std::vector<std::byte> CompressUnsized(std::span<const std::byte> raw, int level) {
  auto reader = ZstdCompressReader::Create(ReadFromSpan(raw), level, std::nullopt);
  EXPECT_TRUE(reader.ok());
  std::vector<std::byte> out, buffer(4096);
  while (true) {
    auto n = (*reader)->Read(buffer);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok() || *n == 0) return out;
    out.insert(out.end(), buffer.begin(), buffer.begin() + *n);
  }
}

TEST(ZstdStream, RoundTripIsBitExactAtEveryLevelAndChunkSize) {
  const std::vector<std::byte> random = RandomBytes(300'000, 1);
  const std::vector<std::byte> mixed = MixedBytes(1'000'003, 2);
  for (const auto* raw : {&random, &mixed}) {
    for (int level : {0, 1, 3, 19}) {
      auto compressed = ZstdCompress(*raw, level);
      ASSERT_TRUE(compressed.ok()) << compressed.status().ToString();
      for (size_t chunk : {size_t{1}, size_t{4093}, size_t{1} << 20}) {
        ZstdDecompressReader reader(ReadFromSpan(*compressed), raw->size());
        auto back = Drain(reader, chunk);
        ASSERT_TRUE(back.ok()) << back.status().ToString();
        EXPECT_TRUE(*back == *raw) << "level " << level << " chunk " << chunk;
      }
    }
  }
  auto compressed = ZstdCompress(mixed, 3);
  EXPECT_LT(compressed->size(), mixed.size() * 6 / 10);  // the runs compress
}

TEST(ZstdStream, UnsizedFramesAndConcatenatedFramesRoundTrip) {
  const std::vector<std::byte> raw = MixedBytes(700'000, 3);
  std::vector<std::byte> two = CompressUnsized(raw, 3);
  auto second = ZstdCompress(raw, 1);
  two.insert(two.end(), second->begin(), second->end());
  auto back = ZstdDecompress(two, 2 * raw.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2 * raw.size());
  EXPECT_TRUE(std::equal(raw.begin(), raw.end(), back->begin()));
  EXPECT_TRUE(std::equal(raw.begin(), raw.end(), back->begin() + raw.size()));
}

TEST(ZstdStream, LevelsOutsideZeroToNineteenAreRefused) {
  for (int level : {-1, 20}) {
    auto reader = ZstdCompressReader::Create(ReadFromSpan({}), level, 0);
    ASSERT_FALSE(reader.ok());
    EXPECT_EQ(reader.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(reader.status().message().find("outside 0..19"), std::string::npos);
  }
}

TEST(ZstdStream, APledgedSizeTheInputDoesNotMatchIsAnError) {
  const std::vector<std::byte> raw = RandomBytes(1000, 4);
  auto reader = ZstdCompressReader::Create(ReadFromSpan(raw), 3, 999);
  std::vector<std::byte> buffer(1 << 16);
  auto n = (*reader)->Read(buffer);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("999 were pledged"), std::string::npos) << n.status().ToString();
}

TEST(ZstdStream, ALimitOfExactlyTheContentSizePassesOneByteLessIsRefused) {
  const std::vector<std::byte> raw = MixedBytes(100'000, 5);
  auto compressed = ZstdCompress(raw, 3);
  EXPECT_TRUE(ZstdDecompress(*compressed, raw.size()).ok());
  auto refused = ZstdDecompress(*compressed, raw.size() - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("declares 100000 bytes of content"), std::string::npos)
      << refused.status().ToString();
  // A frame that does not declare its size (3 MB, so level 3's 2 MiB window fits the limit's cap): stopped at the
  // first byte past the limit.
  const std::vector<std::byte> large = MixedBytes(3'000'000, 5);
  const std::vector<std::byte> unsized = CompressUnsized(large, 3);
  EXPECT_TRUE(ZstdDecompress(unsized, large.size()).ok());
  refused = ZstdDecompress(unsized, large.size() - 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("expands past the limit of 2999999 bytes"), std::string::npos)
      << refused.status().ToString();
}

// A decompression bomb: a few KiB that expand to 64 MiB. Refused from the frame header when it declares its size,
// by the window cap or the running count when it does not; zstd's own allocations stay under the limit throughout.
TEST(ZstdStream, DecompressionBombIsRefusedWithoutExpandingPastTheLimit) {
  const std::vector<std::byte> zeros(size_t{64} << 20);
  auto sized = ZstdCompress(zeros, 3);
  ASSERT_TRUE(sized.ok());
  ASSERT_LT(sized->size(), size_t{64} << 10);
  const std::vector<std::byte> unsized = CompressUnsized(zeros, 3);
  ASSERT_LT(unsized.size(), size_t{64} << 10);

  constexpr uint64_t kLimit = uint64_t{4} << 20;
  std::vector<std::byte> buffer(kLimit);  // the caller's buffer, sized by what it expects
  {
    ZstdDecompressReader reader(ReadFromSpan(*sized), kLimit);
    auto n = reader.Read(buffer);
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find("declares 67108864 bytes of content, more than the 4194304"), std::string::npos)
        << n.status().ToString();
    EXPECT_EQ(reader.bytes_out(), 0u);  // refused before any of it was expanded
    EXPECT_LE(reader.peak_zstd_allocated_bytes(), kZstdContextBytes);
  }
  {
    ZstdDecompressReader reader(ReadFromSpan(unsized), kLimit);
    Status status = Status::Ok();
    while (status.ok()) {
      auto n = reader.Read(buffer);
      if (!n.ok()) status = n.status();
      ASSERT_TRUE(!n.ok() || *n > 0) << "the bomb was decoded to its end";
    }
    EXPECT_NE(status.message().find("expands past the limit of 4194304 bytes"), std::string::npos) << status.ToString();
    EXPECT_EQ(reader.bytes_out(), kLimit + 1);  // stopped at the first byte past the limit
    EXPECT_GT(reader.peak_zstd_allocated_bytes(), 0u);
    EXPECT_LE(reader.peak_zstd_allocated_bytes(), kLimit);
  }
  {
    // A limit below the frame's window: refused from the frame header, before zstd allocates the window.
    constexpr uint64_t kSmallLimit = 256 << 10;
    ZstdDecompressReader reader(ReadFromSpan(unsized), kSmallLimit);
    auto n = reader.Read(buffer);
    ASSERT_FALSE(n.ok());
    EXPECT_NE(n.status().message().find("window is larger than the limit"), std::string::npos) << n.status().ToString();
    EXPECT_EQ(reader.bytes_out(), 0u);
    EXPECT_LE(reader.peak_zstd_allocated_bytes(), kZstdContextBytes);
  }
}

TEST(ZstdStream, TruncatedCorruptAndEmptyStreamsAreRefused) {
  const std::vector<std::byte> raw = RandomBytes(500'000, 6);
  auto compressed = ZstdCompress(raw, 3);
  struct Case {
    const char* what;
    std::vector<std::byte> input;
    const char* message;
  };
  std::vector<std::byte> corrupt = *compressed;
  corrupt[corrupt.size() / 2] ^= std::byte{0x5a};
  std::vector<Case> cases = {
      {"cut before the checksum", {compressed->begin(), compressed->end() - 2}, "truncated"},
      {"cut in half", {compressed->begin(), compressed->begin() + compressed->size() / 2}, "truncated"},
      {"cut inside the frame header", {compressed->begin(), compressed->begin() + 5}, "truncated"},
      {"not zstd", RandomBytes(1000, 7), "not a zstd stream"},
      {"a flipped byte", corrupt, "corrupt"},
      {"empty", {}, "empty"},
  };
  for (const Case& c : cases) {
    auto back = ZstdDecompress(c.input, raw.size());
    ASSERT_FALSE(back.ok()) << c.what;
    EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(back.status().message().find(c.message), std::string::npos) << c.what << ": " << back.status().ToString();
  }
}

}  // namespace
}  // namespace parsyn::weights
