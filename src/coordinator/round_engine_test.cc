#include "coordinator/round_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "strategy/fed_avg.h"
#include "strategy/seed.h"

namespace parsyn::coordinator {
namespace {

using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string AttemptTag(int round, int attempt) {
  std::string tag = "r";
  tag += std::to_string(round);
  tag += 'a';
  tag += std::to_string(attempt);
  return tag;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Actions rendered compactly, so a scenario reads as a table of event -> expected actions.
std::string Render(const Action& action) {
  struct Visitor {
    std::string operator()(const StartRound& a) { return "start " + AttemptTag(a.round, a.attempt); }
    std::string operator()(const AssignTask& a) {
      return "assign w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt) + " s" +
             std::to_string(a.shard) + (a.kind == TaskKind::kEvaluate ? " eval" : "");
    }
    std::string operator()(const ValidateUpdate& a) {
      return "validate w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt);
    }
    std::string operator()(const DropWorker& a) {
      return "drop w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt) + " " +
             std::string(DropCauseName(a.cause));
    }
    std::string operator()(const AggregateRound& a) {
      std::string s = "aggregate " + AttemptTag(a.round, a.attempt) + " [";
      for (size_t i = 0; i < a.updates.size(); ++i) {
        if (i > 0) s += ' ';
        s += 'w';
        s += std::to_string(a.updates[i].worker);
        s += ':';
        s += std::to_string(a.updates[i].sample_count);
      }
      return s + "] loss " + Num(a.train_loss);
    }
    std::string operator()(const GlobalEvaluated& a) {
      return "evaluated g" + std::to_string(a.global_round) + " " + Num(a.validation_loss) + " n" +
             std::to_string(a.validation_samples);
    }
    std::string operator()(const CommitRound& a) { return "commit " + AttemptTag(a.round, a.attempt); }
    std::string operator()(const FailRound& a) {
      return "fail " + AttemptTag(a.round, a.attempt) + " #" + std::to_string(a.consecutive_failures);
    }
    std::string operator()(const JobSucceeded& a) { return "succeeded " + std::to_string(a.final_round); }
    std::string operator()(const JobFailed& a) { return "failed " + std::to_string(a.last_committed_round); }
    std::string operator()(const JobStopped& a) { return "stopped " + std::to_string(a.last_committed_round); }
    std::string operator()(const JobCancelled& a) { return "cancelled " + std::to_string(a.last_committed_round); }
  };
  return std::visit(Visitor{}, action);
}

std::vector<std::string> Render(const Actions& actions) {
  std::vector<std::string> out;
  for (const Action& a : actions) out.push_back(Render(a));
  return out;
}

// One row of a scenario: an event and the actions (or error) it must produce.
struct Step {
  std::string event;  // for failure messages
  std::function<StatusOr<Actions>(RoundEngine&, FakeClock&)> apply;
  std::vector<std::string> expected;
  StatusCode code = StatusCode::kOk;
};

Step Available(WorkerId w, std::vector<std::string> expected = {}) {
  return {"available w" + std::to_string(w), [w](RoundEngine& e, FakeClock&) { return e.WorkerAvailable(w); },
          std::move(expected)};
}
Step Disconnect(WorkerId w, std::vector<std::string> expected = {}) {
  return {"disconnect w" + std::to_string(w), [w](RoundEngine& e, FakeClock&) { return e.WorkerDisconnected(w); },
          std::move(expected)};
}
// A training result: `samples` examples, training loss `loss`, validation loss 2*loss over 10 rows.
Step Result(WorkerId w, int round, int attempt, int64_t samples, double loss, std::vector<std::string> expected,
            StatusCode code = StatusCode::kOk) {
  return {"result w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) {
            return e.ResultUploaded({.worker = w,
                                     .round = round,
                                     .attempt = attempt,
                                     .sample_count = samples,
                                     .train_loss = loss,
                                     .validation_samples = 10,
                                     .validation_loss = 2 * loss});
          },
          std::move(expected), code};
}
Step Failed(WorkerId w, int round, int attempt, std::vector<std::string> expected, StatusCode code = StatusCode::kOk) {
  return {"failed w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.TaskFailed(w, round, attempt, "cannot reach the blob store"); },
          std::move(expected), code};
}
Step Valid(WorkerId w, int round, int attempt, std::vector<std::string> expected = {},
           StatusCode code = StatusCode::kOk) {
  return {"valid w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.UpdateValidated(w, round, attempt, Status::Ok()); },
          std::move(expected), code};
}
Step Invalid(WorkerId w, int round, int attempt, std::string why, std::vector<std::string> expected) {
  return {"invalid w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.UpdateValidated(w, round, attempt, InvalidArgumentError(why)); },
          std::move(expected)};
}
Step Aggregated(int round, int attempt, std::vector<std::string> expected, StatusCode code = StatusCode::kOk) {
  return {"aggregated " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.AggregationFinished(round, attempt, Status::Ok()); },
          std::move(expected), code};
}
Step AggregationError(int round, int attempt, std::vector<std::string> expected) {
  return {"aggregation error " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) {
            return e.AggregationFinished(round, attempt, UnavailableError("blob store is down"));
          },
          std::move(expected)};
}
Step After(int secs, std::vector<std::string> expected = {}) {
  return {"after " + std::to_string(secs) + " s",
          [=](RoundEngine& e, FakeClock& clock) {
            clock.Advance(seconds(secs));
            return e.Tick();
          },
          std::move(expected)};
}
Step StopJob(std::vector<std::string> expected) {
  return {"stop", [](RoundEngine& e, FakeClock&) { return e.Stop(); }, std::move(expected)};
}
Step CancelJob(std::vector<std::string> expected) {
  return {"cancel", [](RoundEngine& e, FakeClock&) { return e.Cancel(); }, std::move(expected)};
}

