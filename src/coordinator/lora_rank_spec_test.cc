#include "coordinator/lora_rank_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "coordinator/job_spec.h"

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json LoraJob(json config) {
  json body = {{"name", "ranks"},
               {"dataset_id", 1},
               {"model_id", 2},
               {"config", std::move(config)},
               {"distributed", {{"enabled", true}, {"min_workers", 2}}}};
  return body;
}

StatusOr<JobSpec> Parse(const json& body) { return ParseJobSpecJson(body); }

TEST(LoraRankSpecTest, AutoRanksKeepTheirMaximumAsTheGlobalsRankAndWriteAutoBack) {
  StatusOr<JobSpec> spec = Parse(LoraJob({{"lora_r", "auto"}, {"lora_r_max", 32}}));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->lora_ranks.auto_rank);
  EXPECT_EQ(spec->config.lora_r, 32);  // the global adapter's rank
  EXPECT_EQ(spec->lora_ranks.EffectiveAggregation(), LoraAggregation::kSvd);
  const json out = JobSpecToJson(*spec);
  EXPECT_EQ(out["config"]["lora_r"], "auto");
  EXPECT_EQ(out["config"]["lora_r_max"], 32);
  EXPECT_FALSE(out["config"].contains("lora_aggregation"));  // not given: the default, not written
  EXPECT_EQ(*Parse(out), *spec);

  StatusOr<JobSpec> defaulted = Parse(LoraJob({{"lora_r", "auto"}}));
  ASSERT_TRUE(defaulted.ok());
  EXPECT_EQ(defaulted->config.lora_r, kDefaultAutoMaxLoraRank);
}

TEST(LoraRankSpecTest, RanksByWorkerTakeTheLargestAsTheGlobalsRankAndLoraRAsTheDefault) {
  json body = LoraJob({{"lora_r", 4}, {"lora_ranks", {{"3", 16}, {"5", 8}}}});
  body["worker_selection"] = {{"worker_ids", {3, 5, 6}}};
  StatusOr<JobSpec> spec = Parse(body);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->config.lora_r, 16);
  EXPECT_EQ(spec->lora_ranks.default_rank, 4);
  EXPECT_EQ(spec->lora_ranks.by_worker, (std::map<int64_t, int>{{3, 16}, {5, 8}}));
  const json out = JobSpecToJson(*spec);
  EXPECT_EQ(out["config"]["lora_r"], 16);
  EXPECT_EQ(out["config"]["lora_ranks"], (json{{"3", 16}, {"5", 8}, {"default", 4}}));
  EXPECT_EQ(*Parse(out), *spec);

  // "default" sets the others' rank; lora_r still counts toward the maximum.
  StatusOr<JobSpec> with_default = Parse(LoraJob({{"lora_r", 8}, {"lora_ranks", {{"default", 2}, {"7", 4}}}}));
  ASSERT_TRUE(with_default.ok()) << with_default.status().ToString();
  EXPECT_EQ(with_default->config.lora_r, 8);
  EXPECT_EQ(with_default->lora_ranks.default_rank, 2);
  EXPECT_EQ(*Parse(JobSpecToJson(*with_default)), *with_default);

  // A job of one rank keeps today's form: nothing of this is written back.
  StatusOr<JobSpec> uniform = Parse(LoraJob({{"lora_r", 8}}));
  ASSERT_TRUE(uniform.ok());
  EXPECT_FALSE(uniform->lora_ranks.mixed());
  EXPECT_EQ(uniform->lora_ranks.EffectiveAggregation(), LoraAggregation::kZeroPad);
  for (const char* key : {"lora_ranks", "lora_r_max", "lora_aggregation"}) {
    EXPECT_FALSE(JobSpecToJson(*uniform)["config"].contains(key)) << key;
  }
  // An aggregation given is written back.
  StatusOr<JobSpec> exact = Parse(LoraJob({{"lora_r", 8}, {"lora_aggregation", "svd"}}));
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(JobSpecToJson(*exact)["config"]["lora_aggregation"], "svd");
  EXPECT_EQ(*Parse(JobSpecToJson(*exact)), *exact);
}

