// The round engine on the paths that succeed: rounds, participation, the join window, restore, configuration.
#include "coordinator/round_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/round_engine_test_steps.h"

namespace parsyn::coordinator {
namespace {

using namespace round_engine_testing;  // NOLINT: the tables read as sentences of these steps
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(RoundEngineTest, NormalRoundsThenFinalEvaluation) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1, 2, 3}),
              ElementsAre("start r1a1", "assign w1 r1a1 s0", "assign w2 r1a1 s1", "assign w3 r1a1 s2"));
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Available(1),  // polls for its next task: none until the next round
                  Result(2, 1, 1, 50, 4.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 50, 1.0, {"validate w3 r1a1"}),
                  Valid(3, 1, 1),
                  Available(3),
                  Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:50 w3:50] loss 1.75"}),
                  Available(2),
                  // (100*2 + 50*8 + 50*2) / 30 rows... each reported 10 validation rows: mean of 2, 8, 2.
                  Aggregated(1, 1,
                             {"evaluated g0 4 n30", "commit r1a1", "start r2a1", "assign w1 r2a1 s0",
                              "assign w2 r2a1 s1", "assign w3 r2a1 s2"}),
                  Result(1, 2, 1, 100, 0.5, {"validate w1 r2a1"}),
                  Result(2, 2, 1, 100, 0.5, {"validate w2 r2a1"}),
                  Result(3, 2, 1, 100, 0.5, {"validate w3 r2a1"}),
                  Valid(1, 2, 1),
                  Valid(2, 2, 1),
                  Valid(3, 2, 1, {"aggregate r2a1 [w1:100 w2:100 w3:100] loss 0.5"}),
                  Aggregated(2, 1, {"evaluated g1 1 n30", "commit r2a1"}),
                  // The final evaluation takes workers as they become idle.
                  Available(2, {"assign w2 r3a1 s1 eval"}),
                  Available(1),
                  Result(2, 3, 1, 0, 0.25, {"evaluated g2 0.5 n10", "succeeded 2"}),
                  Result(1, 3, 1, 100, 0.5, {}, StatusCode::kFailedPrecondition),
              });
  EXPECT_EQ(engine.phase(), JobPhase::kSucceeded);
  EXPECT_EQ(engine.last_committed_round(), 2);
}

TEST_F(RoundEngineTest, TasksCarryTheDerivedSeed) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StatusOr<Actions> started = engine.Start(std::vector<WorkerId>{3, 1});
  ASSERT_TRUE(started.ok());
  ASSERT_EQ(started->size(), 3u);
  const auto& first = std::get<AssignTask>((*started)[1]);
  const auto& second = std::get<AssignTask>((*started)[2]);
  EXPECT_EQ(first.worker, 1);
  EXPECT_EQ(first.seed, strategy::TaskSeed(7, 1, 0));
  EXPECT_EQ(second.worker, 3);
  EXPECT_EQ(second.shard, 2);  // worker 3's shard is its position in the selection, whoever arrives first
  EXPECT_EQ(second.seed, strategy::TaskSeed(7, 1, 2));
}

TEST_F(RoundEngineTest, WorkerGoneMidRoundAndRejoinWithItsShard) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Disconnect(3, {"drop w3 r1a1 disconnected"}),
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  // Every remaining participant reported, min_workers did: aggregate at once, no waiting.
                  Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
                  Available(1),
                  Available(2),
                  Available(3),  // back during aggregation: waits for the next round
                  Aggregated(1, 1,
                             {"evaluated g0 2 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0",
                              "assign w2 r2a1 s1", "assign w3 r2a1 s2"}),
                  // Its late result for round 1 is refused.
                  Result(3, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),
              });
}

TEST_F(RoundEngineTest, ReconnectDuringARoundJoinsTheNextOne) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  EXPECT_EQ(engine.phase(), JobPhase::kTraining);
  Run(engine,
      {
          Available(3),  // the round started without it
          Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
          Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
          Valid(1, 1, 1),
          Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
          Available(1),
          Aggregated(1, 1,
                     {"evaluated g0 2 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0", "assign w3 r2a1 s2"}),
      });
}

