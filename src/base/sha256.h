// SHA-256 of byte streams and files, and HMAC-SHA256 (OpenSSL). Digests are lowercase hex strings, as the API reports
// them. A Sha256 object is used by one thread at a time; the free functions are safe from any thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void Update(std::span<const std::byte> bytes);
  void Update(std::string_view bytes);
  // Lowercase hex of the digest; the object may not be updated afterwards.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SHA-256 on a thread of its own, for one large stream whose reads and writes would otherwise wait for the hashing:
// Update() hands a chunk to that thread and returns once the previous chunk is hashed, so the caller writes chunk i
// and reads chunk i+1 (into another buffer) while chunk i is hashed. A chunk's bytes must stay unchanged until the
// next Update() or HexDigest() returns. One caller thread at a time; the destructor waits for a chunk in hand.
class BackgroundSha256 {
 public:
  BackgroundSha256();
  ~BackgroundSha256();
  BackgroundSha256(const BackgroundSha256&) = delete;
  BackgroundSha256& operator=(const BackgroundSha256&) = delete;

  void Update(std::span<const std::byte> bytes);
  // Waits for the last chunk; lowercase hex of the digest. The object may not be updated afterwards.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string Sha256Hex(std::span<const std::byte> bytes);
std::string Sha256Hex(std::string_view bytes);
// Streams the file in fixed-size chunks. NotFound if it does not exist; Unavailable on read errors.
StatusOr<std::string> Sha256File(const std::filesystem::path& path);

// HMAC-SHA256 of `message` under `key`: the 32 raw bytes (HexEncode or base64 them to print).
std::string HmacSha256(std::string_view key, std::string_view message);

}  // namespace parsyn
