#include "storage/legacy_schema_for_test.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace parsyn::storage {

const std::string_view kLegacyRowsSql = R"sql(
INSERT INTO settings (name, value) VALUES ('admin_key_sha256', 'admin-hash');
INSERT INTO datasets (name, format, kind, row_count, size_bytes, sha256, blob_key, created_at_ms)
  VALUES ('chat', 'jsonl', 'text', 10, 100, 'ds-sha', 'datasets/1', 1000);
INSERT INTO models (name, model_type, config_json, size_bytes, created_at_ms)
  VALUES ('tiny', 'llama', '{"model_type": "llama"}', 200, 1001);
INSERT INTO model_files (model_id, path, blob_key, size_bytes, sha256)
  VALUES (1, 'config.json', 'models/1/config.json', 20, 'cfg-sha');
INSERT INTO workers (name, kind, token_sha256, device, status, last_heartbeat_at_ms, revoked, created_at_ms)
  VALUES ('gpu-1', 'own', 'token-sha', 'cuda:0', 'online', 1500, FALSE, 1002);
INSERT INTO jobs (name, dataset_id, model_id, spec_json, status, failure_reason, current_round, committed_round,
                  consecutive_failed_rounds, created_at_ms, started_at_ms, finished_at_ms)
  VALUES ('old job', 1, 1, '{"rounds": 3}', 'running', '', 1, 1, 0, 1003, 1004, NULL);
INSERT INTO job_artifacts (job_id, name, blob_key, size_bytes, sha256, created_at_ms)
  VALUES (1, 'rounds/000001/global.safetensors', 'jobs/1/g1', 30, 'art-sha', 1010);
INSERT INTO shards (job_id, shard_index, worker_id, blob_key, sha256, train_rows, validation_rows)
  VALUES (1, 0, 1, 'jobs/1/shards/0', 'shard-sha', 9, 1);
INSERT INTO rounds (job_id, round, attempt, status, started_at_ms, ended_at_ms, train_loss, validation_loss,
                    bytes_moved, global_blob_key, global_sha256, failure_reason)
  VALUES (1, 1, 1, 'committed', 1005, 1009, 2.5, NULL, 4096, 'jobs/1/g1', 'g1-sha', '');
INSERT INTO round_participants (job_id, round, attempt, worker_id) VALUES (1, 1, 1, 1);
INSERT INTO round_updates (job_id, round, attempt, worker_id, blob_key, sha256, size_bytes, num_samples, train_loss,
                           metrics_json, status, reject_reason, received_at_ms)
  VALUES (1, 1, 1, 1, 'jobs/1/u1', 'u1-sha', 64, 9, 2.5, '{}', 'accepted', '', 1008);
INSERT INTO metric_points (job_id, round, worker_id, step, loss, throughput, utilization, time_ms)
  VALUES (1, 1, 1, 1, 3.0, NULL, NULL, 1006);
INSERT INTO metric_points (job_id, round, worker_id, step, loss, throughput, utilization, time_ms)
  VALUES (1, 1, 1, 2, 2.75, 12.5, 0.5, 1007);
INSERT INTO metric_points (job_id, round, worker_id, step, loss, throughput, utilization, time_ms)
  VALUES (1, 1, 1, 3, 2.5, NULL, NULL, 1007);
INSERT INTO job_events (job_id, type, payload_json, time_ms) VALUES (1, 'job_status', '{"status": "running"}', 1004);
INSERT INTO job_events (job_id, type, payload_json, time_ms) VALUES (1, 'round_committed', '{"round": 1}', 1009);
)sql";

