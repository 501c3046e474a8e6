// Credentials of the coordinator: the admin API key (users, the CLI), worker tokens, the signed-URL secret.
//
// Secrets are 32 random bytes from the OS, hex-encoded with a readable prefix ("psk_" admin key, "pwt_" worker
// token). Only their sha256 is stored in the metadata store; the admin key is also written once, mode 0600, to
// <data_dir>/admin-key so the local CLI can find it. The URL-signing secret lives in <data_dir>/url-signing-secret
// (0600) so signed URLs stay valid across restarts.
// Functions here are safe from any thread; those touching files or the store block (call them off the loop).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// "<prefix><64 hex digits>" from getrandom(). Unavailable if the OS has no randomness to give.
StatusOr<std::string> NewSecret(std::string_view prefix);
// Lowercase hex sha256 of a key or token: what the store keeps.
std::string HashSecret(std::string_view secret);

struct AdminKeySetup {
  std::optional<std::string> new_key;  // set only on the first start: print it once
};
// Creates the admin key on first start (stored hashed; written to <data_dir>/admin-key, 0600, create-only).
// Later starts change nothing. Unavailable on file or store errors.
StatusOr<AdminKeySetup> EnsureAdminKey(storage::MetadataStore& store, const std::filesystem::path& data_dir);
// Reads <data_dir>/url-signing-secret, creating it (0600) on first start.
StatusOr<std::string> LoadOrCreateSigningSecret(const std::filesystem::path& data_dir);

// The token of an "Authorization: Bearer <token>" header. Unauthenticated naming what is wrong when the header is
// missing or not a bearer credential.
StatusOr<std::string> BearerToken(std::string_view authorization_header);
// Constant-time comparison of two digests (OpenSSL CRYPTO_memcmp); false when their lengths differ. Worker tokens are
// found by their sha256 in a map: comparing digests of a guess reveals nothing of a token through timing.
bool DigestsEqual(std::string_view a, std::string_view b);

}  // namespace parsyn::coordinator
