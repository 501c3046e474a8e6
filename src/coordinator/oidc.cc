#include "coordinator/oidc.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>

#include <algorithm>

#include "base/strings.h"
#include "http/client.h"

namespace parsyn::coordinator {

using nlohmann::json;

namespace {

constexpr int64_t kClockSkewS = 60;
constexpr std::chrono::seconds kKeyRereadInterval{10};

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};

StatusOr<json> GetJson(const OidcSettings& settings, const std::string& url) {
  http::Client client(
      http::ClientOptions{.timeout = std::chrono::seconds(10), .max_attempts = 2, .ca_file = settings.ca_file});
  StatusOr<http::ClientResponse> res = client.Get(url);
  if (!res.ok())
    return UnavailableError("OIDC provider " + settings.issuer + ": GET " + url + ": " + res.status().message());
  StatusOr<json> body = res->Json();
  if (!body.ok() || !body->is_object()) {
    return UnavailableError("OIDC provider " + settings.issuer + ": GET " + url + " answered no JSON object");
  }
  return body;
}

// An RSA public key from a JWK's "n" and "e" (base64url big-endian integers).
StatusOr<std::shared_ptr<EVP_PKEY>> RsaKey(const json& jwk) {
  const std::optional<std::string> n = Base64UrlDecode(jwk.value("n", ""));
  const std::optional<std::string> e = Base64UrlDecode(jwk.value("e", ""));
  if (!n || !e || n->empty() || e->empty()) return InvalidArgumentError("an RSA key without n and e");
  BIGNUM* bn_n = BN_bin2bn(reinterpret_cast<const unsigned char*>(n->data()), static_cast<int>(n->size()), nullptr);
  BIGNUM* bn_e = BN_bin2bn(reinterpret_cast<const unsigned char*>(e->data()), static_cast<int>(e->size()), nullptr);
  OSSL_PARAM_BLD* build = OSSL_PARAM_BLD_new();
  OSSL_PARAM_BLD_push_BN(build, OSSL_PKEY_PARAM_RSA_N, bn_n);
  OSSL_PARAM_BLD_push_BN(build, OSSL_PKEY_PARAM_RSA_E, bn_e);
  OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(build);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, "RSA", nullptr);
  EVP_PKEY* key = nullptr;
  const bool made = ctx != nullptr && params != nullptr && EVP_PKEY_fromdata_init(ctx) == 1 &&
                    EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params) == 1;
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(build);
  BN_free(bn_n);
  BN_free(bn_e);
  if (!made) return InvalidArgumentError("an RSA key OpenSSL does not take");
  return std::shared_ptr<EVP_PKEY>(key, PkeyFree{});
}

bool VerifyRs256(EVP_PKEY* key, std::string_view signed_part, std::string_view signature) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  return EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                          reinterpret_cast<const unsigned char*>(signed_part.data()), signed_part.size()) == 1;
}

// The JSON object of a JWT part; nullopt when it is not base64url of one.
std::optional<json> JsonPart(std::string_view part) {
  const std::optional<std::string> text = Base64UrlDecode(part);
  if (!text) return std::nullopt;
  json value = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return std::nullopt;
  return value;
}

bool HasAudience(const json& aud, const std::string& client_id) {
  if (aud.is_string()) return aud.get<std::string>() == client_id;
  if (!aud.is_array()) return false;
  return std::any_of(aud.begin(), aud.end(), [&](const json& a) { return a.is_string() && a == client_id; });
}

Status Refuse(std::string why) { return UnauthenticatedError("ID token refused: " + why); }

}  // namespace

struct OidcVerifier::Key {
  std::shared_ptr<EVP_PKEY> pkey;
};

StatusOr<std::unique_ptr<OidcVerifier>> OidcVerifier::Discover(OidcSettings settings) {
  std::string base = settings.issuer;
  while (!base.empty() && base.back() == '/') base.pop_back();
  PARSYN_ASSIGN_OR_RETURN(json discovery, GetJson(settings, base + "/.well-known/openid-configuration"));
  if (discovery.value("issuer", "") != settings.issuer) {
    return UnavailableError("OIDC provider " + settings.issuer + ": its discovery document names issuer '" +
                            discovery.value("issuer", "") + "': pass exactly that as --oidc-issuer");
  }
  if (!discovery.contains("jwks_uri") || !discovery["jwks_uri"].is_string()) {
    return UnavailableError("OIDC provider " + settings.issuer + ": its discovery document has no jwks_uri");
  }
  std::unique_ptr<OidcVerifier> verifier(new OidcVerifier(std::move(settings)));
  verifier->discovery_ = std::move(discovery);
  std::lock_guard lock(verifier->mu_);
  PARSYN_RETURN_IF_ERROR(verifier->FetchKeysLocked());
  return verifier;
}

