// Single sign-on (docs/operations.md, "Single sign-on"): the ID tokens of an OpenID Connect provider, checked as
// OpenID Connect Core 1.0 §3.1.3.7 says: an RS256 signature by a key of the provider's JWKS (read again when a token
// names a key it has not seen, the provider having rotated its keys; at most once every 10 s), the issuer, the audience
// (this coordinator's client id), the expiry and issue time (60 s of clock skew allowed), and the nonce when one was
// sent. The provider's endpoints come from its discovery document. Thread-safe: Verify may run on any pool thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

struct OidcSettings {
  std::string issuer;                     // `parsyn server --oidc-issuer`: exactly the tokens' "iss"
  std::string client_id;                  // --oidc-client-id: the tokens' audience
  std::string roles_claim = "groups";     // --oidc-roles-claim: a claim holding a list of group names
  std::vector<std::string> admin_groups;  // --oidc-admin-group: who is in one of these is a platform_admin
  std::filesystem::path ca_file;          // extra CAs for an https provider with a private CA
};

// What a valid ID token says of its user.
struct IdTokenClaims {
  std::string subject;   // "sub"
  std::string username;  // "preferred_username", else "sub"
  std::string email;
  std::vector<std::string> roles;  // the roles claim's values (absent: none)
  int64_t expires_at_s = 0;
};

class OidcVerifier {
 public:
  // Reads the provider's discovery document ("<issuer>/.well-known/openid-configuration", whose "issuer" must be
  // `settings.issuer`) and its keys. Unavailable naming the issuer and what failed when it cannot.
  static StatusOr<std::unique_ptr<OidcVerifier>> Discover(OidcSettings settings);

  // The claims of `id_token` when it is valid at `now_s` (and carries `nonce`, when given). Unauthenticated saying
  // what is wrong otherwise: not a JWT, an algorithm other than RS256, a key the provider does not publish, a bad
  // signature, another issuer or audience, expired, issued in the future, or a missing or other nonce.
  StatusOr<IdTokenClaims> Verify(std::string_view id_token, int64_t now_s,
                                 std::optional<std::string_view> nonce = std::nullopt);
  // Whether `claims` make a platform_admin (one of admin_groups among its roles).
  bool IsPlatformAdmin(const IdTokenClaims& claims) const;
  // The project roles `claims` give: each roles-claim value "<project>:<role>" (role viewer, editor or owner; e.g.
  // "vision:editor"), the highest when a project is named twice. Other values are ignored.
  static std::map<std::string, storage::ProjectRole> ProjectRoles(const IdTokenClaims& claims);

  const OidcSettings& settings() const { return settings_; }
  // The provider's discovery document (its endpoints, for clients).
  const nlohmann::json& discovery() const { return discovery_; }

 private:
  struct Key;
  explicit OidcVerifier(OidcSettings settings) : settings_(std::move(settings)) {}
  // Reads jwks_uri and replaces the keys. Blocking; under mu_.
  Status FetchKeysLocked();
  // The key `kid` names, reading the keys again (at most once every 10 s) when it is not known. Under mu_.
  std::shared_ptr<const Key> FindKeyLocked(const std::string& kid);

  const OidcSettings settings_;
  nlohmann::json discovery_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Key>> keys_;  // by "kid"
  // When a token with an unknown key last made the keys be read again.
  std::optional<std::chrono::steady_clock::time_point> unknown_key_read_at_;
};

}  // namespace parsyn::coordinator
