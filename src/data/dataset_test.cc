#include "data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace parsyn::data {
namespace {

// A scratch directory removed when the test ends.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("parsyn_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::filesystem::path Write(const std::string& name, std::string_view contents) const {
    std::ofstream(path_ / name, std::ios::binary) << contents;
    return path_ / name;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------------------------
// JSONL

TEST(TextDatasetTest, ParsesTextRowsSkippingBlankLinesAndCrlf) {
  auto dataset = ParseText("{\"text\": \"hello\"}\r\n\n   \n{\"text\": \"w\\u00f6rld\", \"id\": 3}\n");
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ(dataset->kind, TextKind::kText);
  ASSERT_EQ(dataset->rows.size(), 2u);
  EXPECT_EQ(dataset->rows[0].text, "hello");
  EXPECT_EQ(dataset->rows[1].text, "w\xC3\xB6rld");
}

TEST(TextDatasetTest, ParsesPromptCompletionRows) {
  auto dataset = ParseText("{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n{\"prompt\": \"\", \"completion\": \"x\"}");
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ(dataset->kind, TextKind::kPromptCompletion);
  ASSERT_EQ(dataset->rows.size(), 2u);
  EXPECT_EQ(dataset->rows[0].prompt, "2+2=");
  EXPECT_EQ(dataset->rows[0].completion, "4");
  EXPECT_EQ(TextRowToJsonl(dataset->rows[0], dataset->kind), "{\"completion\":\"4\",\"prompt\":\"2+2=\"}");
}

struct BadTextCase {
  std::string contents;
  std::string message;
};

TEST(TextDatasetTest, EveryBadRowNamesItsLine) {
  const std::string good = "{\"text\": \"ok\"}\n";
  const BadTextCase cases[] = {
      {good + "[1, 2]\n",
       "line 2: expected a JSON object with \"text\" or \"prompt\"+\"completion\" strings, got an array"},
      {good + good + "\"just a string\"\n",
       "line 3: expected a JSON object with \"text\" or \"prompt\"+\"completion\" "
       "strings, got a string"},
      {good + "{\"txt\": \"typo\"}\n",
       "line 2: expected a JSON object with \"text\" or \"prompt\"+\"completion\" "
       "strings, got an object with keys \"txt\""},
      {good + "{\"text\": 5}\n", "line 2: \"text\" must be a string, got a number"},
      {good + "{\"text\": {\"nested\": \"x\"}}\n", "line 2: \"text\" must be a string, got an object"},
      {"{\"a\": 1, \"b\": [2], \"c\": 3, \"d\": 4, \"e\": 5, \"f\": 6, \"g\": 7}\n",
       "line 1: expected a JSON object with \"text\" or \"prompt\"+\"completion\" strings, got an object with keys "
       "\"a\", \"b\", \"c\", \"d\", \"e\", ..."},
      {good + "{\"text\": \"\"}\n", "line 2: \"text\" is empty"},
      {good + "{\"text\": \"a\", \"prompt\": \"b\"}\n",
       "line 2: has both \"text\" and \"prompt\"/\"completion\"; a row is one or the other"},
      {"{\"prompt\": \"a\"}\n", "line 1: has \"prompt\" without \"completion\""},
      {"{\"prompt\": \"a\", \"completion\": null}\n", "line 1: \"completion\" must be a string, got null"},
      {"{\"prompt\": \"a\", \"completion\": \"\"}\n", "line 1: \"completion\" is empty"},
      {good + "\n{\"prompt\": \"a\", \"completion\": \"b\"}\n",
       "line 3: a \"prompt\"/\"completion\" row in a file whose first row (line 1) is a \"text\" row; use one kind "
       "per file"},
      {"", "no rows: the file is empty or has only blank lines"},
      {"\n  \n", "no rows: the file is empty or has only blank lines"},
  };
  for (const auto& c : cases) {
    auto result = ParseText(c.contents);
    ASSERT_FALSE(result.ok()) << c.contents;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << c.contents;
    EXPECT_EQ(result.status().message(), c.message) << c.contents;
  }
}

TEST(TextDatasetTest, InvalidJsonAndInvalidUtf8NameTheLine) {
  auto truncated = ParseText("{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      truncated.status().message().starts_with("line 2: expected a JSON object with \"text\" or "
                                               "\"prompt\"+\"completion\" strings, got invalid JSON (column"))
      << truncated.status().message();
  auto bad_utf8 = ParseText("{\"text\": \"\xFF\xFE\"}\n");
  ASSERT_FALSE(bad_utf8.ok());
  EXPECT_TRUE(bad_utf8.status().message().starts_with("line 1: ")) << bad_utf8.status().message();
  // Messages go into JSON error bodies: they are valid UTF-8 whatever the input was.
  EXPECT_NO_THROW(nlohmann::json(bad_utf8.status().message()).dump());
  auto bad_number = ParseTabular("x,label\n\xFF\xFE,a\n");
  EXPECT_EQ(bad_number.status().message(),
            "line 2: column 1 (\"x\"): \"\xEF\xBF\xBD\xEF\xBF\xBD\" is not a finite number");
}

