// Users and API keys against a real `parsyn server`: a platform_admin's key does what the admin key does, another
// user's key reaches only its own keys (403 naming the role elsewhere, 404 for another user's user or keys), revoked
// and expired keys are refused saying which, keys survive a restart, and every refusal changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "coordinator/auth.h"
#include "harness.h"
#include "http/status_codes.h"
#include "storage/metadata_store.h"

namespace parsyn::testing {
namespace {

using ::testing::HasSubstr;

class UsersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<ServerProcess>(dir_.path() / "data");
    admin_ = AdminClient(*server_);
  }
  json CreateUser(const std::string& name, bool platform_admin) {
    StatusOr<http::ClientResponse> res =
        admin_->PostJson("/api/v1/users", {{"name", name}, {"platform_admin", platform_admin}});
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  }
  // A new key of `user_id` made with the admin key: its view, with "key".
  json CreateKey(int64_t user_id, const std::string& name, http::Client* as = nullptr) {
    json body = {{"name", name}};
    if (as == nullptr) body["user_id"] = user_id;
    StatusOr<http::ClientResponse> res = (as ? *as : *admin_).PostJson("/api/v1/keys", body);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? *res->Json() : json();
  }
  std::unique_ptr<http::Client> As(const std::string& key) { return ClientWithToken(*server_, key); }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<http::Client> admin_;
};