RoundEngineConfig ThreeWorkers(int num_rounds = 2, int min_workers = 2, int fault_tolerance = 2) {
  RoundEngineConfig c;
  c.job_seed = 7;
  c.num_rounds = num_rounds;
  c.min_workers = min_workers;
  c.max_workers = 3;
  c.aggregation_timeout = seconds(600);
  c.fault_tolerance = fault_tolerance;
  c.eligible_workers = {1, 2, 3};
  c.num_shards = 3;
  c.shard_train_rows = {100, 100, 100};
  return c;
}

class RoundEngineTest : public ::testing::Test {
 protected:
  void Run(RoundEngine& engine, const std::vector<Step>& steps) {
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& step = steps[i];
      StatusOr<Actions> got = step.apply(engine, clock_);
      if (step.code != StatusCode::kOk) {
        EXPECT_EQ(got.status().code(), step.code) << "step " << i << " (" << step.event << ")";
        continue;
      }
      ASSERT_TRUE(got.ok()) << "step " << i << " (" << step.event << "): " << got.status().ToString();
      EXPECT_EQ(Render(*got), step.expected) << "step " << i << " (" << step.event << ")";
    }
  }

  std::vector<std::string> StartWith(RoundEngine& engine, std::vector<WorkerId> idle) {
    StatusOr<Actions> started = engine.Start(idle);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    return started.ok() ? Render(*started) : std::vector<std::string>{};
  }

  FakeClock clock_;
  strategy::FedAvg fed_avg_;
};

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
RoundEngineConfig SpecExample() {
  RoundEngineConfig c = ThreeWorkers(/*num_rounds=*/3, /*min_workers=*/2, /*fault_tolerance=*/1);
  c.join_window = seconds(5);
  return c;
}

