// The metadata store contract (metadata_store_contract.h), its rounds: start, commit and fail, validation losses and
// the best round, late participants, and the rounds' updates, metric points and events.
#include <gmock/gmock.h>

#include "storage/metadata_store_contract.h"
#include "storage/metadata_store_contract_helpers.h"

namespace parsyn::storage {
namespace {

using namespace contract;  // metadata_store_contract_helpers.h
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

}  // namespace

// ---- rounds

TEST_P(MetadataStoreContractTest, RoundLifecycleStartCommitNext) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");

  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w2.id, w1.id})));
  TrainingJob during = Must(store().GetJob(job.id));
  EXPECT_EQ(during.current_round, 1);
  EXPECT_EQ(during.committed_round, 0);
  Round running = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(running.status, RoundStatus::kRunning);
  EXPECT_THAT(running.participants, ElementsAre(w1.id, w2.id));
  EXPECT_TRUE(running.global_blob_key.empty());

  RoundCommit commit = NewCommit(job.id, 1, 1);
  ASSERT_OK(store().CommitRound(commit));
  TrainingJob after = Must(store().GetJob(job.id));
  EXPECT_EQ(after.current_round, 1);
  EXPECT_EQ(after.committed_round, 1);
  Round committed = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(committed.status, RoundStatus::kCommitted);
  EXPECT_EQ(committed.global_blob_key, commit.global_blob_key);
  EXPECT_EQ(committed.global_sha256, commit.global_sha256);
  EXPECT_EQ(committed.ended_at_ms, commit.ended_at_ms);
  EXPECT_EQ(committed.train_loss, commit.train_loss);
  // Round 1's workers measured the starting weights: the job's initial loss; round 1's own global is not measured yet.
  EXPECT_EQ(committed.validation_loss, std::nullopt);
  EXPECT_EQ(after.initial_validation_loss, commit.previous_global_validation_loss);
  EXPECT_EQ(after.best_round, std::nullopt);
  EXPECT_EQ(committed.bytes_down, commit.bytes_down);
  EXPECT_EQ(committed.bytes_up, commit.bytes_up);
  EXPECT_EQ(committed.bytes_moved, commit.bytes_down + commit.bytes_up);

  Status twice = store().CommitRound(commit);
  EXPECT_EQ(twice, FailedPreconditionError("round 1 attempt 1 of training job " + std::to_string(job.id) +
                                           " is already committed"));
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {w1.id})));
  EXPECT_EQ(Must(store().GetJob(job.id)).current_round, 2);
  EXPECT_THAT(Must(store().ListRounds(job.id)), SizeIs(2));
}

// Each loss lands on the weights it measured: round r's commit carries global r-1's loss, the final evaluation the
// last global's; the job keeps the initial, final and lowest (best_round) figures.
TEST_P(MetadataStoreContractTest, ValidationLossesBelongToTheGlobalTheyMeasured) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  const std::vector<double> measured = {3.0, 2.0, 2.5, 2.0};  // the starting weights, then globals 1, 2, 3
  for (int32_t r = 1; r <= 3; ++r) {
    ASSERT_OK(store().StartRound(NewRound(job.id, r, 1, {})));
    if (r == 2) {  // a failed attempt records no loss
      ASSERT_OK(store().FailRound(NewFailure(job.id, r, 1)));
      ASSERT_OK(store().StartRound(NewRound(job.id, r, 2, {})));
    }
    RoundCommit commit = NewCommit(job.id, r, r == 2 ? 2 : 1);
    commit.previous_global_validation_loss = measured[r - 1];
    ASSERT_OK(store().CommitRound(commit));
    TrainingJob now = Must(store().GetJob(job.id));
    EXPECT_EQ(now.initial_validation_loss, 3.0);
    EXPECT_EQ(now.best_round, r == 1 ? std::nullopt : std::optional<int32_t>(1)) << "after round " << r;
  }
  TrainingJob running = Must(store().GetJob(job.id));
  EXPECT_EQ(running.best_validation_loss, 2.0);
  EXPECT_EQ(running.final_validation_loss, std::nullopt);

  // Only the committed round's global is the final one, and only once.
  EXPECT_EQ(store().RecordFinalValidationLoss(job.id, 2, 1.0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store().RecordFinalValidationLoss(4242, 3, 1.0).code(), StatusCode::kNotFound);
  ASSERT_OK(store().RecordFinalValidationLoss(job.id, 3, measured[3]));
  TrainingJob ended = Must(
      store().SetJobStatus(job.id, JobStatus::kSucceeded, kT0 + 90, "stopped early after round 3: no improvement"));
  EXPECT_EQ(ended.status_reason, "stopped early after round 3: no improvement");
  EXPECT_EQ(ended.failure_reason, "");
  EXPECT_EQ(ended.final_validation_loss, 2.0);
  EXPECT_EQ(ended.best_round, 1);  // round 3 ties with round 1: the earliest stays best
  EXPECT_EQ(ended.best_validation_loss, 2.0);
  EXPECT_EQ(store().RecordFinalValidationLoss(job.id, 3, 0.5).code(), StatusCode::kFailedPrecondition);

  std::vector<std::optional<double>> by_round;
  for (const Round& r : Must(store().ListRounds(job.id))) by_round.push_back(r.validation_loss);
  EXPECT_THAT(by_round, ElementsAre(2.0, std::nullopt, 2.5, 2.0));  // rounds 1, 2 (failed), 2, 3
}

