#include "base/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/strings.h"

namespace parsyn {
namespace {

struct EvpContextDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// SHA-256, looked up in OpenSSL's providers once: with EVP_sha256(), OpenSSL 3 looks it up again (an implicit fetch,
// under locks) on every digest started, which at 10,000 workers cost the coordinator's loop more than hashing each
// request's token did.
const EVP_MD* Sha256Algorithm() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  static EVP_MD* const fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // kept for the process's life
  if (fetched != nullptr) return fetched;
#endif
  return EVP_sha256();
}

// The digest of a buffer in one call: no hasher object (the texts hashed per request are short).
std::string OneShotSha256Hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest, &length, Sha256Algorithm(), nullptr) != 1) throw std::bad_alloc();
  return HexEncode(std::span<const unsigned char>(digest, length));
}

}  // namespace

struct Sha256::Impl {
  std::unique_ptr<EVP_MD_CTX, EvpContextDeleter> ctx;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx.reset(EVP_MD_CTX_new());
  // Both fail only on allocation failure, which this codebase treats like any other out-of-memory condition.
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx.get(), Sha256Algorithm(), nullptr) != 1) {
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

struct BackgroundSha256::Impl {
  Sha256 hasher;
  std::mutex mu;
  std::condition_variable changed;
  std::span<const std::byte> in_hand;  // the chunk being hashed; empty when the thread is free
  bool stopping = false;
  std::thread thread;

  void Run() {
    std::unique_lock lock(mu);
    while (true) {
      changed.wait(lock, [&] { return !in_hand.empty() || stopping; });
      if (in_hand.empty()) return;  // stopping, nothing left to hash
      const std::span<const std::byte> chunk = in_hand;
      lock.unlock();
      hasher.Update(chunk);
      lock.lock();
      in_hand = {};
      changed.notify_all();
    }
  }
  // Returns with the lock held and the thread free.
  std::unique_lock<std::mutex> WaitUntilFree() {
    std::unique_lock lock(mu);
    changed.wait(lock, [&] { return in_hand.empty(); });
    return lock;
  }
  void Stop() {
    if (!thread.joinable()) return;
    {
      std::unique_lock lock = WaitUntilFree();
      stopping = true;
    }
    changed.notify_all();
    thread.join();
  }
};

BackgroundSha256::BackgroundSha256() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->Run(); });
}

BackgroundSha256::~BackgroundSha256() { impl_->Stop(); }

void BackgroundSha256::Update(std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  {
    std::unique_lock lock = impl_->WaitUntilFree();
    impl_->in_hand = bytes;
  }
  impl_->changed.notify_all();
}

std::string BackgroundSha256::HexDigest() {
  impl_->Stop();
  return impl_->hasher.HexDigest();
}

std::string Sha256Hex(std::span<const std::byte> bytes) { return OneShotSha256Hex(bytes.data(), bytes.size()); }

std::string Sha256Hex(std::string_view bytes) { return OneShotSha256Hex(bytes.data(), bytes.size()); }

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

// RFC 2104 over the SHA-256 fetched once: OpenSSL 3's HMAC() looks the MAC up in its providers on every call
// (EVP_Q_mac), which was ~3% of the coordinator's loop at 10,000 workers (each task signs its URLs).
std::string HmacSha256(std::string_view key, std::string_view message) {
  constexpr size_t kBlockBytes = 64;  // SHA-256's block
  unsigned char block_key[kBlockBytes] = {};
  unsigned int size = 0;
  if (key.size() > kBlockBytes) {  // a longer key is hashed first
    if (EVP_Digest(key.data(), key.size(), block_key, &size, Sha256Algorithm(), nullptr) != 1) throw std::bad_alloc();
  } else {
    std::memcpy(block_key, key.data(), key.size());
  }
  unsigned char inner_pad[kBlockBytes];
  unsigned char outer_pad[kBlockBytes];
  for (size_t i = 0; i < kBlockBytes; ++i) {
    inner_pad[i] = block_key[i] ^ 0x36;
    outer_pad[i] = block_key[i] ^ 0x5c;
  }
  thread_local const std::unique_ptr<EVP_MD_CTX, EvpContextDeleter> ctx(EVP_MD_CTX_new());
  unsigned char inner[EVP_MAX_MD_SIZE];
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int inner_size = 0;
  // Each call fails only on allocation failure, treated as everywhere else.
  if (!ctx || EVP_DigestInit_ex(ctx.get(), Sha256Algorithm(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), inner_pad, kBlockBytes) != 1 ||
      EVP_DigestUpdate(ctx.get(), message.data(), message.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), inner, &inner_size) != 1 ||
      EVP_DigestInit_ex(ctx.get(), Sha256Algorithm(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), outer_pad, kBlockBytes) != 1 || EVP_DigestUpdate(ctx.get(), inner, inner_size) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), mac, &size) != 1) {
    throw std::bad_alloc();
  }
  return std::string(reinterpret_cast<const char*>(mac), size);
}

}  // namespace parsyn
