#include "weights/sha256.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "base/strings.h"

namespace parsyn::weights {
namespace {

struct EvpContextDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

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
  return HexEncode(std::span<const unsigned char>(digest, length));
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

std::string HmacSha256(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), mac, &size);
  return std::string(reinterpret_cast<const char*>(mac), size);
}

}  // namespace parsyn::weights
