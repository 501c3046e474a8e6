#include "weights/sha256.h"

#include <gtest/gtest.h>

#include <unistd.h>
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
