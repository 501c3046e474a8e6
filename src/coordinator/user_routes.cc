// Users and their API keys (docs/operations.md, "Users, projects and roles"):
//   POST /api/v1/users, GET /api/v1/users               platform_admin
//   GET /api/v1/users/{id}                               platform_admin, or the user itself
//   POST /api/v1/keys, GET /api/v1/keys                  any user, for their own keys (a platform_admin also for
//   DELETE /api/v1/keys/{id}                             another user's: user_id)
//   GET /api/v1/auth/oidc, POST /api/v1/auth/oidc/token  open: single sign-on's settings, and an ID token for a key
// A key is "puk_" and 64 random hex digits, shown once in POST /keys' answer; the store keeps its sha256. Every
// change goes to the store first, then to the service's UserKeys, which checks each request.
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/secure_random.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "coordinator/auth.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "http/client.h"
#include "protocol/json_fields.h"

namespace parsyn::coordinator {
namespace {

json UserView(const storage::User& u) {
  return {{"id", u.id}, {"name", u.name}, {"platform_admin", u.platform_admin}, {"created_at_ms", u.created_at_ms}};
}

json KeyView(const storage::ApiKey& k, const UserKeys& users) {
  const storage::User* user = users.FindUser(k.user_id);
  return {{"id", k.id},
          {"user_id", k.user_id},
          {"user", user != nullptr ? json(user->name) : json()},
          {"name", k.name},
          {"created_at_ms", k.created_at_ms},
          {"expires_at_ms", k.expires_at_ms ? json(*k.expires_at_ms) : json()},
          {"revoked_at_ms", k.revoked_at_ms ? json(*k.revoked_at_ms) : json()}};
}

// Someone else's user or key looks absent, as an id that does not exist: ids leak nothing.
Status NotFound(std::string_view what, int64_t id) {
  return NotFoundError(std::string(what) + " " + std::to_string(id) + " not found");
}

class UserRoutes {
 public:
  UserRoutes(const RouteContext& context, Service& service)
      : context_(context), service_(service), users_(service.user_keys()) {}

  Awaitable<Response> CreateUser(Request& req) {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "platform_admin"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    storage::User user{.name = fields->String("name", true, 64).value_or(""),
                       .platform_admin = fields->Bool("platform_admin", false).value_or(false),
                       .created_at_ms = context_.clock.UnixMillis()};
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    if (Status name = CheckUserName(user.name); !name.ok()) co_return Response::Error(name);
    auto create = loop::Offload(context_.pool, [this, user] { return context_.store.CreateUser(user); });
    StatusOr<storage::User> created = co_await std::move(create);  // kCoAwaitTemporaries
    if (!created.ok()) co_return Response::Error(created.status());
    users_.AddUser(*created);
    co_return Created("/api/v1/users", created->id, UserView(*created));
  }

  Awaitable<Response> ListUsers(Request& req) {
    co_return co_await ListRecords(
        context_, req, "users",
        [](storage::MetadataStore& store, const storage::IdPage& page) { return store.ListUsers(page); }, UserView);
  }

  Awaitable<Response> GetUser(Request& req, const Caller& caller) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "user id");
    if (!id.ok()) co_return Response::Error(id.status());
    const storage::User* user = users_.FindUser(*id);
    if (user == nullptr || (!caller.platform_admin && *id != caller.user_id)) {
      co_return Response::Error(NotFound("user", *id));
    }
    co_return Response::Json(200, UserView(*user));
  }

  Awaitable<Response> CreateKey(Request& req, const Caller& caller) {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "expires_in_days", "user_id"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    constexpr int64_t kMaxDays = 3650;
    const std::string name = fields->String("name", true, 64).value_or("");
    const std::optional<int64_t> days = fields->Int("expires_in_days", false, 1, kMaxDays);
    const int64_t user_id = fields->Int("user_id", false, 1, INT64_MAX).value_or(caller.user_id);
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    if (user_id != caller.user_id && !caller.platform_admin) {
      co_return Response::Error(PermissionDeniedError(
          "only a platform_admin makes keys for another user; leave out user_id to make one of your own"));
    }
    if (users_.FindUser(user_id) == nullptr) co_return Response::Error(NotFound("user", user_id));
    const int64_t now = context_.clock.UnixMillis();
    auto make = MakeKey(user_id, name, days ? std::optional(now + *days * 86'400'000) : std::nullopt);
    StatusOr<json> made = co_await std::move(make);  // kCoAwaitTemporaries
    if (!made.ok()) co_return Response::Error(made.status());
    co_return Created("/api/v1/keys", (*made)["id"].get<int64_t>(), *made);
  }

