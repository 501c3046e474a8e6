#include "storage/sql/sql_store_internal.h"

namespace parsyn::storage::sql_internal {
namespace {

// A stored enum name that does not parse means the database was edited by hand or damaged.
template <typename E>
StatusOr<E> ParseStored(StatusOr<E> parsed, std::string_view where) {
  if (!parsed.ok()) return DataLossError(std::string(where) + ": " + parsed.status().message());
  return parsed;
}

}  // namespace

std::string JobName(int64_t id) { return "training job " + std::to_string(id); }
std::string RoundName(int64_t job_id, int32_t round, int32_t attempt) {
  return "round " + std::to_string(round) + " attempt " + std::to_string(attempt) + " of " + JobName(job_id);
}

StatusOr<ProjectMember> ReadProjectMember(const SqlStatement& q) {
  PARSYN_ASSIGN_OR_RETURN(ProjectRole role, ParseStored(ParseProjectRole(q.Text(2)), "project_members row"));
  return ProjectMember{.project_id = q.Int(0), .user_id = q.Int(1), .role = role};
}

StatusOr<Dataset> ReadDataset(const SqlStatement& q) {
  Dataset d;
  d.id = q.Int(0);
  d.name = q.Text(1);
  PARSYN_ASSIGN_OR_RETURN(d.format, ParseStored(ParseDatasetFormat(q.Text(2)), "datasets row"));
  PARSYN_ASSIGN_OR_RETURN(d.kind, ParseStored(ParseDatasetKind(q.Text(3)), "datasets row"));
  d.row_count = q.Int(4);
  d.size_bytes = q.Int(5);
  d.sha256 = q.Text(6);
  d.blob_key = q.Text(7);
  d.created_at_ms = q.Int(8);
  d.project_id = q.Int(9);
  return d;
}

Model ReadModel(const SqlStatement& q) {
  Model m;
  m.id = q.Int(0);
  m.name = q.Text(1);
  m.model_type = q.Text(2);
  m.config_json = q.Text(3);
  m.size_bytes = q.Int(4);
  m.created_at_ms = q.Int(5);
  m.project_id = q.Int(6);
  return m;
}

StatusOr<Worker> ReadWorker(const SqlStatement& q) {
  Worker w;
  w.id = q.Int(0);
  w.name = q.Text(1);
  PARSYN_ASSIGN_OR_RETURN(w.kind, ParseStored(ParseWorkerKind(q.Text(2)), "workers row"));
  w.token_sha256 = q.Text(3);
  w.device = q.Text(4);
  PARSYN_ASSIGN_OR_RETURN(w.status, ParseStored(ParseWorkerStatus(q.Text(5)), "workers row"));
  w.last_heartbeat_at_ms = q.OptInt(6);
  w.revoked = q.Bool(7);
  w.created_at_ms = q.Int(8);
  w.trainers_json = q.Text(9);
  w.project_id = q.Int(10);
  return w;
}

StatusOr<TrainingJob> ReadJob(const SqlStatement& q) {
  TrainingJob j;
  j.id = q.Int(0);
  j.name = q.Text(1);
  j.dataset_id = q.OptInt(2).value_or(0);  // NULL: the job trains on the workers' own data
  j.model_id = q.Int(3);
  j.spec_json = q.Text(4);
  PARSYN_ASSIGN_OR_RETURN(j.status, ParseStored(ParseJobStatus(q.Text(5)), "jobs row"));
  j.failure_reason = q.Text(6);
  j.current_round = static_cast<int32_t>(q.Int(7));
  j.committed_round = static_cast<int32_t>(q.Int(8));
  j.consecutive_failed_rounds = static_cast<int32_t>(q.Int(9));
  j.created_at_ms = q.Int(10);
  j.started_at_ms = q.OptInt(11);
  j.finished_at_ms = q.OptInt(12);
  j.status_reason = q.Text(13);
  j.initial_validation_loss = q.OptReal(14);
  j.final_validation_loss = q.OptReal(15);
  if (std::optional<int64_t> best = q.OptInt(16)) j.best_round = static_cast<int32_t>(*best);
  j.best_validation_loss = q.OptReal(17);
  j.private_seed = q.Text(18);
  j.project_id = q.Int(19);
  return j;
}

StatusOr<Round> ReadRound(const SqlStatement& q) {
  Round r;
  r.job_id = q.Int(0);
  r.round = static_cast<int32_t>(q.Int(1));
  r.attempt = static_cast<int32_t>(q.Int(2));
  PARSYN_ASSIGN_OR_RETURN(r.status, ParseStored(ParseRoundStatus(q.Text(3)), "rounds row"));
  r.started_at_ms = q.Int(4);
  r.ended_at_ms = q.OptInt(5);
  r.train_loss = q.OptReal(6);
  r.validation_loss = q.OptReal(7);
  r.bytes_moved = q.Int(8);
  r.global_blob_key = q.Text(9);
  r.global_sha256 = q.Text(10);
  r.failure_reason = q.Text(11);
  r.bytes_down = q.OptInt(12);
  r.bytes_up = q.OptInt(13);
  return r;
}

StatusOr<RoundUpdate> ReadUpdate(const SqlStatement& q) {
  RoundUpdate u;
  u.job_id = q.Int(0);
  u.round = static_cast<int32_t>(q.Int(1));
  u.attempt = static_cast<int32_t>(q.Int(2));
  u.worker_id = q.Int(3);
  u.blob_key = q.Text(4);
  u.sha256 = q.Text(5);
  u.size_bytes = q.Int(6);
  u.num_samples = q.Int(7);
  u.train_loss = q.OptReal(8);
  u.metrics_json = q.Text(9);
  PARSYN_ASSIGN_OR_RETURN(u.status, ParseStored(ParseUpdateStatus(q.Text(10)), "round_updates row"));
  u.reject_reason = q.Text(11);
  u.received_at_ms = q.Int(12);
  if (std::optional<int64_t> trained_on = q.OptInt(13)) u.trained_on_round = static_cast<int32_t>(*trained_on);
  return u;
}

}  // namespace parsyn::storage::sql_internal
