#include "coordinator/secure_aggregation_spec.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace parsyn::coordinator {
namespace {

using nlohmann::json;
using strategy::StrategyKind;

struct Parsed {
  SecureAggregationSpec spec;
  std::vector<std::string> errors;
};

Parsed ParseSection(const json& object) {
  Parsed out;
  ParseSecureAggregation(&object, out.spec, out.errors);
  return out;
}

std::string Joined(const std::vector<std::string>& errors) {
  std::string out;
  for (const std::string& e : errors) out += e + "; ";
  return out;
}

TEST(SecureAggregationSpecTest, DefaultsAndTheNormalFormReadBackTheSame) {
  const Parsed defaults = ParseSection(json{{"enabled", true}});
  ASSERT_TRUE(defaults.errors.empty()) << Joined(defaults.errors);
  EXPECT_EQ(defaults.spec.quantization_bits, 16);
  EXPECT_EQ(defaults.spec.clipping_range, 8.0);
  EXPECT_EQ(ThresholdFor(defaults.spec, 10), 7u);  // ceil(2n/3)
  for (const json& body : {json{{"enabled", true}, {"threshold", 5}, {"neighbors", 6}, {"quantization_bits", 8}},
                           json{{"enabled", true}, {"threshold", 0.75}, {"clipping_range", 0.5}}}) {
    const Parsed first = ParseSection(body);
    ASSERT_TRUE(first.errors.empty()) << Joined(first.errors);
    const Parsed again = ParseSection(json::parse(SecureAggregationToJson(first.spec).dump()));
    ASSERT_TRUE(again.errors.empty()) << Joined(again.errors);
    EXPECT_EQ(again.spec, first.spec) << body.dump();
  }
}

TEST(SecureAggregationSpecTest, AThresholdIsACountOrAFractionOfTheRound) {
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 5}}).spec, 10), 5u);
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 5}}).spec, 3), 3u);  // never above the round's participants
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 0.75}}).spec, 10), 8u);
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 0.5}}).spec, 10), 5u);
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 0.1}}).spec, 10), 2u);  // a sum of one update is that update
  EXPECT_EQ(ThresholdFor(ParseSection(json{{"threshold", 1.0}}).spec, 10), 10u);
}

TEST(SecureAggregationSpecTest, BadValuesAreRefusedNamingTheField) {
  for (const auto& [body, field] : std::vector<std::pair<json, std::string>>{
           {{{"threshold", 1}}, "distributed.secure_aggregation.threshold"},
           {{{"threshold", 1.5}}, "distributed.secure_aggregation.threshold"},
           {{{"threshold", 0.0}}, "distributed.secure_aggregation.threshold"},
           {{{"neighbors", 1}}, "distributed.secure_aggregation.neighbors"},
           {{{"clipping_range", 0}}, "distributed.secure_aggregation.clipping_range"},
           {{{"quantization_bits", 12}}, "distributed.secure_aggregation.quantization_bits"},
           {{{"quantization_bits", "8"}}, "distributed.secure_aggregation.quantization_bits"},
           {{{"enabled", "yes"}}, "distributed.secure_aggregation.enabled"},
           {{{"neighbours", 4}}, "distributed.secure_aggregation.neighbours"}}) {
    const Parsed parsed = ParseSection(body);
    ASSERT_EQ(parsed.errors.size(), 1u) << body.dump() << ": " << Joined(parsed.errors);
    EXPECT_NE(parsed.errors[0].find(field), std::string::npos) << parsed.errors[0];
  }
}

