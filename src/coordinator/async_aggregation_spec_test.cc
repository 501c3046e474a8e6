#include "coordinator/async_aggregation_spec.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "coordinator/job_spec.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using Rule = strategy::StalenessWeighting::Rule;

// A distributed job over workers 1..5 with `distributed` merged into its distributed section.
json JobBody(const json& distributed) {
  json body = json::parse(R"({
    "name": "async", "dataset_id": 1, "model_id": 2, "config": {"epochs": 1},
    "distributed": {"enabled": true, "num_rounds": 4, "min_workers": 2, "max_workers": 5},
    "worker_selection": {"mode": "auto"}
  })");
  body["distributed"].update(distributed);
  return body;
}

std::string Problems(const json& body) {
  std::vector<FieldProblem> problems;
  StatusOr<JobSpec> spec = ParseJobSpecJson(body, problems);
  return spec.ok() ? "" : spec.status().message();
}

TEST(AsyncAggregationSpecTest, SyncIsTheDefaultAndAsyncTakesTheDocumentedDefaults) {
  const JobSpec sync = ParseJobSpecJson(JobBody(json::object())).value();
  EXPECT_FALSE(sync.distributed.async.enabled);
  EXPECT_FALSE(JobSpecToJson(sync)["distributed"].contains("aggregation"));

  const JobSpec async = ParseJobSpecJson(JobBody({{"aggregation", "async"}, {"async", {{"buffer_size", 3}}}})).value();
  const AsyncAggregationSpec& a = async.distributed.async;
  EXPECT_TRUE(a.enabled);
  EXPECT_EQ(a.buffer_size, 3);
  EXPECT_EQ(a.MaxConcurrency(async.distributed.max_workers), 5);  // max_workers
  EXPECT_EQ(a.max_staleness, 20);
  EXPECT_EQ(a.staleness_weighting.rule, Rule::kPolynomial);
  EXPECT_EQ(a.staleness_weighting.exponent, 0.5);
  EXPECT_EQ(a.server_learning_rate, 1.0);
  // The normal form reads back the same.
  EXPECT_EQ(ParseJobSpecJson(JobSpecToJson(async)).value(), async);
}

TEST(AsyncAggregationSpecTest, EveryWeightingFormReadsBack) {
  for (const json& weighting : {json("constant"), json("polynomial"), json{{"polynomial", {{"exponent", 1.5}}}}}) {
    const JobSpec spec = ParseJobSpecJson(JobBody({{"aggregation", "async"},
                                                   {"async",
                                                    {{"buffer_size", 2},
                                                     {"max_concurrency", 4},
                                                     {"max_staleness", 0},
                                                     {"staleness_weighting", weighting},
                                                     {"server_learning_rate", 0.5}}}}))
                             .value();
    EXPECT_EQ(ParseJobSpecJson(JobSpecToJson(spec)).value(), spec) << weighting.dump();
  }
  const JobSpec exponent =
      ParseJobSpecJson(
          JobBody({{"aggregation", "async"},
                   {"async", {{"buffer_size", 2}, {"staleness_weighting", {{"polynomial", {{"exponent", 1.5}}}}}}}}))
          .value();
  EXPECT_EQ(exponent.distributed.async.staleness_weighting.exponent, 1.5);
}

TEST(AsyncAggregationSpecTest, BadInputIsRefusedNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 6}}}},
       "distributed.async.buffer_size (6) must be <= distributed.async.max_concurrency (5, which defaults to "
       "distributed.max_workers)"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 3}, {"max_concurrency", 2}}}},
       "distributed.async.buffer_size (3) must be <= distributed.async.max_concurrency (2)"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}, {"max_concurrency", 9}}}},
       "distributed.async.max_concurrency (9) must be <= distributed.max_workers (5)"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}, {"max_staleness", -1}}}},
       "distributed.async.max_staleness"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}, {"staleness_weighting", "linear"}}}},
       "distributed.async.staleness_weighting must be"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}, {"server_learning_rate", 0}}}},
       "distributed.async.server_learning_rate"},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}, {"bufer", 1}}}}, "distributed.async.bufer"},
      {{{"aggregation", "later"}}, "distributed.aggregation must be \"sync\" or \"async\""},
      {{{"async", {{"buffer_size", 2}}}}, "distributed.async applies only with distributed.aggregation \"async\""},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}}}, {"secure_aggregation", {{"enabled", true}}}},
       "distributed.secure_aggregation cannot run with distributed.aggregation \"async\""},
      {{{"aggregation", "async"}, {"async", {{"buffer_size", 2}}}, {"config_lora_r", "auto"}},
       "distributed.aggregation \"async\" needs one LoRA rank for every worker"},
  };
  for (auto [distributed, expected] : cases) {
    json body = JobBody(distributed);
    if (distributed.contains("config_lora_r")) {  // a config key, not a distributed one
      body["distributed"].erase("config_lora_r");
      body["config"] = {{"use_peft", true}, {"lora_r", "auto"}};
    }
    EXPECT_NE(Problems(body).find(expected), std::string::npos) << distributed.dump() << " -> " << Problems(body);
  }
}

TEST(AsyncAggregationSpecTest, AnOrdinaryJobCannotBeAsync) {
  json body = JobBody({{"aggregation", "async"}, {"async", {{"buffer_size", 1}}}});
  body["distributed"]["enabled"] = false;
  body["distributed"].erase("min_workers");
  body["distributed"].erase("max_workers");
  EXPECT_NE(Problems(body).find("distributed.aggregation \"async\" needs distributed.enabled true"), std::string::npos)
      << Problems(body);
}

}  // namespace
}  // namespace parsyn::coordinator
