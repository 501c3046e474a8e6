#include "base/testing/build_paths.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace parsyn::test_support {
namespace {

TEST(BuildPathsTest, SourceDirIsTheTreeThisTestWasBuiltFrom) {
  EXPECT_TRUE(std::filesystem::exists(SourcePath("src/base/build_paths_test.cc")));
  EXPECT_EQ(SourcePath("docs"), BuildPath("source_dir") + "/docs");
}

TEST(BuildPathsTest, AnUnknownKeyAbortsNamingIt) {
  EXPECT_DEATH(BuildPath("no-such-program"), "has no 'no-such-program'");
}

}  // namespace
}  // namespace parsyn::test_support