  // GET /api/v1/auth/oidc: what a client needs to sign in with the provider (`parsyn login`).
  Awaitable<Response> SignInSettings(Request&) {
    if (service_.oidc() == nullptr) co_return Response::Error(SsoOff());
    const OidcVerifier& oidc = *service_.oidc();
    json answer = {{"issuer", oidc.settings().issuer},
                   {"client_id", oidc.settings().client_id},
                   {"scope", "openid profile email " + oidc.settings().roles_claim}};
    for (const char* endpoint : {"authorization_endpoint", "token_endpoint", "device_authorization_endpoint"}) {
      answer[endpoint] = oidc.discovery().value(endpoint, json());
    }
    co_return Response::Json(200, answer);
  }

  // POST /api/v1/auth/oidc/token {"id_token", "key_name"?}: the provider's ID token for an API key of its user, made
  // (with the role the roles claim gives) on the first sign-in, lasting ServiceOptions::session_lifetime.
  Awaitable<Response> SignIn(Request& req) {
    if (service_.oidc() == nullptr) co_return Response::Error(SsoOff());
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"id_token", "key_name"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    const std::string token = fields->String("id_token", true, 16 << 10).value_or("");
    const std::string key_name = fields->String("key_name", false, 64).value_or("sign-in");
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    OidcVerifier* oidc = service_.oidc();
    const int64_t now = context_.clock.UnixMillis();
    // On the pool: a token naming a new key makes the verifier read the provider's keys again.
    auto verify = loop::Offload(context_.pool, [oidc, token, now] { return oidc->Verify(token, now / 1000); });
    StatusOr<IdTokenClaims> claims = co_await std::move(verify);  // kCoAwaitTemporaries
    if (!claims.ok()) co_return Response::Error(claims.status());
    auto session = StartSession(req, *claims, key_name);
    StatusOr<json> made = co_await std::move(session);  // kCoAwaitTemporaries
    if (!made.ok()) co_return Response::Error(made.status());
    co_return Response::Json(200, *made);
  }

  // The user of valid ID-token claims (made at the first sign-in, its role from the claims) and a key of it lasting
  // the session's lifetime: the key's view with "key" and "platform_admin". The request's actor is the user.
  Awaitable<StatusOr<json>> StartSession(Request& req, IdTokenClaims claims, std::string key_name) {
    const std::string name = ToLower(claims.username);
    if (Status valid = CheckUserName(name); !valid.ok()) {
      co_return PermissionDeniedError("the provider's user name cannot be a Parsyn user: " + valid.message());
    }
    req.principal = name;
    auto user = EnsureUser(name, service_.oidc()->IsPlatformAdmin(claims));
    StatusOr<storage::User> signed_in = co_await std::move(user);  // kCoAwaitTemporaries
    if (!signed_in.ok()) co_return signed_in.status();
    auto roles = GrantProjectRoles(signed_in->id, OidcVerifier::ProjectRoles(claims));
    co_await std::move(roles);  // kCoAwaitTemporaries
    const int64_t lifetime_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(service_.options().session_lifetime).count();
    auto make = MakeKey(signed_in->id, std::move(key_name), context_.clock.UnixMillis() + lifetime_ms);
    StatusOr<json> made = co_await std::move(make);  // kCoAwaitTemporaries
    if (made.ok()) (*made)["platform_admin"] = signed_in->platform_admin;
    co_return made;
  }

  // A new key of `user_id`, stored and in force: its view with "key", the key itself (to be shown once).
  Awaitable<StatusOr<json>> MakeKey(int64_t user_id, std::string name, std::optional<int64_t> expires_at_ms) {
    StatusOr<std::string> secret = NewSecret(kUserKeyPrefix);
    if (!secret.ok()) co_return secret.status();
    const storage::ApiKey key{.user_id = user_id,
                              .name = std::move(name),
                              .key_sha256 = HashSecret(*secret),
                              .created_at_ms = context_.clock.UnixMillis(),
                              .expires_at_ms = expires_at_ms};
    auto create = loop::Offload(context_.pool, [this, key] { return context_.store.CreateApiKey(key); });
    StatusOr<storage::ApiKey> created = co_await std::move(create);  // kCoAwaitTemporaries
    if (!created.ok()) co_return created.status();
    users_.AddKey(*created);
    json view = KeyView(*created, users_);
    view["key"] = *secret;
    co_return view;
  }

