// The round engine's asynchronous rounds (round_engine.h, "Asynchronous rounds"): versions from a buffer, stale
// updates taken or refused, tasks that outlive versions, each task's deadline, and the last version.
#include <gtest/gtest.h>

#include "coordinator/round_engine_test_steps.h"

namespace parsyn::coordinator {
namespace {

using namespace round_engine_testing;  // NOLINT: the tables read as sentences of these steps

RoundEngineConfig AsyncThreeWorkers(int num_rounds, int buffer_size, int max_concurrency, int max_staleness) {
  RoundEngineConfig c = ThreeWorkers(num_rounds, /*min_workers=*/1);
  c.async = RoundEngineConfig::Async{
      .buffer_size = buffer_size, .max_concurrency = max_concurrency, .max_staleness = max_staleness};
  return c;
}

TEST_F(RoundEngineTest, AsyncVersionsCommitWithoutWaitingForTheSlowestWorker) {
  RoundEngine engine(AsyncThreeWorkers(/*num_rounds=*/3, /*buffer_size=*/2, /*max_concurrency=*/3, 2), fed_avg_,
                     clock_);
  EXPECT_THAT(StartWith(engine, {1, 2, 3}),
              ElementsAre("start r1a1", "assign w1 r1a1 s0", "assign w2 r1a1 s1", "assign w3 r1a1 s2"));
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Available(1),  // its update is in this version's buffer: its next task waits for the next version
                  Result(2, 1, 1, 50, 2.0, {"validate w2 r1a1"}),
                  Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:50] loss 1.333"}),
                  Aggregated(1, 1, {"evaluated g0 3 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0"}),
                  Available(2, {"assign w2 r2a1 s1"}),
                  // Worker 3, slow, reports its version-0 update while version 2 is being built: staleness 1.
                  Result(3, 1, 1, 100, 3.0, {"validate w3 r2a1 stale 1"}),
                  Valid(3, 2, 1),
                  Result(2, 2, 1, 50, 1.0, {"validate w2 r2a1"}),
                  // In the order accepted; only worker 2 trained on global 1, so only it measured it.
                  Valid(2, 2, 1, {"aggregate r2a1 [w3:100/s1 w2:50] loss 2.333"}),
                  Aggregated(2, 1, {"evaluated g1 2 n10", "commit r2a1", "start r3a1"}),
                  Available(3, {"assign w3 r3a1 s2"}),
              });
  EXPECT_TRUE(engine.TaskOpen(1, 2, 1));  // worker 1's task of version 2 is still in training
  EXPECT_FALSE(engine.TaskOpen(1, 3, 1));
  EXPECT_EQ(engine.last_committed_round(), 2);
}

TEST_F(RoundEngineTest, AsyncUpdatesStalerThanMaxStalenessAreRefusedAndTheWorkerTakesNewWork) {
  RoundEngine engine(AsyncThreeWorkers(3, /*buffer_size=*/1, /*max_concurrency=*/2, /*max_staleness=*/0), fed_avg_,
                     clock_);
  EXPECT_THAT(StartWith(engine, {1, 2}), ElementsAre("start r1a1", "assign w1 r1a1 s0", "assign w2 r1a1 s1"));
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1", "start r2a1"}),
                  Result(2, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // 1 version old, max 0
                  Available(2, {"drop w2 r2a1 abandoned task r1a1", "assign w2 r2a1 s1"}),
                  Result(2, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // that task is gone
              });
  const Status refused = engine.ExpectsResult(1, 1, 1).status();
  EXPECT_THAT(refused.message(), HasSubstr("no such task"));
  RoundEngine stale(AsyncThreeWorkers(3, 1, 2, 0), fed_avg_, clock_);
  StartWith(stale, {1, 2});
  Run(stale, {Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
              Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1", "start r2a1"})});
  EXPECT_THAT(stale.ExpectsResult(2, 1, 1).status().message(),
              HasSubstr("trained on version 0, 1 versions before the latest (1), past distributed.async.max_staleness "
                        "(0); take new work"));
}

TEST_F(RoundEngineTest, AsyncRunsAtMostMaxConcurrencyTasks) {
  RoundEngine engine(AsyncThreeWorkers(3, /*buffer_size=*/2, /*max_concurrency=*/2, 2), fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1, 2, 3}), ElementsAre("start r1a1", "assign w1 r1a1 s0", "assign w2 r1a1 s1"));
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"assign w3 r1a1 s2"}),  // worker 1 finished training: a slot for worker 3
                  Failed(3, 1, 1, {"drop w3 r1a1 task_failed"}),
                  Available(3),  // one task per worker per version: its next comes with the next version
              });
}