TEST(TextDatasetTest, ExtraKeysAndHugeValuesAreAllowedOrRejectedCheaply) {
  auto dataset = ParseText("{\"meta\": {\"source\": [1, 2, {\"x\": null}]}, \"text\": \"ok\", \"id\": 7}\n");
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ(dataset->rows[0].text, "ok");
  // A 2 MB array: rejected with its type, its elements never kept.
  std::string huge = "[";
  for (int i = 0; i < 1'000'000; ++i) huge += "1,";
  huge += "1]\n";
  auto result = ParseText(huge);
  EXPECT_EQ(result.status().message(),
            "line 1: expected a JSON object with \"text\" or \"prompt\"+\"completion\" strings, got an array");
}

TEST(TextDatasetTest, LineOverTheLimitIsResourceExhausted) {
  Limits limits;
  limits.max_line_bytes = 16;
  auto result = ParseText("{\"text\": \"ok\"}\n{\"text\": \"0123456789\"}\n", limits);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(result.status().message(), "line 2: longer than 16 bytes");
}

TEST(TextDatasetTest, ValidateStreamsAndCountsRowsAndBytes) {
  std::string contents;
  for (int i = 0; i < 1000; ++i) contents += "{\"text\": \"row " + std::to_string(i) + "\"}\n\n";
  std::istringstream in(contents);
  auto stats = ValidateText(in);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->num_rows, 1000);
  EXPECT_EQ(stats->kind, TextKind::kText);
  EXPECT_EQ(stats->size_bytes, contents.size());
}

TEST(TextDatasetTest, MissingFileIsNotFound) {
  auto stats = ValidateTextFile("/nonexistent/parsyn/data.jsonl");
  EXPECT_EQ(stats.status().code(), StatusCode::kNotFound);
  auto loaded = LoadTextFile("/nonexistent/parsyn/data.jsonl");
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
}

TEST(TextDatasetTest, SubsetCopiesChosenRowsInFileOrder) {
  TempDir dir;
  auto source = dir.Write("d.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"}\r\n{\"text\":\"c\"}\n{\"text\": \"d\"}");
  auto destination = dir.path() / "shard.jsonl";
  const std::vector<int64_t> rows = {3, 1};
  ASSERT_TRUE(WriteSubsetFile(source, DatasetFormat::kJsonl, rows, destination).ok());
  EXPECT_EQ(ReadAll(destination), "{\"text\": \"b\"}\n{\"text\": \"d\"}\n");
  auto loaded = LoadTextFile(destination);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->rows.size(), 2u);
}

