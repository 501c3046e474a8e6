// parsyn user create --name N [--platform-admin] | list | get ID
// parsyn key create --name N [--expires-in-days D] [--user ID] | list [--user ID] | revoke ID
// Users and their API keys (docs/operations.md, "Users, projects and roles"). `key create` prints the key once;
// pass it as --api-key, PARSYN_API_KEY or a key_file.
#include <iomanip>
#include <iostream>

#include "base/clock.h"
#include "cli/coordinator_commands.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct UserFlags {
  RemoteFlags remote;
  std::string name;
  bool platform_admin = false;
  int64_t expires_in_days = 0;  // 0: never
  int64_t user_id = 0;          // 0: the caller
  int64_t id = 0;
};

std::string TimeOrDash(const json& ms) { return ms.is_number() ? Rfc3339Millis(ms.get<int64_t>()) : "-"; }

int CreateUser(const UserFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("user create", client.status());
  auto res = (*client)->PostJson("/api/v1/users", json{{"name", f.name}, {"platform_admin", f.platform_admin}});
  if (!res.ok()) return Fail("user create", res.status());
  StatusOr<json> user = res->Json();
  if (!user.ok()) return Fail("user create", user.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*user);
    return 0;
  }
  std::cout << "user " << (*user)["id"] << " '" << (*user)["name"].get<std::string>() << "' created"
            << ((*user)["platform_admin"].get<bool>() ? " (platform_admin)" : "") << "\n"
            << "make its first key: parsyn key create --name NAME --user " << (*user)["id"] << "\n";
  return 0;
}

int ListUsers(const UserFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("user list", client.status());
  StatusOr<json> users = ListAll(**client, "/api/v1/users", "users");
  if (!users.ok()) return Fail("user list", users.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("users", *std::move(users)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(24) << "NAME"
            << "PLATFORM_ADMIN\n";
  for (const json& u : *users) {
    std::cout << std::left << std::setw(6) << u["id"].get<int64_t>() << std::setw(24) << u["name"].get<std::string>()
              << (u["platform_admin"].get<bool>() ? "yes" : "no") << "\n";
  }
  return 0;
}

int CreateKey(const UserFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("key create", client.status());
  json body = {{"name", f.name}};
  if (f.expires_in_days > 0) body["expires_in_days"] = f.expires_in_days;
  if (f.user_id > 0) body["user_id"] = f.user_id;
  auto res = (*client)->PostJson("/api/v1/keys", body);
  if (!res.ok()) return Fail("key create", res.status());
  StatusOr<json> key = res->Json();
  if (!key.ok()) return Fail("key create", key.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*key);
    return 0;
  }
  std::cout << "API key " << (*key)["id"] << " '" << (*key)["name"].get<std::string>() << "' of user "
            << (*key)["user"].get<std::string>() << ", expires " << TimeOrDash((*key)["expires_at_ms"]) << "\n"
            << "key (shown once; pass it as --api-key or PARSYN_API_KEY): " << (*key)["key"].get<std::string>() << "\n";
  return 0;
}

int ListKeys(const UserFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("key list", client.status());
  const std::string path = f.user_id > 0 ? "/api/v1/keys?user_id=" + std::to_string(f.user_id) : "/api/v1/keys";
  StatusOr<json> keys = ListAll(**client, path, "keys");
  if (!keys.ok()) return Fail("key list", keys.status());
  if (JsonOutput(f.remote)) {
    PrintJson(ListAnswer("keys", *std::move(keys)));
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(20) << "NAME" << std::setw(16) << "USER" << std::setw(26)
            << "EXPIRES"
            << "REVOKED\n";
  for (const json& k : *keys) {
    std::cout << std::left << std::setw(6) << k["id"].get<int64_t>() << std::setw(20) << k["name"].get<std::string>()
              << std::setw(16) << k.value("user", "") << std::setw(26) << TimeOrDash(k["expires_at_ms"])
              << TimeOrDash(k["revoked_at_ms"]) << "\n";
  }
  return 0;
}

int RevokeKey(const UserFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("key revoke", client.status());
  auto res = (*client)->Delete("/api/v1/keys/" + std::to_string(f.id));
  if (!res.ok()) return Fail("key revoke", res.status());
  StatusOr<json> key = res->Json();
  if (!key.ok()) return Fail("key revoke", key.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*key);
    return 0;
  }
  std::cout << "API key " << f.id << " revoked at " << TimeOrDash((*key)["revoked_at_ms"]) << "\n";
  return 0;
}

}  // namespace

void AddUserCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<UserFlags>();
  CLI::App* users = SubcommandGroup(app, "user", "users (platform_admin)");
  CLI::App* create = users->add_subcommand("create", "create a user");
  AddRemoteFlags(*create, flags->remote);
  create->add_option("--name", flags->name, "1 to 64 of a-z 0-9 . _ @ -")->required();
  create->add_flag("--platform-admin", flags->platform_admin, "the user may do everything, as the admin key");
  create->callback([flags, &exit_code] { exit_code = CreateUser(*flags); });
  CLI::App* list = users->add_subcommand("list", "list users");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = ListUsers(*flags); });
  CLI::App* get = users->add_subcommand("get", "show a user (its JSON)");
  AddRemoteFlags(*get, flags->remote);
  get->add_option("id", flags->id, "user id")->required();
  get->callback([flags, &exit_code] {
    exit_code = PrintResource(flags->remote, "user get", "/api/v1/users/" + std::to_string(flags->id));
  });

  CLI::App* keys = SubcommandGroup(app, "key", "your API keys");
  CLI::App* make = keys->add_subcommand("create", "make an API key; prints it once");
  AddRemoteFlags(*make, flags->remote);
  make->add_option("--name", flags->name, "what the key is for (\"laptop\", \"ci\")")->required();
  make->add_option("--expires-in-days", flags->expires_in_days, "the key stops working after this (default: never)")
      ->check(CLI::Range(int64_t{1}, int64_t{3650}));
  make->add_option("--user", flags->user_id, "another user's id (platform_admin only)");
  make->callback([flags, &exit_code] { exit_code = CreateKey(*flags); });
  CLI::App* mine = keys->add_subcommand("list", "list your keys (never the keys themselves)");
  AddRemoteFlags(*mine, flags->remote);
  mine->add_option("--user", flags->user_id, "another user's id (platform_admin only)");
  mine->callback([flags, &exit_code] { exit_code = ListKeys(*flags); });
  CLI::App* revoke = keys->add_subcommand("revoke", "revoke a key: it is refused from now on");
  AddRemoteFlags(*revoke, flags->remote);
  revoke->add_option("id", flags->id, "key id (parsyn key list)")->required();
  revoke->callback([flags, &exit_code] { exit_code = RevokeKey(*flags); });
}

}  // namespace parsyn::cli
