#include "secagg/crypto.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "base/secure_random.h"

namespace parsyn::secagg {
namespace {

constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct ContextFree {
  void operator()(EVP_PKEY_CTX* ctx) const { EVP_PKEY_CTX_free(ctx); }
};
struct CipherFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;
using ContextPtr = std::unique_ptr<EVP_PKEY_CTX, ContextFree>;
using CipherPtr = std::unique_ptr<EVP_CIPHER_CTX, CipherFree>;

KeyPtr PrivateKey(const Key32& raw) {
  return KeyPtr(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, raw.data(), raw.size()));
}

StatusOr<Key32> RawPublicKey(EVP_PKEY* key) {
  Key32 out{};
  size_t length = out.size();
  if (EVP_PKEY_get_raw_public_key(key, out.data(), &length) != 1 || length != out.size()) {
    return InternalError("OpenSSL could not give an X25519 public key");
  }
  return out;
}

}  // namespace

StatusOr<Key32> RandomKey() {
  Key32 key{};
  PARSYN_RETURN_IF_ERROR(SecureRandomBytes(key));
  return key;
}

StatusOr<X25519KeyPair> GenerateX25519KeyPair() {
  ContextPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return InternalError("OpenSSL could not generate an X25519 key");
  }
  KeyPtr key(raw);
  X25519KeyPair pair;
  size_t length = pair.private_key.size();
  if (EVP_PKEY_get_raw_private_key(key.get(), pair.private_key.data(), &length) != 1) {
    return InternalError("OpenSSL could not give an X25519 private key");
  }
  PARSYN_ASSIGN_OR_RETURN(pair.public_key, RawPublicKey(key.get()));
  return pair;
}

StatusOr<Key32> X25519PublicKey(const Key32& private_key) {
  KeyPtr key = PrivateKey(private_key);
  if (!key) return InternalError("OpenSSL could not load an X25519 private key");
  return RawPublicKey(key.get());
}

StatusOr<Key32> AgreeKey(const Key32& private_key, const Key32& peer_public, std::string_view info) {
  KeyPtr own = PrivateKey(private_key);
  KeyPtr peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_public.data(), peer_public.size()));
  if (!own || !peer) return InternalError("OpenSSL could not load an X25519 key");
  ContextPtr ctx(EVP_PKEY_CTX_new(own.get(), nullptr));
  Key32 shared{};
  size_t length = shared.size();
  // OpenSSL refuses to derive an all-zero secret (a peer key of small order), as RFC 7748 section 6.1 advises.
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 || EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), shared.data(), &length) != 1 || length != shared.size()) {
    return InvalidArgumentError("an X25519 public key gives no shared secret (a key of small order)");
  }
  unsigned char any = 0;
  for (unsigned char b : shared) any |= b;
  if (any == 0) return InvalidArgumentError("an X25519 public key gives no shared secret (a key of small order)");
  return DeriveKey(std::string_view(reinterpret_cast<const char*>(shared.data()), shared.size()), info);
}

Key32 DeriveKey(std::string_view input, std::string_view info) {
  Key32 out{};
  ContextPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  size_t length = out.size();
  const bool ok = ctx && EVP_PKEY_derive_init(ctx.get()) == 1 &&
                  EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), reinterpret_cast<const unsigned char*>(input.data()),
                                             static_cast<int>(input.size())) == 1 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(info.data()),
                                              static_cast<int>(info.size())) == 1 &&
                  EVP_PKEY_derive(ctx.get(), out.data(), &length) == 1 && length == out.size();
  if (!ok) std::abort();  // HKDF-SHA256 fails only when OpenSSL cannot allocate
  return out;
}

StatusOr<std::string> Seal(const Key32& key, std::string_view associated_data, std::string_view plaintext) {
  std::string out(kNonceBytes + plaintext.size() + kTagBytes, '\0');
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  if (RAND_bytes(bytes, kNonceBytes) != 1) return UnavailableError("OpenSSL's random generator failed");
  CipherPtr ctx(EVP_CIPHER_CTX_new());
  int written = 0;
  const bool ok =
      ctx && EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), bytes) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &written, reinterpret_cast<const unsigned char*>(associated_data.data()),
                        static_cast<int>(associated_data.size())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), bytes + kNonceBytes, &written,
                        reinterpret_cast<const unsigned char*>(plaintext.data()),
                        static_cast<int>(plaintext.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx.get(), bytes + kNonceBytes + written, &written) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, bytes + kNonceBytes + plaintext.size()) == 1;
  if (!ok) return InternalError("OpenSSL could not seal with AES-256-GCM");
  return out;
}

StatusOr<std::string> Open(const Key32& key, std::string_view associated_data, std::string_view sealed) {
  const Status refused = PermissionDeniedError(
      "a sealed share does not open: it was sealed for another worker or attempt, or altered on the way");
  if (sealed.size() < kNonceBytes + kTagBytes) return refused;
  const auto* bytes = reinterpret_cast<const unsigned char*>(sealed.data());
  const size_t length = sealed.size() - kNonceBytes - kTagBytes;
  std::string out(length, '\0');
  unsigned char tag[kTagBytes];
  std::copy(bytes + kNonceBytes + length, bytes + sealed.size(), tag);
  CipherPtr ctx(EVP_CIPHER_CTX_new());
  int written = 0;
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), bytes) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &written, reinterpret_cast<const unsigned char*>(associated_data.data()),
                        static_cast<int>(associated_data.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &written, bytes + kNonceBytes,
                        static_cast<int>(length)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) != 1 ||
      EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()) + written, &written) != 1) {
    return refused;
  }
  return out;
}

}  // namespace parsyn::secagg
