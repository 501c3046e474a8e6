// Who may act in which project (docs/operations.md, "Users, projects and roles"): a request's project, and the role a
// caller holds there. The checks RouteTable's project routes run; pure functions over the caller and UserKeys.
// Loop thread only (UserKeys).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "coordinator/user_keys.h"
#include "http/server.h"
#include "storage/metadata_store.h"

namespace parsyn::coordinator {

// What names a request's project: the header, else the query parameter (for clients that cannot set headers, such as
// a browser's EventSource), else the default project.
inline constexpr std::string_view kProjectHeader = "X-Parsyn-Project";
inline constexpr std::string_view kProjectParam = "project";
inline constexpr std::string_view kDefaultProjectName = "default";

// The project id of the managed worker pool's objects (the managed workers): every user reads them, only platform
// admins change them.
inline constexpr int64_t kManagedPool = 0;

// The role `caller` holds in project `project_id`: owner everywhere for a platform_admin; nullopt when they are not
// its member.
std::optional<storage::ProjectRole> RoleIn(const Caller& caller, int64_t project_id);

// The request's project, in which `caller` must hold `needed`: NotFound naming the project when it does not exist or
// the caller is not its member (so names do not leak), PermissionDenied naming the route, the role and the caller's.
StatusOr<const storage::Project*> RequestProject(const http::Request& req, const Caller& caller,
                                                 const UserKeys& directory, storage::ProjectRole needed);
// The same for the project named `name`.
StatusOr<const storage::Project*> NamedProject(const http::Request& req, std::string_view name, const Caller& caller,
                                               const UserKeys& directory, storage::ProjectRole needed);

// Whether `caller` may act with `needed` on `object` ("dataset 7") of project `project_id`: NotFound "<object> not
// found" for a caller who is not the project's member (the answer an unknown id gets), PermissionDenied naming the
// role for one whose role is lower. Objects of kManagedPool: viewers' routes are open to every user, the others need
// platform_admin.
Status CheckObjectRole(const http::Request& req, const Caller& caller, int64_t project_id, std::string_view object,
                       storage::ProjectRole needed, const UserKeys& directory);

// A project name: 1 to 64 of [a-z0-9._-], starting with a letter or digit. InvalidArgument saying what is wrong.
Status CheckProjectName(std::string_view name);

}  // namespace parsyn::coordinator