TEST_F(RoundEngineTest, EverySelectedWorkerTrainsInEveryRound) {
  RoundEngine engine(SpecExample(), fed_avg_, clock_);
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

TEST_F(RoundEngineTest, JoinWindowEndsTheWaitForABusyWorker) {
  RoundEngine engine(SpecExample(), fed_avg_, clock_);
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
  RoundEngine second(SpecExample(), fed_avg_, clock_);
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

TEST_F(RoundEngineTest, FailedRoundsAreRetriedAfterABackoff) {
  RoundEngineConfig config = ThreeWorkers(/*num_rounds=*/1, /*min_workers=*/2, /*fault_tolerance=*/4);
  config.retry_backoff = seconds(5);
  config.aggregation_timeout = seconds(15);
  EXPECT_EQ(RetryBackoff(config, 1), seconds(5));
  EXPECT_EQ(RetryBackoff(config, 2), seconds(10));
  EXPECT_EQ(RetryBackoff(config, 3), seconds(15));  // at most aggregation_timeout
  EXPECT_EQ(RetryBackoff(config, 30), seconds(15));
  RoundEngine engine(config, fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine,
      {
          Disconnect(2, {"drop w2 r1a1 disconnected"}), Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
          Valid(1, 1, 1, {"fail r1a1 #1"}),
          Result(1, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // the failed attempt's
          Available(1),
          Available(2),  // idle, but no attempt runs during the backoff
          After(4), After(1, {"start r1a2", "assign w1 r1a2 s0", "assign w2 r1a2 s1"}),
          Disconnect(1, {"drop w1 r1a2 disconnected"}), Disconnect(2, {"drop w2 r1a2 disconnected", "fail r1a2 #2"}),
          After(9), After(1, {"start r1a3"}), After(15, {"fail r1a3 #3"}),
          StopJob({"stopped 0"}),  // a stop during the backoff ends the job at once
      });
  EXPECT_EQ(engine.phase(), JobPhase::kStopped);
}

TEST_F(RoundEngineTest, TooFewWorkersFailsRoundsThenTheJob) {
  RoundEngine engine(ThreeWorkers(/*num_rounds=*/2, /*min_workers=*/2, /*fault_tolerance=*/2), fed_avg_, clock_);
  EXPECT_THAT(StartWith(engine, {1}), ElementsAre("start r1a1"));
  Run(engine, {
                  After(599),
                  After(1, {"fail r1a1 #1", "start r1a2"}),
                  After(600, {"fail r1a2 #2", "failed 0"}),
                  Available(2),
                  Result(1, 1, 2, 100, 1.0, {}, StatusCode::kFailedPrecondition),
              });
  EXPECT_EQ(engine.phase(), JobPhase::kFailed);
}

TEST_F(RoundEngineTest, JobFailedReasonNamesTheRoundAndTheCause) {
  RoundEngineConfig config = ThreeWorkers(2, 2, 1);
  RoundEngine engine(config, fed_avg_, clock_);
  StartWith(engine, {1});
  clock_.Advance(seconds(600));
  Actions actions = engine.Tick();
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(std::get<FailRound>(actions[0]).reason,
            "round 1 attempt 1: fewer than min_workers (2) eligible workers were available within "
            "aggregation_timeout (600 s)");
  EXPECT_EQ(std::get<JobFailed>(actions[1]).reason,
            "round 1 failed 1 time(s) in a row (fault_tolerance 1); last failure: round 1 attempt 1: fewer than "
            "min_workers (2) eligible workers were available within aggregation_timeout (600 s)");
}

TEST_F(RoundEngineTest, RetryAfterTooFewUpdatesThenSuccessResetsTheFailureCount) {
  RoundEngine engine(ThreeWorkers(/*num_rounds=*/1, /*min_workers=*/2, /*fault_tolerance=*/2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Disconnect(2, {"drop w2 r1a1 disconnected"}),
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  // Every participant is done and only one update counted: min_workers is out of reach.
                  Valid(1, 1, 1, {"fail r1a1 #1", "start r1a2"}),
                  Available(1),
                  Available(2, {"assign w1 r1a2 s0", "assign w2 r1a2 s1"}),
                  Result(1, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // the failed attempt's
                  Result(1, 1, 2, 100, 1.0, {"validate w1 r1a2"}),
                  Result(2, 1, 2, 100, 1.0, {"validate w2 r1a2"}),
                  Valid(1, 1, 2),
                  Valid(2, 1, 2, {"aggregate r1a2 [w1:100 w2:100] loss 1"}),
                  Aggregated(1, 2, {"evaluated g0 2 n20", "commit r1a2"}),
              });
  EXPECT_EQ(engine.checkpoint().consecutive_failed_rounds, 0);
  EXPECT_EQ(engine.phase(), JobPhase::kEvaluating);
}

TEST_F(RoundEngineTest, FailedAggregationFailsTheRoundAndIsRetried) {
  RoundEngine engine(ThreeWorkers(1, 1, 3), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  Available(1),
                  AggregationError(1, 1, {"fail r1a1 #1", "start r1a2", "assign w1 r1a2 s0"}),
                  Aggregated(1, 1, {}, StatusCode::kFailedPrecondition),
              });
}

TEST_F(RoundEngineTest, BadUpdatesDropTheWorkerAndTheJobGoesOn) {
  RoundEngine engine(ThreeWorkers(), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Invalid(2, 1, 1, "tensor 'w' has a non-finite value (nan) at index 3", {"drop w2 r1a1 rejected"}),
                  Result(3, 1, 1, 101, 1.0, {"drop w3 r1a1 rejected"}),  // more samples than its shard has
                  Valid(1, 1, 1, {"fail r1a1 #1", "start r1a2"}),        // 1 < min_workers
              });
  std::vector<ParticipantView> view = engine.participants();
  EXPECT_TRUE(view.empty());  // a new attempt has begun

  RoundEngine second(ThreeWorkers(1, 1, 2), fed_avg_, clock_);
  StartWith(second, {1, 2, 3});
  Run(second, {
                  Result(1, 1, 1, 0, 1.0, {"drop w1 r1a1 rejected"}),
                  Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}),
                  Invalid(2, 1, 1, "sha256 differs from the reported one", {"drop w2 r1a1 rejected"}),
                  Result(3, 1, 1, 100, 1.0, {"validate w3 r1a1"}),
                  Valid(3, 1, 1, {"aggregate r1a1 [w3:100] loss 1"}),
              });
  view = second.participants();
  ASSERT_EQ(view.size(), 3u);
  EXPECT_EQ(view[0].state, ParticipantState::kRejected);
  EXPECT_EQ(view[0].reason, "result rejected: sample count 0 is not positive");
  EXPECT_EQ(view[1].reason, "update rejected: sha256 differs from the reported one");
  EXPECT_EQ(view[2].state, ParticipantState::kAccepted);
}

