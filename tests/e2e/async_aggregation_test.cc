// Asynchronous aggregation end to end (docs/training.md, "Asynchronous aggregation"): a federated tabular job (the MLP
// of federated_tabular_test.cc) with distributed.aggregation "async", three real `parsyn worker` processes and one
// made slow (PARSYN_WORKER_SLOW_S). Versions commit without waiting for it; its updates, trained on older versions,
// join later ones weighted down by their staleness, and every version's global is the rule's, recomputed here from the
// kept update files; with max_staleness 0 its updates are refused and it takes new work.
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "llama_fixture.h"

namespace parsyn::e2e {
namespace {

using Tensors = std::map<std::string, std::vector<double>>;

class AsyncJobTest : public LlamaJobTest {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartTabularMlpServer()); }

  // Three workers and a fourth `slow_seconds` slower per task; their ids, the slow one's last.
  std::vector<int64_t> StartFastAndSlowWorkers(double slow_seconds) {
    std::vector<int64_t> ids = StartWorkers(3);
    const Registered slow = RegisterWorker(*admin_, "slow");
    workers_.push_back(std::make_unique<Worker>(server_->url(), slow.token, "slow", tmp_.path() / "cache-slow"));
    workers_.back()->set_environment({"PARSYN_WORKER_SLOW_S=" + std::to_string(slow_seconds)});
    workers_.back()->Start();
    ids.push_back(slow.id);
    EXPECT_TRUE(WaitOnline(ids)) << "workers did not say hello in time";
    return ids;
  }

  // 50 steps a task: a fraction of a second for the fast workers, so that the slow one's 1.5 s more spans versions.
  json AsyncSpec(const std::vector<int64_t>& ids, int versions, json async) const {
    json spec = TabularJobSpec("e2e-async", dataset_id_, model_id_, ids, versions, 50);
    spec["distributed"]["min_workers"] = 1;
    spec["distributed"]["aggregation"] = "async";
    spec["distributed"]["async"] = std::move(async);
    return spec;
  }

  // The global committed by round `round` of `committed` (0: the model's own weights, a tabular job's first global).
  Tensors GlobalOf(int64_t job_id, const std::vector<json>& committed, int round) {
    if (round == 0) return ReadTensors(tmp_.path() / "model" / "model.safetensors");
    const json& r = committed.at(static_cast<size_t>(round - 1));
    EXPECT_EQ(r["round"], round);
    return ReadTensors(BlobPath(AttemptPrefix(job_id, round, r["attempt"]) + "/global.safetensors"));
  }

  // The update file of worker `worker`'s task of round `task_round` (its attempt's folder, whichever it was).
  Tensors UpdateOf(int64_t job_id, int task_round, int64_t worker) {
    const std::string name = "w" + std::to_string(worker) + ".safetensors";
    for (int attempt = 1; attempt <= 5; ++attempt) {
      const fs::path file = BlobPath(AttemptPrefix(job_id, task_round, attempt) + "/updates/" + name);
      if (fs::exists(file)) return ReadTensors(file);
    }
    ADD_FAILURE() << "no update file of worker " << worker << " for round " << task_round;
    return {};
  }

  // The rule for version v: g(v-1) + eta * sum_i w_i (u_i - g(b_i)) / sum_i w_i over its accepted updates, u_i trained
  // on global b_i = trained_on_round, w_i = n_i (1 + staleness_i)^-exponent (exponent 0: no staleness weighting).
  Tensors VersionByTheRule(int64_t job_id, const std::vector<json>& committed, int version, double eta,
                           double exponent) {
    Tensors sum;
    double weights = 0;
    for (const json& u : committed.at(static_cast<size_t>(version - 1))["updates"]) {
      if (u["status"] != "accepted") continue;
      const int trained_on = u["trained_on_round"].get<int>();
      const double w = u["num_samples"].get<double>() * std::pow(1.0 + u["staleness"].get<double>(), -exponent);
      const Tensors base = GlobalOf(job_id, committed, trained_on);
      for (auto& [name, values] : UpdateOf(job_id, trained_on + 1, u["worker_id"].get<int64_t>())) {
        std::vector<double>& s = sum[name];
        s.resize(values.size());
        for (size_t i = 0; i < values.size(); ++i) s[i] += w * (values[i] - base.at(name)[i]);
      }
      weights += w;
    }
    Tensors out = GlobalOf(job_id, committed, version - 1);
    for (auto& [name, values] : out) {
      for (size_t i = 0; i < values.size(); ++i) values[i] += eta * sum[name][i] / weights;
    }
    return out;
  }