TEST(RowLabelsTest, JsonlFieldsAndCsvColumnsGiveEachRowItsClass) {
  TempDir dir;
  auto jsonl = dir.Write("d.jsonl",
                         "{\"text\": \"a\", \"topic\": \"news\"}\n\n{\"text\": \"b\", \"topic\": 10}\n"
                         "{\"prompt\": \"p\", \"completion\": \"c\", \"x\": 1, \"y\": 2, \"z\": 3, \"w\": 4, \"v\": 5, "
                         "\"topic\": true}\n{\"text\": \"d\", \"topic\": \"news\"}\n");
  StatusOr<RowLabels> labels = ReadRowLabels(jsonl, DatasetFormat::kJsonl, "topic");
  ASSERT_TRUE(labels.ok()) << labels.status().ToString();
  EXPECT_EQ(labels->class_names, (std::vector<std::string>{"10", "news", "true"}));  // by bytes: not all integers
  EXPECT_EQ(labels->labels, (std::vector<int32_t>{1, 0, 2, 1}));

  auto csv = dir.Write("d.csv", "a,label\n1,10\n2,2\n3,10\n");
  labels = ReadRowLabels(csv, DatasetFormat::kCsv, "label");
  ASSERT_TRUE(labels.ok()) << labels.status().ToString();
  EXPECT_EQ(labels->class_names, (std::vector<std::string>{"2", "10"}));  // numerically, as TabularStats
  EXPECT_EQ(labels->labels, (std::vector<int32_t>{1, 0, 1}));
}

TEST(RowLabelsTest, AMissingOrUnusableLabelNamesTheLine) {
  TempDir dir;
  auto missing = dir.Write("m.jsonl", "{\"text\": \"a\", \"topic\": \"x\"}\n\n{\"text\": \"b\"}\n");
  StatusOr<RowLabels> labels = ReadRowLabels(missing, DatasetFormat::kJsonl, "topic");
  ASSERT_FALSE(labels.ok());
  EXPECT_EQ(labels.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(labels.status().message(), "line 3: the record has no \"topic\" field");
  auto nested = dir.Write("n.jsonl", "{\"text\": \"a\", \"topic\": {\"name\": \"x\"}}\n");
  labels = ReadRowLabels(nested, DatasetFormat::kJsonl, "topic");
  ASSERT_FALSE(labels.ok());
  EXPECT_EQ(labels.status().message(),
            "line 1: \"topic\" must be a string, number or boolean to serve as a label, got an object");
  auto csv = dir.Write("d.csv", "a,label\n1,x\n");
  labels = ReadRowLabels(csv, DatasetFormat::kCsv, "class");
  ASSERT_FALSE(labels.ok());
  EXPECT_NE(labels.status().message().find("the header has no label column \"class\""), std::string::npos)
      << labels.status().message();
}

TEST(TextDatasetTest, SubsetRejectsBadIndicesAndLeavesNoFile) {
  TempDir dir;
  auto source = dir.Write("d.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
  auto destination = dir.path() / "shard.jsonl";
  const std::vector<int64_t> out_of_range = {0, 2};
  Status s = WriteSubsetFile(source, DatasetFormat::kJsonl, out_of_range, destination);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "row index 2 is out of range: d.jsonl has 2 rows");
  const std::vector<int64_t> duplicate = {1, 1};
  s = WriteSubsetFile(source, DatasetFormat::kJsonl, duplicate, destination);
  EXPECT_EQ(s.message(), "row index 1 is listed twice");
  EXPECT_FALSE(std::filesystem::exists(destination));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "temporary file left behind";
}

// A job's shards: many disjoint subsets split in memory, each exactly what WriteSubsetFile writes for its rows, in
// one pass when the dataset fits the budget and in several groups when it does not (same bytes either way); a row in
// two subsets, or past the end, is refused before any subset is handed over.
TEST(TabularDatasetTest, ManySubsetsAreSplitInBudgetedPasses) {
  TempDir dir;
  const int kSubsets = 300;
  std::string csv = "x,label\n";
  for (int r = 0; r < 3 * kSubsets; ++r) csv += std::to_string(r) + "," + (r % 3 == 0 ? "a" : "b") + "\n";
  auto source = dir.Write("d.csv", csv);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(kSubsets));
  for (int r = 0; r < 3 * kSubsets; ++r) rows[static_cast<size_t>((r * 7) % kSubsets)].push_back(r);
  std::vector<std::span<const int64_t>> subsets;
  for (std::vector<int64_t>& r : rows) {
    std::reverse(r.begin(), r.end());  // any order
    subsets.push_back(r);
  }
  for (uint64_t budget : {kSubsetSplitBudgetBytes, uint64_t{100}}) {  // one pass; a pass per few subsets
    std::vector<std::string> got;
    auto take = [&](size_t i, std::string&& bytes) {
      EXPECT_EQ(i, got.size()) << "subsets come in index order";
      got.push_back(std::move(bytes));
      return Status::Ok();
    };
    ASSERT_TRUE(SplitIntoSubsets(source, DatasetFormat::kCsv, subsets, take, {}, {}, budget).ok());
    ASSERT_EQ(got.size(), rows.size());
    for (int i : {0, 1, 256, kSubsets - 1}) {
      const std::filesystem::path one = dir.path() / ("one" + std::to_string(i));
      ASSERT_TRUE(WriteSubsetFile(source, DatasetFormat::kCsv, rows[static_cast<size_t>(i)], one).ok());
      EXPECT_EQ(got[static_cast<size_t>(i)], ReadAll(one)) << "subset " << i << ", budget " << budget;
    }
    EXPECT_EQ(got[0].substr(0, 8), "x,label\n");
  }

  int taken = 0;
  auto count = [&](size_t, std::string&&) {
    ++taken;
    return Status::Ok();
  };
  const std::vector<int64_t> first = {0, 1}, second = {1, 2}, past = {2, 3 * kSubsets};
  const std::vector<std::span<const int64_t>> overlapping = {first, second};
  Status s = SplitIntoSubsets(source, DatasetFormat::kCsv, overlapping, count);
  EXPECT_EQ(s.message(), "row index 1 is listed twice");
  const std::vector<std::span<const int64_t>> out_of_range = {first, past};
  s = SplitIntoSubsets(source, DatasetFormat::kCsv, out_of_range, count);
  EXPECT_EQ(s.message(), "row index " + std::to_string(3 * kSubsets) + " is out of range: d.csv has " +
                             std::to_string(3 * kSubsets) + " rows");
  EXPECT_EQ(taken, 0);
  auto refuse = [](size_t i, std::string&&) { return i == 1 ? UnavailableError("disk full") : Status::Ok(); };
  EXPECT_EQ(SplitIntoSubsets(source, DatasetFormat::kCsv, subsets, refuse).message(), "disk full");
}

