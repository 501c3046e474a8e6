#include "storage/sql/sql_metadata_store.h"
#include "storage/sql/sql_store_internal.h"

// SqlMetadataStore's users, API keys and audit log (the rest is in sql_metadata_store.cc and
// sql_metadata_store_rounds.cc).
namespace parsyn::storage {

using namespace sql_internal;  // NOLINT(google-build-using-namespace): this file implements what it declares

namespace {

constexpr const char* kApiKeyColumns = "id, user_id, name, key_sha256, created_at_ms, expires_at_ms, revoked_at_ms";

ApiKey ReadApiKey(const SqlStatement& row) {
  return ApiKey{.id = row.Int(0),
                .user_id = row.Int(1),
                .name = row.Text(2),
                .key_sha256 = row.Text(3),
                .created_at_ms = row.Int(4),
                .expires_at_ms = row.OptInt(5),
                .revoked_at_ms = row.OptInt(6)};
}

User ReadUser(const SqlStatement& row) {
  return User{.id = row.Int(0), .name = row.Text(1), .platform_admin = row.Bool(2), .created_at_ms = row.Int(3)};
}

}  // namespace

StatusOr<User> SqlMetadataStore::CreateUser(const User& user) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q, "INSERT INTO users (name, platform_admin, created_at_ms) VALUES ($1, $2, $3) RETURNING id");
  q->Bind(user.name, user.platform_admin, user.created_at_ms);
  StatusOr<int64_t> id = q->RunReturningId();
  if (id.status().code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("a user named '" + user.name + "' already exists");
  }
  PARSYN_RETURN_IF_ERROR(id.status());
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  User stored = user;
  stored.id = *id;
  return stored;
}

StatusOr<User> SqlMetadataStore::SetUserPlatformAdmin(int64_t id, bool platform_admin) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  {
    PARSYN_PREPARE(q, "UPDATE users SET platform_admin = $2 WHERE id = $1");
    q->Bind(id, platform_admin);
    PARSYN_RETURN_IF_ERROR(q->Run());
    if (q->changes() == 0) return NotFoundError("user " + std::to_string(id) + " not found");
  }
  PARSYN_PREPARE(q, "SELECT id, name, platform_admin, created_at_ms FROM users WHERE id = $1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("user " + std::to_string(id) + " not found");
  User user = ReadUser(*q);
  q.reset();
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return user;
}

StatusOr<User> SqlMetadataStore::GetUser(int64_t id) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT id, name, platform_admin, created_at_ms FROM users WHERE id = $1");
  q->Bind(id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("user " + std::to_string(id) + " not found");
  return ReadUser(*q);
}

StatusOr<std::vector<User>> SqlMetadataStore::ListUsers(const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT id, name, platform_admin, created_at_ms FROM users WHERE id > $1 ORDER BY id LIMIT $2");
  q->Bind(page.after_id, page.limit);
  return ReadAll<User>(*q, ReadUser);
}

StatusOr<ApiKey> SqlMetadataStore::CreateApiKey(const ApiKey& key) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q,
                 "INSERT INTO api_keys (user_id, name, key_sha256, created_at_ms, expires_at_ms, revoked_at_ms) "
                 "VALUES ($1, $2, $3, $4, $5, $6) RETURNING id");
  q->Bind(key.user_id, key.name, key.key_sha256, key.created_at_ms, key.expires_at_ms, key.revoked_at_ms);
  StatusOr<int64_t> id = q->RunReturningId();
  if (q->violated() == SqlConstraint::kForeignKey) {
    return NotFoundError("user " + std::to_string(key.user_id) + " not found");
  }
  if (id.status().code() == StatusCode::kAlreadyExists) return AlreadyExistsError("this API key is already stored");
  PARSYN_RETURN_IF_ERROR(id.status());
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  ApiKey stored = key;
  stored.id = *id;
  return stored;
}

StatusOr<std::vector<ApiKey>> SqlMetadataStore::ListApiKeys(std::optional<int64_t> user_id, const IdPage& page) {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, std::string("SELECT ") + kApiKeyColumns +
                        " FROM api_keys WHERE id > $1 AND (CAST($2 AS BIGINT) = 0 OR user_id = CAST($2 AS BIGINT)) "
                        "ORDER BY id LIMIT $3");
  q->Bind(page.after_id, user_id.value_or(0), page.limit);
  return ReadAll<ApiKey>(*q, ReadApiKey);
}

StatusOr<ApiKey> SqlMetadataStore::RevokeApiKey(int64_t key_id, int64_t time_ms) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  {
    PARSYN_PREPARE(q, "UPDATE api_keys SET revoked_at_ms = $2 WHERE id = $1 AND revoked_at_ms IS NULL");
    q->Bind(key_id, time_ms);
    PARSYN_RETURN_IF_ERROR(q->Run());
  }
  PARSYN_PREPARE(q, std::string("SELECT ") + kApiKeyColumns + " FROM api_keys WHERE id = $1");
  q->Bind(key_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (!row) return NotFoundError("API key " + std::to_string(key_id) + " not found");
  ApiKey key = ReadApiKey(*q);
  q.reset();
  PARSYN_RETURN_IF_ERROR(txn.Commit());
  return key;
}

StatusOr<Project> SqlMetadataStore::CreateProject(const Project& project) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(BeginFencedWriteLocked(txn));
  PARSYN_PREPARE(q, "INSERT INTO projects (name, created_at_ms) VALUES ($1, $2) RETURNING id");
  q->Bind(project.name, project.created_at_ms);
  StatusOr<int64_t> id = q->RunReturningId();
  if (id.status().code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError("a project named '" + project.name + "' already exists");
  }
  PARSYN_RETURN_IF_ERROR(id.status());
  PARSYN_RETURN_IF_ERROR(txn.CommitIfBegun());
  Project stored = project;
  stored.id = *id;
  return stored;
}