TEST_F(RoundEngineTest, AsyncAVersionNoWorkerLeftCanFillStartsAgainAsANewAttempt) {
  RoundEngineConfig config = AsyncThreeWorkers(3, /*buffer_size=*/2, /*max_concurrency=*/2, 2);
  config.eligible_workers = {1, 2};
  config.num_shards = 2;
  config.shard_train_rows = {100, 100};
  RoundEngine engine(config, fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Available(1),
                  Failed(2, 1, 1, {"drop w2 r1a1 task_failed"}),
                  Available(2, {"fail r1a1 #1", "start r1a2", "assign w1 r1a2 s0", "assign w2 r1a2 s1"}),
              });
}

TEST_F(RoundEngineTest, AsyncTasksHaveTheirOwnDeadlines) {
  RoundEngine engine(AsyncThreeWorkers(3, /*buffer_size=*/1, /*max_concurrency=*/2, 5), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, {
                  After(300),
                  Available(2, {"assign w2 r1a1 s1"}),
                  After(300, {"drop w1 r1a1 straggler"}),  // worker 1's 600 s are up; worker 2 has 300 s left
                  After(299),
                  After(1, {"drop w2 r1a1 straggler"}),
              });
}

TEST_F(RoundEngineTest, AsyncTheLastVersionEndsTheTasksStillTrainingAndTheJobEvaluates) {
  RoundEngine engine(AsyncThreeWorkers(/*num_rounds=*/1, /*buffer_size=*/1, /*max_concurrency=*/3, 2), fed_avg_,
                     clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1", "drop w2 r1a1 job_ended"}),  // no version left
                  Available(1, {"assign w1 r2a1 s0 eval"}),
                  Result(1, 2, 1, 0, 0.5, {"evaluated g1 1 n10", "succeeded 1"}),
              });
}

TEST_F(RoundEngineTest, AsyncAFailedAggregationStartsTheVersionAgainKeepingTasksInTraining) {
  RoundEngine engine(AsyncThreeWorkers(3, /*buffer_size=*/1, /*max_concurrency=*/2, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  AggregationError(1, 1, {"fail r1a1 #1", "start r1a2"}),  // no backoff: worker 2 trains on
                  Result(2, 1, 1, 100, 2.0, {"validate w2 r1a2"}),
                  Valid(2, 1, 2, {"aggregate r1a2 [w2:100] loss 2"}),
                  Aggregated(1, 2, {"evaluated g0 4 n10", "commit r1a2", "start r2a1"}),
              });
}

TEST_F(RoundEngineTest, AsyncRestoreAnnouncesTheUpdatesCarriedOverARestartInTheirOrder) {
  RoundEngine engine(AsyncThreeWorkers(3, /*buffer_size=*/2, /*max_concurrency=*/3, 5), fed_avg_, clock_);
  EngineCheckpoint checkpoint;
  checkpoint.last_committed_round = 1;
  checkpoint.attempts_of_next_round = 1;  // version 2's first attempt ran when the coordinator stopped
  checkpoint.shards = {{1, 0}, {2, 1}, {3, 2}};
  const std::vector<CarriedUpdate> carried = {
      {.worker = 3, .sample_count = 100, .train_loss = 1.0, .task_round = 1, .task_attempt = 1}};
  StatusOr<Actions> restored = engine.Restore(checkpoint, std::vector<WorkerId>{1, 3}, carried);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_THAT(Render(*restored), ElementsAre("start r2a2", "validate w3 r2a2 stale 1", "assign w1 r2a2 s0"));
  Run(engine, {
                  Valid(3, 2, 2),
                  Result(1, 2, 2, 50, 2.0, {"validate w1 r2a2"}),
                  Valid(1, 2, 2, {"aggregate r2a2 [w3:100/s1 w1:50] loss 1.333"}),
              });
  RoundEngine sync(ThreeWorkers(), fed_avg_, clock_);
  EXPECT_EQ(sync.Restore(checkpoint, {}, carried).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(RoundEngineTest, AsyncStopEndsTheTasksInTraining) {
  RoundEngine engine(AsyncThreeWorkers(3, 2, 3, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {StopJob({"drop w1 r1a1 job_ended", "drop w2 r1a1 job_ended", "stopped 0"})});
}

}  // namespace
}  // namespace parsyn::coordinator