// ---------------------------------------------------------------------------------------------------------------
// CSV

TEST(TabularDatasetTest, ParsesFeaturesAndMapsSortedLabelsToIds) {
  auto dataset = ParseTabular("x1,label,x2\n1,cat,2.5\n-3e1,dog,0\n4, cat ,+1\n");
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ(dataset->feature_names, (std::vector<std::string>{"x1", "x2"}));
  EXPECT_EQ(dataset->class_names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(dataset->labels, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(dataset->features, (std::vector<float>{1, 2.5f, -30, 0, 4, 1}));
  EXPECT_EQ(dataset->Row(1)[0], -30.0f);
}

TEST(TabularDatasetTest, IntegerLabelsSortNumerically) {
  auto dataset = ParseTabular("f,label\n1,10\n2,2\n3,-1\n");
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(dataset->class_names, (std::vector<std::string>{"-1", "2", "10"}));
  EXPECT_EQ(dataset->labels, (std::vector<int64_t>{2, 1, 0}));
}

TEST(TabularDatasetTest, QuotedFieldsFollowRfc4180) {
  // Quoted header name with a comma, an escaped quote in a label, a label spanning two lines, CRLF endings.
  auto dataset = ParseTabular("\"a,b\",\"class\"\r\n\"1.5\",\"say \"\"hi\"\"\"\r\n2,\"two\nlines\"\r\n",
                              TabularOptions{.label_column = "class", .class_names = {}});
  ASSERT_TRUE(dataset.ok()) << dataset.status().ToString();
  EXPECT_EQ(dataset->feature_names, (std::vector<std::string>{"a,b"}));
  EXPECT_EQ(dataset->class_names, (std::vector<std::string>{"say \"hi\"", "two\nlines"}));
  EXPECT_EQ(dataset->features, (std::vector<float>{1.5f, 2}));
}

TEST(TabularDatasetTest, GivenClassNamesFixTheMapping) {
  TabularOptions options;
  options.class_names = {"setosa", "versicolor", "virginica"};
  auto dataset = ParseTabular("f,label\n1,virginica\n", options);
  ASSERT_TRUE(dataset.ok());
  EXPECT_EQ(dataset->labels, (std::vector<int64_t>{2}));
  EXPECT_EQ(dataset->class_names, options.class_names);
  auto unknown = ParseTabular("f,label\n1,virginica\n2,rose\n", options);
  EXPECT_EQ(unknown.status().message(), "line 3: label \"rose\" is not one of the dataset's classes");
}

TEST(TabularDatasetTest, EveryBadRowNamesItsLineAndColumn) {
  const BadTextCase cases[] = {
      {"x,y\n1,2\n", "line 1: the header has no label column \"label\" (columns: x, y)"},
      {"x,,label\n", "line 1: header column 2 has no name"},
      {"label\na\n", "line 1: the header has no feature columns besides the label \"label\""},
      {"x,x,label\n", "line 1: header name \"x\" appears twice (columns 1 and 2)"},
      {"x,label\n1,a\n2\n", "line 3: has 1 columns, the header has 2"},
      {"x,label\n1,a\n2,b,3\n", "line 3: has 3 columns, the header has 2"},
      {"x,y,label\n1,2,a\n1,abc,b\n", "line 3: column 2 (\"y\"): \"abc\" is not a finite number"},
      {"x,y,label\n1,,a\n", "line 2: column 2 (\"y\"): missing value"},
      {"x,label\nnan,a\n", "line 2: column 1 (\"x\"): \"nan\" is not a finite number"},
      {"x,label\ninf,a\n", "line 2: column 1 (\"x\"): \"inf\" is not a finite number"},
      {"x,label\n0x10,a\n", "line 2: column 1 (\"x\"): \"0x10\" is not a finite number"},
      {"x,label\n1e39,a\n", "line 2: column 1 (\"x\"): \"1e39\" is outside the float32 range"},
      {"x,label\n1, \n", "line 2: column 2 (\"label\"): the label is empty"},
      {"x,label\n1,\xFF\n", "line 2: column 2 (\"label\"): the label is not valid UTF-8"},
      {"x,\xC3,label\n", "line 1: header column 2 is not valid UTF-8"},
      {"x,label\n1,\"open\n2,b\n", "line 2: column 2: quoted field is never closed (missing '\"')"},
      {"x,label\n1,\"a\"b\n", "line 2: column 2: text after the closing quote of a quoted field"},
      {"x,label\n1,a\"b\n",
       "line 2: column 2: '\"' inside an unquoted field (quote the whole field and write "
       "'\"\"' for a quote)"},
      {"x,label\n1,\"a\nb\"\n2,\"b\"c\n", "line 4: column 2: text after the closing quote of a quoted field"},
      {"", "no header: the file is empty"},
      {"x,label\n\n", "no rows: the file has a header but no data rows"},
  };
  for (const auto& c : cases) {
    auto result = ParseTabular(c.contents);
    ASSERT_FALSE(result.ok()) << c.contents;
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << c.contents;
    EXPECT_EQ(result.status().message(), c.message) << c.contents;
  }
}

TEST(TabularDatasetTest, TooManyClassesIsResourceExhausted) {
  Limits limits;
  limits.max_classes = 2;
  auto result = ParseTabular("x,label\n1,a\n2,b\n3,c\n", {}, limits);
  EXPECT_EQ(result.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(result.status().message().starts_with("line 4: more than 2 distinct labels"));
}

TEST(TabularDatasetTest, ValidateReportsCountsClassesAndFeatureMoments) {
  std::istringstream in("a,b,label\n1,10,x\n3,10,y\n5,10,x\n");
  auto stats = ValidateTabular(in);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->num_rows, 3);
  EXPECT_EQ(stats->class_names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(stats->class_counts, (std::vector<int64_t>{2, 1}));
  EXPECT_DOUBLE_EQ(stats->feature_mean[0], 3.0);
  EXPECT_NEAR(stats->feature_std[0], std::sqrt(8.0 / 3.0), 1e-12);
  EXPECT_DOUBLE_EQ(stats->feature_std[1], 0.0);
  EXPECT_EQ(stats->size_bytes, 31u);
}

TEST(TabularDatasetTest, SubsetKeepsHeaderAndQuotedRecordsVerbatim) {
  TempDir dir;
  auto source = dir.Write("d.csv", "x,label\r\n1,a\r\n2,\"multi\nline\"\r\n3,c\r\n");
  auto destination = dir.path() / "shard.csv";
  const std::vector<int64_t> rows = {1, 2};
  ASSERT_TRUE(WriteSubsetFile(source, DatasetFormat::kCsv, rows, destination).ok());
  EXPECT_EQ(ReadAll(destination), "x,label\n2,\"multi\nline\"\n3,c\n");
  auto loaded = LoadTabularFile(destination);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->class_names, (std::vector<std::string>{"c", "multi\nline"}));
}

TEST(StandardizerTest, FitApplyAndJsonRoundTrip) {
  auto dataset = ParseTabular("a,b,label\n1,5,x\n3,5,y\n");
  ASSERT_TRUE(dataset.ok());
  Standardizer standardizer = Standardizer::Fit(*dataset);
  EXPECT_EQ(standardizer.mean, (std::vector<float>{2, 5}));
  EXPECT_EQ(standardizer.std, (std::vector<float>{1, 1}));  // b is constant: std 1, not 0
  ASSERT_TRUE(standardizer.Apply(*dataset).ok());
  EXPECT_EQ(dataset->features, (std::vector<float>{-1, 0, 1, 0}));

  auto restored = Standardizer::FromJson(nlohmann::json::parse(standardizer.ToJson().dump()));
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->mean, standardizer.mean);
  EXPECT_EQ(restored->std, standardizer.std);

  auto bad = Standardizer::FromJson(nlohmann::json{{"mean", {1, 2}}, {"std", {1}}});
  EXPECT_EQ(bad.status().message(), "standardizer: \"mean\" has 2 entries, \"std\" has 1");
  bad = Standardizer::FromJson(nlohmann::json{{"mean", {1}}, {"std", {0}}});
  EXPECT_EQ(bad.status().message(), "standardizer: \"std\"[0] must be positive");
  bad = Standardizer::FromJson(nlohmann::json{{"std", {1}}});
  EXPECT_EQ(bad.status().message(), "standardizer: missing \"mean\"");
  std::vector<float> wrong_width = {1, 2, 3};
  EXPECT_EQ(standardizer.ApplyToRow(wrong_width).code(), StatusCode::kInvalidArgument);
}

TEST(StandardizerTest, FitOnChosenRowsOnly) {
  auto dataset = ParseTabular("a,label\n0,x\n10,y\n20,x\n");
  ASSERT_TRUE(dataset.ok());
  const std::vector<int64_t> rows = {1, 2};
  Standardizer standardizer = Standardizer::Fit(*dataset, rows);
  EXPECT_EQ(standardizer.mean, (std::vector<float>{15}));
  EXPECT_EQ(standardizer.std, (std::vector<float>{5}));
}

// ---------------------------------------------------------------------------------------------------------------
// Shuffling and splits

TEST(SplitTest, SplitMix64MatchesReferenceOutput) {
  // Reference values of SplitMix64 seeded with 1234567 (from the algorithm's published C implementation).
  SplitMix64 rng(1234567);
  EXPECT_EQ(rng.Next(), 6457827717110365317ull);
  EXPECT_EQ(rng.Next(), 3203168211198807973ull);
  EXPECT_EQ(rng.Next(), 9817491932198370423ull);
}

TEST(SplitTest, ShuffleIsAPermutationAndDeterministic) {
  std::vector<int64_t> a = ShuffledIndices(100, 7);
  EXPECT_EQ(a, ShuffledIndices(100, 7));
  EXPECT_NE(a, ShuffledIndices(100, 8));
  std::set<int64_t> unique(a.begin(), a.end());
  EXPECT_EQ(unique.size(), 100u);
  EXPECT_EQ(*unique.begin(), 0);
  EXPECT_EQ(*unique.rbegin(), 99);
  // Pinned (values from an independent Python transcription of the same Fisher-Yates over SplitMix64), so a change
  // of algorithm, which would reshuffle every job's data, is noticed.
  EXPECT_EQ(ShuffledIndices(6, 42), (std::vector<int64_t>{4, 3, 0, 2, 5, 1}));
}

TEST(SplitTest, ValidationSliceSizes) {
  struct Case {
    int64_t n;
    double fraction;
    size_t validation;
  };
  for (const Case& c : {Case{0, 0.1, 0}, Case{1, 0.5, 0}, Case{2, 0.01, 1}, Case{10, 0.1, 1}, Case{10, 0.25, 3},
                        Case{10, 0.0, 0}, Case{3, 0.99, 2}, Case{1000, 0.1, 100}}) {
    auto split = SplitTrainValidation(c.n, c.fraction, 1);
    ASSERT_TRUE(split.ok());
    EXPECT_EQ(split->validation.size(), c.validation) << c.n << " " << c.fraction;
    EXPECT_EQ(split->train.size() + split->validation.size(), static_cast<size_t>(c.n));
    std::set<int64_t> all(split->train.begin(), split->train.end());
    all.insert(split->validation.begin(), split->validation.end());
    EXPECT_EQ(all.size(), static_cast<size_t>(c.n));
  }
  EXPECT_EQ(SplitTrainValidation(10, 1.0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitTrainValidation(10, -0.1, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(SplitTest, SplitIsDeterministicFromTheSeed) {
  auto a = SplitTrainValidation(50, 0.2, 99);
  auto b = SplitTrainValidation(50, 0.2, 99);
  auto c = SplitTrainValidation(50, 0.2, 100);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->train, b->train);
  EXPECT_EQ(a->validation, b->validation);
  EXPECT_NE(a->validation, c->validation);
  EXPECT_TRUE(std::is_sorted(a->validation.begin(), a->validation.end()));
}

TEST(SplitTest, ShardsAreDisjointNearlyEqualAndSorted) {
  auto shards = ShardIndices(10, 3, 5);
  ASSERT_TRUE(shards.ok());
  ASSERT_EQ(shards->size(), 3u);
  std::set<int64_t> all;
  for (const auto& shard : *shards) {
    EXPECT_TRUE(shard.size() == 3 || shard.size() == 4);
    EXPECT_TRUE(std::is_sorted(shard.begin(), shard.end()));
    all.insert(shard.begin(), shard.end());
  }
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(ShardIndices(10, 3, 5)->at(1), shards->at(1));
  EXPECT_EQ(ShardIndices(2, 3, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardIndices(2, 0, 5).status().code(), StatusCode::kInvalidArgument);
}

TEST(SplitTest, ShuffledShardsAreConsecutivePiecesOfTheShuffle) {
  // The first n % num_shards shards take the extra row; the pieces, joined, are ShuffledIndices(n, seed) itself.
  auto shards = ShuffledShards(11, 3, 9);
  ASSERT_TRUE(shards.ok());
  ASSERT_EQ(shards->size(), 3u);
  EXPECT_EQ(shards->at(0).size(), 4u);
  EXPECT_EQ(shards->at(1).size(), 4u);
  EXPECT_EQ(shards->at(2).size(), 3u);
  std::vector<int64_t> joined;
  for (const auto& shard : *shards) joined.insert(joined.end(), shard.begin(), shard.end());
  EXPECT_EQ(joined, ShuffledIndices(11, 9));
  // ShardIndices is the same split, sorted.
  auto sorted = ShardIndices(11, 3, 9);
  ASSERT_TRUE(sorted.ok());
  for (size_t i = 0; i < shards->size(); ++i) {
    std::vector<int64_t> expected = shards->at(i);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(sorted->at(i), expected);
  }
  EXPECT_EQ(ShuffledShards(2, 3, 5).status().message(), "cannot split 2 rows into 3 non-empty shards");
  EXPECT_EQ(ShuffledShards(2, 0, 5).status().message(), "need at least one shard, got 0");
}

}  // namespace
}  // namespace parsyn::data