  // The roles the provider's groups give (OidcVerifier::ProjectRoles) in projects that exist, set at each sign-in
  // (a membership the groups do not name is left as it is). One the store refuses (it would leave a project without
  // an owner) is logged and skipped.
  Awaitable<void> GrantProjectRoles(int64_t user_id, std::map<std::string, storage::ProjectRole> roles) {
    for (const auto& [project_name, role] : roles) {
      const storage::Project* project = users_.FindProjectByName(project_name);
      if (project == nullptr) continue;
      const storage::ProjectMember member{project->id, user_id, role};
      auto set = loop::Offload(context_.pool, [this, member] { return context_.store.SetProjectMember(member); });
      Status stored = co_await std::move(set);  // kCoAwaitTemporaries
      if (!stored.ok()) {
        PARSYN_LOG_WARN("single sign-on: role {} in project {} for user {} not set: {}", storage::ToString(role),
                        project_name, user_id, stored.ToString());
        continue;
      }
      users_.SetMember(member);
    }
  }

  // The user `name`, created on its first sign-in; its platform_admin follows the provider's claims.
  Awaitable<StatusOr<storage::User>> EnsureUser(std::string name, bool platform_admin) {
    const int64_t now = context_.clock.UnixMillis();
    auto ensure = loop::Offload(context_.pool, [this, name, platform_admin, now]() -> StatusOr<storage::User> {
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::User> users, context_.store.ListUsers());
      for (const storage::User& u : users) {
        if (u.name != name) continue;
        if (u.platform_admin == platform_admin) return u;
        return context_.store.SetUserPlatformAdmin(u.id, platform_admin);
      }
      return context_.store.CreateUser({.name = name, .platform_admin = platform_admin, .created_at_ms = now});
    });
    StatusOr<storage::User> user = co_await std::move(ensure);  // kCoAwaitTemporaries
    if (user.ok()) users_.AddUser(*user);
    co_return user;
  }

  // GET /api/v1/auth/oidc/login?return_to=PATH: the browser's sign-in (authorization code with PKCE, S256): a 302 to
  // the provider's page, with a state, nonce and code challenge this coordinator keeps for 10 minutes.
  Awaitable<Response> BrowserSignIn(Request& req) {
    if (service_.oidc() == nullptr) co_return Response::Error(SsoOff());
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(pending_, [now](const auto& p) { return p.second.expires < now; });
    if (pending_.size() >= kMaxPendingSignIns) {
      co_return Response::Error(UnavailableError("too many sign-ins in progress: try again in a minute"));
    }
    std::string return_to = req.query.contains("return_to") ? req.query["return_to"] : "/";
    // Only a path of this server: never a redirect elsewhere ("//host", "https://...").
    if (!return_to.starts_with("/") || return_to.starts_with("//") || return_to.find('\\') != std::string::npos) {
      return_to = "/";
    }
    StatusOr<std::string> state = SecureRandomHex(16);
    StatusOr<std::string> nonce = SecureRandomHex(16);
    StatusOr<std::string> verifier = SecureRandomHex(32);
    if (!state.ok() || !nonce.ok() || !verifier.ok()) co_return Response::Error(UnavailableError("no randomness"));
    const OidcVerifier& oidc = *service_.oidc();
    const std::string challenge = Base64UrlEncode(HexDecode(Sha256Hex(*verifier)).value_or(""));
    const std::string url = oidc.discovery().value("authorization_endpoint", "") + "?" +
                            http::FormEncode({{"response_type", "code"},
                                              {"client_id", oidc.settings().client_id},
                                              {"redirect_uri", RedirectUri()},
                                              {"scope", "openid profile email " + oidc.settings().roles_claim},
                                              {"state", *state},
                                              {"nonce", *nonce},
                                              {"code_challenge", challenge},
                                              {"code_challenge_method", "S256"}});
    pending_[*state] = PendingSignIn{*nonce, *verifier, return_to, now + std::chrono::minutes(10)};
    Response res;
    res.status = 302;
    res.headers.emplace_back("Location", url);
    co_return res;
  }

  // GET /api/v1/auth/oidc/callback?code=&state=: the provider sends the browser back here. The code is exchanged (with
  // the verifier) for the ID token, which is checked (with the nonce); the session is a key of its user in an HttpOnly
  // cookie, with the CSRF token beside it; then a 302 to where the sign-in started.
  Awaitable<Response> BrowserCallback(Request& req) {
    if (service_.oidc() == nullptr) co_return Response::Error(SsoOff());
    if (req.query.contains("error")) {
      co_return Response::Error(UnauthenticatedError("the provider refused the sign-in: " + req.query["error"]));
    }
    const auto pending = pending_.find(req.query["state"]);
    if (pending == pending_.end() || pending->second.expires < std::chrono::steady_clock::now()) {
      co_return Response::Error(
          InvalidArgumentError("this sign-in is unknown or expired (10 minutes): start again from the dashboard"));
    }
    const PendingSignIn sign_in = pending->second;
    pending_.erase(pending);
    OidcVerifier* oidc = service_.oidc();
    const std::string form = http::FormEncode({{"grant_type", "authorization_code"},
                                               {"code", req.query["code"]},
                                               {"redirect_uri", RedirectUri()},
                                               {"client_id", oidc->settings().client_id},
                                               {"code_verifier", sign_in.verifier}});
    const int64_t now = context_.clock.UnixMillis();
    auto exchange = loop::Offload(context_.pool, [oidc, form, now, nonce = sign_in.nonce]() -> StatusOr<IdTokenClaims> {
      http::Client provider(http::ClientOptions{.max_attempts = 1, .ca_file = oidc->settings().ca_file});
      PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res,
                              provider.Send(http::Method::kPost, oidc->discovery().value("token_endpoint", ""), form,
                                            "application/x-www-form-urlencoded", {.headers = {{"Expect", ""}}}));
      PARSYN_ASSIGN_OR_RETURN(json tokens, res.Json());
      if (!tokens.contains("id_token") || !tokens["id_token"].is_string()) {
        return UnauthenticatedError("the provider answered no ID token");
      }
      return oidc->Verify(tokens["id_token"].get<std::string>(), now / 1000, nonce);
    });
    StatusOr<IdTokenClaims> claims = co_await std::move(exchange);  // kCoAwaitTemporaries
    if (!claims.ok()) co_return Response::Error(claims.status());
    auto session = StartSession(req, *claims, "dashboard sign-in");
    StatusOr<json> key = co_await std::move(session);  // kCoAwaitTemporaries
    if (!key.ok()) co_return Response::Error(key.status());
    StatusOr<std::string> csrf = SecureRandomHex(16);
    if (!csrf.ok()) co_return Response::Error(csrf.status());
    const int64_t max_age =
        std::chrono::duration_cast<std::chrono::seconds>(service_.options().session_lifetime).count();
    Response res;
    res.status = 302;
    res.headers.emplace_back("Location", sign_in.return_to);
    res.headers.emplace_back("Set-Cookie", Cookie(kSessionCookie, (*key)["key"].get<std::string>(), max_age, true));
    res.headers.emplace_back("Set-Cookie", Cookie(kCsrfCookie, *csrf, max_age, false));
    co_return res;
  }

  // POST /api/v1/auth/logout: the session's key is revoked and its cookies cleared.
  Awaitable<Response> SignOut(Request& req, const Caller& caller) {
    const std::optional<std::string> session = req.Cookie(kSessionCookie);
    if (const storage::ApiKey* key = session ? users_.FindKey(HashSecret(*session)) : nullptr) {
      auto revoke = loop::Offload(context_.pool, [this, id = key->id, now = context_.clock.UnixMillis()] {
        return context_.store.RevokeApiKey(id, now);
      });
      StatusOr<storage::ApiKey> revoked = co_await std::move(revoke);  // kCoAwaitTemporaries
      if (revoked.ok()) users_.RevokeKey(*revoked);
    }
    Response res = Response::Json(200, {{"signed_out", caller.name}});
    res.headers.emplace_back("Set-Cookie", Cookie(kSessionCookie, "", 0, true));
    res.headers.emplace_back("Set-Cookie", Cookie(kCsrfCookie, "", 0, false));
    co_return res;
  }

  static Status SsoOff() {
    return NotFoundError("single sign-on is off: start the server with --oidc-issuer URL --oidc-client-id ID");
  }

  Awaitable<Response> ListKeys(Request& req, const Caller& caller) {
    StatusOr<int64_t> user_id = IntQuery(req, "user_id", caller.user_id, 1, INT64_MAX);
    if (!user_id.ok()) co_return Response::Error(user_id.status());
    if (*user_id != caller.user_id && !caller.platform_admin) co_return Response::Error(NotFound("user", *user_id));
    const int64_t owner = *user_id;
    co_return co_await ListRecords(
        context_, req, "keys",
        [owner](storage::MetadataStore& store, const storage::IdPage& page) { return store.ListApiKeys(owner, page); },
        [this](const storage::ApiKey& k) { return KeyView(k, users_); });
  }

  Awaitable<Response> RevokeKey(Request& req, const Caller& caller) {
    StatusOr<int64_t> id = ParseId(req.params["id"], "key id");
    if (!id.ok()) co_return Response::Error(id.status());
    const int64_t key_id = *id;
    const int64_t now = context_.clock.UnixMillis();
    // Read first: another user's key is not revoked, and answers as if it did not exist.
    auto revoke = loop::Offload(context_.pool, [this, key_id, now, caller]() -> StatusOr<storage::ApiKey> {
      PARSYN_ASSIGN_OR_RETURN(std::vector<storage::ApiKey> keys,
                              context_.store.ListApiKeys(std::nullopt, {.after_id = key_id - 1, .limit = 1}));
      if (keys.empty() || keys[0].id != key_id || (!caller.platform_admin && keys[0].user_id != caller.user_id)) {
        return NotFound("API key", key_id);
      }
      return context_.store.RevokeApiKey(key_id, now);
    });
    StatusOr<storage::ApiKey> revoked = co_await std::move(revoke);  // kCoAwaitTemporaries
    if (!revoked.ok()) co_return Response::Error(revoked.status());
    users_.RevokeKey(*revoked);
    co_return Response::Json(200, KeyView(*revoked, users_));
  }

 private:
  struct PendingSignIn {
    std::string nonce;
    std::string verifier;
    std::string return_to;
    std::chrono::steady_clock::time_point expires;
  };
  static constexpr size_t kMaxPendingSignIns = 10'000;

  // Where the provider sends the browser back: this coordinator's public URL.
  std::string RedirectUri() const { return service_.options().public_url + "/api/v1/auth/oidc/callback"; }
  // "name=value; Path=/; Max-Age=N; SameSite=Strict" with HttpOnly when `http_only`, Secure when the server speaks
  // HTTPS (a browser drops Secure cookies of plain HTTP).
  std::string Cookie(std::string_view name, std::string_view value, int64_t max_age, bool http_only) const {
    std::string cookie = std::string(name) + "=" + std::string(value) + "; Path=/; Max-Age=" + std::to_string(max_age) +
                         "; SameSite=Strict";
    if (http_only) cookie += "; HttpOnly";
    if (service_.options().tls) cookie += "; Secure";
    return cookie;
  }

  const RouteContext context_;
  Service& service_;
  UserKeys& users_;
  std::map<std::string, PendingSignIn> pending_;  // browser sign-ins under way, by state
};

}  // namespace

