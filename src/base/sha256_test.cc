#include "base/sha256.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/strings.h"

namespace parsyn {
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

// RFC 4231 test cases 1, 2 and 6 (a key longer than the block is hashed first), then OpenSSL's own HMAC() for keys
// of every length around the block size.
TEST(Sha256Test, HmacMatchesRfc4231AndOpenSsl) {
  auto hex = [](std::string_view key, std::string_view message) { return HexEncode(HmacSha256(key, message)); };
  EXPECT_EQ(hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const std::string message = "GET\njobs/1/rounds/000001-a1/global.safetensors\n1767225600";
  for (size_t length = 0; length <= 130; ++length) {
    std::string key(length, '\0');
    for (size_t i = 0; i < length; ++i) key[i] = static_cast<char>(i * 7 + 1);
    unsigned char expected[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
         message.size(), expected, &size);
    EXPECT_EQ(HmacSha256(key, message), std::string(reinterpret_cast<const char*>(expected), size)) << length;
  }
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
}  // namespace parsyn
