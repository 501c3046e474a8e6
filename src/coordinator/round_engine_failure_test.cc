// The round engine when things go wrong: timeouts, failed rounds and retries, bad or late results, stop and
// cancel; and random event sequences against its invariants.
#include "coordinator/round_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "coordinator/round_engine_test_steps.h"

namespace parsyn::coordinator {
namespace {

using namespace round_engine_testing;  // NOLINT: the tables read as sentences of these steps
using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

// A worker training on its own data can claim any sample count, and the count is its weight: the job's bound
// rejects a claim above it, naming both numbers; the others' round goes on.
TEST_F(RoundEngineTest, WorkersOwnDataSampleCountsAreBounded) {
  RoundEngineConfig config = ThreeWorkers(1, 2, 2);
  config.shard_train_rows = {};
  config.workers_hold_data = true;
  config.max_samples_per_worker = 700;
  config.worker_has_data = [](WorkerId) { return true; };
  RoundEngine engine(config, fed_avg_, clock_);
  StartWith(engine, {1, 2, 3});
  Run(engine, {
                  Result(1, 1, 1, 701, 1.0, {"drop w1 r1a1 rejected"}),
                  Result(2, 1, 1, 700, 1.0, {"validate w2 r1a1"}),
                  Result(3, 1, 1, 20, 1.0, {"validate w3 r1a1"}),
                  Valid(2, 1, 1),
                  Valid(3, 1, 1, {"aggregate r1a1 [w2:700 w3:20] loss 1"}),
              });
  EXPECT_EQ(engine.participants().at(0).reason,
            "result rejected: sample count 701 exceeds the job's data.max_samples_per_worker (700)");

  // Such a job needs to know who has data, and a bound.
  config.worker_has_data = nullptr;
  RoundEngine unusable(config, fed_avg_, clock_);
  EXPECT_EQ(unusable.Start().status().message(),
            "workers_hold_data needs worker_has_data, max_samples_per_worker >= 1 and no shard_train_rows");
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

// Random event sequences (fixed seeds, bounded length) against invariants that must hold whatever happens:
// committed rounds go 1, 2, 3, ... without gaps or repeats; a worker is only assigned after saying it is idle; an
// attempt has at most max_workers participants; aggregation has at least min_workers updates; nothing happens
// after the job ends.
// Random event sequences for 40 jobs (synchronous, or with `async` asynchronous rounds of buffer 2 and a random
// max_staleness): the commits and jobs ended they reached.
void RunRandomEventSequences(bool async, int& total_commits, int& jobs_ended) {
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
    if (async) {
      config.async =
          RoundEngineConfig::Async{.buffer_size = 2, .max_concurrency = 3, .max_staleness = static_cast<int>(seed % 4)};
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
          // Asynchronous: one task per worker per version (of the 4 eligible); synchronous: max_workers a round.
          ASSERT_LE((++assigned_in_attempt[{t->round, t->attempt}]), async ? 4 : config.max_workers);
          open_tasks.push_back({t->worker, *t});
        } else if (const auto* v = std::get_if<ValidateUpdate>(&a)) {
          pending_validations.push_back(*v);
          if (async) ASSERT_LE(v->staleness, config.async->max_staleness) << Render(a);
        } else if (const auto* g = std::get_if<AggregateRound>(&a)) {
          if (async) {
            ASSERT_EQ(static_cast<int>(g->updates.size()), config.async->buffer_size) << Render(a);
            ASSERT_NE(g->updates[0].worker, g->updates[1].worker) << "one update per worker per version";
          } else {
            ASSERT_GE(static_cast<int>(g->updates.size()), config.min_workers);
          }
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
      if (async) {
        int training = 0;
        for (const ParticipantView& p : engine.participants()) training += p.state == ParticipantState::kTraining;
        ASSERT_LE(training, config.async->max_concurrency);
      }
    }
    EXPECT_EQ(engine.last_committed_round(), last_commit);
    total_commits += last_commit;
    jobs_ended += ended ? 1 : 0;
  }
}

TEST(RoundEngineInvariantsTest, RandomEventSequences) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous" : "synchronous");
    int total_commits = 0, jobs_ended = 0;
    RunRandomEventSequences(async, total_commits, jobs_ended);
    if (::testing::Test::HasFatalFailure()) return;
    // The sequences do reach commits and job ends, so the invariants were exercised.
    EXPECT_GT(total_commits, 20);
    EXPECT_GT(jobs_ended, 5);
    std::printf("random %s sequences: %d commits, %d jobs ended\n", async ? "asynchronous" : "synchronous",
                total_commits, jobs_ended);
  }
}

}  // namespace
}  // namespace parsyn::coordinator
