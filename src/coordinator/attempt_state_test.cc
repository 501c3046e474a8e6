#include "coordinator/attempt_state.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdio>

namespace parsyn::coordinator {
namespace {

weights::WeightSet OneTensor(float value) {
  weights::WeightSet set;
  const std::array<float, 2> values{value, -value};
  EXPECT_TRUE(set.Add("w", weights::DType::kF32, {2}, std::as_bytes(std::span(values))).ok());
  return set;
}

TEST(AttemptStateTest, BeginForgetsThePreviousAttempt) {
  AttemptState state;
  EXPECT_EQ(state.started(), std::chrono::steady_clock::time_point{});
  state.Begin({1, 2});
  const auto first_start = state.started();
  EXPECT_NE(first_start, std::chrono::steady_clock::time_point{});
  state.RecordResult(1, ResultReport{.round = 1, .attempt = 1, .blob_key = "k1", .sample_count = 10});
  state.RecordVerdict(1, Status::Ok());
  state.RecordProgress(1, {{"step", 3}});
  state.RecordVerifiedBytes("k1", 100);
  state.AddMultipartUpload(1, {.key = "k1", .upload_id = "u1"});
  state.AddBytesDown(500);
  state.AddBytesUp(300);
  EXPECT_FALSE(state.AddStoredParticipant(2));  // listed by the start
  EXPECT_TRUE(state.AddStoredParticipant(3));   // a late joiner
  EXPECT_FALSE(state.AddStoredParticipant(3));

  state.Begin({3});
  EXPECT_GE(state.started(), first_start);
  EXPECT_EQ(state.result(1), nullptr);
  EXPECT_FALSE(state.update_recorded(1));
  EXPECT_EQ(state.last_verdict(1), nullptr);
  EXPECT_TRUE(state.progress().empty());
  EXPECT_EQ(state.verified_bytes("k1"), std::nullopt);
  EXPECT_EQ(state.multipart_upload(1), nullptr);
  EXPECT_EQ(state.bytes_down(), 0);
  EXPECT_EQ(state.bytes_up(), 0);
  EXPECT_FALSE(state.AddStoredParticipant(3));
  EXPECT_TRUE(state.AddStoredParticipant(2));
}

TEST(AttemptStateTest, ResultsAndVerdicts) {
  AttemptState state;
  state.Begin({});
  state.RecordResult(7, ResultReport{.round = 2, .attempt = 1, .blob_key = "u7", .sample_count = 40});
  ASSERT_NE(state.result(7), nullptr);
  EXPECT_EQ(state.result(7)->sample_count, 40);
  EXPECT_EQ(state.result(7)->blob_key, "u7");
  EXPECT_EQ(state.result(8), nullptr);

  EXPECT_FALSE(state.update_recorded(7));
  state.RecordVerdict(7, Status::Ok());
  EXPECT_TRUE(state.update_recorded(7));
  ASSERT_NE(state.last_verdict(7), nullptr);
  EXPECT_EQ(*state.last_verdict(7), "");
  state.RecordVerdict(8, InvalidArgumentError("sample_count must be positive"));
  ASSERT_NE(state.last_verdict(8), nullptr);
  EXPECT_EQ(*state.last_verdict(8), "sample_count must be positive");

  state.AddBytesDown(10);
  state.AddBytesDown(32);
  state.AddBytesUp(5);
  EXPECT_EQ(state.bytes_down(), 42);
  EXPECT_EQ(state.bytes_up(), 5);
  state.RecordProgress(7, {{"step", 1}});
  state.RecordProgress(7, {{"step", 2}});  // the latest counts
  EXPECT_EQ(state.progress().at(7)["step"], 2);
}

TEST(AttemptStateTest, VerifiedSizesIgnoreChecksThatReadNothing) {
  AttemptState state;
  state.RecordVerifiedBytes("a", 0);
  EXPECT_EQ(state.verified_bytes("a"), std::nullopt);
  state.RecordVerifiedBytes("a", 2048);
  EXPECT_EQ(state.verified_bytes("a"), 2048u);
}

TEST(AttemptStateTest, MultipartUploadsAreTakenOnlyForTheirKey) {
  AttemptState state;
  state.AddMultipartUpload(4, {.key = "jobs/1/rounds/000001-a1/updates/w4.safetensors", .upload_id = "id-4"});
  ASSERT_NE(state.multipart_upload(4), nullptr);
  EXPECT_EQ(state.multipart_upload(4)->upload_id, "id-4");
  EXPECT_FALSE(state.TakeMultipartUpload(4, "another key").has_value());
  EXPECT_NE(state.multipart_upload(4), nullptr);  // not taken
  std::optional<MultipartUpload> taken = state.TakeMultipartUpload(4, "jobs/1/rounds/000001-a1/updates/w4.safetensors");
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->upload_id, "id-4");
  EXPECT_EQ(state.multipart_upload(4), nullptr);  // a repeated result finds nothing to complete
  state.AddMultipartUpload(5, {.key = "k5", .upload_id = "id-5"});
  state.ForgetMultipartUploads();
  EXPECT_EQ(state.multipart_upload(5), nullptr);
}

TEST(AttemptStateTest, EarlyCheckedUpdatesAreBoundedAndMatchedByRoundAttemptAndKey) {
  EXPECT_EQ(AttemptState::MaxEarlyCheckedUpdates(true, uint64_t{1} << 30), AttemptState::kMaxEarlyCheckedMapped);
  EXPECT_EQ(AttemptState::MaxEarlyCheckedUpdates(false, uint64_t{1} << 30), AttemptState::kMinEarlyCheckedUpdates);
  EXPECT_EQ(AttemptState::MaxEarlyCheckedUpdates(false, uint64_t{64} << 10), 4096u);  // 256 MiB / 64 KiB
  EXPECT_EQ(AttemptState::MaxEarlyCheckedUpdates(false, 0), AttemptState::kEarlyCheckedBudgetBytes);

  AttemptState state;
  EXPECT_TRUE(state.MayCheckEarly(1, 2));
  state.StartEarlyCheck(1, 3, 1, "k1");
  EXPECT_FALSE(state.MayCheckEarly(1, 2));  // its own check is held
  EXPECT_TRUE(state.MayCheckEarly(2, 2));
  state.StartEarlyCheck(2, 3, 1, "k2");
  EXPECT_FALSE(state.MayCheckEarly(3, 2));  // the bound

  EXPECT_FALSE(state.TakeEarlyChecked(1, 3, 1, "k1").has_value());  // still running
  state.FinishEarlyCheck(1, OneTensor(0.5f), 0.5);
  EXPECT_FALSE(state.TakeEarlyChecked(1, 3, 2, "k1").has_value());  // another attempt
  EXPECT_FALSE(state.TakeEarlyChecked(1, 4, 1, "k1").has_value());  // another round
  EXPECT_FALSE(state.TakeEarlyChecked(1, 3, 1, "k9").has_value());  // another key
  std::optional<CheckedUpdate> checked = state.TakeEarlyChecked(1, 3, 1, "k1");
  ASSERT_TRUE(checked.has_value());
  ASSERT_TRUE(checked->update.ok());
  EXPECT_EQ(checked->update->size(), 1u);
  EXPECT_EQ(checked->max_magnitude, 0.5);
  EXPECT_TRUE(state.MayCheckEarly(1, 2));  // taken over

  state.DropEarlyCheck(2);
  state.FinishEarlyCheck(2, InvalidArgumentError("bad"), std::nullopt);  // dropped meanwhile: not kept
  EXPECT_FALSE(state.TakeEarlyChecked(2, 3, 1, "k2").has_value());
  EXPECT_TRUE(state.MayCheckEarly(3, 1));
}

TEST(AttemptStateTest, ResultsInProgressAreCountedWhileTheyLive) {
  AttemptState state;
  EXPECT_EQ(state.results_in_progress(), 0);
  {
    AttemptState::ResultInProgress first(state);
    {
      AttemptState::ResultInProgress second(state);
      EXPECT_EQ(state.results_in_progress(), 2);
    }
    EXPECT_EQ(state.results_in_progress(), 1);
  }
  EXPECT_EQ(state.results_in_progress(), 0);
}

TEST(AttemptStateTest, CheckedUploadsAreTakenOnceAndBounded) {
  AttemptState state;
  state.RememberCheckedUpload("b", {.sha256 = "beef", .max_magnitude = 2.5});
  std::optional<StreamChecked> taken = state.TakeCheckedUpload("b");
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->sha256, "beef");
  EXPECT_EQ(taken->max_magnitude, 2.5);
  EXPECT_FALSE(state.TakeCheckedUpload("b").has_value());

  // Past the bound the lowest key goes first (keys name their round, so the oldest).
  char key[32];
  for (size_t i = 0; i <= AttemptState::kMaxCheckedUploads; ++i) {
    std::snprintf(key, sizeof key, "k%06zu", i);
    state.RememberCheckedUpload(key, {.sha256 = key, .max_magnitude = 1});
  }
  EXPECT_FALSE(state.TakeCheckedUpload("k000000").has_value());
  EXPECT_TRUE(state.TakeCheckedUpload("k000001").has_value());
  std::snprintf(key, sizeof key, "k%06zu", AttemptState::kMaxCheckedUploads);
  EXPECT_TRUE(state.TakeCheckedUpload(key).has_value());
}

}  // namespace
}  // namespace parsyn::coordinator