TEST_P(MetadataStoreContractTest, ALowerLossMovesBestRound) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  for (int32_t r = 1; r <= 3; ++r) {
    ASSERT_OK(store().StartRound(NewRound(job.id, r, 1, {})));
    RoundCommit commit = NewCommit(job.id, r, 1);
    commit.previous_global_validation_loss = 4.0 - r;  // 3, then global 1: 2, global 2: 1
    ASSERT_OK(store().CommitRound(commit));
  }
  ASSERT_OK(store().RecordFinalValidationLoss(job.id, 3, 0.5));
  TrainingJob j = Must(store().GetJob(job.id));
  EXPECT_EQ(j.best_round, 3);
  EXPECT_EQ(j.best_validation_loss, 0.5);
  EXPECT_EQ(j.final_validation_loss, 0.5);
}

TEST_P(MetadataStoreContractTest, LateParticipantsJoinTheirAttemptOnly) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w1.id})));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 1, w2.id));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 1, w1.id));  // already listed: unchanged
  EXPECT_THAT(Must(store().GetRound(job.id, 1, 1)).participants, ElementsAre(w1.id, w2.id));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 2, {})));
  ASSERT_OK(store().AddRoundParticipant(job.id, 1, 2, w2.id));
  std::vector<Round> rounds = Must(store().ListRounds(job.id));
  ASSERT_THAT(rounds, SizeIs(2));
  // The failed attempt's bytes as recorded; a running one has moved none yet.
  EXPECT_EQ(rounds[0].bytes_down, 7);
  EXPECT_EQ(rounds[0].bytes_up, 5);
  EXPECT_EQ(rounds[0].bytes_moved, 12);
  EXPECT_EQ(rounds[1].bytes_down, 0);
  EXPECT_EQ(rounds[1].bytes_up, 0);
  EXPECT_THAT(rounds[0].participants, ElementsAre(w1.id, w2.id));
  EXPECT_THAT(rounds[1].participants, ElementsAre(w2.id));
  EXPECT_EQ(store().AddRoundParticipant(job.id, 1, 3, w1.id).code(), StatusCode::kNotFound);
  EXPECT_EQ(store().AddRoundParticipant(job.id, 1, 2, 4040).code(), StatusCode::kNotFound);
}

struct StartCase {
  std::string what;
  int32_t round;
  int32_t attempt;
  std::string message_fragment;
};