TEST_F(RoundEngineTest, StragglerDroppedAtTimeout) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  EXPECT_EQ(engine.next_deadline(), clock_.Now() + seconds(600));
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Valid(2, 1, 1),  // min_workers reached, but worker 3 may still report
                  After(599),
                  After(1, {"drop w3 r1a1 straggler", "aggregate r1a1 [w1:100 w2:100] loss 1"}),
                  Result(3, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),
              });
  StatusOr<Actions> late = engine.ResultUploaded({.worker = 3, .round = 1, .attempt = 1, .sample_count = 100});
  EXPECT_EQ(late.status().message(),
            "worker 3 was dropped from round 1 attempt 1: no result within aggregation_timeout (600 s)");
  EXPECT_EQ(engine.next_deadline(), std::nullopt);
}

TEST_F(RoundEngineTest, UploadedUpdatesFinishValidationAfterTheDeadline) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  After(600, {"drop w3 r1a1 straggler"}),  // w2's upload arrived in time: wait for its verdict
                  Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
              });
}

TEST_F(RoundEngineTest, TheDeadlineCountsFromTheAttemptsStart) {
  // "If fewer than min_workers complete a round within the aggregation_timeout": waiting for workers is part of it.
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1}), ElementsAre("start r1a1"));
  EXPECT_EQ(engine.phase(), JobPhase::kWaitingForWorkers);
  Run(engine, {
                  After(500), Available(2, {"assign w1 r1a1 s0", "assign w2 r1a1 s1"}),
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Valid(1, 1, 1), After(99),
                  After(1, {"drop w2 r1a1 straggler", "fail r1a1 #1", "start r1a2"}),  // 600 s after r1a1 began
              });
}

// The product spec's example: 3 selected workers, min_workers 2. The last reporter of a round is still busy for a
// moment when the next round could start; it must not sit that round out.
RoundEngineConfig SpecExampleRoundConfig() {
  RoundEngineConfig c = ThreeWorkers(/*num_rounds=*/3, /*min_workers=*/2, /*fault_tolerance=*/1);
  c.join_window = seconds(5);
  return c;
}

TEST_F(RoundEngineTest, EverySelectedWorkerTrainsInEveryRound) {
  RoundEngine engine(SpecExampleRoundConfig(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 100, 1.0, {"validate w3 r1a1"}),
                  Valid(1, 1, 1),
                  Valid(2, 1, 1),
                  Available(1),
                  Available(2),
                  // Worker 3 reported last and has not polled yet: min_workers are idle, but the round waits for it.
                  Valid(3, 1, 1, {"aggregate r1a1 [w1:100 w2:100 w3:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n30", "commit r1a1", "start r2a1"}),
                  Available(3, {"assign w1 r2a1 s0", "assign w2 r2a1 s1", "assign w3 r2a1 s2"}),
              });
  EXPECT_EQ(engine.phase(), JobPhase::kTraining);
}

// The final evaluation waits for the job's workers as a round does, so the final global is measured on the same
// validation slices as the globals before it (one worker alone gave a loss not comparable with the others').
TEST_F(RoundEngineTest, TheFinalEvaluationWaitsForEveryWorkerOfTheJob) {
  RoundEngineConfig one_round = SpecExampleRoundConfig();
  one_round.num_rounds = 1;
  RoundEngine engine(one_round, fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 100, 1.0, {"validate w3 r1a1"}),
                  Valid(1, 1, 1),
                  Valid(2, 1, 1),
                  Available(1),
                  Valid(3, 1, 1, {"aggregate r1a1 [w1:100 w2:100 w3:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n30", "commit r1a1"}),  // w2 and w3 still reporting
                  Available(2),
                  Available(3, {"assign w1 r2a1 s0 eval", "assign w2 r2a1 s1 eval", "assign w3 r2a1 s2 eval"}),
              });
  // A worker that does not come back within the join window is not waited for longer; one worker suffices.
  RoundEngine second(one_round, fed_avg_, clock_);
  StartWith(second, {1, 2, 3});
  Run(second, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 100, 1.0, {"validate w3 r1a1"}),
                  Valid(1, 1, 1),
                  Valid(2, 1, 1),
                  Valid(3, 1, 1, {"aggregate r1a1 [w1:100 w2:100 w3:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n30", "commit r1a1"}),
                  Available(1),  // the window begins
                  After(4),
                  After(1, {"assign w1 r2a1 s0 eval"}),
              });
}

