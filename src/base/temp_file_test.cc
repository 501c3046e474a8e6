#include "base/temp_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

namespace parsyn {
namespace {

namespace fs = std::filesystem;

TEST(TempFileTest, FilesAndDirectoriesAreNewPrivateAndDistinct) {
  StatusOr<fs::path> dir = CreateTempDir(fs::temp_directory_path(), "parsyn-base-test");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_TRUE(fs::is_directory(*dir));
  EXPECT_EQ(dir->filename().string().rfind("parsyn-base-test-", 0), 0u) << *dir;
  struct stat st {};
  ASSERT_EQ(::stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  std::set<fs::path> names;
  for (int i = 0; i < 20; ++i) {
    StatusOr<TempFile> file = CreateTempFile(*dir, "blob");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_EQ(file->path.parent_path(), *dir);
    EXPECT_EQ(::write(file->fd, "x", 1), 1);
    ::close(file->fd);
    EXPECT_EQ(fs::file_size(file->path), 1u);
    names.insert(file->path);
  }
  EXPECT_EQ(names.size(), 20u);
  fs::remove_all(*dir);
}

TEST(TempFileTest, MissingDirectoryIsUnavailableNamingIt) {
  StatusOr<TempFile> file = CreateTempFile("/nonexistent-parsyn-dir", "x");
  EXPECT_EQ(file.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(file.status().message().find("/nonexistent-parsyn-dir"), std::string::npos) << file.status().message();
  EXPECT_EQ(CreateTempDir("/nonexistent-parsyn-dir", "x").status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace parsyn
