// What the two source files of SqlMetadataStore (sql_metadata_store.cc, sql_metadata_store_rounds.cc) share: each
// table's column list and the reader that maps one of its rows to a record, names for messages, and shorthands (also
// for PostgresMetadataStore's lease). Not for use outside the SQL stores.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "storage/metadata_store.h"
#include "storage/sql/sql_connection.h"

namespace parsyn::storage::sql_internal {

// Shorthand inside SqlMetadataStore's members: `var`, a run of the prepared statement `sql`, or returns the error.
#define PARSYN_PREPARE(var, sql) PARSYN_ASSIGN_OR_RETURN(std::unique_ptr<SqlStatement> var, db_->Prepare(sql))

// Shorthand: takes the store's lock and makes sure the connection is up.
#define PARSYN_LOCK_AND_CONNECT() \
  std::lock_guard lock(mu_);      \
  PARSYN_RETURN_IF_ERROR(db_->EnsureReady())

// Every remaining row of `q`, each mapped to a T by `read` (which returns T, or StatusOr<T> when a row can be bad).
template <typename T, typename Read>
StatusOr<std::vector<T>> ReadAll(SqlStatement& q, Read read) {
  std::vector<T> out;
  while (true) {
    PARSYN_ASSIGN_OR_RETURN(bool row, q.Step());
    if (!row) return out;
    if constexpr (std::is_same_v<std::invoke_result_t<Read, const SqlStatement&>, T>) {
      out.push_back(read(q));
    } else {
      PARSYN_ASSIGN_OR_RETURN(T value, read(q));
      out.push_back(std::move(value));
    }
  }
}

std::string JobName(int64_t id);
std::string RoundName(int64_t job_id, int32_t round, int32_t attempt);

inline constexpr const char* kDatasetColumns =
    "id, name, format, kind, row_count, size_bytes, sha256, blob_key, created_at_ms, project_id";
inline constexpr const char* kModelColumns = "id, name, model_type, config_json, size_bytes, created_at_ms, project_id";
inline constexpr const char* kWorkerColumns =
    "id, name, kind, token_sha256, device, status, last_heartbeat_at_ms, revoked, created_at_ms, trainers_json, "
    "project_id";
inline constexpr const char* kJobColumns =
    "id, name, dataset_id, model_id, spec_json, status, failure_reason, current_round, committed_round, "
    "consecutive_failed_rounds, created_at_ms, started_at_ms, finished_at_ms, status_reason, "
    "initial_validation_loss, final_validation_loss, best_round, best_validation_loss, private_seed, project_id";
// IdPage::project_id as a condition, bound as the query's third parameter (the jobs list: its fourth).
inline constexpr const char* kInPageProject = "(CAST($3 AS BIGINT) IS NULL OR project_id = CAST($3 AS BIGINT))";
inline constexpr const char* kInPageProjectAt4 = "(CAST($4 AS BIGINT) IS NULL OR project_id = CAST($4 AS BIGINT))";
inline constexpr const char* kRoundColumns =
    "job_id, round, attempt, status, started_at_ms, ended_at_ms, train_loss, validation_loss, bytes_moved, "
    "global_blob_key, global_sha256, failure_reason, bytes_down, bytes_up";
inline constexpr const char* kUpdateColumns =
    "job_id, round, attempt, worker_id, blob_key, sha256, size_bytes, num_samples, train_loss, metrics_json, status, "
    "reject_reason, received_at_ms, trained_on_round";

// Each reads the columns of its list above, in order. DataLoss for a stored enum name that does not parse (the
// database was edited by hand or damaged).
StatusOr<Dataset> ReadDataset(const SqlStatement& q);
// project_id, user_id, role.
StatusOr<ProjectMember> ReadProjectMember(const SqlStatement& q);
Model ReadModel(const SqlStatement& q);
StatusOr<Worker> ReadWorker(const SqlStatement& q);
StatusOr<TrainingJob> ReadJob(const SqlStatement& q);
StatusOr<Round> ReadRound(const SqlStatement& q);
StatusOr<RoundUpdate> ReadUpdate(const SqlStatement& q);

}  // namespace parsyn::storage::sql_internal