TEST_F(RoundEngineTest, JoinWindowEndsTheWaitForABusyWorker) {
  RoundEngine engine(SpecExampleRoundConfig(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 100, 1.0, {"validate w3 r1a1"}), Valid(1, 1, 1), Valid(2, 1, 1),
                  Valid(3, 1, 1, {"aggregate r1a1 [w1:100 w2:100 w3:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n30", "commit r1a1", "start r2a1"}),
                  Available(1),  // one idle: below min_workers, the join window has not begun
                  After(10),
                  Available(2),  // two idle: the window begins now
                  After(4), After(1, {"assign w1 r2a1 s0", "assign w2 r2a1 s1"}),
                  Available(3),  // too late for round 2: it joins round 3
              });
  // A worker that went offline is not waited for.
  RoundEngine second(SpecExampleRoundConfig(), fed_avg_, clock_);
  StartWith(second, {1, 2, 3});
  Run(second,
      {
          Disconnect(3, {"drop w3 r1a1 disconnected"}),
          Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
          Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
          Valid(1, 1, 1),
          Available(1),
          Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
          Available(2),
          Aggregated(1, 1,
                     {"evaluated g0 2 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0", "assign w2 r2a1 s1"}),
      });
}

// The product spec's example job, its third selected worker saying hello a moment after the job was created: the
// first round waits the join window for it, and starts without it only once the window has passed.
TEST_F(RoundEngineTest, JoinWindowWaitsForASelectedWorkerNotOnlineYet) {
  RoundEngine inside(SpecExampleRoundConfig(), fed_avg_, clock_);
  EXPECT_THAT(StartWith(inside, {1, 2}), ElementsAre("start r1a1"));  // min_workers idle: the window begins
  Run(inside, {
                  After(4),
                  Available(3, {"assign w1 r1a1 s0", "assign w2 r1a1 s1", "assign w3 r1a1 s2"}),
              });

  RoundEngine outside(SpecExampleRoundConfig(), fed_avg_, clock_);
  EXPECT_THAT(StartWith(outside, {1, 2}), ElementsAre("start r1a1"));
  Run(outside, {
                   After(4),
                   After(1, {"assign w1 r1a1 s0", "assign w2 r1a1 s1"}),
                   Available(3),  // too late for round 1: it joins round 2
                   Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                   Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                   Valid(1, 1, 1),
                   Available(1),
                   Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
                   Available(2),
                   Aggregated(1, 1,
                              {"evaluated g0 2 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0",
                               "assign w2 r2a1 s1", "assign w3 r2a1 s2"}),
               });
}