namespace {

template <typename T>
T ValueOrFail(StatusOr<T> s) {
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : T{};
}

void ExpectOldRecords(MetadataStore& store) {
  EXPECT_EQ(ValueOrFail(store.GetAdminKeyHash()), "admin-hash");
  EXPECT_EQ(ValueOrFail(store.GetDataset(1)),
            (Dataset{1, "chat", DatasetFormat::kJsonl, DatasetKind::kText, 10, 100, "ds-sha", "datasets/1", 1000}));
  const Model model = ValueOrFail(store.GetModel(1));
  EXPECT_EQ(model.config_json, R"({"model_type": "llama"})");
  EXPECT_THAT(model.files, ::testing::ElementsAre(ModelFile{"config.json", "models/1/config.json", 20, "cfg-sha"}));
  const Worker worker = ValueOrFail(store.FindWorkerByTokenHash("token-sha"));
  EXPECT_EQ(worker.id, 1);
  EXPECT_EQ(worker.status, WorkerStatus::kOnline);
  EXPECT_EQ(worker.last_heartbeat_at_ms, 1500);
  EXPECT_FALSE(worker.revoked);
  EXPECT_EQ(worker.trainers_json, "");  // a later version's column, with its default
  const TrainingJob job = ValueOrFail(store.GetJob(1));
  EXPECT_EQ(job.name, "old job");
  // Everything stored before projects existed is the default project's.
  EXPECT_EQ(job.project_id, kDefaultProjectId);
  EXPECT_EQ(model.project_id, kDefaultProjectId);
  EXPECT_EQ(worker.project_id, kDefaultProjectId);
  EXPECT_THAT(ValueOrFail(store.ListProjects()), ::testing::ElementsAre(Project{kDefaultProjectId, "default", 0}));
  EXPECT_EQ(job.status, JobStatus::kRunning);
  EXPECT_EQ(job.committed_round, 1);
  EXPECT_EQ(job.started_at_ms, 1004);
  EXPECT_EQ(job.private_seed.size(), 64u);  // drawn by the old migration that added the column
  EXPECT_EQ(ValueOrFail(store.ListJobArtifacts(1)).size(), 1u);
  EXPECT_THAT(ValueOrFail(store.ListShards(1)),
              ::testing::ElementsAre(Shard{1, 0, 1, "jobs/1/shards/0", "shard-sha", 9, 1, ""}));
  const Round round = ValueOrFail(store.GetRound(1, 1, 1));
  EXPECT_EQ(round.status, RoundStatus::kCommitted);
  EXPECT_EQ(round.participants, std::vector<int64_t>{1});
  EXPECT_EQ(round.global_sha256, "g1-sha");
  EXPECT_EQ(ValueOrFail(store.ListUpdates(1, 1, 1)).size(), 1u);
  std::vector<int64_t> metric_ids;
  for (const StoredMetricPoint& p : ValueOrFail(store.ListMetricsPage(1, 0, 10))) metric_ids.push_back(p.id);
  EXPECT_THAT(metric_ids, ::testing::ElementsAre(1, 2, 3));  // the ids pages were cut at before stay valid
  EXPECT_EQ(ValueOrFail(store.ListMetrics(1)).at(1).throughput, 12.5);
  EXPECT_EQ(ValueOrFail(store.ListJobEvents(1, 0)).size(), 2u);
  EXPECT_EQ(ValueOrFail(store.LastJobEventId(1)), 2);
}

}  // namespace

void ExpectLegacyRowsReadBack(MetadataStore& store) {
  ExpectOldRecords(store);
  EXPECT_TRUE(store.AppendMetrics(std::vector<MetricPoint>{{1, 1, 1, 4, 2.25, std::nullopt, std::nullopt, 1011}}).ok());
  EXPECT_EQ(ValueOrFail(store.ListMetricsPage(1, 3, 10)).at(0).id, 4);
  TrainingJob next;
  next.name = "new job";
  next.model_id = 1;
  EXPECT_EQ(ValueOrFail(store.CreateJob(next)).id, 2);
  EXPECT_EQ(ValueOrFail(store.AppendJobEvent(JobEvent{0, 1, "job_status", "{}", 1012})), 3);
}

}  // namespace parsyn::storage