StatusOr<std::vector<Project>> SqlMetadataStore::ListProjects() {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT id, name, created_at_ms FROM projects ORDER BY id");
  return ReadAll<Project>(*q, [](const SqlStatement& row) {
    return Project{.id = row.Int(0), .name = row.Text(1), .created_at_ms = row.Int(2)};
  });
}

Status SqlMetadataStore::CheckProjectKeepsOwnerLocked(int64_t project_id) {
  PARSYN_PREPARE(q, "SELECT COUNT(*) FROM project_members WHERE project_id = $1 AND role = 'owner'");
  q->Bind(project_id);
  PARSYN_ASSIGN_OR_RETURN(bool row, q->Step());
  if (row && q->Int(0) == 0) {
    return FailedPreconditionError("project " + std::to_string(project_id) +
                                   " would have no owner left: make another member its owner first");
  }
  return Status::Ok();
}

Status SqlMetadataStore::SetProjectMember(const ProjectMember& member) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  bool had_owner = false;
  {
    PARSYN_PREPARE(q, "SELECT 1 FROM project_members WHERE project_id = $1 AND role = 'owner'");
    q->Bind(member.project_id);
    PARSYN_ASSIGN_OR_RETURN(had_owner, q->Step());
  }
  {
    PARSYN_PREPARE(q,
                   "INSERT INTO project_members (project_id, user_id, role) VALUES ($1, $2, $3) "
                   "ON CONFLICT (project_id, user_id) DO UPDATE SET role = excluded.role");
    q->Bind(member.project_id, member.user_id, ToString(member.role));
    Status s = q->Run();
    if (q->violated() == SqlConstraint::kForeignKey) {
      return NotFoundError("project " + std::to_string(member.project_id) + " or user " +
                           std::to_string(member.user_id) + " not found");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  if (had_owner) PARSYN_RETURN_IF_ERROR(CheckProjectKeepsOwnerLocked(member.project_id));
  return txn.Commit();
}

Status SqlMetadataStore::RemoveProjectMember(int64_t project_id, int64_t user_id) {
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  {
    PARSYN_PREPARE(q, "DELETE FROM project_members WHERE project_id = $1 AND user_id = $2");
    q->Bind(project_id, user_id);
    PARSYN_RETURN_IF_ERROR(q->Run());
    if (q->changes() == 0) {
      return NotFoundError("user " + std::to_string(user_id) + " is not a member of project " +
                           std::to_string(project_id));
    }
  }
  PARSYN_RETURN_IF_ERROR(CheckProjectKeepsOwnerLocked(project_id));
  return txn.Commit();
}

StatusOr<std::vector<ProjectMember>> SqlMetadataStore::ListProjectMembers() {
  PARSYN_LOCK_AND_CONNECT();
  PARSYN_PREPARE(q, "SELECT project_id, user_id, role FROM project_members ORDER BY project_id, user_id");
  return ReadAll<ProjectMember>(*q, ReadProjectMember);
}

Status SqlMetadataStore::AppendAuditRecords(std::span<const AuditRecord> records) {
  if (records.empty()) return Status::Ok();
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  for (const AuditRecord& r : records) {
    PARSYN_PREPARE(q,
                   "INSERT INTO audit_records (seq, time_ms, actor, action, outcome, record_json, project_id) "
                   "VALUES ($1, $2, $3, $4, $5, $6, $7)");
    q->Bind(r.seq, r.time_ms, r.actor, r.action, r.outcome, r.record_json, r.project_id);
    Status s = q->Run();
    if (q->violated() == SqlConstraint::kUnique) {
      return AlreadyExistsError("audit record " + std::to_string(r.seq) +
                                " is already stored (another coordinator continued the chain)");
    }
    PARSYN_RETURN_IF_ERROR(s);
  }
  return txn.Commit();
}

StatusOr<std::vector<AuditRecord>> SqlMetadataStore::ListAuditRecords(const AuditQuery& query) {
  PARSYN_LOCK_AND_CONNECT();
  constexpr std::string_view kSelect =
      "SELECT seq, time_ms, actor, action, outcome, record_json, project_id FROM audit_records WHERE seq > $1 "
      "AND (CAST($2 AS BIGINT) = 0 OR seq < CAST($2 AS BIGINT)) AND ($3 = '' OR actor = $3) "
      "AND ($4 = '' OR action = $4) AND ($5 = '' OR outcome = $5) AND time_ms >= $6 "
      "AND (CAST($7 AS BIGINT) = 0 OR time_ms < CAST($7 AS BIGINT)) "
      "AND (CAST($9 AS BIGINT) = 0 OR project_id = CAST($9 AS BIGINT)) ORDER BY seq ";
  PARSYN_PREPARE(q, std::string(kSelect) + (query.newest_first ? "DESC" : "ASC") + " LIMIT $8");
  q->Bind(query.after_seq, query.before_seq, query.actor, query.action, query.outcome, query.since_ms, query.until_ms,
          std::max<int64_t>(query.limit, 0), query.project_id);
  return ReadAll<AuditRecord>(*q, [](const SqlStatement& row) {
    return AuditRecord{row.Int(0), row.Int(1), row.Text(2), row.Text(3), row.Text(4), row.Text(5), row.Int(6)};
  });
}

}  // namespace parsyn::storage
