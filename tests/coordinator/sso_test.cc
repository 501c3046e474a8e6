// Single sign-on against a real OpenID Connect provider (tests/support/oidc_provider.py, on python3-authlib's server
// classes) and a real `parsyn server --oidc-issuer`: the provider's ID tokens, from its device flow, are traded for
// API keys of their users with the role the groups claim gives; tampered, expired, other-audience and unknown-key
// tokens are refused saying which, creating nothing; a key rotation at the provider is followed; and `parsyn login`
// signs in end to end.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <regex>
#include <thread>

#include "base/strings.h"
#include "base/subprocess.h"
#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"
#include "base/testing/raw_socket.h"
#include "base/text_file.h"
#include "harness.h"
#include "http/status_codes.h"

namespace parsyn::testing {
namespace {

using ::testing::HasSubstr;

class SsoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string script = test_support::SourcePath("tests/support/oidc_provider.py");
    StatusOr<Subprocess> provider = Subprocess::Start(
        "/usr/bin/python3", {script, "--port", "0", "--issuer-host", "127.0.0.1", "--client-id", "parsyn-cli", "--user",
                             "alice:wonderland:groups=parsyn-admins,team-a", "--user",
                             "bob:builder:groups=team-a,vision:editor,vision:viewer,nowhere:owner"});
    ASSERT_TRUE(provider.ok()) << provider.status().ToString();
    provider_.emplace(std::move(*provider));
    const std::optional<std::string> first = provider_->ReadLine();
    if (!first) PARSYN_SKIP_FOR_MISSING_DEPENDENCY("the OIDC provider did not start (python3-authlib: ./dev setup)");
    issuer_ = json::parse(*first)["issuer"].get<std::string>();
    idp_ = std::make_unique<http::Client>(http::ClientOptions{.base_url = issuer_, .max_attempts = 1});
    server_ = std::make_unique<ServerProcess>(
        dir_.path() / "data", std::vector<std::string>{"--oidc-issuer", issuer_, "--oidc-client-id", "parsyn-cli",
                                                       "--oidc-admin-group", "parsyn-admins"});
    admin_ = AdminClient(*server_);
  }
  void TearDown() override {
    if (provider_) provider_->Terminate();
  }
  StatusOr<json> PostForm(const std::string& path, const std::string& body) {
    PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res,
                            idp_->Send(http::Method::kPost, path, body, "application/x-www-form-urlencoded",
                                       {.headers = {{"Expect", ""}}}));
    return res.body.empty() ? json::object() : json::parse(res.body, nullptr, false);
  }
  // An ID token of `user` from the provider's device flow, approved as the user would.
  std::string IdToken(const std::string& user, const std::string& password) {
    StatusOr<json> device =
        PostForm("/device_authorization",
                 http::FormEncode({{"client_id", "parsyn-cli"}, {"scope", "openid profile email groups"}}));
    EXPECT_TRUE(device.ok()) << device.status().ToString();
    if (!device.ok()) return "";
    EXPECT_TRUE(PostForm("/device", http::FormEncode({{"user_code", (*device)["user_code"].get<std::string>()},
                                                      {"username", user},
                                                      {"password", password}}))
                    .ok());
    StatusOr<json> token =
        PostForm("/token", http::FormEncode({{"grant_type", "urn:ietf:params:oauth:grant-type:device_code"},
                                             {"device_code", (*device)["device_code"].get<std::string>()},
                                             {"client_id", "parsyn-cli"}}));
    EXPECT_TRUE(token.ok()) << token.status().ToString();
    return token.ok() ? (*token)["id_token"].get<std::string>() : "";
  }
  // The next token the provider issues: expired, for another audience, or signed by a key it does not publish.
  void NextToken(const json& change) { ASSERT_TRUE(idp_->PostJson("/test/next-token", change).ok()); }
  StatusOr<http::ClientResponse> SignIn(const std::string& id_token) {
    http::Client anyone({.base_url = server_->url(), .max_attempts = 1});
    return anyone.PostJson("/api/v1/auth/oidc/token", {{"id_token", id_token}});
  }
  size_t Users() { return (*(*admin_->Get("/api/v1/users")).Json())["users"].size(); }

  TempDir dir_;
  std::optional<Subprocess> provider_;
  std::string issuer_;
  std::unique_ptr<http::Client> idp_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
};

