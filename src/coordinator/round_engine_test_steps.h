// Test-only: the table-driven steps of the round engine's tests (round_engine_test.cc,
// round_engine_failure_test.cc): each Step feeds the engine one event and lists the actions it must answer with,
// rendered as short strings ("assign w1 r1a1 s0", ...), and RoundEngineTest runs such tables.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/round_engine.h"
#include "strategy/fed_avg.h"
#include "strategy/seed.h"

namespace parsyn::coordinator::round_engine_testing {

using std::chrono::seconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

inline std::string AttemptTag(int round, int attempt) {
  std::string tag = "r";
  tag += std::to_string(round);
  tag += 'a';
  tag += std::to_string(attempt);
  return tag;
}

inline std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Actions rendered compactly, so a scenario reads as a table of event -> expected actions.
inline std::string Render(const Action& action) {
  struct Visitor {
    std::string operator()(const StartRound& a) { return "start " + AttemptTag(a.round, a.attempt); }
    std::string operator()(const AssignTask& a) {
      return "assign w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt) + " s" +
             std::to_string(a.shard) + (a.kind == TaskKind::kEvaluate ? " eval" : "");
    }
    std::string operator()(const ValidateUpdate& a) {
      return "validate w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt) +
             (a.staleness > 0 ? " stale " + std::to_string(a.staleness) : "");
    }
    std::string operator()(const DropWorker& a) {
      const bool own_task = a.task_round == a.round && a.task_attempt == a.attempt;
      return "drop w" + std::to_string(a.worker) + " " + AttemptTag(a.round, a.attempt) + " " +
             std::string(DropCauseName(a.cause)) +
             (own_task ? "" : " task " + AttemptTag(a.task_round, a.task_attempt));
    }
    std::string operator()(const AggregateRound& a) {
      std::string s = "aggregate " + AttemptTag(a.round, a.attempt) + " [";
      for (size_t i = 0; i < a.updates.size(); ++i) {
        if (i > 0) s += ' ';
        s += 'w';
        s += std::to_string(a.updates[i].worker);
        s += ':';
        s += std::to_string(a.updates[i].sample_count);
        if (a.updates[i].staleness > 0) s += "/s" + std::to_string(a.updates[i].staleness);
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

inline std::vector<std::string> Render(const Actions& actions) {
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

inline Step Available(WorkerId w, std::vector<std::string> expected = {}) {
  return {"available w" + std::to_string(w), [w](RoundEngine& e, FakeClock&) { return e.WorkerAvailable(w); },
          std::move(expected)};
}
inline Step Disconnect(WorkerId w, std::vector<std::string> expected = {}) {
  return {"disconnect w" + std::to_string(w), [w](RoundEngine& e, FakeClock&) { return e.WorkerDisconnected(w); },
          std::move(expected)};
}
// A training result: `samples` examples, training loss `loss`, validation loss 2*loss over 10 rows.
inline Step Result(WorkerId w, int round, int attempt, int64_t samples, double loss, std::vector<std::string> expected,
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
inline Step Failed(WorkerId w, int round, int attempt, std::vector<std::string> expected,
                   StatusCode code = StatusCode::kOk) {
  return {"failed w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.TaskFailed(w, round, attempt, "cannot reach the blob store"); },
          std::move(expected), code};
}
inline Step Valid(WorkerId w, int round, int attempt, std::vector<std::string> expected = {},
                  StatusCode code = StatusCode::kOk) {
  return {"valid w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.UpdateValidated(w, round, attempt, Status::Ok()); },
          std::move(expected), code};
}
inline Step Invalid(WorkerId w, int round, int attempt, std::string why, std::vector<std::string> expected) {
  return {"invalid w" + std::to_string(w) + " " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.UpdateValidated(w, round, attempt, InvalidArgumentError(why)); },
          std::move(expected)};
}
inline Step Aggregated(int round, int attempt, std::vector<std::string> expected, StatusCode code = StatusCode::kOk) {
  return {"aggregated " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) { return e.AggregationFinished(round, attempt, Status::Ok()); },
          std::move(expected), code};
}
inline Step AggregationError(int round, int attempt, std::vector<std::string> expected) {
  return {"aggregation error " + AttemptTag(round, attempt),
          [=](RoundEngine& e, FakeClock&) {
            return e.AggregationFinished(round, attempt, UnavailableError("blob store is down"));
          },
          std::move(expected)};
}
inline Step After(int secs, std::vector<std::string> expected = {}) {
  return {"after " + std::to_string(secs) + " s",
          [=](RoundEngine& e, FakeClock& clock) {
            clock.Advance(seconds(secs));
            return e.Tick();
          },
          std::move(expected)};
}
inline Step StopJob(std::vector<std::string> expected) {
  return {"stop", [](RoundEngine& e, FakeClock&) { return e.Stop(); }, std::move(expected)};
}
inline Step CancelJob(std::vector<std::string> expected) {
  return {"cancel", [](RoundEngine& e, FakeClock&) { return e.Cancel(); }, std::move(expected)};
}

inline RoundEngineConfig ThreeWorkers(int num_rounds = 2, int min_workers = 2, int fault_tolerance = 2) {
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

}  // namespace parsyn::coordinator::round_engine_testing
