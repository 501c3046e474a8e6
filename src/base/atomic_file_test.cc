#include "base/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "base/testing/temp_dir.h"

namespace parsyn {
namespace {

std::string Contents(const std::filesystem::path& file) {
  std::stringstream s;
  s << std::ifstream(file).rdbuf();
  return s.str();
}

TEST(AtomicFileTest, ReplacesTheFileWholeAndLeavesNoTemporary) {
  test_support::TempDir dir("parsyn-atomic-file-test");
  const std::filesystem::path file = dir.path() / "config.json";
  ASSERT_TRUE(WriteFileAtomically(file, "old\n").ok());
  ASSERT_TRUE(WriteFileAtomically(file, "new\n").ok());
  EXPECT_EQ(Contents(file), "new\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(AtomicFileTest, AWriterNotCommittedLeavesTheOldFile) {
  test_support::TempDir dir("parsyn-atomic-file-test");
  const std::filesystem::path file = dir.path() / "data";
  ASSERT_TRUE(WriteFileAtomically(file, "kept").ok());
  {
    StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Open(file);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    ASSERT_TRUE(writer->Append("half").ok());
  }
  EXPECT_EQ(Contents(file), "kept");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1);
}

TEST(AtomicFileTest, SecretsGetTheModeTheyAskFor) {
  test_support::TempDir dir("parsyn-atomic-file-test");
  const std::filesystem::path file = dir.path() / "token";
  ASSERT_TRUE(WriteFileAtomically(file, "pwt_secret\n", 0600).ok());
  struct stat info {};
  ASSERT_EQ(::stat(file.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

TEST(AtomicFileTest, MissingDirectoryIsUnavailable) {
  test_support::TempDir dir("parsyn-atomic-file-test");
  EXPECT_EQ(WriteFileAtomically(dir.path() / "no" / "file", "x").code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace parsyn
