// The primitives of secure aggregation, all OpenSSL 3: X25519 key agreement, HKDF-SHA256 key derivation, AES-256-GCM
// for the shares two workers send each other through the coordinator. Keys are 32 raw bytes. Safe from any thread.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "base/status.h"
#include "weights/keyed_stream.h"

namespace parsyn::secagg {

using Key32 = weights::SecretKey;  // 32 raw bytes

struct X25519KeyPair {
  Key32 private_key{};
  Key32 public_key{};
};

// 32 bytes from getrandom (a seed). Unavailable if the kernel has none to give.
StatusOr<Key32> RandomKey();

// A fresh key pair (private key from OpenSSL's DRBG). Internal if OpenSSL fails.
StatusOr<X25519KeyPair> GenerateX25519KeyPair();

// The public key of `private_key`.
StatusOr<Key32> X25519PublicKey(const Key32& private_key);

// X25519(private_key, peer_public) through HKDF-SHA256 (no salt, `info` binding the key to its use): 32 bytes. Both
// sides of a pair derive the same key from their own private and the other's public key. InvalidArgument for a peer
// key of small order (whose shared secret is all zeros).
StatusOr<Key32> AgreeKey(const Key32& private_key, const Key32& peer_public, std::string_view info);

// HKDF-SHA256 of `input` (no salt) under `info`: 32 bytes.
Key32 DeriveKey(std::string_view input, std::string_view info);

// AES-256-GCM: a random 12-byte nonce, the ciphertext, the 16-byte tag, as one string. `associated_data` is
// authenticated, not sent.
StatusOr<std::string> Seal(const Key32& key, std::string_view associated_data, std::string_view plaintext);

// The plaintext of Seal's output. PermissionDenied if it was sealed under another key or associated data, or altered.
StatusOr<std::string> Open(const Key32& key, std::string_view associated_data, std::string_view sealed);

}  // namespace parsyn::secagg
