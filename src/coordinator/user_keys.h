// Users, their API keys, the projects and their members as the coordinator checks them (docs/operations.md, "Users,
// projects and roles"): every request's key is looked up here by its sha256, and its roles with it, without a store
// call. Loaded from the store when the coordinator starts and when it becomes the leader (LoadUserKeys), and changed
// together with the store by the user, key and project routes (only the leader writes). Loop thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// Who a request's credential names.
struct Caller {
  int64_t user_id = 0;
  std::string name;  // the user's name: what logs and the audit log call the actor
  bool platform_admin = false;
  std::map<int64_t, storage::ProjectRole> roles;  // project id -> the user's role there
};

// The store's users, keys, projects and members, for UserKeys::Reset. Blocking.
struct StoredUserKeys {
  std::vector<storage::User> users;
  std::vector<storage::ApiKey> keys;
  std::vector<storage::Project> projects;
  std::vector<storage::ProjectMember> members;
};
StatusOr<StoredUserKeys> LoadUserKeys(storage::MetadataStore& store);

// The prefix of user API keys ("puk_" and 64 hex digits); the admin key's is "psk_".
inline constexpr std::string_view kUserKeyPrefix = "puk_";

// A browser signed in with single sign-on holds its session's key in an HttpOnly cookie, and a CSRF token in a cookie
// its pages can read: a state-changing request authenticated by the cookie must repeat that token in the header
// (double submit), which another site's page cannot.
inline constexpr std::string_view kSessionCookie = "parsyn_session";
inline constexpr std::string_view kCsrfCookie = "parsyn_csrf";
inline constexpr std::string_view kCsrfHeader = "X-CSRF-Token";

class UserKeys {
 public:
  // Replaces everything with the store's.
  void Reset(const StoredUserKeys& stored);
  void AddUser(const storage::User& user);
  void AddKey(const storage::ApiKey& key);
  // The key's revoked_at_ms set (a key it does not know is ignored).
  void RevokeKey(const storage::ApiKey& key);
  // The caller a key's sha256 belongs to at `now_ms`. Unauthenticated "invalid API key" for an unknown key, and one
  // naming the key, its user and what to do for an expired or revoked one.
  StatusOr<Caller> Authenticate(std::string_view key_sha256, int64_t now_ms) const;
  // The key with this sha256 (revoked and expired ones too); nullptr when none.
  const storage::ApiKey* FindKey(std::string_view key_sha256) const;
  // The user with this id; nullptr when none.
  const storage::User* FindUser(int64_t id) const;
  const storage::User* FindUserByName(std::string_view name) const;

  void AddProject(const storage::Project& project);
  // Adds the member or changes their role.
  void SetMember(const storage::ProjectMember& member);
  void RemoveMember(int64_t project_id, int64_t user_id);
  // nullptr when none.
  const storage::Project* FindProject(int64_t id) const;
  const storage::Project* FindProjectByName(std::string_view name) const;
  const std::map<int64_t, storage::Project>& projects() const { return projects_; }
  // The project's members by user id.
  std::vector<storage::ProjectMember> Members(int64_t project_id) const;
  // The user's roles: project id -> role.
  std::map<int64_t, storage::ProjectRole> RolesOf(int64_t user_id) const;

 private:
  struct DigestHash {
    using is_transparent = void;
    size_t operator()(std::string_view digest) const { return std::hash<std::string_view>{}(digest); }
  };
  std::unordered_map<std::string, storage::ApiKey, DigestHash, std::equal_to<>> keys_by_sha256_;
  std::map<int64_t, storage::User> users_;
  std::map<int64_t, storage::Project> projects_;
  // Every collection request looks its project up by name.
  std::map<std::string, int64_t, std::less<>> project_ids_by_name_;
  std::map<int64_t, std::map<int64_t, storage::ProjectRole>> roles_by_user_;  // user -> project -> role
};

// A user name: 1 to 64 of [a-z0-9._@-], not "anonymous" (the audit log's name for a refused credential).
// InvalidArgument saying what is wrong.
Status CheckUserName(std::string_view name);

}  // namespace parsyn::coordinator