// With round 1 committed and round 2 attempt 1 failed, which starts are allowed.
TEST_P(MetadataStoreContractTest, StartRoundRefusesSkipsRepeatsAndWrongAttempts) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  ASSERT_OK(store().CommitRound(NewCommit(job.id, 1, 1)));
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {})));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 2, 1)));

  const std::vector<StartCase> refused = {
      {"repeat a committed round", 1, 2, "the last committed round is 1, so the next is 2"},
      {"skip a round", 3, 1, "the last committed round is 1, so the next is 2"},
      {"reuse a failed attempt", 2, 1, "the next attempt is 2"},
      {"skip an attempt", 2, 3, "the next attempt is 2"},
  };
  for (const StartCase& c : refused) {
    Status s = store().StartRound(NewRound(job.id, c.round, c.attempt, {}));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << c.what;
    EXPECT_THAT(s.message(), HasSubstr(c.message_fragment)) << c.what;
  }
  EXPECT_EQ(store().StartRound(NewRound(job.id, 0, 1, {})).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 2, {})));
  Status overlapping = store().StartRound(NewRound(job.id, 2, 3, {}));
  EXPECT_EQ(overlapping.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(overlapping.message(), HasSubstr("attempt 2 is still running"));
}

TEST_P(MetadataStoreContractTest, StartRoundNeedsARunningJobAndKnownParticipants) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob queued;
  queued.name = "q";
  queued.dataset_id = d.id;
  queued.model_id = m.id;
  queued = Must(store().CreateJob(queued));
  Status s = store().StartRound(NewRound(queued.id, 1, 1, {}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("the job is queued"));
  EXPECT_EQ(store().StartRound(NewRound(999, 1, 1, {})).code(), StatusCode::kNotFound);

  TrainingJob job = AddRunningJob(d, m);
  Status unknown = store().StartRound(NewRound(job.id, 1, 1, {4040}));
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("worker 4040"));
  // Nothing of the refused start was kept.
  EXPECT_THAT(Must(store().ListRounds(job.id)), IsEmpty());
  EXPECT_EQ(Must(store().GetJob(job.id)).current_round, 0);
}

TEST_P(MetadataStoreContractTest, RefusedCommitLeavesThePriorState) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  RoundCommit no_key = NewCommit(job.id, 1, 1);
  no_key.global_blob_key.clear();
  EXPECT_EQ(store().CommitRound(no_key).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store().CommitRound(NewCommit(job.id, 1, 2)).code(), StatusCode::kNotFound);

  // A job cancelled while its round ran cannot commit that round.
  ASSERT_TRUE(store().SetJobStatus(job.id, JobStatus::kCancelled, kT0 + 5).ok());
  Status s = store().CommitRound(NewCommit(job.id, 1, 1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("the job is cancelled"));
  EXPECT_EQ(Must(store().GetRound(job.id, 1, 1)).status, RoundStatus::kRunning);
  EXPECT_EQ(Must(store().GetJob(job.id)).committed_round, 0);

  // It can still be closed as failed; the terminal job is left alone.
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  TrainingJob after = Must(store().GetJob(job.id));
  EXPECT_EQ(after.status, JobStatus::kCancelled);
  EXPECT_EQ(after.consecutive_failed_rounds, 0);
}

TEST_P(MetadataStoreContractTest, FailedRoundsCountUntilACommitAndCanFailTheJob) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {})));
  ASSERT_OK(store().FailRound(NewFailure(job.id, 1, 1)));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 1);
  Round failed = Must(store().GetRound(job.id, 1, 1));
  EXPECT_EQ(failed.status, RoundStatus::kFailed);
  EXPECT_EQ(failed.failure_reason, NewFailure(job.id, 1, 1).reason);
  EXPECT_EQ(store().FailRound(NewFailure(job.id, 1, 1)).code(), StatusCode::kFailedPrecondition);

  // A round abandoned by a coordinator restart does not count.
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 2, {})));
  RoundFailure restart = NewFailure(job.id, 1, 2);
  restart.reason = "coordinator restarted";
  restart.counts_toward_fault_tolerance = false;
  ASSERT_OK(store().FailRound(restart));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 1);

  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 3, {})));
  ASSERT_OK(store().CommitRound(NewCommit(job.id, 1, 3)));
  EXPECT_EQ(Must(store().GetJob(job.id)).consecutive_failed_rounds, 0);

  ASSERT_OK(store().StartRound(NewRound(job.id, 2, 1, {})));
  RoundFailure last = NewFailure(job.id, 2, 1);
  last.fail_job_reason = "2 consecutive rounds failed (fault_tolerance 1): too few workers";
  ASSERT_OK(store().FailRound(last));
  TrainingJob dead = Must(store().GetJob(job.id));
  EXPECT_EQ(dead.status, JobStatus::kFailed);
  EXPECT_EQ(dead.failure_reason, *last.fail_job_reason);
  EXPECT_EQ(dead.status_reason, *last.fail_job_reason);
  EXPECT_EQ(dead.finished_at_ms, last.ended_at_ms);
  EXPECT_EQ(dead.consecutive_failed_rounds, 1);
  EXPECT_EQ(dead.committed_round, 1);

  RoundFailure no_reason = NewFailure(job.id, 2, 1);
  no_reason.reason.clear();
  EXPECT_EQ(store().FailRound(no_reason).code(), StatusCode::kInvalidArgument);

  std::vector<Round> rounds = Must(store().ListRounds(job.id));
  ASSERT_THAT(rounds, SizeIs(4));
  EXPECT_EQ(rounds[0].attempt, 1);
  EXPECT_EQ(rounds[2].status, RoundStatus::kCommitted);
  EXPECT_EQ(rounds[3].round, 2);
}

