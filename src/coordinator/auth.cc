#include "coordinator/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/strings.h"
#include "base/text_file.h"
#include "weights/sha256.h"

namespace parsyn::coordinator {

namespace {

// Writes `contents` to a new file with mode 0600; AlreadyExists if it is there.
Status WriteSecretFile(const std::filesystem::path& path, std::string_view contents) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return AlreadyExistsError(path.string() + " already exists");
    return UnavailableError("cannot create " + path.string() + ": " + std::strerror(errno));
  }
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return UnavailableError("cannot write " + path.string() + ": " + std::strerror(errno));
    }
    written += static_cast<size_t>(n);
  }
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return UnavailableError("cannot fsync " + path.string() + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> NewSecret(std::string_view prefix) {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return std::string(prefix) + HexEncode(std::span<const unsigned char>(bytes, sizeof(bytes)));
}

std::string HashSecret(std::string_view secret) { return weights::Sha256Hex(secret); }

StatusOr<AdminKeySetup> EnsureAdminKey(storage::MetadataStore& store, const std::filesystem::path& data_dir) {
  AdminKeySetup setup;
  StatusOr<std::string> existing = store.GetAdminKeyHash();
  if (existing.ok()) return setup;
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  PARSYN_ASSIGN_OR_RETURN(std::string key, NewSecret("psk_"));
  const std::filesystem::path key_file = data_dir / "admin-key";
  // A key file without a stored hash is left from a start that crashed in between: replace it.
  std::error_code ec;
  std::filesystem::remove(key_file, ec);
  PARSYN_RETURN_IF_ERROR(WriteSecretFile(key_file, key + "\n"));
  PARSYN_RETURN_IF_ERROR(store.SetAdminKeyHash(HashSecret(key)));
  setup.new_key = key;
  return setup;
}

StatusOr<std::string> LoadOrCreateSigningSecret(const std::filesystem::path& data_dir) {
  const std::filesystem::path path = data_dir / "url-signing-secret";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    PARSYN_ASSIGN_OR_RETURN(std::string secret, NewSecret(""));
    Status written = WriteSecretFile(path, secret + "\n");
    if (!written.ok() && written.code() != StatusCode::kAlreadyExists) return written;
  }
  PARSYN_ASSIGN_OR_RETURN(std::string secret, ReadTrimmedTextFile(path));
  if (secret.size() < 32) return DataLossError(path.string() + " is truncated; delete it to make a new one");
  return secret;
}

StatusOr<std::string> BearerToken(std::string_view header) {
  if (header.empty()) return UnauthenticatedError("missing Authorization header (expected \"Bearer <key>\")");
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() <= kScheme.size() || header.substr(0, kScheme.size()) != kScheme) {
    return UnauthenticatedError("Authorization header is not a bearer credential (expected \"Bearer <key>\")");
  }
  std::string_view token = header.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  if (token.empty()) return UnauthenticatedError("empty bearer token");
  return std::string(token);
}

bool DigestsEqual(std::string_view a, std::string_view b) {
  // OpenSSL's constant-time compare: a hand-written loop may be turned into an early-exit compare by the optimizer.
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace parsyn::coordinator