Status OidcVerifier::FetchKeysLocked() {
  PARSYN_ASSIGN_OR_RETURN(json jwks, GetJson(settings_, discovery_["jwks_uri"].get<std::string>()));
  std::map<std::string, std::shared_ptr<const Key>> keys;
  if (jwks.contains("keys") && jwks["keys"].is_array()) {
    for (const json& jwk : jwks["keys"]) {
      if (!jwk.is_object() || jwk.value("kty", "") != "RSA" || jwk.value("use", "sig") != "sig") continue;
      StatusOr<std::shared_ptr<EVP_PKEY>> pkey = RsaKey(jwk);
      if (pkey.ok()) keys[jwk.value("kid", "")] = std::make_shared<const Key>(Key{*pkey});
    }
  }
  keys_ = std::move(keys);
  return Status::Ok();
}

std::shared_ptr<const OidcVerifier::Key> OidcVerifier::FindKeyLocked(const std::string& kid) {
  auto it = keys_.find(kid);
  if (it != keys_.end()) return it->second;
  // A token naming a key not seen: the provider may have rotated its keys. Read them again, but not for every such
  // token (anyone may send one): at most once per kKeyRereadInterval.
  const auto now = std::chrono::steady_clock::now();
  if (unknown_key_read_at_ && now - *unknown_key_read_at_ < kKeyRereadInterval) return nullptr;
  unknown_key_read_at_ = now;
  if (!FetchKeysLocked().ok()) return nullptr;
  it = keys_.find(kid);
  return it == keys_.end() ? nullptr : it->second;
}

StatusOr<IdTokenClaims> OidcVerifier::Verify(std::string_view id_token, int64_t now_s,
                                             std::optional<std::string_view> nonce) {
  const size_t first = id_token.find('.');
  const size_t second = first == std::string_view::npos ? first : id_token.find('.', first + 1);
  if (second == std::string_view::npos || id_token.find('.', second + 1) != std::string_view::npos) {
    return Refuse("it is not a JWT (three base64url parts separated by dots)");
  }
  const std::optional<json> header = JsonPart(id_token.substr(0, first));
  const std::optional<json> claims = JsonPart(id_token.substr(first + 1, second - first - 1));
  const std::optional<std::string> signature = Base64UrlDecode(id_token.substr(second + 1));
  if (!header || !claims || !signature) return Refuse("its parts are not base64url JSON");
  if (header->value("alg", "") != "RS256") {
    return Refuse("it is signed with '" + header->value("alg", "") + "'; this coordinator takes RS256");
  }
  std::shared_ptr<const Key> key;
  {
    std::lock_guard lock(mu_);
    key = FindKeyLocked(header->value("kid", ""));
  }
  if (key == nullptr) {
    return Refuse("it is signed by key '" + header->value("kid", "") + "', which the provider does not publish");
  }
  if (!VerifyRs256(key->pkey.get(), id_token.substr(0, second), *signature)) {
    return Refuse("its signature does not verify (the token was changed, or not signed by the provider)");
  }
  if (claims->value("iss", "") != settings_.issuer) {
    return Refuse("it was issued by '" + claims->value("iss", "") + "', not " + settings_.issuer);
  }
  if (!HasAudience(claims->value("aud", json()), settings_.client_id)) {
    return Refuse("it is for audience " + claims->value("aud", json()).dump() + ", not this coordinator's client id '" +
                  settings_.client_id + "'");
  }
  const int64_t exp = claims->value("exp", int64_t{0});
  if (exp + kClockSkewS <= now_s) return Refuse("it expired " + std::to_string(now_s - exp) + " s ago: sign in again");
  if (claims->value("iat", int64_t{0}) > now_s + kClockSkewS) return Refuse("it is issued in the future");
  if (nonce && claims->value("nonce", "") != *nonce) return Refuse("its nonce is not the one this sign-in sent");
  IdTokenClaims out{.subject = claims->value("sub", ""),
                    .username = claims->value("preferred_username", claims->value("sub", "")),
                    .email = claims->value("email", ""),
                    .expires_at_s = exp};
  if (out.subject.empty()) return Refuse("it names no subject (sub)");
  const json roles = claims->value(settings_.roles_claim, json::array());
  if (roles.is_array()) {
    for (const json& r : roles) {
      if (r.is_string()) out.roles.push_back(r.get<std::string>());
    }
  }
  return out;
}

std::map<std::string, storage::ProjectRole> OidcVerifier::ProjectRoles(const IdTokenClaims& claims) {
  std::map<std::string, storage::ProjectRole> roles;
  for (const std::string& value : claims.roles) {
    const size_t colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0) continue;
    StatusOr<storage::ProjectRole> role = storage::ParseProjectRole(value.substr(colon + 1));
    if (!role.ok()) continue;
    auto [it, added] = roles.emplace(value.substr(0, colon), *role);
    if (!added && it->second < *role) it->second = *role;
  }
  return roles;
}

bool OidcVerifier::IsPlatformAdmin(const IdTokenClaims& claims) const {
  return std::any_of(claims.roles.begin(), claims.roles.end(), [&](const std::string& role) {
    return std::find(settings_.admin_groups.begin(), settings_.admin_groups.end(), role) !=
           settings_.admin_groups.end();
  });
}

}  // namespace parsyn::coordinator