// ---- updates, metrics, events

TEST_P(MetadataStoreContractTest, OneUpdatePerWorkerPerRoundAttempt) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  ASSERT_OK(store().StartRound(NewRound(job.id, 1, 1, {w1.id, w2.id})));
  RoundUpdate u1{job.id,
                 1,
                 1,
                 w1.id,
                 "jobs/1/rounds/1/w1",
                 "sha-1",
                 4096,
                 90,
                 1.25,
                 R"({"steps":10})",
                 UpdateStatus::kAccepted,
                 "",
                 kT0 + 10};
  RoundUpdate u2{job.id,
                 1,
                 1,
                 w2.id,
                 "jobs/1/rounds/1/w2",
                 "sha-2",
                 4096,
                 91,
                 std::nullopt,
                 "{}",
                 UpdateStatus::kRejected,
                 "tensor 'lora_A' has NaN at index 3",
                 kT0 + 11};
  ASSERT_OK(store().RecordUpdate(u2));
  ASSERT_OK(store().RecordUpdate(u1));
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 1)), ElementsAre(u1, u2));

  Status dup = store().RecordUpdate(u1);
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(dup.message(), HasSubstr("worker " + std::to_string(w1.id)));
  RoundUpdate wrong_round = u1;
  wrong_round.round = 2;
  EXPECT_EQ(store().RecordUpdate(wrong_round).code(), StatusCode::kNotFound);
  RoundUpdate ghost = u1;
  ghost.worker_id = 5050;
  EXPECT_EQ(store().RecordUpdate(ghost), NotFoundError("worker 5050 not found"));
  EXPECT_THAT(Must(store().ListUpdates(job.id, 1, 2)), IsEmpty());
}

TEST_P(MetadataStoreContractTest, MetricsAppendInBatchesAndFilterByWorker) {
  TrainingJob job = AddRunningJob(AddDataset(), AddModel());
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  std::vector<MetricPoint> batch = {
      {job.id, 1, w2.id, 10, 2.0, 30.5, 0.9, kT0 + 20},
      {job.id, 1, w1.id, 10, 2.1, std::nullopt, std::nullopt, kT0 + 10},
      {job.id, 1, w1.id, 20, 1.9, 31.0, 0.8, kT0 + 30},
  };
  ASSERT_OK(store().AppendMetrics(batch));
  ASSERT_OK(store().AppendMetrics({}));
  EXPECT_THAT(Must(store().ListMetrics(job.id)), ElementsAre(batch[1], batch[0], batch[2]));
  EXPECT_THAT(Must(store().ListMetrics(job.id, w1.id)), ElementsAre(batch[1], batch[2]));

  // A batch with one bad point stores none of it.
  std::vector<MetricPoint> bad = {{job.id, 1, w1.id, 30, 1.8, 1, 1, kT0 + 40}, {job.id, 1, 6060, 30, 1, 1, 1, kT0}};
  EXPECT_EQ(store().AppendMetrics(bad).code(), StatusCode::kNotFound);
  EXPECT_THAT(Must(store().ListMetrics(job.id)), SizeIs(3));
}

