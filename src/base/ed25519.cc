#include "base/ed25519.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <optional>
#include <span>

#include "base/sha256.h"
#include "base/strings.h"

namespace parsyn {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

Bio ReadBio(std::string_view pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

struct Ed25519PrivateKey::Key {
  Pkey pkey;
};
struct Ed25519PublicKey::Key {
  Pkey pkey;
};

StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::Generate() {
  EVP_PKEY* raw = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (raw == nullptr) return InternalError("OpenSSL could not generate an Ed25519 key");
  return Ed25519PrivateKey(std::make_shared<const Key>(Key{Pkey(raw)}));
}

StatusOr<Ed25519PrivateKey> Ed25519PrivateKey::FromPem(std::string_view pem) {
  Bio bio = ReadBio(pem);
  Pkey pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) return InvalidArgumentError("no PEM private key found");
  if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
    return InvalidArgumentError("the private key is not an Ed25519 key");
  }
  return Ed25519PrivateKey(std::make_shared<const Key>(Key{std::move(pkey)}));
}

std::string Ed25519PrivateKey::PrivatePem() const {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key_->pkey.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return BioText(bio.get());
}

std::string Ed25519PrivateKey::PublicPem() const {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PUBKEY(bio.get(), key_->pkey.get());
  return BioText(bio.get());
}

std::string Ed25519PrivateKey::Sign(std::string_view message) const {
  MdCtx ctx(EVP_MD_CTX_new());
  std::string signature(64, '\0');
  size_t length = signature.size();
  // Ed25519 hashes internally: no digest is named, and the message goes in one call.
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return {};
  }
  signature.resize(length);
  return signature;
}

StatusOr<Ed25519PublicKey> Ed25519PublicKey::FromPem(std::string_view pem) {
  Bio bio = ReadBio(pem);
  Pkey pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) return InvalidArgumentError("no PEM public key found (expected \"-----BEGIN PUBLIC KEY-----\")");
  if (EVP_PKEY_get_id(pkey.get()) != EVP_PKEY_ED25519) {
    return InvalidArgumentError("the public key is not an Ed25519 key");
  }
  return Ed25519PublicKey(std::make_shared<const Key>(Key{std::move(pkey)}));
}

std::string Ed25519PublicKey::RawHex() const {
  unsigned char raw[32];
  size_t length = sizeof(raw);
  if (EVP_PKEY_get_raw_public_key(key_->pkey.get(), raw, &length) != 1) return {};
  return HexEncode(std::span<const unsigned char>(raw, length));
}

bool Ed25519PublicKey::Verify(std::string_view message, std::string_view signature) const {
  MdCtx ctx(EVP_MD_CTX_new());
  return EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key_->pkey.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                          reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
}

std::string Ed25519KeyId(const Ed25519PublicKey& key) {
  const std::optional<std::string> raw = HexDecode(key.RawHex());
  return Sha256Hex(raw.value_or("")).substr(0, 16);
}

}  // namespace parsyn
