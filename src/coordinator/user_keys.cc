#include "coordinator/user_keys.h"

#include <algorithm>

#include "base/clock.h"

namespace parsyn::coordinator {

void UserKeys::Reset(const StoredUserKeys& stored) {
  users_.clear();
  keys_by_sha256_.clear();
  projects_.clear();
  project_ids_by_name_.clear();
  roles_by_user_.clear();
  for (const storage::User& u : stored.users) AddUser(u);
  for (const storage::ApiKey& k : stored.keys) AddKey(k);
  for (const storage::Project& p : stored.projects) AddProject(p);
  for (const storage::ProjectMember& m : stored.members) SetMember(m);
}

void UserKeys::AddProject(const storage::Project& project) {
  projects_[project.id] = project;
  project_ids_by_name_[project.name] = project.id;
}

void UserKeys::SetMember(const storage::ProjectMember& member) {
  roles_by_user_[member.user_id][member.project_id] = member.role;
}

void UserKeys::RemoveMember(int64_t project_id, int64_t user_id) {
  auto it = roles_by_user_.find(user_id);
  if (it != roles_by_user_.end()) it->second.erase(project_id);
}

const storage::Project* UserKeys::FindProject(int64_t id) const {
  const auto it = projects_.find(id);
  return it == projects_.end() ? nullptr : &it->second;
}

const storage::Project* UserKeys::FindProjectByName(std::string_view name) const {
  const auto it = project_ids_by_name_.find(name);
  return it == project_ids_by_name_.end() ? nullptr : FindProject(it->second);
}

std::vector<storage::ProjectMember> UserKeys::Members(int64_t project_id) const {
  std::vector<storage::ProjectMember> out;
  for (const auto& [user_id, roles] : roles_by_user_) {
    if (auto it = roles.find(project_id); it != roles.end()) out.push_back({project_id, user_id, it->second});
  }
  return out;
}

void UserKeys::AddUser(const storage::User& user) { users_[user.id] = user; }

void UserKeys::AddKey(const storage::ApiKey& key) { keys_by_sha256_[key.key_sha256] = key; }

void UserKeys::RevokeKey(const storage::ApiKey& key) {
  auto it = keys_by_sha256_.find(key.key_sha256);
  if (it != keys_by_sha256_.end()) it->second.revoked_at_ms = key.revoked_at_ms;
}

StatusOr<Caller> UserKeys::Authenticate(std::string_view key_sha256, int64_t now_ms) const {
  const auto it = keys_by_sha256_.find(key_sha256);
  if (it == keys_by_sha256_.end()) return UnauthenticatedError("invalid API key");
  const storage::ApiKey& key = it->second;
  const storage::User* user = FindUser(key.user_id);
  if (user == nullptr) return UnauthenticatedError("invalid API key");
  const std::string which = "API key '" + key.name + "' (" + std::to_string(key.id) + ") of user " + user->name;
  if (key.revoked_at_ms) {
    return UnauthenticatedError(which + " was revoked at " + Rfc3339Millis(*key.revoked_at_ms) +
                                "; use another key, or make one with `parsyn key create`");
  }
  if (key.expires_at_ms && *key.expires_at_ms <= now_ms) {
    return UnauthenticatedError(which + " expired at " + Rfc3339Millis(*key.expires_at_ms) +
                                "; make a new one with `parsyn key create`");
  }
  return Caller{
      .user_id = user->id, .name = user->name, .platform_admin = user->platform_admin, .roles = RolesOf(user->id)};
}

std::map<int64_t, storage::ProjectRole> UserKeys::RolesOf(int64_t user_id) const {
  auto it = roles_by_user_.find(user_id);
  return it == roles_by_user_.end() ? std::map<int64_t, storage::ProjectRole>{} : it->second;
}

const storage::ApiKey* UserKeys::FindKey(std::string_view key_sha256) const {
  const auto it = keys_by_sha256_.find(key_sha256);
  return it == keys_by_sha256_.end() ? nullptr : &it->second;
}

const storage::User* UserKeys::FindUser(int64_t id) const {
  const auto it = users_.find(id);
  return it == users_.end() ? nullptr : &it->second;
}

const storage::User* UserKeys::FindUserByName(std::string_view name) const {
  for (const auto& [id, u] : users_) {
    if (u.name == name) return &u;
  }
  return nullptr;
}

StatusOr<StoredUserKeys> LoadUserKeys(storage::MetadataStore& store) {
  StoredUserKeys loaded;
  PARSYN_ASSIGN_OR_RETURN(loaded.users, store.ListUsers());
  PARSYN_ASSIGN_OR_RETURN(loaded.keys, store.ListApiKeys());
  PARSYN_ASSIGN_OR_RETURN(loaded.projects, store.ListProjects());
  PARSYN_ASSIGN_OR_RETURN(loaded.members, store.ListProjectMembers());
  return loaded;
}

Status CheckUserName(std::string_view name) {
  const bool allowed = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '@' || c == '-';
  });
  if (!allowed) {
    return InvalidArgumentError(
        "name must be 1 to 64 of a-z, 0-9, '.', '_', '@' and '-' (e.g. \"alice\" or "
        "\"ci-bot\"), got '" +
        std::string(name.substr(0, 64)) + "'");
  }
  if (name == "anonymous") return InvalidArgumentError("name 'anonymous' is reserved (refused credentials)");
  return Status::Ok();
}

}  // namespace parsyn::coordinator