Status AddUserRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<UserRoutes>(context, service);
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/users", Bind(h, &UserRoutes::CreateUser)));
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kGet, "/api/v1/users", Bind(h, &UserRoutes::ListUsers)));
  PARSYN_RETURN_IF_ERROR(routes.User(Method::kGet, "/api/v1/users/{id}", Bind(h, &UserRoutes::GetUser)));
  PARSYN_RETURN_IF_ERROR(routes.User(Method::kPost, "/api/v1/keys", Bind(h, &UserRoutes::CreateKey)));
  PARSYN_RETURN_IF_ERROR(routes.User(Method::kGet, "/api/v1/keys", Bind(h, &UserRoutes::ListKeys)));
  PARSYN_RETURN_IF_ERROR(routes.User(Method::kDelete, "/api/v1/keys/{id}", Bind(h, &UserRoutes::RevokeKey)));
  PARSYN_RETURN_IF_ERROR(routes.Open(Method::kGet, "/api/v1/auth/oidc", Bind(h, &UserRoutes::SignInSettings)));
  PARSYN_RETURN_IF_ERROR(routes.Open(Method::kGet, "/api/v1/auth/oidc/login", Bind(h, &UserRoutes::BrowserSignIn)));
  // The credential is the provider's ID token (with the sign-in's state, on the callback), checked by the handler.
  PARSYN_RETURN_IF_ERROR(routes.SignIn(Method::kPost, "/api/v1/auth/oidc/token", Bind(h, &UserRoutes::SignIn)));
  PARSYN_RETURN_IF_ERROR(
      routes.SignIn(Method::kGet, "/api/v1/auth/oidc/callback", Bind(h, &UserRoutes::BrowserCallback)));
  return routes.User(Method::kPost, "/api/v1/auth/logout", Bind(h, &UserRoutes::SignOut));
}

}  // namespace parsyn::coordinator