  // The largest |a - b| over every value.
  static double LargestDifference(const Tensors& a, const Tensors& b) {
    double largest = 0;
    for (const auto& [name, values] : a) {
      for (size_t i = 0; i < values.size(); ++i) largest = std::max(largest, std::abs(values[i] - b.at(name).at(i)));
    }
    return largest;
  }
};

TEST_F(AsyncJobTest, VersionsCommitWithoutTheSlowWorkerAndItsStaleUpdatesAreWeightedDown) {
  const std::vector<int64_t> ids = StartFastAndSlowWorkers(1.5);
  const int64_t slow = ids.back();
  const int kVersions = 60;
  const double kEta = 0.8;
  const int64_t job_id =
      CreateJob(*admin_, AsyncSpec(ids, kVersions,
                                   {{"buffer_size", 2},
                                    {"max_staleness", 1000},
                                    {"server_learning_rate", kEta},
                                    {"staleness_weighting", {{"polynomial", {{"exponent", 1.0}}}}}}));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  const std::vector<json> committed = CommittedRounds(*admin_, job_id);
  ASSERT_EQ(committed.size(), static_cast<size_t>(kVersions));
  int slow_updates = 0, largest_staleness = 0;
  for (const json& version : committed) {
    for (const json& u : version["updates"]) {
      ASSERT_TRUE(u.contains("staleness")) << u.dump();
      EXPECT_EQ(u["trained_on_round"].get<int>() + u["staleness"].get<int>(), version["round"].get<int>() - 1);
      if (u["status"] != "accepted" || u["worker_id"] != slow) continue;
      ++slow_updates;
      largest_staleness = std::max(largest_staleness, u["staleness"].get<int>());
      // Versions 1 and 2 need two updates each from the three fast workers, whose tasks take seconds less.
      EXPECT_GT(version["round"].get<int>(), 2) << version.dump();
    }
  }
  EXPECT_GE(slow_updates, 1) << "the slow worker's updates never joined a version";
  EXPECT_GE(largest_staleness, 1) << "the slow worker's updates were never stale";

  // `parsyn job watch` prints the versions as they committed, with their updates' staleness.
  const std::string watched = WatchEndedJob(job_id);
  EXPECT_NE(watched.find("version 1/60 committed: 2 updates (staleness 0, 0)"), std::string::npos) << watched;

  // Every version is the rule's, with its staleness weights: and with them dropped it would not be.
  bool weighting_changes_a_version = false;
  for (int v = 1; v <= kVersions; ++v) {
    SCOPED_TRACE("version " + std::to_string(v));
    const Tensors global = GlobalOf(job_id, committed, v);
    EXPECT_LT(LargestDifference(global, VersionByTheRule(job_id, committed, v, kEta, 1.0)), 1e-4);
    if (LargestDifference(global, VersionByTheRule(job_id, committed, v, kEta, 0.0)) > 1e-3) {
      weighting_changes_a_version = true;
    }
  }
  EXPECT_TRUE(weighting_changes_a_version);
}

TEST_F(AsyncJobTest, UpdatesPastMaxStalenessAreRefusedAndTheWorkerTakesNewWork) {
  const std::vector<int64_t> ids = StartFastAndSlowWorkers(1.5);
  const int64_t slow = ids.back();
  const int64_t job_id =
      CreateJob(*admin_, AsyncSpec(ids, 40, {{"buffer_size", 2}, {"max_concurrency", 4}, {"max_staleness", 0}}));
  ASSERT_GT(job_id, 0);
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);
  for (const json& version : CommittedRounds(*admin_, job_id)) {
    for (const json& u : version["updates"]) {
      EXPECT_EQ(u["staleness"], 0) << u.dump();
      EXPECT_NE(u["worker_id"], slow) << "a stale update was taken: " << u.dump();
    }
  }
  // Its refused task left with the reason, and it was given new work (a task of a later version).
  int refused_round = 0;
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        if (type == "worker_dropped" && d.value("worker_id", int64_t{0}) == slow &&
            d.value("reason", "").find("max_staleness") != std::string::npos) {
          refused_round = d.value("round", 0);
        }
        return refused_round > 0 && type == "task_assigned" && d.value("worker_id", int64_t{0}) == slow &&
               d.value("round", 0) >= refused_round;
      },
      std::chrono::seconds(10)));
}

