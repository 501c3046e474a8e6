// REST API v1 for projects and their members (docs/operations.md, "Users, projects and roles"). Each change goes to
// the store first, then to the service's UserKeys, which checks every request's roles.
#include "coordinator/api_json.h"
#include "coordinator/project_access.h"
#include "coordinator/service.h"
#include "coordinator/service_routes.h"
#include "loop/loop_tools.h"
#include "protocol/json_fields.h"

namespace parsyn::coordinator {

namespace {

using protocol::JsonFields;
using storage::ProjectRole;

json ProjectView(const storage::Project& p) {
  return {{"id", p.id}, {"name", p.name}, {"created_at_ms", p.created_at_ms}};
}

class ProjectRoutes {
 public:
  ProjectRoutes(const RouteContext& context, UserKeys& directory) : context_(context), directory_(directory) {}

  // POST /api/v1/projects {"name", "owner"?: a user name}: a platform admin makes a project; its first owner is the
  // named user (the caller when absent).
  Awaitable<Response> Create(Request& req, const Caller& caller) {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"name", "owner"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    const std::string name = fields->String("name", true, 64).value_or("");
    const std::string owner_name = fields->String("owner", false, 64).value_or(caller.name);
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    if (Status valid = CheckProjectName(name); !valid.ok()) co_return Response::Error(valid);
    const storage::User* owner = directory_.FindUserByName(owner_name);
    if (owner == nullptr) co_return Response::Error(NotFoundError("owner: user '" + owner_name + "' not found"));
    const storage::Project project{.name = name, .created_at_ms = context_.clock.UnixMillis()};
    const int64_t owner_id = owner->id;
    auto create = loop::Offload(context_.pool, [this, project, owner_id]() -> StatusOr<storage::Project> {
      PARSYN_ASSIGN_OR_RETURN(storage::Project created, context_.store.CreateProject(project));
      PARSYN_RETURN_IF_ERROR(context_.store.SetProjectMember({created.id, owner_id, ProjectRole::kOwner}));
      return created;
    });
    StatusOr<storage::Project> created = co_await std::move(create);  // kCoAwaitTemporaries
    if (!created.ok()) co_return Response::Error(created.status());
    directory_.AddProject(*created);
    directory_.SetMember({created->id, owner_id, ProjectRole::kOwner});
    req.scope_id = created->id;
    req.scope = created->name;
    co_return Created("/api/v1/projects", created->id, ProjectView(*created));
  }

  // GET /api/v1/projects: the projects the caller is a member of (a platform admin: all), each with "role".
  Awaitable<Response> List(Request&, const Caller& caller) {
    json items = json::array();
    for (const auto& [id, project] : directory_.projects()) {
      const std::optional<ProjectRole> role = RoleIn(caller, id);
      if (!role) continue;
      json view = ProjectView(project);
      view["role"] = storage::ToString(*role);
      items.push_back(std::move(view));
    }
    co_return Response::Json(200, {{"projects", std::move(items)}});
  }

  // GET /api/v1/projects/{id}: the project, with its members.
  Awaitable<Response> Get(Request& req, const Caller& caller) {
    const storage::Project* project = directory_.FindProject(req.scope_id);
    if (project == nullptr) co_return Response::Error(NotFoundError("project not found"));
    json view = ProjectView(*project);
    view["role"] = storage::ToString(RoleIn(caller, project->id).value_or(ProjectRole::kViewer));
    view["members"] = MembersJson(project->id);
    co_return Response::Json(200, view);
  }

  // POST /api/v1/projects/{id}/members {"user": name, "role"}: adds the user or changes their role (owners).
  Awaitable<Response> SetMember(Request& req, const Caller& caller) {
    StatusOr<JsonFields> fields = JsonFields::Parse(req.body, {"user", "role"});
    if (!fields.ok()) co_return Response::Error(fields.status());
    const std::string user_name = fields->String("user", true, 64).value_or("");
    const std::string role_name = fields->String("role", true, 16).value_or("");
    if (!fields->status().ok()) co_return Response::Error(fields->status());
    StatusOr<ProjectRole> role = storage::ParseProjectRole(role_name);
    if (!role.ok()) co_return Response::Error(InvalidArgumentError("role: " + role.status().message()));
    const storage::User* user = directory_.FindUserByName(user_name);
    if (user == nullptr) co_return Response::Error(NotFoundError("user: user '" + user_name + "' not found"));
    const int64_t project_id = req.scope_id;
    if (user->id == caller.user_id && !caller.platform_admin &&
        *role > RoleIn(caller, project_id).value_or(ProjectRole::kViewer)) {
      co_return Response::Error(PermissionDeniedError("a user cannot raise their own role; ask another owner"));
    }
    const storage::ProjectMember member{project_id, user->id, *role};
    auto set = loop::Offload(context_.pool, [this, member] { return context_.store.SetProjectMember(member); });
    Status stored = co_await std::move(set);  // kCoAwaitTemporaries
    if (stored.code() == StatusCode::kFailedPrecondition) {
      co_return Response::Error(FailedPreconditionError(user->name + " is the last owner of project " + req.scope +
                                                        ": make another member its owner first"));
    }
    if (!stored.ok()) co_return Response::Error(stored);
    directory_.SetMember(member);
    co_return Response::Json(200, {{"members", MembersJson(project_id)}});
  }

