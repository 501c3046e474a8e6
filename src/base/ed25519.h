// Ed25519 signatures (OpenSSL 3): a private key generated, saved and read as PEM (PKCS#8), its public half as PEM
// (SubjectPublicKeyInfo), detached signatures of byte strings. The coordinator signs its audit log's chain head with
// one; `parsyn audit verify` checks those signatures with the public half. Keys are immutable once made: any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn {

class Ed25519PrivateKey {
 public:
  // A new key from the OS's randomness. Internal if OpenSSL fails.
  static StatusOr<Ed25519PrivateKey> Generate();
  // InvalidArgument when `pem` holds no private key, or one of another kind (RSA, an EC curve).
  static StatusOr<Ed25519PrivateKey> FromPem(std::string_view pem);

  std::string PrivatePem() const;  // PKCS#8, unencrypted: keep it in a 0600 file
  std::string PublicPem() const;   // SubjectPublicKeyInfo
  // The 64-byte signature of `message`.
  std::string Sign(std::string_view message) const;

 private:
  struct Key;
  explicit Ed25519PrivateKey(std::shared_ptr<const Key> key) : key_(std::move(key)) {}
  std::shared_ptr<const Key> key_;
};

class Ed25519PublicKey {
 public:
  // InvalidArgument when `pem` holds no public key, or one that is not Ed25519.
  static StatusOr<Ed25519PublicKey> FromPem(std::string_view pem);
  // The 32 raw bytes of the key as hex; its first 16 digits name the key (KeyId).
  std::string RawHex() const;
  // Whether `signature` is this key's signature of `message`.
  bool Verify(std::string_view message, std::string_view signature) const;

 private:
  struct Key;
  explicit Ed25519PublicKey(std::shared_ptr<const Key> key) : key_(std::move(key)) {}
  std::shared_ptr<const Key> key_;
};

// A short name of a public key, as records that a key signed name it: the first 16 hex digits of the SHA-256 of its
// 32 raw bytes.
std::string Ed25519KeyId(const Ed25519PublicKey& key);

}  // namespace parsyn