TEST_P(MetadataStoreContractTest, MetricsPageInStoredOrderAndCountPerWorker) {
  Dataset dataset = AddDataset();
  Model model = AddModel();
  TrainingJob job = AddRunningJob(dataset, model);
  TrainingJob other = AddRunningJob(dataset, model);
  Worker w1 = AddWorker("w1");
  Worker w2 = AddWorker("w2");
  std::vector<MetricPoint> batch = {
      {job.id, 1, w2.id, 10, 2.0, 30.5, 0.9, kT0 + 20},
      {other.id, 1, w1.id, 5, 3.0, std::nullopt, std::nullopt, kT0 + 15},
      {job.id, 1, w1.id, 10, 2.1, std::nullopt, std::nullopt, kT0 + 10},
      {job.id, 1, w1.id, 20, 1.9, 31.0, 0.8, kT0 + 30},
  };
  ASSERT_OK(store().AppendMetrics(batch));
  std::vector<StoredMetricPoint> all = Must(store().ListMetricsPage(job.id, 0, 10));
  ASSERT_THAT(all, SizeIs(3));  // the job's points only, in the order stored (not by time)
  EXPECT_EQ(all[0].point, batch[0]);
  EXPECT_EQ(all[1].point, batch[2]);
  EXPECT_EQ(all[2].point, batch[3]);
  EXPECT_LT(all[0].id, all[1].id);
  EXPECT_LT(all[1].id, all[2].id);
  // Paging: a limit, then the rest after the last id seen, then nothing.
  std::vector<StoredMetricPoint> first = Must(store().ListMetricsPage(job.id, 0, 2));
  EXPECT_THAT(first, ElementsAre(all[0], all[1]));
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, first.back().id, 2)), ElementsAre(all[2]));
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, all[2].id, 2)), IsEmpty());
  EXPECT_THAT(Must(store().ListMetricsPage(job.id, 0, 0)), IsEmpty());

  EXPECT_EQ(Must(store().CountMetrics(job.id, w1.id)), 2);
  EXPECT_EQ(Must(store().CountMetrics(job.id, w2.id)), 1);
  EXPECT_EQ(Must(store().CountMetrics(other.id, w2.id)), 0);
}

TEST_P(MetadataStoreContractTest, EventsReplayAfterAnIdPerJob) {
  Dataset d = AddDataset();
  Model m = AddModel();
  TrainingJob a = AddRunningJob(d, m);
  TrainingJob b = AddRunningJob(d, m);
  std::vector<int64_t> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(Must(store().AppendJobEvent(
        {0, i % 2 ? b.id : a.id, "round_started", R"({"round":)" + std::to_string(i) + "}", kT0 + i})));
  }
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());

  std::vector<JobEvent> all_a = Must(store().ListJobEvents(a.id, 0));
  ASSERT_THAT(all_a, SizeIs(3));
  EXPECT_EQ(all_a[0], (JobEvent{ids[0], a.id, "round_started", R"({"round":0})", kT0}));
  EXPECT_EQ(all_a[2].id, ids[4]);

  std::vector<JobEvent> after = Must(store().ListJobEvents(a.id, ids[0]));
  ASSERT_THAT(after, SizeIs(2));
  EXPECT_EQ(after[0].id, ids[2]);
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1)), SizeIs(1));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, ids[4])), IsEmpty());
  EXPECT_EQ(store().AppendJobEvent({0, 999, "x", "{}", kT0}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Must(store().LastJobEventId(a.id)), ids[4]);
  EXPECT_EQ(Must(store().LastJobEventId(b.id)), ids[3]);
  EXPECT_EQ(Must(store().LastJobEventId(999)), 0);

  // Filtered by type: only one type, or every other.
  const int64_t warning = Must(store().AppendJobEvent({0, a.id, "warning", R"({"message":"w"})", kT0 + 9}));
  std::vector<JobEvent> warnings = Must(store().ListJobEvents(a.id, 0, 1000, {.type = "warning"}));
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_EQ(warnings[0].id, warning);
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1000, {.type = "round_started", .exclude_type = true})),
              ElementsAre(Field(&JobEvent::id, warning)));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, 0, 1000, {.type = "round_started"})), SizeIs(3));
  EXPECT_THAT(Must(store().ListJobEvents(a.id, warning, 1000, {.type = "warning"})), IsEmpty());
}

}  // namespace parsyn::storage