// A coordinator SIGKILLed twice while versions' buffers hold accepted updates (half a second after one was accepted,
// and at once after another): the job resumes each time, the updates accepted before a kill are carried into the
// version's next attempt (none lost, none counted twice), and every version is still the rule over the updates its
// record lists.
TEST_F(AsyncJobTest, ACoordinatorKilledWithUpdatesInTheBufferCarriesThemIntoTheVersionsNextAttempt) {
  // Every version needs all four workers' updates: the three fast ones wait in the buffer for the slow one's.
  const std::vector<int64_t> ids = StartFastAndSlowWorkers(3.0);
  const int kVersions = 4;
  const int64_t job_id = CreateJob(*admin_, AsyncSpec(ids, kVersions, {{"buffer_size", 4}, {"max_staleness", 5}}));
  ASSERT_GT(job_id, 0);
  for (const auto& [version, settle] : {std::pair(2, 500), std::pair(3, 0)}) {
    ASSERT_TRUE(WaitForEvent(
        *admin_, job_id,
        [&](const std::string& type, const json& d) {
          return type == "update_accepted" && d.value("round", 0) == version;
        },
        std::chrono::seconds(120)));
    std::this_thread::sleep_for(std::chrono::milliseconds(settle));  // the other fast updates join the buffer
    server_->Kill();
    server_->Start();  // same data directory, same port: the workers reconnect on their own
  }
  json job = WaitForJobEnd(*admin_, job_id, std::chrono::seconds(300));
  ASSERT_EQ(job.value("status", ""), "succeeded") << job.dump(2);

  const std::vector<json> committed = CommittedRounds(*admin_, job_id);
  ASSERT_EQ(committed.size(), static_cast<size_t>(kVersions));
  // The tasks each (round, attempt) gave out, by worker.
  std::set<std::tuple<int, int, int64_t>> tasks;
  EXPECT_TRUE(WaitForEvent(
      *admin_, job_id,
      [&](const std::string& type, const json& d) {
        if (type == "task_assigned")
          tasks.insert({d.value("round", 0), d.value("attempt", 0), d.value("worker_id", 0)});
        return type == "job_status" && d.value("status", "") == "succeeded";
      },
      std::chrono::seconds(10)));
  int carried = 0;
  for (const json& attempt : Rounds(*admin_, job_id)) {
    if (attempt["outcome"] != "failed") continue;
    const json& next = committed.at(attempt["round"].get<size_t>() - 1);
    for (const json& u : attempt["updates"]) {
      if (u["status"] != "accepted") continue;
      bool found = false;
      for (const json& v : next["updates"]) {
        found = found || (v["worker_id"] == u["worker_id"] && v["trained_on_round"] == u["trained_on_round"] &&
                          v["sha256"] == u["sha256"] && v["status"] == "accepted");
      }
      EXPECT_TRUE(found) << "an update accepted before the kill is missing from its version: " << u.dump();
      // Carried, not trained again: its worker had no task in the attempt that committed.
      EXPECT_FALSE(
          tasks.contains({next["round"].get<int>(), next["attempt"].get<int>(), u["worker_id"].get<int64_t>()}))
          << "worker " << u["worker_id"] << " trained version " << next["round"] << " again";
      ++carried;
    }
  }
  EXPECT_GE(carried, 1) << "the kills found no accepted update in a buffer";
  int interrupted = 0;  // each kill failed the attempt it found running
  for (const json& attempt : Rounds(*admin_, job_id)) interrupted += attempt["outcome"] == "failed";
  EXPECT_EQ(interrupted, 2);
  for (int v = 1; v <= kVersions; ++v) {
    SCOPED_TRACE("version " + std::to_string(v));
    EXPECT_EQ(committed[static_cast<size_t>(v - 1)]["updates"].size(), 4u);
    EXPECT_LT(LargestDifference(GlobalOf(job_id, committed, v), VersionByTheRule(job_id, committed, v, 1.0, 0.5)),
              1e-4);
  }
}

}  // namespace
}  // namespace parsyn::e2e
