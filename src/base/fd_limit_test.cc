#include "base/fd_limit.h"

#include <sys/resource.h>

#include <gtest/gtest.h>

namespace parsyn {
namespace {

TEST(FdLimitTest, RaisesTheSoftLimitToTheHardOneOrTheCap) {
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max < 128) GTEST_SKIP() << "hard limit " << original.rlim_max << " leaves nothing to raise";
  rlimit low = original;
  low.rlim_cur = 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);

  StatusOr<OpenFilesLimit> capped = RaiseOpenFilesLimit(100);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->before, 64u);
  EXPECT_EQ(capped->after, 100u);
  StatusOr<OpenFilesLimit> raised = RaiseOpenFilesLimit();
  ASSERT_TRUE(raised.ok()) << raised.status().ToString();
  EXPECT_EQ(raised->before, 100u);
  EXPECT_EQ(raised->after, original.rlim_max);
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, now.rlim_max);
  // Already there: nothing changes.
  StatusOr<OpenFilesLimit> again = RaiseOpenFilesLimit();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->before, again->after);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &original), 0);
}

}  // namespace
}  // namespace parsyn