TEST(LoraRankSpecTest, BadRanksNameTheFieldAndTheFix) {
  auto problem = [](json config, json selection = nullptr) {
    json body = LoraJob(std::move(config));
    if (!selection.is_null()) body["worker_selection"] = selection;
    StatusOr<JobSpec> spec = Parse(body);
    return spec.ok() ? std::string("ok") : std::string(spec.status().message());
  };
  EXPECT_EQ(problem({{"lora_ranks", {{"3", 0}}}}), "config.lora_ranks.3 must be a LoRA rank between 1 and 1024, got 0");
  EXPECT_EQ(problem({{"lora_ranks", {{"gpu-box", 8}}}}),
            "config.lora_ranks keys must be worker ids (\"3\") or \"default\", got \"gpu-box\"");
  EXPECT_THAT(problem({{"lora_ranks", json::array()}}), HasSubstr("config.lora_ranks must be an object"));
  EXPECT_EQ(problem({{"lora_ranks", {{"9", 8}}}}, {{"worker_ids", {1, 2}}}),
            "config.lora_ranks names worker 9, which is not in this job's worker_selection; name one of its workers "
            "or \"default\"");
  EXPECT_EQ(problem({{"lora_r", 8}, {"lora_r_max", 8}}),
            "config.lora_r_max applies only to config.lora_r \"auto\" (it caps the automatic ranks)");
  EXPECT_THAT(problem({{"lora_r", "auto"}, {"lora_ranks", {{"default", 4}}}}),
              HasSubstr("config.lora_ranks.default cannot be given with config.lora_r \"auto\""));
  EXPECT_EQ(problem({{"lora_aggregation", "mean"}}),
            "config.lora_aggregation must be one of \"svd\", \"zero_pad\", got \"mean\"");
  EXPECT_THAT(problem({{"lora_r", "auto"}, {"use_peft", false}}), HasSubstr("need config.use_peft true"));
  EXPECT_THAT(problem({{"lora_r", "big"}}), HasSubstr("config.lora_r"));

  json median = LoraJob({{"lora_r", "auto"}});
  median["distributed"]["strategy"] = "median";
  StatusOr<JobSpec> spec = Parse(median);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(),
            "config.lora_aggregation \"svd\" (the default with mixed ranks) needs distributed.strategy "
            "federated_averaging or fedprox, whose new global is the updates' weighted mean; with median set "
            "config.lora_aggregation to \"zero_pad\"");
  median["config"]["lora_aggregation"] = "zero_pad";
  EXPECT_TRUE(Parse(median).ok());
}

TEST(LoraRankSpecTest, AutoRankFollowsTheMemoryToModelRatio) {
  constexpr int64_t kModel = 1'000'000'000;
  EXPECT_EQ(AutoLoraRank(16, 8 * kModel, kModel), 16);
  EXPECT_EQ(AutoLoraRank(16, 8 * kModel - 1, kModel), 8);
  EXPECT_EQ(AutoLoraRank(16, 4 * kModel, kModel), 8);
  EXPECT_EQ(AutoLoraRank(16, 2 * kModel, kModel), 4);
  EXPECT_EQ(AutoLoraRank(16, kModel, kModel), 2);
  EXPECT_EQ(AutoLoraRank(4, kModel, kModel), 1);          // never below 1
  EXPECT_EQ(AutoLoraRank(16, std::nullopt, kModel), 16);  // not said: the maximum
  EXPECT_EQ(AutoLoraRank(16, kModel, 0), 16);
}

TEST(LoraRankSpecTest, AWorkersRankIsTheJobsCappedByWhatItAnnouncesAndAboveItIsRefused) {
  constexpr int64_t kModel = 1'000'000'000;
  LoraRankSpec ranks{.by_worker = {{3, 16}}, .default_rank = 4};
  EXPECT_EQ(*WorkerLoraRank(ranks, 16, 3, std::nullopt, std::nullopt, kModel), 16);
  EXPECT_EQ(*WorkerLoraRank(ranks, 16, 8, std::nullopt, std::nullopt, kModel), 4);
  StatusOr<int> refused = WorkerLoraRank(ranks, 16, 3, std::nullopt, 8, kModel);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "worker 3 announces it trains LoRA ranks up to 8 (parsyn worker --lora-rank), and this job gives it rank "
            "16: lower its rank in config.lora_ranks, or restart the worker with --lora-rank 16");
  // A job of one rank refuses the same way.
  EXPECT_FALSE(WorkerLoraRank(LoraRankSpec{}, 16, 3, std::nullopt, 8, kModel).ok());
  EXPECT_EQ(*WorkerLoraRank(LoraRankSpec{}, 16, 3, std::nullopt, 16, kModel), 16);

  // "auto": the memory rule, capped by --lora-rank; lora_ranks still names fixed ranks.
  LoraRankSpec automatic{.auto_rank = true, .auto_max_rank = 16, .by_worker = {{5, 2}}};
  EXPECT_EQ(*WorkerLoraRank(automatic, 16, 1, 80 * kModel, std::nullopt, kModel), 16);
  EXPECT_EQ(*WorkerLoraRank(automatic, 16, 1, 80 * kModel, 8, kModel), 8);
  EXPECT_EQ(*WorkerLoraRank(automatic, 16, 1, 3 * kModel, std::nullopt, kModel), 4);
  EXPECT_EQ(*WorkerLoraRank(automatic, 16, 5, 80 * kModel, std::nullopt, kModel), 2);
}

}  // namespace
}  // namespace parsyn::coordinator