TEST_F(RoundEngineTest, RestoreResumesAfterTheLastCommittedRound) {
  EngineCheckpoint saved;
  {
    RoundEngine engine(ThreeWorkers(3, 2, 2), fed_avg_, clock_);
    StartWith(engine, {1, 2});
    Run(engine,
        {
            Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
            Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
            Valid(1, 1, 1),
            Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
            Available(1),
            Available(2),
            Aggregated(1, 1,
                       {"evaluated g0 2 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0", "assign w2 r2a1 s1"}),
            Result(1, 2, 1, 100, 1.0, {"validate w1 r2a1"}),
        });
    saved = engine.checkpoint();
  }  // the server dies mid-round 2
  EXPECT_EQ(saved, (EngineCheckpoint{.last_committed_round = 1,
                                     .attempts_of_next_round = 1,
                                     .consecutive_failed_rounds = 0,
                                     .shards = {{1, 0}, {2, 1}},
                                     .best_validation_loss = 2.0}));  // the starting weights' (g0)

  RoundEngine restored(ThreeWorkers(3, 2, 2), fed_avg_, clock_);
  StatusOr<Actions> resumed = restored.Restore(saved, std::vector<WorkerId>{2, 1});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_THAT(Render(*resumed), ElementsAre("start r2a2", "assign w1 r2a2 s0", "assign w2 r2a2 s1"));
  Run(restored, {
                    Result(1, 2, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // from before the restart
                    Result(1, 2, 2, 100, 1.0, {"validate w1 r2a2"}),
                    Result(2, 2, 2, 100, 1.0, {"validate w2 r2a2"}),
                    Valid(1, 2, 2),
                    Valid(2, 2, 2, {"aggregate r2a2 [w1:100 w2:100] loss 1"}),
                    Aggregated(2, 2, {"evaluated g1 2 n20", "commit r2a2", "start r3a1"}),
                });
}

TEST_F(RoundEngineTest, RestoreAfterTheLastRoundRunsTheFinalEvaluation) {
  RoundEngine engine(ThreeWorkers(3, 2, 2), fed_avg_, clock_);
  StatusOr<Actions> resumed = engine.Restore({.last_committed_round = 3, .shards = {{3, 2}}}, std::vector<WorkerId>{3});
  ASSERT_TRUE(resumed.ok());
  EXPECT_THAT(Render(*resumed), ElementsAre("assign w3 r4a1 s2 eval"));
}

TEST_F(RoundEngineTest, RestoreRejectsCheckpointsThatDoNotFit) {
  const EngineCheckpoint bad[] = {
      {.last_committed_round = 4, .shards = {}},
      {.last_committed_round = -1, .shards = {}},
      {.consecutive_failed_rounds = 2, .shards = {}},  // fault_tolerance 2: such a job has already failed
      {.shards = {{1, 3}}},
      {.shards = {{1, 0}, {2, 0}}},
      {.shards = {{9, 0}}},  // not eligible
  };
  for (const EngineCheckpoint& cp : bad) {
    RoundEngine engine(ThreeWorkers(3, 2, 2), fed_avg_, clock_);
    EXPECT_EQ(engine.Restore(cp).status().code(), StatusCode::kInvalidArgument);
  }
  RoundEngine engine(ThreeWorkers(3, 2, 2), fed_avg_, clock_);
  ASSERT_TRUE(engine.Start().ok());
  EXPECT_EQ(engine.Start().status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RoundEngineTest, StartRejectsUnusableConfigs) {
  RoundEngineConfig config = ThreeWorkers();
  config.min_workers = 4;
  config.max_workers = 3;
  RoundEngine engine(config, fed_avg_, clock_);
  StatusOr<Actions> started = engine.Start();
  EXPECT_EQ(started.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(started.status().message(), "need 1 <= min_workers <= max_workers, got 4 and 3");

  config = ThreeWorkers();
  config.shard_train_rows = {1, 2};
  RoundEngine engine2(config, fed_avg_, clock_);
  EXPECT_EQ(engine2.Start().status().message(), "shard_train_rows has 2 entries for 3 shards");
}

TEST_F(RoundEngineTest, AutoModeGivesSlotsFirstComeAndKeepsThem) {
  RoundEngineConfig config = ThreeWorkers(2, 1, 2);
  config.eligible_workers = {};
  config.num_shards = 2;
  config.max_workers = 2;
  config.shard_train_rows = {100, 100};
  RoundEngine engine(config, fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {}), ElementsAre("start r1a1"));
  Run(engine,
      {
          Available(9, {"assign w9 r1a1 s0"}),
          Available(7),  // gets slot 1, but the round has started
          Available(5),  // no slot left: never takes part
          Disconnect(9, {"drop w9 r1a1 disconnected", "fail r1a1 #1", "start r1a2", "assign w7 r1a2 s1"}),
          Available(9),
          Result(7, 1, 2, 50, 1.0, {"validate w7 r1a2"}),
          Valid(7, 1, 2, {"aggregate r1a2 [w7:50] loss 1"}),
          Available(7),
          Aggregated(1, 2,
                     {"evaluated g0 2 n10", "commit r1a2", "start r2a1", "assign w9 r2a1 s0", "assign w7 r2a1 s1"}),
      });
  EXPECT_EQ(engine.checkpoint().shards, (std::map<WorkerId, int>{{9, 0}, {7, 1}}));
}

TEST_F(RoundEngineTest, OrdinaryJobRunsOneRoundOnOneWorker) {
  StatusOr<JobSpec> spec =
      ParseJobSpec(R"({"name": "solo", "dataset_id": 1, "model_id": 1, "worker_selection": {"worker_ids": [4, 6]}})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  RoundEngineConfig config = EngineConfigFor(*spec);
  EXPECT_EQ(config.num_rounds, 1);
  EXPECT_EQ(config.num_shards, 1);
  EXPECT_EQ(config.eligible_workers, (std::vector<WorkerId>{4, 6}));
  RoundEngine engine(config, fed_avg_, clock_);
  // The one shard goes to the first of the listed workers to arrive.
  EXPECT_THAT(StartWith(engine, {6, 4}), ElementsAre("start r1a1", "assign w6 r1a1 s0"));
  Run(engine, {
                  Available(3),  // not selected: ignored
                  Result(6, 1, 1, 1000, 0.3, {"validate w6 r1a1"}),
                  Valid(6, 1, 1, {"aggregate r1a1 [w6:1000] loss 0.3"}),
                  // Worker 4 holds no shard, so it has no validation slice to evaluate on.
                  Aggregated(1, 1, {"evaluated g0 0.6 n10", "commit r1a1"}),
                  Available(6, {"assign w6 r2a1 s0 eval"}),
              });
}

TEST_F(RoundEngineTest, DistributedSpecMapsToOneShardPerListedWorker) {
  StatusOr<JobSpec> spec = ParseJobSpec(R"({
    "name": "d", "dataset_id": 1, "model_id": 1,
    "distributed": {"enabled": true, "num_rounds": 4, "min_workers": 2, "max_workers": 5,
                    "aggregation_timeout": 90, "fault_tolerance": 2},
    "worker_selection": {"mode": "mixed", "worker_ids": [1, 3], "parsyn_worker_ids": [5]},
    "config": {"seed": 11}})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  RoundEngineConfig config = EngineConfigFor(*spec);
  EXPECT_EQ(config.job_seed, 11u);
  EXPECT_EQ(config.num_rounds, 4);
  EXPECT_EQ(config.num_shards, 3);
  EXPECT_EQ(config.aggregation_timeout, seconds(90));
  EXPECT_EQ(config.eligible_workers, (std::vector<WorkerId>{1, 3, 5}));
  RoundEngine engine(config, fed_avg_, clock_);
  // Worker 3 has not said hello: the round waits the join window (5 s by default) for it, then starts without it.
  EXPECT_THAT(StartWith(engine, {5, 1}), ElementsAre("start r1a1"));
  Run(engine, {After(5, {"assign w1 r1a1 s0", "assign w5 r1a1 s2"})});
}

// ---- early stopping. One worker (w1) trains each round; it reports validation loss `v` of the global it received.

RoundEngineConfig EarlyStopping(int patience, double min_delta = 0, int num_rounds = 10) {
  RoundEngineConfig c = ThreeWorkers(num_rounds, /*min_workers=*/1);
  c.early_stopping = coordinator::EarlyStopping{.patience = patience, .min_delta = min_delta};
  return c;
}

// Round r on w1, which measured global r-1 at `v`; `then` lists what follows the commit.
std::vector<Step> RoundMeasuring(int round, double v, std::vector<std::string> then) {
  std::vector<std::string> committed = {"evaluated g" + std::to_string(round - 1) + " " + Num(v) + " n10",
                                        "commit " + AttemptTag(round, 1)};
  committed.insert(committed.end(), then.begin(), then.end());
  return {Result(1, round, 1, 100, v / 2, {"validate w1 " + AttemptTag(round, 1)}),
          Valid(1, round, 1, {"aggregate " + AttemptTag(round, 1) + " [w1:100] loss " + Num(v / 2)}), Available(1),
          Aggregated(round, 1, committed)};
}

std::vector<std::string> Next(int round) {
  return {"start " + AttemptTag(round, 1), "assign w1 " + AttemptTag(round, 1) + " s0"};
}

TEST_F(RoundEngineTest, EarlyStopCommitsTheRoundThatMeasuredItThenEvaluatesAndSucceeds) {
  RoundEngine engine(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1}), ElementsAre("start r1a1", "assign w1 r1a1 s0"));
  Run(engine, RoundMeasuring(1, 4.0, Next(2)));  // the starting weights: 4
  Run(engine, RoundMeasuring(2, 3.0, Next(3)));  // global 1 improves
  Run(engine, RoundMeasuring(3, 3.0, Next(4)));  // global 2: no improvement (1 of 2)
  // Global 3's loss arrives with round 4's results: round 4 still commits, then no round 5, the final evaluation.
  Run(engine, RoundMeasuring(4, 3.5, {"assign w1 r11a1 s0 eval"}));
  EXPECT_EQ(engine.checkpoint().evaluations_without_improvement, 2);
  EXPECT_EQ(engine.last_committed_round(), 4);
  StatusOr<Actions> ended =
      engine.ResultUploaded({.worker = 1, .round = 11, .attempt = 1, .validation_samples = 10, .validation_loss = 3.0});
  ASSERT_TRUE(ended.ok());
  EXPECT_THAT(Render(*ended), ElementsAre("evaluated g4 3 n10", "succeeded 4"));
  EXPECT_TRUE(std::get<GlobalEvaluated>((*ended)[0]).final);
  EXPECT_EQ(std::get<JobSucceeded>((*ended)[1]).reason,
            "stopped early after round 4 of 10: the validation loss did not improve by more than min_delta 0 for 2 "
            "evaluated global(s) in a row (patience); lowest validation loss 3, after round 1");

  // The stop was decided when round 4 committed: a lower loss of the final global does not undo its reason.
  RoundEngine again(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
  StartWith(again, {1});
  Run(again, RoundMeasuring(1, 4.0, Next(2)));
  Run(again, RoundMeasuring(2, 3.0, Next(3)));
  Run(again, RoundMeasuring(3, 3.0, Next(4)));
  Run(again, RoundMeasuring(4, 3.5, {"assign w1 r11a1 s0 eval"}));
  StatusOr<Actions> lower =
      again.ResultUploaded({.worker = 1, .round = 11, .attempt = 1, .validation_samples = 10, .validation_loss = 1.0});
  ASSERT_TRUE(lower.ok());
  EXPECT_THAT(Render(*lower), ElementsAre("evaluated g4 1 n10", "succeeded 4"));
  EXPECT_THAT(std::get<JobSucceeded>((*lower)[1]).reason, HasSubstr("stopped early after round 4 of 10"));
}

TEST_F(RoundEngineTest, ImprovementResetsTheEarlyStoppingCount) {
  RoundEngine engine(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, RoundMeasuring(1, 4.0, Next(2)));
  Run(engine, RoundMeasuring(2, 4.0, Next(3)));  // 1 of 2
  Run(engine, RoundMeasuring(3, 3.0, Next(4)));  // improves: back to 0
  Run(engine, RoundMeasuring(4, 3.0, Next(5)));  // 1 of 2
  EXPECT_EQ(engine.checkpoint().best_global_round, 2);
  Run(engine, RoundMeasuring(5, 3.2, {"assign w1 r11a1 s0 eval"}));
}

TEST_F(RoundEngineTest, EarlyStoppingCountsOnlyImprovementsBeyondMinDelta) {
  {
    RoundEngine engine(EarlyStopping(/*patience=*/1, /*min_delta=*/0.5), fed_avg_, clock_);
    StartWith(engine, {1});
    Run(engine, RoundMeasuring(1, 4.0, Next(2)));
    Run(engine, RoundMeasuring(2, 3.6, {"assign w1 r11a1 s0 eval"}));  // 0.4 lower: not by more than 0.5
    EXPECT_EQ(engine.checkpoint().best_global_round, 1);               // still the lowest loss
  }
  {
    RoundEngine engine(EarlyStopping(/*patience=*/1, /*min_delta=*/0.5), fed_avg_, clock_);
    StartWith(engine, {1});
    Run(engine, RoundMeasuring(1, 4.0, Next(2)));
    Run(engine, RoundMeasuring(2, 3.4, Next(3)));  // 0.6 lower
  }
}

TEST_F(RoundEngineTest, WithoutEarlyStoppingEveryRoundRuns) {
  RoundEngine engine(ThreeWorkers(3, /*min_workers=*/1), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, RoundMeasuring(1, 4.0, Next(2)));
  Run(engine, RoundMeasuring(2, 5.0, Next(3)));
  Run(engine, RoundMeasuring(3, 6.0, {"assign w1 r4a1 s0 eval"}));
  EXPECT_EQ(engine.checkpoint().evaluations_without_improvement, 2);
}

TEST_F(RoundEngineTest, StopWhileAggregatingWinsOverEarlyStop) {
  RoundEngine engine(EarlyStopping(/*patience=*/1), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, RoundMeasuring(1, 4.0, Next(2)));
  Run(engine, {Result(1, 2, 1, 100, 2.5, {"validate w1 r2a1"}), Valid(1, 2, 1, {"aggregate r2a1 [w1:100] loss 2.5"}),
               StopJob({}), Aggregated(2, 1, {"evaluated g1 5 n10", "commit r2a1", "stopped 2"})});
}

TEST_F(RoundEngineTest, EarlyStoppingStateSurvivesARestart) {
  EngineCheckpoint saved;
  {
    RoundEngine engine(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
    StartWith(engine, {1});
    Run(engine, RoundMeasuring(1, 4.0, Next(2)));
    Run(engine, RoundMeasuring(2, 4.0, Next(3)));  // 1 of 2
    saved = engine.checkpoint();
  }  // the server dies during round 3
  // The runner rebuilds the state from the stored losses, in order: the same as the engine's.
  EngineCheckpoint replayed;
  RecordEvaluation(replayed, EarlyStopping(2), 0, 4.0);
  RecordEvaluation(replayed, EarlyStopping(2), 1, 4.0);
  EXPECT_EQ(replayed.best_validation_loss, saved.best_validation_loss);
  EXPECT_EQ(replayed.best_global_round, saved.best_global_round);
  EXPECT_EQ(replayed.evaluations_without_improvement, 1);
  EXPECT_EQ(saved.evaluations_without_improvement, 1);

  RoundEngine restored(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
  StatusOr<Actions> resumed = restored.Restore(saved, std::vector<WorkerId>{1});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_THAT(Render(*resumed), ElementsAre("start r3a2", "assign w1 r3a2 s0"));
  Run(restored, {Result(1, 3, 2, 100, 2.0, {"validate w1 r3a2"}), Valid(1, 3, 2, {"aggregate r3a2 [w1:100] loss 2"}),
                 Available(1), Aggregated(3, 2, {"evaluated g2 4 n10", "commit r3a2", "assign w1 r11a1 s0 eval"})});

  // A restart during that final evaluation: patience is used up, so the job goes straight to evaluating.
  EngineCheckpoint during_evaluation = restored.checkpoint();
  during_evaluation.attempts_of_next_round = 0;
  RoundEngine again(EarlyStopping(/*patience=*/2), fed_avg_, clock_);
  StatusOr<Actions> evaluating = again.Restore(during_evaluation, std::vector<WorkerId>{1});
  ASSERT_TRUE(evaluating.ok()) << evaluating.status().ToString();
  EXPECT_THAT(Render(*evaluating), ElementsAre("assign w1 r11a1 s0 eval"));
  EXPECT_EQ(again.phase(), JobPhase::kEvaluating);
}

// data.source "workers": only workers that announced a data file take part (in slots, first come); each update
// weighs the samples it reports, however different the files' sizes.
TEST_F(RoundEngineTest, WorkersOwnDataOnlyWorkersWithDataTakePart) {
  StatusOr<JobSpec> spec = ParseJobSpec(R"({"name": "local", "model_id": 1,
    "data": {"source": "workers", "max_samples_per_worker": 1000},
    "distributed": {"enabled": true, "num_rounds": 2, "min_workers": 2, "max_workers": 3}})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  RoundEngineConfig config = EngineConfigFor(*spec);
  EXPECT_TRUE(config.workers_hold_data);
  EXPECT_EQ(config.max_samples_per_worker, 1000);
  EXPECT_TRUE(config.shard_train_rows.empty());
  EXPECT_EQ(config.num_shards, 3);
  std::set<WorkerId> with_data = {1, 3, 4};
  config.worker_has_data = [&with_data](WorkerId w) { return with_data.count(w) > 0; };
  RoundEngine engine(config, fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1, 2}), ElementsAre("start r1a1"));  // worker 2 has no data: not a candidate
  Run(engine, {
                  Available(2),
                  Available(3, {"assign w1 r1a1 s0", "assign w3 r1a1 s1"}),
                  Available(4),  // takes slot 2 for the next round
                  Result(1, 1, 1, 135, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1),
                  Result(3, 1, 1, 630, 2.0, {"validate w3 r1a1"}),
                  Valid(3, 1, 1, {"aggregate r1a1 [w1:135 w3:630] loss 1.824"}),
                  Available(1),
                  Available(3),
                  Aggregated(1, 1,
                             {"evaluated g0 3 n20", "commit r1a1", "start r2a1", "assign w1 r2a1 s0",
                              "assign w3 r2a1 s1", "assign w4 r2a1 s2"}),
                  // Worker 3 comes back without its file: it no longer takes part.
                  Disconnect(3, {"drop w3 r2a1 disconnected"}),
              });
  with_data.erase(3);
  Run(engine, {
                  Available(3),
                  Result(1, 2, 1, 135, 1.0, {"validate w1 r2a1"}),
                  Valid(1, 2, 1),
                  Result(4, 2, 1, 1000, 1.0, {"validate w4 r2a1"}),
                  Valid(4, 2, 1, {"aggregate r2a1 [w1:135 w4:1000] loss 1"}),
              });
  EXPECT_EQ(engine.checkpoint().shards, (std::map<WorkerId, int>{{1, 0}, {3, 1}, {4, 2}}));
}

}  // namespace
}  // namespace parsyn::coordinator
