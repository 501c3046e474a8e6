#include "coordinator/dataset_import.h"

#include <gtest/gtest.h>

#include <fstream>

#include "base/testing/temp_dir.h"

namespace parsyn::coordinator {
namespace {

TEST(DatasetImportTest, QueryNamesTheDatasetAndItsFormat) {
  StatusOr<DatasetImport> csv = DatasetImportFromQuery({{"name", "iris.csv"}});
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  EXPECT_EQ(csv->name, "iris.csv");
  EXPECT_EQ(csv->format, storage::DatasetFormat::kCsv);
  EXPECT_EQ(csv->label_column, "label");

  StatusOr<DatasetImport> jsonl = DatasetImportFromQuery({{"name", "chat.jsonl"}});
  ASSERT_TRUE(jsonl.ok());
  EXPECT_EQ(jsonl->format, storage::DatasetFormat::kJsonl);

  // An explicit format wins over the name's ending.
  StatusOr<DatasetImport> named =
      DatasetImportFromQuery({{"name", "data.jsonl"}, {"format", "csv"}, {"label_column", "species"}});
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->format, storage::DatasetFormat::kCsv);
  EXPECT_EQ(named->label_column, "species");
}

TEST(DatasetImportTest, BadQueriesNameTheParameter) {
  const std::string required = "query parameter 'name' (1..256 bytes) is required";
  EXPECT_EQ(DatasetImportFromQuery({}).status().message(), required);
  EXPECT_EQ(DatasetImportFromQuery({{"name", ""}}).status().message(), required);
  EXPECT_EQ(DatasetImportFromQuery({{"name", std::string(257, 'a')}}).status().message(), required);
  EXPECT_EQ(DatasetImportFromQuery({{"name", "data.txt"}}).status().message(),
            "cannot tell the dataset format from the name 'data.txt': pass format=jsonl or format=csv");
  EXPECT_EQ(DatasetImportFromQuery({{"name", "data.csv"}, {"format", "parquet"}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DatasetImportTest, DescribesTheFileOrSaysWhatIsWrong) {
  test_support::TempDir dir("dataset-import-test");
  auto write = [&](const std::string& name, const std::string& contents) {
    std::ofstream(dir.path() / name) << contents;
    return dir.path() / name;
  };
  storage::Dataset text;
  ASSERT_TRUE(DescribeDatasetFile(write("t.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n"),
                                  storage::DatasetFormat::kJsonl, "label", text)
                  .ok());
  EXPECT_EQ(text.kind, storage::DatasetKind::kText);
  EXPECT_EQ(text.row_count, 2);

  storage::Dataset chat;
  ASSERT_TRUE(DescribeDatasetFile(write("c.jsonl", "{\"prompt\": \"q\", \"completion\": \"a\"}\n"),
                                  storage::DatasetFormat::kJsonl, "label", chat)
                  .ok());
  EXPECT_EQ(chat.kind, storage::DatasetKind::kPromptCompletion);
  EXPECT_EQ(chat.row_count, 1);

  storage::Dataset table;
  const std::filesystem::path csv = write("d.csv", "x,species\n1,cat\n2,dog\n3,cat\n");
  ASSERT_TRUE(DescribeDatasetFile(csv, storage::DatasetFormat::kCsv, "species", table).ok());
  EXPECT_EQ(table.kind, storage::DatasetKind::kTabular);
  EXPECT_EQ(table.row_count, 3);

  storage::Dataset bad;
  Status no_label = DescribeDatasetFile(csv, storage::DatasetFormat::kCsv, "label", bad);
  EXPECT_EQ(no_label.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_label.message().find("line 1"), std::string::npos) << no_label.message();
}

}  // namespace
}  // namespace parsyn::coordinator
