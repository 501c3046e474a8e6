// Streams of random words under a secret key, for draws that whoever reads a job's spec must not be able to repeat:
// dp_fedavg's Gaussian noise and client sample (strategy/dp_fed_avg.h). The key is a job's private seed (256 bits
// from getrandom, storage::TrainingJob::private_seed); the words are ChaCha20's keystream (RFC 8439, OpenSSL's), so
// without the key they cannot be told from random, and with it they are the same on every run (a resumed job commits
// the same bits). A KeyedStream is used by one thread; KeyedRank is safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::weights {

using SecretKey = std::array<unsigned char, 32>;

// 64 hex digits (either case) as the key's 32 bytes. InvalidArgument otherwise (the message never echoes the text).
StatusOr<SecretKey> ParseSecretKey(std::string_view hex);

class KeyedStream {
 public:
  // The keystream under `key` with the 96-bit nonce (domain: 32 bits, round: 64 bits, little-endian), from block 0.
  // Distinct (domain, round) pairs give unrelated streams.
  KeyedStream(const SecretKey& key, uint32_t domain, uint64_t round);
  ~KeyedStream();
  KeyedStream(const KeyedStream&) = delete;
  KeyedStream& operator=(const KeyedStream&) = delete;

  // The next 64 bits of the keystream, little-endian.
  uint64_t Next();

 private:
  void Refill();

  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  std::vector<uint64_t> words_;
  size_t next_ = 0;
};

// Standard normal draws by Box-Muller over KeyedStream(key, domain, round): two words per pair of draws, u1 from the
// first word's top 53 bits in (0, 1] (so log(u1) is finite), u2 from the second's in [0, 1); r = sqrt(-2 log u1),
// draws r cos(2 pi u2), then r sin(2 pi u2). The same key and nonce give the same draws on every run.
class GaussianStream {
 public:
  GaussianStream(const SecretKey& key, uint32_t domain, uint64_t round) : words_(key, domain, round) {}
  double Next();

 private:
  KeyedStream words_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// A 64-bit pseudorandom value of (domain, round, item) under `key`: the first 8 bytes of HMAC-SHA256(key, the three
// as little-endian integers). For ranking items (client sampling) so that no one without the key can predict them.
uint64_t KeyedRank(const SecretKey& key, uint32_t domain, uint64_t round, uint64_t item);

}  // namespace parsyn::weights
