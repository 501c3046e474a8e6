// parsyn login [--server URL] [--key-out FILE]: single sign-on from the command line (docs/operations.md, "Single
// sign-on"). The device-authorization flow (RFC 8628) with the coordinator's OpenID Connect provider: the CLI asks the
// provider for a code, the user opens the provider's page (any browser, any machine) and enters it, the CLI polls for
// the ID token and trades it at the coordinator (POST /api/v1/auth/oidc/token) for an API key of its user, which it
// saves (0600) where the other commands find it (LoginKeyPath(), remote.h).
#include <chrono>
#include <iostream>
#include <thread>

#include "base/atomic_file.h"
#include "base/clock.h"
#include "cli/coordinator_commands.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct LoginFlags {
  RemoteFlags remote;
  std::string key_out;  // "": LoginKeyPath()
};

// Form posts to the provider go without "Expect: 100-continue", which servers that do not answer it (Python's
// http.server, some proxies) make the client wait a second for.
const http::CallOptions kNoExpect{.headers = {{"Expect", ""}}};

// The ID token, once the user approved the code: polls the token endpoint as the provider asks.
StatusOr<std::string> PollForIdToken(http::Client& provider, const json& settings, const json& device) {
  const std::string token_endpoint = settings.value("token_endpoint", "");
  auto interval = std::chrono::seconds(device.value("interval", 5));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(device.value("expires_in", 600));
  const std::string body = http::FormEncode({{"grant_type", "urn:ietf:params:oauth:grant-type:device_code"},
                                             {"device_code", device.value("device_code", "")},
                                             {"client_id", settings.value("client_id", "")}});
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(interval);
    StatusOr<http::ClientResponse> res =
        provider.Send(http::Method::kPost, token_endpoint, body, "application/x-www-form-urlencoded", kNoExpect);
    if (res.ok()) {
      StatusOr<json> token = res->Json();
      if (token.ok() && token->contains("id_token") && (*token)["id_token"].is_string()) {
        return (*token)["id_token"].get<std::string>();
      }
      return UnavailableError("the provider answered no id_token: is 'openid' among the client's scopes?");
    }
    const std::string why = res.status().message();
    if (why.find("authorization_pending") != std::string::npos) continue;
    if (why.find("slow_down") != std::string::npos) {
      interval += std::chrono::seconds(5);
      continue;
    }
    return UnauthenticatedError("the provider refused the sign-in: " + why);
  }
  return DeadlineExceededError("the code expired before it was entered: run parsyn login again");
}

int Login(const LoginFlags& f) {
  StatusOr<RemoteSettings> remote = ResolveRemote(f.remote, /*need_key=*/false);
  if (!remote.ok()) return Fail("login", remote.status());
  http::Client coordinator(http::ClientOptions{.base_url = remote->server, .ca_file = remote->ca_file});
  StatusOr<http::ClientResponse> answer = coordinator.Get("/api/v1/auth/oidc");
  if (!answer.ok()) return Fail("login", answer.status());
  StatusOr<json> settings = answer->Json();
  if (!settings.ok()) return Fail("login", settings.status());
  if (!(*settings)["device_authorization_endpoint"].is_string()) {
    return Fail("login", FailedPreconditionError("the provider (" + settings->value("issuer", "") +
                                                 ") offers no device authorization"));
  }
  http::Client provider(http::ClientOptions{.max_attempts = 1});
  StatusOr<http::ClientResponse> started =
      provider.Send(http::Method::kPost, (*settings)["device_authorization_endpoint"].get<std::string>(),
                    http::FormEncode({{"client_id", settings->value("client_id", "")},
                                      {"scope", settings->value("scope", "openid")}}),
                    "application/x-www-form-urlencoded", kNoExpect);
  if (!started.ok()) return Fail("login", started.status());
  StatusOr<json> device = started->Json();
  if (!device.ok()) return Fail("login", device.status());
  std::cout << "To sign in, open " << device->value("verification_uri", "") << " and enter the code "
            << device->value("user_code", "") << "\n"
            << "(or open " << device->value("verification_uri_complete", device->value("verification_uri", ""))
            << "). Waiting for the provider..." << std::endl;
  StatusOr<std::string> id_token = PollForIdToken(provider, *settings, *device);
  if (!id_token.ok()) return Fail("login", id_token.status());
  StatusOr<http::ClientResponse> traded =
      coordinator.PostJson("/api/v1/auth/oidc/token", {{"id_token", *id_token}, {"key_name", "parsyn login"}});
  if (!traded.ok()) return Fail("login", traded.status());
  StatusOr<json> key = traded->Json();
  if (!key.ok()) return Fail("login", key.status());
  const std::filesystem::path out = f.key_out.empty() ? LoginKeyPath() : std::filesystem::path(f.key_out);
  std::error_code ec;
  std::filesystem::create_directories(out.parent_path(), ec);
  if (Status saved = WriteFileAtomically(out, key->value("key", "") + "\n", 0600); !saved.ok()) {
    return Fail("login", saved);
  }
  std::cout << "signed in as " << key->value("user", "")
            << (key->value("platform_admin", false) ? " (platform_admin)" : "") << " until "
            << Rfc3339Millis(key->value("expires_at_ms", int64_t{0})) << "; key saved to " << out.string() << "\n";
  return 0;
}

}  // namespace

void AddLoginCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<LoginFlags>();
  CLI::App* login = app.add_subcommand(
      "login", "sign in with the coordinator's single sign-on (a code to enter on the provider's page); saves a key");
  AddRemoteFlags(*login, flags->remote);
  login->add_option("--key-out", flags->key_out, "where to save the key (default: " + LoginKeyPath().string() + ")");
  login->callback([flags, &exit_code] { exit_code = Login(*flags); });
}

}  // namespace parsyn::cli