  // DELETE /api/v1/projects/{id}/members/{user_id}: an owner removes a member.
  Awaitable<Response> RemoveMember(Request& req, const Caller&) {
    StatusOr<int64_t> user_id = ParseId(req.params["user_id"], "user id");
    if (!user_id.ok()) co_return Response::Error(user_id.status());
    co_return co_await Remove(req, *user_id);
  }

  // DELETE /api/v1/projects/{id}/membership: the caller leaves the project.
  Awaitable<Response> Leave(Request& req, const Caller& caller) {
    if (!caller.roles.contains(req.scope_id)) {
      co_return Response::Error(NotFoundError(caller.name + " is not a member of project " + req.scope +
                                              " (a platform admin sees every project without being its member)"));
    }
    co_return co_await Remove(req, caller.user_id);
  }

  // The membership of `user_id` in the route's project, removed unless it is the last owner's.
  Awaitable<Response> Remove(Request& req, int64_t user_id) {
    const int64_t project_id = req.scope_id;
    auto remove = loop::Offload(
        context_.pool, [this, project_id, user_id] { return context_.store.RemoveProjectMember(project_id, user_id); });
    Status removed = co_await std::move(remove);  // kCoAwaitTemporaries
    if (removed.code() == StatusCode::kFailedPrecondition) {
      co_return Response::Error(FailedPreconditionError("user " + std::to_string(user_id) +
                                                        " is the last owner of project " + req.scope +
                                                        " and cannot leave it: make another member its owner first"));
    }
    if (!removed.ok()) co_return Response::Error(removed);
    directory_.RemoveMember(project_id, user_id);
    co_return Response::NoContent();
  }

 private:
  json MembersJson(int64_t project_id) const {
    json members = json::array();
    for (const storage::ProjectMember& m : directory_.Members(project_id)) {
      const storage::User* u = directory_.FindUser(m.user_id);
      members.push_back({{"user_id", m.user_id}, {"name", u ? u->name : ""}, {"role", storage::ToString(m.role)}});
    }
    return members;
  }

  const RouteContext context_;
  UserKeys& directory_;
};

// The owner of the project a route's {id} names (from UserKeys: no store call).
ObjectProject ProjectById(const UserKeys& directory) {
  return [&directory](const Request& req) -> Awaitable<StatusOr<ObjectOwner>> {
    const auto param = req.params.find("id");
    StatusOr<int64_t> id = ParseId(param == req.params.end() ? "" : param->second, "project");
    if (!id.ok()) co_return id.status();
    const std::string object = "project " + std::to_string(*id);
    if (directory.FindProject(*id) == nullptr) co_return NotFoundError(object + " not found");
    co_return ObjectOwner{*id, object};
  };
}

}  // namespace

Status AddProjectRoutes(RouteTable& routes, const RouteContext& context, Service& service) {
  auto h = std::make_shared<ProjectRoutes>(context, service.user_keys());
  const ObjectProject owner = ProjectById(service.user_keys());
  PARSYN_RETURN_IF_ERROR(routes.Admin(Method::kPost, "/api/v1/projects", Bind(h, &ProjectRoutes::Create)));
  PARSYN_RETURN_IF_ERROR(routes.User(Method::kGet, "/api/v1/projects", Bind(h, &ProjectRoutes::List)));
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kGet, "/api/v1/projects/{id}", Bind(h, &ProjectRoutes::Get),
                                                ProjectRole::kViewer, owner));
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kPost, "/api/v1/projects/{id}/members",
                                                Bind(h, &ProjectRoutes::SetMember), ProjectRole::kOwner, owner));
  PARSYN_RETURN_IF_ERROR(routes.OnProjectObject(Method::kDelete, "/api/v1/projects/{id}/members/{user_id}",
                                                Bind(h, &ProjectRoutes::RemoveMember), ProjectRole::kOwner, owner));
  return routes.OnProjectObject(Method::kDelete, "/api/v1/projects/{id}/membership", Bind(h, &ProjectRoutes::Leave),
                                ProjectRole::kViewer, owner);
}

}  // namespace parsyn::coordinator
