// parsyn project create NAME [--owner USER] | list | members NAME | add-member NAME USER --role R |
//   remove-member NAME USER | leave NAME
// Projects and their members (docs/operations.md, "Users, projects and roles"). Projects and users are named; the
// ids the API takes are looked up from the caller's projects (GET /api/v1/projects) and their members.
#include <iomanip>
#include <iostream>

#include "cli/coordinator_commands.h"
#include "cli/remote.h"

namespace parsyn::cli {
namespace {

using nlohmann::json;

struct ProjectFlags {
  RemoteFlags remote;
  std::string name;
  std::string owner;
  std::string user;
  std::string role;
};

// The caller's project `name` (its JSON with "id"); NotFound naming it and what to do.
StatusOr<json> FindProject(http::Client& client, const std::string& name) {
  PARSYN_ASSIGN_OR_RETURN(http::ClientResponse res, client.Get("/api/v1/projects"));
  PARSYN_ASSIGN_OR_RETURN(json body, res.Json());
  for (const json& p : body["projects"]) {
    if (p["name"] == name) return p;
  }
  return NotFoundError("no project '" + name + "' among yours: `parsyn project list` shows them");
}

std::string ProjectPath(const json& project) { return "/api/v1/projects/" + project["id"].dump(); }

void PrintMembers(const json& members) {
  std::cout << std::left << std::setw(8) << "USER_ID" << std::setw(24) << "NAME"
            << "ROLE\n";
  for (const json& m : members) {
    std::cout << std::left << std::setw(8) << m["user_id"].get<int64_t>() << std::setw(24)
              << m["name"].get<std::string>() << m["role"].get<std::string>() << "\n";
  }
}

int CreateProject(const ProjectFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("project create", client.status());
  json body = {{"name", f.name}};
  if (!f.owner.empty()) body["owner"] = f.owner;
  auto res = (*client)->PostJson("/api/v1/projects", body);
  if (!res.ok()) return Fail("project create", res.status());
  StatusOr<json> project = res->Json();
  if (!project.ok()) return Fail("project create", project.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*project);
    return 0;
  }
  std::cout << "project " << (*project)["id"] << " '" << f.name << "' created, owned by "
            << (f.owner.empty() ? "you" : f.owner) << "\n"
            << "add members: parsyn project add-member " << f.name << " USER --role editor\n";
  return 0;
}

int ListProjects(const ProjectFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("project list", client.status());
  auto res = (*client)->Get("/api/v1/projects");
  if (!res.ok()) return Fail("project list", res.status());
  StatusOr<json> body = res->Json();
  if (!body.ok()) return Fail("project list", body.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*body);
    return 0;
  }
  std::cout << std::left << std::setw(6) << "ID" << std::setw(32) << "NAME"
            << "YOUR ROLE\n";
  for (const json& p : (*body)["projects"]) {
    std::cout << std::left << std::setw(6) << p["id"].get<int64_t>() << std::setw(32) << p["name"].get<std::string>()
              << p["role"].get<std::string>() << "\n";
  }
  return 0;
}

int Members(const ProjectFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("project members", client.status());
  StatusOr<json> project = FindProject(**client, f.name);
  if (!project.ok()) return Fail("project members", project.status());
  auto res = (*client)->Get(ProjectPath(*project));
  if (!res.ok()) return Fail("project members", res.status());
  StatusOr<json> body = res->Json();
  if (!body.ok()) return Fail("project members", body.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*body);
    return 0;
  }
  PrintMembers((*body)["members"]);
  return 0;
}

int AddMember(const ProjectFlags& f) {
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail("project add-member", client.status());
  StatusOr<json> project = FindProject(**client, f.name);
  if (!project.ok()) return Fail("project add-member", project.status());
  auto res = (*client)->PostJson(ProjectPath(*project) + "/members", json{{"user", f.user}, {"role", f.role}});
  if (!res.ok()) return Fail("project add-member", res.status());
  StatusOr<json> body = res->Json();
  if (!body.ok()) return Fail("project add-member", body.status());
  if (JsonOutput(f.remote)) {
    PrintJson(*body);
    return 0;
  }
  std::cout << f.user << " is now " << f.role << " of project " << f.name << "\n";
  PrintMembers((*body)["members"]);
  return 0;
}

