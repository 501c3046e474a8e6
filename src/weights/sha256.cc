#include "weights/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace parsyn::weights {
namespace {

struct EvpContextDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

std::string ToHex(const unsigned char* digest, unsigned int length) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(length * 2, '0');
  for (unsigned int i = 0; i < length; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace

struct Sha256::Impl {
  std::unique_ptr<EVP_MD_CTX, EvpContextDeleter> ctx;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx.reset(EVP_MD_CTX_new());
  // Both fail only on allocation failure, which this codebase treats like any other out-of-memory condition.
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw std::bad_alloc();
  }
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(std::span<const std::byte> bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(impl_->ctx.get(), bytes.data(), bytes.size());
}

void Sha256::Update(std::string_view bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(impl_->ctx.get(), bytes.data(), bytes.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(impl_->ctx.get(), digest, &length);
  return ToHex(digest, length);
}

std::string Sha256Hex(std::span<const std::byte> bytes) {
  Sha256 hasher;
  hasher.Update(bytes);
  return hasher.HexDigest();
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 hasher;
  hasher.Update(bytes);
  return hasher.HexDigest();
}

StatusOr<std::string> Sha256File(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("no such file: " + path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) return UnavailableError("cannot open " + path.string() + ": " + std::strerror(errno));
  constexpr size_t kChunkBytes = 1 << 20;
  std::vector<char> chunk(kChunkBytes);
  Sha256 hasher;
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) hasher.Update(std::string_view(chunk.data(), static_cast<size_t>(got)));
  }
  if (in.bad()) return UnavailableError("error reading " + path.string());
  return hasher.HexDigest();
}

}  // namespace parsyn::weights
