#include "protocol/trainer_events.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace parsyn::protocol {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(TrainerEventsTest, EventsRoundTrip) {
  const TrainerProgress progress{
      .step = 3, .total_steps = 10, .loss = 0.5, .throughput = 120.0, .throughput_unit = "tokens/s"};
  EXPECT_EQ(std::get<TrainerProgress>(*ParseTrainerEvent(TrainerProgressToJson(progress))), progress);
  TrainerDone done;
  done.result.num_samples = 750;
  done.result.num_validation = 250;
  done.result.train_loss = 0.52;
  done.result.validation_before = json{{"loss", 0.9}, {"accuracy", 0.6}};
  done.result.validation_after = json{{"loss", 0.4}};
  done.result.metrics = json{{"steps", 20}};
  EXPECT_EQ(std::get<TrainerDone>(*ParseTrainerEvent(TrainerDoneToJson(done))), done);
  EXPECT_EQ(done.result.ValidationLossBefore(), 0.9);
  const TrainerError error{.code = "non_finite_loss", .message = "line 1\nline 2"};
  EXPECT_EQ(std::get<TrainerError>(*ParseTrainerEvent(TrainerErrorToJson(error))), error);
  EXPECT_EQ(std::get<TrainerOtherEvent>(*ParseTrainerEvent(json{{"event", "eval"}, {"loss", 1}})).name, "eval");
}

// fuzz_trainer_output found it: a unit without a throughput read back differently once written.
TEST(TrainerEventsTest, AUnitGoesOnlyWithAThroughput) {
  const json event = {{"event", "progress"}, {"step", 1}, {"total_steps", 10}, {"throughput_unit", "samples/s"}};
  const TrainerProgress p = std::get<TrainerProgress>(*ParseTrainerEvent(event));
  EXPECT_TRUE(p.throughput_unit.empty());
  EXPECT_EQ(std::get<TrainerProgress>(*ParseTrainerEvent(TrainerProgressToJson(p))), p);
}

TEST(TrainerEventsTest, LinesThatAreNotEvents) {
  EXPECT_FALSE(ParseEventObject("hello world").has_value());
  EXPECT_FALSE(ParseEventObject("[1, 2]").has_value());
  EXPECT_FALSE(ParseEventObject(R"({"step": 1})").has_value());
  EXPECT_FALSE(ParseEventObject(R"({"event": 7})").has_value());
  ASSERT_TRUE(ParseEventObject(R"({"event": "progress", "step": 1, "total_steps": 2})").has_value());
}

TEST(TrainerEventsTest, MalformedKnownEventsNameTheField) {
  struct Case {
    json event;
    std::string message;
  };
  const Case cases[] = {
      {{{"event", "progress"}, {"total_steps", 2}}, "progress.step is required"},
      {{{"event", "progress"}, {"step", 1}, {"total_steps", 2}, {"loss", "nan"}},
       "progress.loss must be a finite number, got \"nan\""},
      {{{"event", "progress"}, {"step", 1}, {"total_steps", 2}, {"throughput", 5}, {"throughput_unit", "img/s"}},
       "progress.throughput_unit must be \"samples/s\" or \"tokens/s\", got \"img/s\""},
      {{{"event", "done"}}, "done.num_samples is required"},
      {{{"event", "done"}, {"num_samples", 5}, {"validation_before", {{"accuracy", 0.5}}}},
       "done.validation_before.loss is required (the loss on the validation rows)"},
      {{{"event", "error"}, {"message", "boom"}}, "error.code is required"},
  };
  for (const Case& c : cases) {
    StatusOr<TrainerEvent> parsed = ParseTrainerEvent(c.event);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << c.event.dump();
    EXPECT_EQ(parsed.status().message(), c.message) << c.event.dump();
  }
}

TEST(TrainerEventsTest, ResultNumbersMustBeFinite) {
  // Python's json writes NaN as the bare word NaN, which is not JSON: such a line is not an event at all.
  EXPECT_FALSE(ParseEventObject(R"({"event": "done", "num_samples": 4, "train_loss": NaN})").has_value());
  const json result = {{"num_samples", 4}, {"train_loss", std::numeric_limits<double>::infinity()}};
  EXPECT_THAT(ParseTrainerResult(result).status().message(), HasSubstr("result.train_loss must be a finite number"));
  EXPECT_EQ(ParseTrainerResult(json{{"num_samples", -1}}).status().message(),
            "result.num_samples (-1) must be between 0 and 9007199254740992");
  auto ok = ParseTrainerResult(json{{"num_samples", 4}, {"train_loss", nullptr}, {"extra", "ignored"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_FALSE(ok->train_loss.has_value());
  EXPECT_EQ(ok->metrics, json::object());
}

TEST(TrainerEventsTest, DescriptionNeedsVersionOneAndKinds) {
  const json good = {{"contract_versions", {1, 2}},
                     {"task_kinds", {"train", "evaluate"}},
                     {"model_kinds", {"tabular-mlp"}},
                     {"name", "tab"}};
  StatusOr<TrainerDescription> d = ParseTrainerDescription(good);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->TrainsModelKind("tabular-mlp"));
  EXPECT_FALSE(d->TrainsModelKind("llama"));
  EXPECT_EQ(*ParseTrainerDescription(TrainerDescriptionToJson(*d)), *d);
  json any = good;
  any["model_kinds"] = {"*"};
  EXPECT_TRUE(ParseTrainerDescription(any)->TrainsModelKind("llama"));
  json old = good;
  old["contract_versions"] = {2};
  EXPECT_EQ(ParseTrainerDescription(old).status().message(), "describe.contract_versions must list 1, got [2]");
  json bad_kind = good;
  bad_kind["task_kinds"] = {"infer"};
  EXPECT_EQ(ParseTrainerDescription(bad_kind).status().message(),
            "describe.task_kinds may hold \"train\" and \"evaluate\", got \"infer\"");
  EXPECT_EQ(ParseTrainerDescription(json{{"task_kinds", {"train"}}}).status().message(),
            "describe.contract_versions is required; describe.model_kinds is required");
}

}  // namespace
}  // namespace parsyn::protocol