TEST_F(RoundEngineTest, RejectedReportsNameTheProblem) {
  RoundEngine engine(ThreeWorkers(1, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  StatusOr<Actions> a = engine.ResultUploaded({.worker = 1, .round = 1, .attempt = 1, .sample_count = 101});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(std::get<DropWorker>(a->at(0)).reason,
            "result rejected: sample count 101 exceeds the 100 training rows of shard 0");
  a = engine.ResultUploaded({.worker = 2,
                             .round = 1,
                             .attempt = 1,
                             .sample_count = 10,
                             .train_loss = std::numeric_limits<double>::quiet_NaN()});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(std::get<DropWorker>(a->at(0)).reason, "result rejected: training loss is not finite");
}

TEST_F(RoundEngineTest, LateAndDuplicateResults) {
  RoundEngine engine(ThreeWorkers(2, 2, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine,
      {
          Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
          Result(1, 1, 1, 100, 1.0, {}),                                        // repeat while validating: idempotent
          Valid(1, 1, 1), Valid(1, 1, 1, {}, StatusCode::kFailedPrecondition),  // no second verdict
          Result(1, 1, 1, 100, 1.0, {}),                                        // repeat after acceptance
          Result(3, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),       // no task
          Result(2, 2, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),       // a future round
          Result(2, 1, 1, 100, 1.0, {"validate w2 r1a1"}), Valid(2, 1, 1, {"aggregate r1a1 [w1:100 w2:100] loss 1"}),
          Result(2, 1, 1, 100, 1.0, {}),  // repeat during aggregation
          Aggregated(1, 1, {"evaluated g0 2 n20", "commit r1a1", "start r2a1"}),
          Aggregated(1, 1, {}, StatusCode::kFailedPrecondition),           // committing twice is refused
          Result(2, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),  // a past round
      });
  StatusOr<Actions> late = engine.ResultUploaded({.worker = 2, .round = 1, .attempt = 1, .sample_count = 100});
  EXPECT_EQ(late.status().message(), "result for round 1 attempt 1 refused: the job is at round 2 attempt 1");
  StatusOr<Actions> stranger = engine.UpdateValidated(9, 2, 1, Status::Ok());
  EXPECT_EQ(stranger.status().message(), "no validation is pending for worker 9 in round 2 attempt 1");
}

TEST_F(RoundEngineTest, FailedTaskLeavesTheRoundWithItsReasonAndTheWorkerComesBack) {
  RoundEngine engine(ThreeWorkers(1, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Failed(2, 1, 2, {}, StatusCode::kFailedPrecondition),  // another attempt: ignored
                  Failed(3, 1, 1, {}, StatusCode::kFailedPrecondition),  // no task
                  Failed(2, 1, 1, {"drop w2 r1a1 task_failed"}),
                  Failed(2, 1, 1, {}, StatusCode::kFailedPrecondition),  // already dropped
                  Result(2, 1, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),
              });
  std::string reason;
  for (const ParticipantView& p : engine.participants()) {
    if (p.worker == 2) reason = p.reason;
  }
  EXPECT_EQ(reason, "cannot reach the blob store");
  Run(engine, {
                  Available(2),  // online again: takes part in what comes next
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1", "assign w2 r2a1 s1 eval"}),
              });
}

TEST_F(RoundEngineTest, AbandonedTaskLeavesTheRound) {
  RoundEngine engine(ThreeWorkers(1, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Available(2, {"drop w2 r1a1 abandoned"}),  // restarted and polls again: its task is gone
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
              });
}

TEST_F(RoundEngineTest, StopFinishesWithTheLatestCommittedRound) {
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
          StopJob({"drop w1 r2a1 job_ended", "drop w2 r2a1 job_ended", "stopped 1"}),
          StopJob({}),
          Result(1, 2, 1, 100, 1.0, {}, StatusCode::kFailedPrecondition),
      });
  EXPECT_EQ(engine.phase(), JobPhase::kStopped);
  EXPECT_EQ(engine.next_deadline(), std::nullopt);
}

TEST_F(RoundEngineTest, StopDuringAggregationCommitsThatRoundFirst) {
  RoundEngine engine(ThreeWorkers(3, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  StopJob({}),
                  Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1", "stopped 1"}),
              });
}

TEST_F(RoundEngineTest, CancelEndsAtOnce) {
  RoundEngine engine(ThreeWorkers(3, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1, 2});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  CancelJob({"drop w1 r1a1 job_ended", "drop w2 r1a1 job_ended", "cancelled 0"}),
                  Valid(1, 1, 1, {}, StatusCode::kFailedPrecondition),
                  Available(3),
                  After(1000),
                  CancelJob({}),
              });
  EXPECT_EQ(engine.phase(), JobPhase::kCancelled);
}

