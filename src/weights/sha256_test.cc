#include "weights/sha256.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace parsyn::weights {
namespace {

// FIPS 180-2 test vectors.
constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(std::string_view("")), kEmpty);
  EXPECT_EQ(Sha256Hex(std::string_view("abc")), kAbc);
  EXPECT_EQ(Sha256Hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, StreamingEqualsOneShot) {
  Sha256 hasher;
  hasher.Update(std::string_view("a"));
  hasher.Update(std::as_bytes(std::span<const char>("bc", 2)));
  Sha256 moved = std::move(hasher);
  EXPECT_EQ(moved.HexDigest(), kAbc);
}

// The way a blob store uses it: two buffers taking turns, each refilled once Update() of the other returned.
TEST(Sha256Test, BackgroundHashOfChunksInTwoBuffersEqualsOneShot) {
  std::string content(5 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 131) % 251);
  constexpr size_t kChunk = 300'000;  // not a divisor: the last chunk is short
  std::string buffers[2] = {std::string(kChunk, '\0'), std::string(kChunk, '\0')};
  BackgroundSha256 hasher;
  for (size_t at = 0, i = 0; at < content.size(); at += kChunk, ++i) {
    std::string& buffer = buffers[i % 2];
    const size_t n = std::min(kChunk, content.size() - at);
    std::memcpy(buffer.data(), content.data() + at, n);  // overwrites what was hashed two chunks ago
    hasher.Update(std::as_bytes(std::span<const char>(buffer.data(), n)));
  }
  EXPECT_EQ(hasher.HexDigest(), Sha256Hex(std::string_view(content)));

  BackgroundSha256 nothing;
  EXPECT_EQ(nothing.HexDigest(), kEmpty);
  BackgroundSha256 abandoned;  // destroyed with a chunk in hand: waits for it
  abandoned.Update(std::as_bytes(std::span<const char>(content.data(), content.size())));
}

TEST(Sha256Test, FileMatchesBytesAndMissingFileIsNotFound) {
  auto path = std::filesystem::temp_directory_path() / ("parsyn_sha256_test_" + std::to_string(getpid()));
  std::string content(3 << 20, 'x');  // spans several read chunks
  content[12345] = 'y';
  {
    std::ofstream out(path, std::ios::binary);
    out << content;
  }
  auto digest = Sha256File(path);
  ASSERT_TRUE(digest.ok()) << digest.status().ToString();
  EXPECT_EQ(*digest, Sha256Hex(std::string_view(content)));
  std::filesystem::remove(path);
  auto missing = Sha256File(path);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace parsyn::weights