// remove-member (an owner removes `f.user`) or leave (`leave`: the caller goes).
int Remove(const ProjectFlags& f, bool leave) {
  const std::string command = leave ? "project leave" : "project remove-member";
  auto client = ConnectToServer(f.remote);
  if (!client.ok()) return Fail(command, client.status());
  StatusOr<json> project = FindProject(**client, f.name);
  if (!project.ok()) return Fail(command, project.status());
  std::string path = ProjectPath(*project) + "/membership";
  if (!leave) {
    auto res = (*client)->Get(ProjectPath(*project));
    if (!res.ok()) return Fail(command, res.status());
    StatusOr<json> body = res->Json();
    if (!body.ok()) return Fail(command, body.status());
    path.clear();
    for (const json& m : (*body)["members"]) {
      if (m["name"] == f.user) path = ProjectPath(*project) + "/members/" + m["user_id"].dump();
    }
    if (path.empty()) return Fail(command, NotFoundError(f.user + " is not a member of project " + f.name));
  }
  auto res = (*client)->Delete(path);
  if (!res.ok()) return Fail(command, res.status());
  if (JsonOutput(f.remote)) {
    PrintJson(json{{"project", f.name}, {"removed", leave ? "you" : f.user}});
    return 0;
  }
  std::cout << (leave ? "you left project " : f.user + " removed from project ") << f.name << "\n";
  return 0;
}

}  // namespace

void AddProjectCommands(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ProjectFlags>();
  CLI::App* projects = SubcommandGroup(app, "project", "projects and their members");
  CLI::App* create = projects->add_subcommand("create", "make a project (platform_admin)");
  AddRemoteFlags(*create, flags->remote);
  create->add_option("name", flags->name, "1 to 64 of a-z 0-9 . _ -")->required();
  create->add_option("--owner", flags->owner, "its first owner's user name (default: you)");
  create->callback([flags, &exit_code] { exit_code = CreateProject(*flags); });
  CLI::App* list = projects->add_subcommand("list", "your projects and your role in each");
  AddRemoteFlags(*list, flags->remote);
  list->callback([flags, &exit_code] { exit_code = ListProjects(*flags); });
  CLI::App* members = projects->add_subcommand("members", "a project's members and their roles");
  AddRemoteFlags(*members, flags->remote);
  members->add_option("name", flags->name, "project name")->required();
  members->callback([flags, &exit_code] { exit_code = Members(*flags); });
  CLI::App* add = projects->add_subcommand("add-member", "add a member or change their role (owner)");
  AddRemoteFlags(*add, flags->remote);
  add->add_option("name", flags->name, "project name")->required();
  add->add_option("user", flags->user, "user name")->required();
  add->add_option("--role", flags->role, "viewer (reads), editor (datasets, models, workers, jobs) or owner")
      ->required()
      ->check(CLI::IsMember({"viewer", "editor", "owner"}));
  add->callback([flags, &exit_code] { exit_code = AddMember(*flags); });
  CLI::App* remove = projects->add_subcommand("remove-member", "remove a member (owner)");
  AddRemoteFlags(*remove, flags->remote);
  remove->add_option("name", flags->name, "project name")->required();
  remove->add_option("user", flags->user, "user name")->required();
  remove->callback([flags, &exit_code] { exit_code = Remove(*flags, /*leave=*/false); });
  CLI::App* leave = projects->add_subcommand("leave", "leave a project (its last owner cannot)");
  AddRemoteFlags(*leave, flags->remote);
  leave->add_option("name", flags->name, "project name")->required();
  leave->callback([flags, &exit_code] { exit_code = Remove(*flags, /*leave=*/true); });
}

}  // namespace parsyn::cli
