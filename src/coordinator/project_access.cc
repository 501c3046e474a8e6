#include "coordinator/project_access.h"

#include <algorithm>

namespace parsyn::coordinator {

namespace {

std::string RouteName(const http::Request& req) { return std::string(http::MethodName(req.method)) + " " + req.route; }

Status RoleTooLow(const http::Request& req, const Caller& caller, std::string_view project, storage::ProjectRole needed,
                  storage::ProjectRole held) {
  return PermissionDeniedError(RouteName(req) + " needs the " + std::string(storage::ToString(needed)) +
                               " role in project " + std::string(project) + "; user " + caller.name + " is its " +
                               std::string(storage::ToString(held)) + ": ask one of its owners");
}

}  // namespace

std::optional<storage::ProjectRole> RoleIn(const Caller& caller, int64_t project_id) {
  if (caller.platform_admin) return storage::ProjectRole::kOwner;
  const auto it = caller.roles.find(project_id);
  if (it == caller.roles.end()) return std::nullopt;
  return it->second;
}

StatusOr<const storage::Project*> RequestProject(const http::Request& req, const Caller& caller,
                                                 const UserKeys& directory, storage::ProjectRole needed) {
  std::string name(req.Header(kProjectHeader));
  if (name.empty()) {
    if (auto it = req.query.find(std::string(kProjectParam)); it != req.query.end()) name = it->second;
  }
  if (name.empty()) name = kDefaultProjectName;
  return NamedProject(req, name, caller, directory, needed);
}

StatusOr<const storage::Project*> NamedProject(const http::Request& req, std::string_view name_view,
                                               const Caller& caller, const UserKeys& directory,
                                               storage::ProjectRole needed) {
  const std::string name(name_view);
  const storage::Project* project = directory.FindProjectByName(name);
  const std::optional<storage::ProjectRole> role = project == nullptr ? std::nullopt : RoleIn(caller, project->id);
  if (!role) {
    return NotFoundError("project '" + name.substr(0, 64) + "' not found: `parsyn project list` shows the projects " +
                         caller.name + " is a member of (choose one with the " + std::string(kProjectHeader) +
                         " header, or `project` in the CLI's config)");
  }
  if (*role < needed) return RoleTooLow(req, caller, project->name, needed, *role);
  return project;
}

Status CheckObjectRole(const http::Request& req, const Caller& caller, int64_t project_id, std::string_view object,
                       storage::ProjectRole needed, const UserKeys& directory) {
  if (project_id == kManagedPool) {
    if (needed == storage::ProjectRole::kViewer || caller.platform_admin) return Status::Ok();
    return PermissionDeniedError(RouteName(req) + " on " + std::string(object) +
                                 " (of the managed pool) needs the platform_admin role, which user " + caller.name +
                                 " does not have: ask a platform admin");
  }
  const std::optional<storage::ProjectRole> role = RoleIn(caller, project_id);
  if (!role) return NotFoundError(std::string(object) + " not found");
  if (*role < needed) {
    const storage::Project* project = directory.FindProject(project_id);
    return RoleTooLow(req, caller, project ? project->name : std::to_string(project_id), needed, *role);
  }
  return Status::Ok();
}

Status CheckProjectName(std::string_view name) {
  const bool allowed = !name.empty() && name.size() <= 64 && name[0] != '.' && name[0] != '-' && name[0] != '_' &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                       });
  if (!allowed) {
    return InvalidArgumentError(
        "project name must be 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. "
        "\"vision-team\"), got '" +
        std::string(name.substr(0, 64)) + "'");
  }
  return Status::Ok();
}

}  // namespace parsyn::coordinator