TEST_F(SsoTest, AnIdTokenBecomesAKeyOfItsUserWithTheRoleItsGroupsGive) {
  StatusOr<http::ClientResponse> settings = admin_->Get("/api/v1/auth/oidc");
  ASSERT_TRUE(settings.ok());
  EXPECT_EQ((*settings->Json())["device_authorization_endpoint"], issuer_ + "/device_authorization");

  StatusOr<http::ClientResponse> alice = SignIn(IdToken("alice", "wonderland"));
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  const json alice_key = *alice->Json();
  EXPECT_EQ(alice_key["user"], "alice");
  EXPECT_EQ(alice_key["platform_admin"], true);
  const double hours = (alice_key["expires_at_ms"].get<double>() - alice_key["created_at_ms"].get<double>()) / 3.6e6;
  EXPECT_NEAR(hours, 12, 0.01);  // the default session
  EXPECT_EQ(ClientWithToken(*server_, alice_key["key"])->Get("/api/v1/workers")->status, 200);

  // bob's groups make him an editor of project vision (the higher of the two roles it names; a project that does
  // not exist is skipped), and of nothing else.
  StatusOr<http::ClientResponse> vision = admin_->PostJson("/api/v1/projects", {{"name", "vision"}});
  ASSERT_TRUE(vision.ok()) << vision.status().ToString();
  StatusOr<http::ClientResponse> bob = SignIn(IdToken("bob", "builder"));
  ASSERT_TRUE(bob.ok()) << bob.status().ToString();
  const json bob_key = *bob->Json();
  EXPECT_EQ(bob_key["platform_admin"], false);
  auto as_bob = ClientWithToken(*server_, bob_key["key"]);
  EXPECT_EQ(as_bob->Get("/api/v1/workers").status().code(), StatusCode::kNotFound);  // the default project
  EXPECT_EQ(as_bob->Get("/api/v1/workers?project=vision")->status, 200);
  EXPECT_EQ(StatusOf(as_bob->PostJson("/api/v1/workers?project=vision", {{"name", "bobs"}})), 201);
  EXPECT_EQ(as_bob->Get("/api/v1/audit?project=vision").status().code(),
            StatusCode::kPermissionDenied);  // owners only
  const json projects = *(*as_bob->Get("/api/v1/projects")).Json();
  ASSERT_EQ(projects["projects"].size(), 1u) << projects.dump();
  EXPECT_EQ(projects["projects"][0]["role"], "editor");
  EXPECT_EQ(as_bob->Get("/api/v1/keys")->status, 200);
  // Signing in again reuses the user; each sign-in is in the audit log under the user's name.
  ASSERT_TRUE(SignIn(IdToken("alice", "wonderland")).ok());
  EXPECT_EQ(Users(), 3u);  // admin, alice, bob
  StatusOr<http::ClientResponse> audit = admin_->Get("/api/v1/audit?actor=alice");
  ASSERT_TRUE(audit.ok());
  const json records = (*audit->Json())["records"];
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["action"], "POST /api/v1/auth/oidc/token");
}