TEST(SecureAggregationSpecTest, StrategiesThatNeedSingleUpdatesAndUpdateCompressionAreRefused) {
  const SecureAggregationSpec on = ParseSection(json{{"enabled", true}}).spec;
  for (StrategyKind ok :
       {StrategyKind::kFederatedAveraging, StrategyKind::kFedProx, StrategyKind::kFedAvgM, StrategyKind::kFedAdam,
        StrategyKind::kFedYogi, StrategyKind::kFedAdagrad, StrategyKind::kDpFedAvg}) {
    std::vector<std::string> errors;
    CheckSecureAggregation(on, true, ok, {}, 3, errors);
    EXPECT_TRUE(errors.empty()) << Joined(errors);
  }
  for (StrategyKind refused :
       {StrategyKind::kMedian, StrategyKind::kTrimmedMean, StrategyKind::kKrum, StrategyKind::kMultiKrum}) {
    std::vector<std::string> errors;
    CheckSecureAggregation(on, true, refused, {}, 3, errors);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].find(std::string(strategy::StrategyKindName(refused))), std::string::npos) << errors[0];
  }
  protocol::UpdateCompression int8;
  int8.update = "int8";
  std::vector<std::string> errors;
  CheckSecureAggregation(on, true, StrategyKind::kFederatedAveraging, int8, 3, errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("distributed.compression"), std::string::npos) << errors[0];
  protocol::UpdateCompression downlink;
  downlink.global = "delta_bf16";  // the downlink's compression stays
  errors.clear();
  CheckSecureAggregation(on, true, StrategyKind::kFederatedAveraging, downlink, 3, errors);
  EXPECT_TRUE(errors.empty()) << Joined(errors);
}

TEST(SecureAggregationSpecTest, TheThresholdMustAllowARoundOfMinWorkers) {
  std::vector<std::string> errors;
  CheckSecureAggregation(ParseSection(json{{"enabled", true}, {"threshold", 4}}).spec, true,
                         StrategyKind::kFederatedAveraging, {}, 3, errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("distributed.min_workers (3)"), std::string::npos) << errors[0];
  errors.clear();
  CheckSecureAggregation(ParseSection(json{{"enabled", true}}).spec, false, StrategyKind::kFederatedAveraging, {}, 1,
                         errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("distributed.enabled"), std::string::npos) << errors[0];
  errors.clear();
  CheckSecureAggregation(ParseSection(json{{"enabled", false}, {"threshold", 9}}).spec, true, StrategyKind::kMedian, {},
                         1, errors);
  EXPECT_TRUE(errors.empty()) << Joined(errors);  // off: nothing to check
}

TEST(SecureAggregationSpecTest, EachAttemptHasItsOwnNameAndAValidSetup) {
  const SecureAggregationSpec spec = ParseSection(json{{"enabled", true}, {"threshold", 0.6}}).spec;
  auto setup = SecureAttemptSetup(spec, 7, 3, 2, {5, 1, 9, 4, 2}, 101, secagg::Key32{});
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  EXPECT_EQ(setup->attempt, "job 7 round 3 attempt 2");
  EXPECT_EQ(setup->participants, (std::vector<uint64_t>{1, 2, 4, 5, 9}));
  EXPECT_EQ(setup->min_survivors, 3u);
  EXPECT_EQ(setup->neighbors, 4u);
  EXPECT_NE(SecureAttemptName(7, 3, 2), SecureAttemptName(7, 3, 3));
  EXPECT_NE(SecureAttemptName(7, 13, 2), SecureAttemptName(71, 3, 2));
}

// A threshold below a majority of the share holders: unmasking needs more survivors than it says, and the job is
// warned with both numbers; the defaults never are.
TEST(SecureAggregationSpecTest, AThresholdBelowWhatUnmaskingNeedsIsWarnedOf) {
  const SecureAggregationSpec low = ParseSection(json{{"enabled", true}, {"threshold", 2}}).spec;
  const std::optional<std::string> warning = SecureThresholdWarning(low, 4);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("fewer than 3 survivors fails at unmasking"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("set threshold to 3"), std::string::npos) << *warning;
  EXPECT_FALSE(SecureThresholdWarning(low, 3).has_value());  // 2 of 3 is a majority
  const SecureAggregationSpec defaults = ParseSection(json{{"enabled", true}}).spec;
  for (size_t n : {2u, 3u, 4u, 5u, 10u, 16u, 17u, 100u, 1000u}) {
    EXPECT_FALSE(SecureThresholdWarning(defaults, n).has_value()) << n;
  }
}

}  // namespace
}  // namespace parsyn::coordinator