TEST_F(RoundEngineTest, CancelDuringAggregationRefusesTheCommit) {
  RoundEngine engine(ThreeWorkers(3, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}),
                  Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  CancelJob({"cancelled 0"}),
                  Aggregated(1, 1, {}, StatusCode::kFailedPrecondition),
              });
}

TEST_F(RoundEngineTest, FinalEvaluationIsBestEffort) {
  RoundEngine engine(ThreeWorkers(1, 1, 2), fed_avg_, clock_);
  StartWith(engine, {1});
  Run(engine, {
                  Result(1, 1, 1, 100, 1.0, {"validate w1 r1a1"}), Valid(1, 1, 1, {"aggregate r1a1 [w1:100] loss 1"}),
                  Aggregated(1, 1, {"evaluated g0 2 n10", "commit r1a1"}),  // w1 is not idle yet
                  After(600, {"succeeded 1"}),                              // nobody came to evaluate
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
                                     .shards = {{1, 0}, {2, 1}}}));

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
  EXPECT_THAT(StartWith(engine, {5, 1}), ElementsAre("start r1a1", "assign w1 r1a1 s0", "assign w5 r1a1 s2"));
}

}  // namespace
}  // namespace parsyn::coordinator

namespace parsyn::coordinator {
namespace {

// Random event sequences (fixed seeds, bounded length) against invariants that must hold whatever happens:
// committed rounds go 1, 2, 3, ... without gaps or repeats; a worker is only assigned after saying it is idle; an
// attempt has at most max_workers participants; aggregation has at least min_workers updates; nothing happens
// after the job ends.
TEST(RoundEngineInvariantsTest, RandomEventSequences) {
  int total_commits = 0, jobs_ended = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    FakeClock clock;
    strategy::FedAvg fed_avg;
    RoundEngineConfig config;
    config.job_seed = seed;
    config.num_rounds = 4;
    config.min_workers = 2;
    config.max_workers = 3;
    config.aggregation_timeout = seconds(300);
    config.fault_tolerance = 5;
    config.eligible_workers = {1, 2, 3, 4};
    config.num_shards = 4;
    if (seed % 2 == 1) {  // half the sequences with the job defaults' waits
      config.join_window = kDefaultJoinWindow;
      config.retry_backoff = kDefaultRetryBackoff;
    }
    RoundEngine engine(config, fed_avg, clock);

    std::map<WorkerId, bool> idle;  // what the engine was told
    std::set<std::pair<int, int>> attempts_seen;
    std::map<std::pair<int, int>, int> assigned_in_attempt;
    std::vector<std::pair<WorkerId, AssignTask>> open_tasks;
    std::vector<ValidateUpdate> pending_validations;
    std::optional<AggregateRound> pending_aggregation;
    int last_commit = 0;
    bool ended = false;

    auto check = [&](const Actions& actions) {
      for (const Action& a : actions) {
        ASSERT_FALSE(ended) << "action after the job ended: " << Render(a);
        if (const auto* t = std::get_if<AssignTask>(&a)) {
          ASSERT_TRUE(idle[t->worker]) << "assigned a busy worker: " << Render(a);
          idle[t->worker] = false;
          ASSERT_LE((++assigned_in_attempt[{t->round, t->attempt}]), config.max_workers);
          open_tasks.push_back({t->worker, *t});
        } else if (const auto* v = std::get_if<ValidateUpdate>(&a)) {
          pending_validations.push_back(*v);
        } else if (const auto* g = std::get_if<AggregateRound>(&a)) {
          ASSERT_GE(static_cast<int>(g->updates.size()), config.min_workers);
          pending_aggregation = *g;
        } else if (const auto* c = std::get_if<CommitRound>(&a)) {
          ASSERT_EQ(c->round, last_commit + 1) << "committed rounds must be consecutive";
          last_commit = c->round;
        } else if (const auto* s = std::get_if<StartRound>(&a)) {
          ASSERT_TRUE(attempts_seen.insert({s->round, s->attempt}).second) << "attempt started twice";
          ASSERT_EQ(s->round, last_commit + 1);
        } else if (std::holds_alternative<JobSucceeded>(a) || std::holds_alternative<JobFailed>(a) ||
                   std::holds_alternative<JobStopped>(a) || std::holds_alternative<JobCancelled>(a)) {
          ended = true;
        }
      }
    };

    StatusOr<Actions> started = engine.Start();
    ASSERT_TRUE(started.ok());
    check(*started);
    for (int step = 0; step < 400 && !ended; ++step) {
      const int kind = std::uniform_int_distribution<int>(0, 10)(rng);
      const WorkerId w = std::uniform_int_distribution<WorkerId>(1, 5)(rng);  // 5 is not eligible
      Actions actions;
      if (kind <= 1) {
        idle[w] = true;
        actions = engine.WorkerAvailable(w);
        if (w == 5) idle[w] = false;
      } else if (kind == 2 && std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
        idle[w] = false;
        actions = engine.WorkerDisconnected(w);
      } else if (kind <= 4 && !open_tasks.empty()) {
        const size_t i = std::uniform_int_distribution<size_t>(0, open_tasks.size() - 1)(rng);
        const AssignTask t = open_tasks[i].second;
        open_tasks.erase(open_tasks.begin() + static_cast<std::ptrdiff_t>(i));
        StatusOr<Actions> r = engine.ResultUploaded({.worker = t.worker,
                                                     .round = t.round,
                                                     .attempt = t.attempt,
                                                     .sample_count = 10,
                                                     .train_loss = 1.0,
                                                     .validation_samples = 2,
                                                     .validation_loss = 1.0});
        if (r.ok()) actions = *r;
      } else if (kind <= 6 && !pending_validations.empty()) {
        const ValidateUpdate v = pending_validations.front();
        pending_validations.erase(pending_validations.begin());
        const bool accept = std::uniform_int_distribution<int>(0, 4)(rng) != 0;
        StatusOr<Actions> r =
            engine.UpdateValidated(v.worker, v.round, v.attempt, accept ? Status::Ok() : InvalidArgumentError("bad"));
        if (r.ok()) actions = *r;
      } else if (kind == 7 && pending_aggregation) {
        const bool ok = std::uniform_int_distribution<int>(0, 4)(rng) != 0;
        StatusOr<Actions> r = engine.AggregationFinished(pending_aggregation->round, pending_aggregation->attempt,
                                                         ok ? Status::Ok() : UnavailableError("store down"));
        pending_aggregation.reset();
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        actions = *r;
      } else {
        clock.Advance(seconds(std::uniform_int_distribution<int>(1, 30)(rng)));
        actions = engine.Tick();
      }
      check(actions);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_EQ(engine.last_committed_round(), last_commit);
    total_commits += last_commit;
    jobs_ended += ended ? 1 : 0;
  }
  // The sequences do reach commits and job ends, so the invariants were exercised.
  EXPECT_GT(total_commits, 20);
  EXPECT_GT(jobs_ended, 5);
  std::printf("random sequences: %d commits, %d jobs ended\n", total_commits, jobs_ended);
}

}  // namespace
}  // namespace parsyn::coordinator
