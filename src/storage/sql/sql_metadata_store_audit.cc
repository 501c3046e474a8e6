#include "storage/sql/sql_metadata_store.h"
#include "storage/sql/sql_store_internal.h"

// SqlMetadataStore's audit log (the rest is in sql_metadata_store.cc and sql_metadata_store_rounds.cc).
namespace parsyn::storage {

using namespace sql_internal;  // NOLINT(google-build-using-namespace): this file implements what it declares

Status SqlMetadataStore::AppendAuditRecords(std::span<const AuditRecord> records) {
  if (records.empty()) return Status::Ok();
  PARSYN_LOCK_AND_CONNECT();
  SqlTransaction txn(*db_);
  PARSYN_RETURN_IF_ERROR(txn.Begin());
  PARSYN_RETURN_IF_ERROR(CheckFenceLocked());
  for (const AuditRecord& r : records) {
    PARSYN_PREPARE(q,
                   "INSERT INTO audit_records (seq, time_ms, actor, action, outcome, record_json) "
                   "VALUES ($1, $2, $3, $4, $5, $6)");
    q->Bind(r.seq, r.time_ms, r.actor, r.action, r.outcome, r.record_json);
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
      "SELECT seq, time_ms, actor, action, outcome, record_json FROM audit_records WHERE seq > $1 "
      "AND (CAST($2 AS BIGINT) = 0 OR seq < CAST($2 AS BIGINT)) AND ($3 = '' OR actor = $3) "
      "AND ($4 = '' OR action = $4) AND ($5 = '' OR outcome = $5) AND time_ms >= $6 "
      "AND (CAST($7 AS BIGINT) = 0 OR time_ms < CAST($7 AS BIGINT)) ORDER BY seq ";
  PARSYN_PREPARE(q, std::string(kSelect) + (query.newest_first ? "DESC" : "ASC") + " LIMIT $8");
  q->Bind(query.after_seq, query.before_seq, query.actor, query.action, query.outcome, query.since_ms, query.until_ms,
          std::max<int64_t>(query.limit, 0));
  return ReadAll<AuditRecord>(*q, [](const SqlStatement& row) {
    return AuditRecord{row.Int(0), row.Int(1), row.Text(2), row.Text(3), row.Text(4), row.Text(5)};
  });
}

}  // namespace parsyn::storage
