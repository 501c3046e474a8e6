#include "base/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace parsyn {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndMessage) {
  Status s = NotFoundError("job 7 does not exist");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: job 7 does not exist");
  EXPECT_EQ(s.WithContext("loading").message(), "loading: job 7 does not exist");
}

TEST(StatusTest, EachCodeHasItsSlug) {
  struct Row {
    StatusCode code;
    const char* slug;
  };
  const Row rows[] = {
      {StatusCode::kInvalidArgument, "invalid_argument"},
      {StatusCode::kNotFound, "not_found"},
      {StatusCode::kAlreadyExists, "already_exists"},
      {StatusCode::kFailedPrecondition, "failed_precondition"},
      {StatusCode::kUnavailable, "unavailable"},
      {StatusCode::kDeadlineExceeded, "deadline_exceeded"},
      {StatusCode::kDataLoss, "data_loss"},
      {StatusCode::kInternal, "internal"},
      {StatusCode::kUnauthenticated, "unauthenticated"},
      {StatusCode::kPermissionDenied, "permission_denied"},
      {StatusCode::kResourceExhausted, "resource_exhausted"},
  };
  for (const Row& r : rows) EXPECT_EQ(StatusCodeSlug(r.code), r.slug) << StatusCodeName(r.code);
}

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  PARSYN_ASSIGN_OR_RETURN(int h, Half(x));
  PARSYN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  PARSYN_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(StatusOrTest, ValueAndErrorPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  StatusOr<int> bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).code(), StatusCode::kInvalidArgument);
}

TEST(StatusOrTest, HoldsMoveOnlyTypes) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(5);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 5);
}

}  // namespace
}  // namespace parsyn
