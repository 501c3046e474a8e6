#include "http/status_codes.h"

#include <gtest/gtest.h>

namespace parsyn::http {
namespace {

TEST(StatusCodesTest, EachCodeHasItsHttpStatus) {
  struct Row {
    StatusCode code;
    int http;
  };
  const Row rows[] = {
      {StatusCode::kOk, 200},
      {StatusCode::kInvalidArgument, 400},
      {StatusCode::kNotFound, 404},
      {StatusCode::kAlreadyExists, 409},
      {StatusCode::kFailedPrecondition, 409},
      {StatusCode::kUnavailable, 503},
      {StatusCode::kDeadlineExceeded, 504},
      {StatusCode::kDataLoss, 500},
      {StatusCode::kInternal, 500},
      {StatusCode::kUnauthenticated, 401},
      {StatusCode::kPermissionDenied, 403},
      {StatusCode::kResourceExhausted, 413},
      {StatusCode::kCancelled, 499},
  };
  for (const Row& r : rows) EXPECT_EQ(HttpStatusFor(r.code), r.http) << StatusCodeName(r.code);
}

TEST(StatusCodesTest, AnAnswersStatusBecomesTheCodeThatMakesIt) {
  // One-to-one where the server's mapping is.
  for (StatusCode code : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kUnavailable,
                          StatusCode::kDeadlineExceeded, StatusCode::kUnauthenticated, StatusCode::kPermissionDenied,
                          StatusCode::kResourceExhausted, StatusCode::kCancelled}) {
    EXPECT_EQ(CodeForHttpStatus(HttpStatusFor(code)), code) << StatusCodeName(code);
  }
  EXPECT_EQ(CodeForHttpStatus(409), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForHttpStatus(412), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForHttpStatus(429), StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForHttpStatus(502), StatusCode::kUnavailable);
  EXPECT_EQ(CodeForHttpStatus(507), StatusCode::kInternal);
  EXPECT_EQ(CodeForHttpStatus(418), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace parsyn::http
