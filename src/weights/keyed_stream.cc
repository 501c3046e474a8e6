#include "weights/keyed_stream.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <numbers>

#include "base/sha256.h"
#include "base/strings.h"

namespace parsyn::weights {
namespace {

constexpr size_t kWordsPerRefill = 512;  // 4 KiB of keystream per cipher call

void PutLe(unsigned char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

StatusOr<SecretKey> ParseSecretKey(std::string_view hex) {
  const std::optional<std::string> bytes = HexDecode(hex);
  SecretKey key{};
  if (!bytes || bytes->size() != key.size()) return InvalidArgumentError("a secret key is 64 hex digits");
  std::copy(bytes->begin(), bytes->end(), key.begin());
  return key;
}

struct KeyedStream::Cipher {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  ~Cipher() { EVP_CIPHER_CTX_free(ctx); }
};

KeyedStream::KeyedStream(const SecretKey& key, uint32_t domain, uint64_t round)
    : cipher_(std::make_unique<Cipher>()), words_(kWordsPerRefill) {
  // OpenSSL's ChaCha20 IV: a 32-bit block counter (0) then the 96-bit nonce, all little-endian.
  unsigned char iv[16] = {};
  PutLe(iv + 4, domain, 4);
  PutLe(iv + 8, round, 8);
  const int ok = EVP_EncryptInit_ex(cipher_->ctx, EVP_chacha20(), nullptr, key.data(), iv);
  assert(ok == 1);  // only fails on allocation
  (void)ok;
  next_ = words_.size();
}

KeyedStream::~KeyedStream() = default;

void KeyedStream::Refill() {
  // The keystream is the encryption of zeros.
  std::vector<unsigned char> zeros(words_.size() * sizeof(uint64_t), 0);
  std::vector<unsigned char> out(zeros.size());
  int written = 0;
  const int ok = EVP_EncryptUpdate(cipher_->ctx, out.data(), &written, zeros.data(), static_cast<int>(zeros.size()));
  assert(ok == 1 && written == static_cast<int>(out.size()));
  (void)ok;
  for (size_t i = 0; i < words_.size(); ++i) {
    uint64_t w = 0;
    for (int b = 7; b >= 0; --b) w = (w << 8) | out[i * 8 + static_cast<size_t>(b)];
    words_[i] = w;
  }
  next_ = 0;
}

uint64_t KeyedStream::Next() {
  if (next_ == words_.size()) Refill();
  return words_[next_++];
}

double GaussianStream::Next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const uint64_t w1 = words_.Next();
  const uint64_t w2 = words_.Next();
  const double u1 = static_cast<double>((w1 >> 11) + 1) * 0x1p-53;  // (0, 1]: log(u1) is finite
  const double u2 = static_cast<double>(w2 >> 11) * 0x1p-53;        // [0, 1)
  const double r = std::sqrt(-2 * std::log(u1));
  const double theta = 2 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

uint64_t KeyedRank(const SecretKey& key, uint32_t domain, uint64_t round, uint64_t item) {
  unsigned char message[20];
  PutLe(message, domain, 4);
  PutLe(message + 4, round, 8);
  PutLe(message + 12, item, 8);
  const std::string mac = HmacSha256(std::string_view(reinterpret_cast<const char*>(key.data()), key.size()),
                                     std::string_view(reinterpret_cast<const char*>(message), sizeof message));
  uint64_t rank = 0;
  for (int b = 7; b >= 0; --b) rank = (rank << 8) | static_cast<unsigned char>(mac[static_cast<size_t>(b)]);
  return rank;
}

}  // namespace parsyn::weights