TEST_F(UsersTest, APlatformAdminsKeyDoesWhatTheAdminKeyDoesAndOtherUsersOnlyTheirOwnKeys) {
  const json alice = CreateUser("alice", true);
  const json bob = CreateUser("bob", false);
  EXPECT_EQ(alice["platform_admin"], true);
  EXPECT_EQ(bob["platform_admin"], false);
  const json alice_key = CreateKey(alice["id"], "laptop");
  ASSERT_THAT(alice_key["key"].get<std::string>(), ::testing::StartsWith("puk_"));
  EXPECT_EQ(alice_key["user"], "alice");
  auto as_alice = As(alice_key["key"]);
  auto as_bob = As(CreateKey(bob["id"], "first")["key"]);

  // alice: everything, recorded as alice.
  EXPECT_EQ(StatusOf(as_alice->Get("/api/v1/datasets")), 200);
  ASSERT_TRUE(as_alice->PostJson("/api/v1/workers", {{"name", "alices-worker"}}).ok());
  StatusOr<http::ClientResponse> audit = admin_->Get("/api/v1/audit?actor=alice");
  ASSERT_TRUE(audit.ok());
  ASSERT_EQ((*audit->Json())["records"].size(), 1u);
  EXPECT_EQ((*audit->Json())["records"][0]["action"], "POST /api/v1/workers");

  // bob, a member of no project: the default project's routes answer 404 naming the project (before reading a
  // body), the platform's 403 naming the role; nothing created.
  StatusOr<http::ClientResponse> datasets = as_bob->Get("/api/v1/datasets");
  EXPECT_EQ(datasets.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(datasets.status().message(), HasSubstr("project 'default' not found"));
  StatusOr<http::ClientResponse> users =
      as_bob->PostJson("/api/v1/users", {{"name", "mallory"}, {"platform_admin", true}});
  EXPECT_EQ(users.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(users.status().message(),
              HasSubstr("POST /api/v1/users needs the platform_admin role, which user bob does not have"));
  EXPECT_EQ(StatusOf(as_bob->PostJson("/api/v1/workers", {{"name", "bobs"}})), 404);
  EXPECT_EQ((*(*admin_->Get("/api/v1/users")).Json())["users"].size(), 3u);  // admin, alice, bob
  // He cannot make keys for others, nor see or revoke theirs: another user's things answer 404.
  EXPECT_EQ(StatusOf(as_bob->PostJson("/api/v1/keys", {{"name", "x"}, {"user_id", alice["id"]}})), 403);
  EXPECT_EQ(StatusOf(as_bob->Get("/api/v1/keys?user_id=" + alice["id"].dump())), 404);
  EXPECT_EQ(StatusOf(as_bob->Delete("/api/v1/keys/" + alice_key["id"].dump())), 404);
  EXPECT_EQ(StatusOf(as_bob->Get("/api/v1/users/" + alice["id"].dump())), 404);
  EXPECT_EQ(StatusOf(as_alice->Get("/api/v1/datasets")), 200);  // alice's key still works
  // His own: himself, his keys (never a key itself), a new key with an expiry.
  StatusOr<http::ClientResponse> me = as_bob->Get("/api/v1/users/" + bob["id"].dump());
  ASSERT_TRUE(me.ok());
  EXPECT_EQ((*me->Json())["name"], "bob");
  const json second = CreateKey(0, "ci", as_bob.get());
  EXPECT_EQ(second["user_id"], bob["id"]);
  StatusOr<http::ClientResponse> created = as_bob->PostJson("/api/v1/keys", {{"name", "week"}, {"expires_in_days", 7}});
  ASSERT_TRUE(created.ok());
  const json week = *created->Json();
  EXPECT_NEAR(week["expires_at_ms"].get<double>() - week["created_at_ms"].get<double>(), 7 * 86'400'000.0, 1);
  StatusOr<http::ClientResponse> mine = as_bob->Get("/api/v1/keys");
  ASSERT_TRUE(mine.ok());
  const json keys = (*mine->Json())["keys"];
  ASSERT_EQ(keys.size(), 3u);
  for (const json& k : keys) {
    EXPECT_FALSE(k.contains("key")) << k.dump();
    EXPECT_EQ(k["user"], "bob");
  }
  // The admin sees anyone's keys.
  StatusOr<http::ClientResponse> bobs = admin_->Get("/api/v1/keys?user_id=" + bob["id"].dump());
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ((*bobs->Json())["keys"].size(), 3u);
}

TEST_F(UsersTest, RevokedAndExpiredKeysAreRefusedSayingWhichAndKeysSurviveARestart) {
  const json carol = CreateUser("carol", true);
  const json key = CreateKey(carol["id"], "laptop");
  const json other = CreateKey(carol["id"], "desktop");
  auto as_carol = As(key["key"]);
  ASSERT_EQ(StatusOf(as_carol->Get("/api/v1/workers")), 200);
  StatusOr<http::ClientResponse> revoked = as_carol->Delete("/api/v1/keys/" + key["id"].dump());
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_TRUE((*revoked->Json())["revoked_at_ms"].is_number());
  StatusOr<http::ClientResponse> refused = as_carol->Get("/api/v1/workers");
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("API key 'laptop' (" + key["id"].dump() + ") of user carol was revoked"));

  // An expired key, written into the store while the server is down (a key's shortest life is a day).
  server_->Terminate();
  const std::string expired_key = "puk_expired-key-for-the-test-0123456789abcdef";
  {
    StatusOr<std::unique_ptr<storage::MetadataStore>> store =
        storage::OpenMetadataStore((dir_.path() / "data" / "metadata.db").string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)
                    ->CreateApiKey(storage::ApiKey{.user_id = carol["id"],
                                                   .name = "old",
                                                   .key_sha256 = coordinator::HashSecret(expired_key),
                                                   .created_at_ms = 1,
                                                   .expires_at_ms = 2})
                    .ok());
  }
  server_->Restart();
  admin_ = AdminClient(*server_);
  StatusOr<http::ClientResponse> expired = As(expired_key)->Get("/api/v1/workers");
  EXPECT_EQ(expired.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(expired.status().message(), HasSubstr("API key 'old'"));
  EXPECT_THAT(expired.status().message(), HasSubstr("expired at 1970-01-01T00:00:00.002Z"));
  // After the restart the revoked key is still refused and the other still works.
  EXPECT_EQ(StatusOf(As(key["key"])->Get("/api/v1/workers")), 401);
  EXPECT_EQ(StatusOf(As(other["key"])->Get("/api/v1/workers")), 200);
  // Each refusal is in the audit log, with the reason (a key refused before its route's handler ran is recorded right
  // after the answer).
  std::string details;
  for (int i = 0; i < 100 && details.find("expired at") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StatusOr<http::ClientResponse> denied = admin_->Get("/api/v1/audit?outcome=denied");
    ASSERT_TRUE(denied.ok());
    details.clear();
    const json page = *denied->Json();
    for (const json& r : page["records"]) details += r["detail"].get<std::string>() + "\n";
  }
  EXPECT_THAT(details, HasSubstr("was revoked"));
  EXPECT_THAT(details, HasSubstr("expired at"));
}

TEST_F(UsersTest, BadUsersAndKeysAreRefusedNamingTheField) {
  struct Case {
    std::string path;
    json body;
    int status;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"/api/v1/users", {{"name", "Alice Smith"}}, 400, "name must be 1 to 64 of a-z"},
      {"/api/v1/users", {{"name", "anonymous"}}, 400, "reserved"},
      {"/api/v1/users", {{"name", "admin"}}, 409, "a user named 'admin' already exists"},
      {"/api/v1/users", {{"name", "dave"}, {"role", "owner"}}, 400, "role"},
      {"/api/v1/keys", {{"name", "k"}, {"expires_in_days", 0}}, 400, "expires_in_days"},
      {"/api/v1/keys", {{"name", "k"}, {"user_id", 999}}, 404, "user 999 not found"},
      {"/api/v1/keys", json::object(), 400, "name"},
  };
  for (const Case& c : cases) {
    StatusOr<http::ClientResponse> res = admin_->PostJson(c.path, c.body);
    EXPECT_EQ(StatusOf(res), c.status) << c.body.dump();
    EXPECT_THAT(res.status().message(), HasSubstr(c.says)) << c.body.dump();
  }
  EXPECT_EQ((*(*admin_->Get("/api/v1/users")).Json())["users"].size(), 1u);
  EXPECT_TRUE((*(*admin_->Get("/api/v1/keys")).Json())["keys"].empty());
  EXPECT_EQ(StatusOf(admin_->Delete("/api/v1/keys/12345")), 404);
}

}  // namespace
}  // namespace parsyn::testing