TEST_F(SsoTest, TamperedExpiredOtherAudienceAndUnknownKeyTokensAreRefusedSayingWhich) {
  const std::string good = IdToken("alice", "wonderland");
  // A changed payload (its groups, say) no longer matches the signature.
  const size_t dot = good.find('.');
  json claims = json::parse(*Base64UrlDecode(good.substr(dot + 1, good.find('.', dot + 1) - dot - 1)));
  claims["groups"] = {"parsyn-admins", "everything"};
  const std::string tampered =
      good.substr(0, dot + 1) + Base64UrlEncode(claims.dump()) + good.substr(good.find('.', dot + 1));
  struct Case {
    std::string what;
    json next_token;  // what the provider is told for the next token; null: `tampered`
    std::string says;
  };
  const std::vector<Case> cases = {
      {"tampered", nullptr, "its signature does not verify"},
      {"expired", {{"expires_in", -300}}, "it expired"},
      {"another audience", {{"audience", "someone-else"}}, "it is for audience \"someone-else\""},
      {"an unknown key", {{"sign_with_unknown_key", true}}, "which the provider does not publish"},
  };
  for (const Case& c : cases) {
    std::string token = tampered;
    if (!c.next_token.is_null()) {
      NextToken(c.next_token);
      token = IdToken("bob", "builder");
    }
    StatusOr<http::ClientResponse> refused = SignIn(token);
    EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << c.what;
    EXPECT_THAT(refused.status().message(), HasSubstr(c.says)) << c.what;
  }
  EXPECT_EQ(SignIn("not.a-token").status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(Users(), 1u);  // nothing made: only the admin
  EXPECT_TRUE((*(*admin_->Get("/api/v1/keys?user_id=1")).Json())["keys"].empty());
  StatusOr<http::ClientResponse> denied =
      admin_->Get("/api/v1/audit?outcome=denied&action=" + http::PercentEncode("POST /api/v1/auth/oidc/token"));
  ASSERT_TRUE(denied.ok());
  EXPECT_EQ((*denied->Json())["records"].size(), 5u);
}

TEST_F(SsoTest, AKeyRotationAtTheProviderIsFollowed) {
  const std::string before = IdToken("alice", "wonderland");
  ASSERT_TRUE(idp_->Send(http::Method::kPost, "/test/rotate-keys?drop_old=1", "", "").ok());
  // A token of the new key: the coordinator reads the provider's keys again and takes it.
  StatusOr<http::ClientResponse> after = SignIn(IdToken("alice", "wonderland"));
  EXPECT_TRUE(after.ok()) << after.status().ToString();
  // The old key is gone from the provider's keys: its tokens are refused from now on.
  StatusOr<http::ClientResponse> old = SignIn(before);
  EXPECT_EQ(old.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(old.status().message(), HasSubstr("does not publish"));
}

TEST_F(SsoTest, TheBrowserSignInGoesToTheProviderWithPkceAndRefusesAnUnknownState) {
  // The redirect as a browser gets it (the HTTP client here does not take a 302 for an answer).
  const uint16_t port = static_cast<uint16_t>(std::stoi(server_->url().substr(server_->url().rfind(':') + 1)));
  const int fd = test_support::ConnectLoopback(port);
  const std::string request =
      "GET /api/v1/auth/oidc/login?return_to=%2F%2Fevil.example HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
      "close\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  const std::string answer = test_support::ReadUntilClosed(fd);
  ::close(fd);
  EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 302"));
  std::smatch found;
  ASSERT_TRUE(std::regex_search(answer, found, std::regex("\r\n[Ll]ocation: ([^\r]+)\r\n"))) << answer;
  const std::string location = found[1];
  http::Client browser({.base_url = server_->url(), .max_attempts = 1});
  EXPECT_THAT(location, ::testing::StartsWith(issuer_ + "/authorize?response_type=code&client_id=parsyn-cli"));
  EXPECT_THAT(location, HasSubstr("code_challenge_method=S256"));
  EXPECT_THAT(location, HasSubstr("&nonce="));
  EXPECT_THAT(location,
              HasSubstr("redirect_uri=" + http::PercentEncode(server_->url() + "/api/v1/auth/oidc/callback")));
  StatusOr<http::ClientResponse> forged = browser.Get("/api/v1/auth/oidc/callback?code=x&state=not-one-we-made");
  EXPECT_EQ(forged.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(forged.status().message(), HasSubstr("unknown or expired"));
  EXPECT_EQ(Users(), 1u);
}

TEST_F(SsoTest, ParsynLoginSignsInWithADeviceCodeAndSavesTheKeyWhereTheCliFindsIt) {
  const std::filesystem::path config = dir_.path() / "config";
  StatusOr<Subprocess> login =
      Subprocess::Start(test_support::BuildPath("parsyn"), {"login", "--server", server_->url()},
                        {.environment = {{"XDG_CONFIG_HOME", config.string()}}});
  ASSERT_TRUE(login.ok()) << login.status().ToString();
  // "To sign in, open URL and enter the code XXXX-XXXX": the user does so on the provider's page.
  std::optional<std::string> line = login->ReadLine();
  ASSERT_TRUE(line.has_value());
  const std::smatch code = [&] {
    std::smatch m;
    std::regex_search(*line, m, std::regex("enter the code (\\S+)"));
    return m;
  }();
  ASSERT_EQ(code.size(), 2u) << *line;
  ASSERT_TRUE(
      PostForm("/device",
               http::FormEncode({{"user_code", code[1].str()}, {"username", "alice"}, {"password", "wonderland"}}))
          .ok());
  std::string output;
  while (std::optional<std::string> more = login->ReadLine()) output += *more + "\n";
  EXPECT_EQ(login->Wait(), 0) << output;
  EXPECT_THAT(output, HasSubstr("signed in as alice (platform_admin) until"));
  const StatusOr<std::string> saved = ReadTrimmedTextFile(config / "parsyn" / "login-key");
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string key = *saved;
  EXPECT_THAT(key, ::testing::StartsWith("puk_"));
  EXPECT_EQ((std::filesystem::status(config / "parsyn" / "login-key").permissions() & std::filesystem::perms::all),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  // The other commands use it without being told.
  StatusOr<Subprocess> list = Subprocess::Start(
      test_support::BuildPath("parsyn"), {"key", "list", "--server", server_->url()},
      {.environment = {{"XDG_CONFIG_HOME", config.string()}, {"PARSYN_DATA_DIR", (dir_.path() / "none").string()}}});
  ASSERT_TRUE(list.ok());
  std::string listed;
  while (std::optional<std::string> more = list->ReadLine()) listed += *more + "\n";
  EXPECT_EQ(list->Wait(), 0) << listed;
  EXPECT_THAT(listed, HasSubstr("parsyn login"));
  EXPECT_THAT(listed, HasSubstr("alice"));
}

}  // namespace
}  // namespace parsyn::testing
