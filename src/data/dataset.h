// Training datasets: parsing, validation, loading, subsets (for sharding), standardisation, seeded splits.
//
// Two formats, both UTF-8 text files:
//   JSONL text:  one JSON object per line, all of one kind: {"text": "..."} or {"prompt": "...", "completion": "..."}.
//                Other keys are ignored. Blank (all-whitespace) lines are skipped and do not count as rows.
//   CSV tabular: RFC 4180 (comma separator, "double-quoted" fields with "" escapes and embedded newlines, CRLF or LF),
//                a header row, numeric feature columns and one label column (default "label") holding class names.
//
// Every error about the file's content is InvalidArgument and names the 1-based physical line (and, for CSV, the
// column) and what is wrong, e.g. `line 17: expected a JSON object with "text" or "prompt"+"completion" strings, got
// an array`. A file that cannot be opened is NotFound; a read failure is Unavailable. A line or field over the limits
// is ResourceExhausted.
//
// Rows are numbered 0..num_rows-1 in file order, skipping blank lines (JSONL) and the header (CSV); every index list
// below uses this numbering.
//
// Everything here is stateless or a plain value: free functions are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <istream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"

namespace parsyn::data {

enum class DatasetFormat { kJsonl, kCsv };
// "jsonl", "csv". DatasetFormatFromName() accepts these and returns InvalidArgument for anything else.
std::string_view DatasetFormatName(DatasetFormat format);
StatusOr<DatasetFormat> DatasetFormatFromName(std::string_view name);

struct Limits {
  uint64_t max_line_bytes = 16ull << 20;  // one JSONL line, or one CSV record (which may span several lines)
  int64_t max_columns = 100'000;          // CSV
  int64_t max_classes = 10'000;           // distinct CSV labels
};

// ---------------------------------------------------------------------------------------------------------------
// JSONL text datasets

enum class TextKind { kText, kPromptCompletion };
// "text", "prompt_completion".
std::string_view TextKindName(TextKind kind);

// One row. kText: `text` is set (non-empty), prompt/completion are empty. kPromptCompletion: prompt (may be empty) and
// completion (non-empty) are set (the trainer takes loss on completion tokens only), `text` is empty.
struct TextRow {
  std::string text;
  std::string prompt;
  std::string completion;
};

struct TextDataset {
  TextKind kind = TextKind::kText;
  std::vector<TextRow> rows;
};

// What an upload's validation records.
struct TextStats {
  TextKind kind = TextKind::kText;
  int64_t num_rows = 0;
  uint64_t size_bytes = 0;
};

// Reads the stream to its end, checking every line; memory stays O(max_line_bytes) whatever the size.
// InvalidArgument (naming the line) on the first bad row, on rows of mixed kinds, on invalid UTF-8 (as JSON parsing
// rejects it), and on a file with no rows at all ("no rows: the file is empty or has only blank lines").
StatusOr<TextStats> ValidateText(std::istream& in, const Limits& limits = {});
StatusOr<TextStats> ValidateTextFile(const std::filesystem::path& path, const Limits& limits = {});

// Same checks as ValidateText; returns the rows.
StatusOr<TextDataset> ParseText(std::string_view contents, const Limits& limits = {});
StatusOr<TextDataset> LoadTextFile(const std::filesystem::path& path, const Limits& limits = {});

// The JSONL line for one row (no trailing newline): {"text":...} or {"prompt":...,"completion":...}.
std::string TextRowToJsonl(const TextRow& row, TextKind kind);

// ---------------------------------------------------------------------------------------------------------------
// CSV tabular datasets

struct TabularOptions {
  std::string label_column = "label";
  // When non-empty, the label mapping to use (class id = index here); a label not in it is InvalidArgument naming the
  // line. Pass the full dataset's class_names when loading a shard, so every worker maps labels alike.
  std::vector<std::string> class_names;
};

// Features are row-major float32: row r's features are features[r * num_features, (r + 1) * num_features).
struct TabularDataset {
  std::vector<std::string> feature_names;  // header order, without the label column
  std::vector<std::string> class_names;    // class id -> name
  std::vector<float> features;
  std::vector<int64_t> labels;  // class ids, one per row

  int64_t num_rows() const { return static_cast<int64_t>(labels.size()); }
  int64_t num_features() const { return static_cast<int64_t>(feature_names.size()); }
  std::span<const float> Row(int64_t r) const {
    return std::span<const float>(features).subspan(static_cast<size_t>(r * num_features()),
                                                    static_cast<size_t>(num_features()));
  }
};

// Per-feature mean and standard deviation over all rows (population std), computed while validating; the coordinator
// can hand them to workers so every shard is standardised alike.
struct TabularStats {
  int64_t num_rows = 0;
  uint64_t size_bytes = 0;
  std::vector<std::string> feature_names;
  std::vector<std::string> class_names;
  std::vector<int64_t> class_counts;  // rows per class id
  std::vector<double> feature_mean;
  std::vector<double> feature_std;
};

// Class ids: when options.class_names is empty, the distinct labels sorted — numerically when every label is an
// integer ("2" < "10"), else by bytes — and numbered from 0. Header names and labels are trimmed of spaces and tabs;
// feature values may have surrounding spaces and a leading '+'. Blank lines are skipped.
//
// Errors (InvalidArgument, naming line and column by name and 1-based number): a header without the label column or
// without any feature column, an empty or duplicate header name, a row whose field count differs from the header's,
// an empty or non-numeric feature value (finite decimal numbers only: "1", "-2.5e3"; not "nan", "inf" or hex), an
// empty label, a header name or label that is not UTF-8, an unterminated quoted field, text after a closing quote, no
// data rows. More distinct labels than limits.max_classes: ResourceExhausted.
StatusOr<TabularStats> ValidateTabular(std::istream& in, const TabularOptions& options = {}, const Limits& limits = {});
StatusOr<TabularStats> ValidateTabularFile(const std::filesystem::path& path, const TabularOptions& options = {},
                                           const Limits& limits = {});

StatusOr<TabularDataset> ParseTabular(std::string_view contents, const TabularOptions& options = {},
                                      const Limits& limits = {});
StatusOr<TabularDataset> LoadTabularFile(const std::filesystem::path& path, const TabularOptions& options = {},
                                         const Limits& limits = {});

// ---------------------------------------------------------------------------------------------------------------
// Subsets (shards)

// Streams `source` (a dataset of `format`) into a new file `destination` holding only the rows whose indices are
// listed, in file order, each copied byte for byte (CSV: the header first, records end in "\n"). `row_indices` may be
// in any order; a duplicate or an index >= the number of rows is InvalidArgument. The source is validated as it is
// read (same errors as Validate*). Written atomically: a temporary file beside `destination`, fsync, rename.
// Memory stays O(max_line_bytes + row_indices.size()).
Status WriteSubsetFile(const std::filesystem::path& source, DatasetFormat format, std::span<const int64_t> row_indices,
                       const std::filesystem::path& destination, const TabularOptions& options = {},
                       const Limits& limits = {});

// WriteSubsetFile for many disjoint subsets (a job's shards) at once, in memory: `take(i, bytes)` receives subset i's
// complete bytes (exactly what WriteSubsetFile would write for its rows), once, in index order. The source is parsed
// and validated once per group of subsets whose rows fit about `budget_bytes` (estimated from the file's mean row
// size): for a dataset within the budget, one pass whatever the number of subsets, so a job's setup is linear in its
// dataset (a pass per 256 subsets made 10,000 shards cost 79 parses). A row listed twice, in one subset or in two,
// or past the end is InvalidArgument, before `take` is called for any subset of the failing group. An error from
// `take` stops the split and is returned. Memory: O(number of rows listed) plus about budget_bytes.
inline constexpr uint64_t kSubsetSplitBudgetBytes = 256ull << 20;
Status SplitIntoSubsets(const std::filesystem::path& source, DatasetFormat format,
                        std::span<const std::span<const int64_t>> subsets,
                        const std::function<Status(size_t subset, std::string&& bytes)>& take,
                        const TabularOptions& options = {}, const Limits& limits = {},
                        uint64_t budget_bytes = kSubsetSplitBudgetBytes);

// ---------------------------------------------------------------------------------------------------------------
// Row labels (for label-skewed sharding: coordinator/partition.h)

// Each row's class: labels[r] in [0, class_names.size()).
struct RowLabels {
  std::vector<std::string> class_names;  // class id -> label value
  std::vector<int32_t> labels;           // one per row, in row order
};

// Reads the label of every row, streaming: for CSV the column `label` (the other columns checked as ValidateTabular
// does with options.label_column = label), for JSONL the top-level field `label` of each record (a string as is, a
// number or boolean as its JSON text). Class ids are numbered as TabularStats' are: numerically sorted when every
// value is an integer, else by bytes. InvalidArgument naming the line: a JSONL record without the field ("line 7:
// the record has no \"topic\" field"), or with an object, array, null or empty string there; the CSV errors of
// ValidateTabular. More than limits.max_classes distinct values: ResourceExhausted.
StatusOr<RowLabels> ReadRowLabels(const std::filesystem::path& path, DatasetFormat format, const std::string& label,
                                  const Limits& limits = {});

// ---------------------------------------------------------------------------------------------------------------
// Feature standardisation: x' = (x - mean) / std, with std 1 for constant features.

struct Standardizer {
  std::vector<float> mean;
  std::vector<float> std;

  // Mean and population std over the given rows (all rows when `rows` is empty). The sums run in double.
  static Standardizer Fit(const TabularDataset& dataset, std::span<const int64_t> rows = {});
  // From TabularStats (whole-dataset statistics).
  static Standardizer FromStats(const TabularStats& stats);

  // Standardises every row in place. InvalidArgument if the feature count differs.
  Status Apply(TabularDataset& dataset) const;
  // Standardises one row in place (for prediction). InvalidArgument if the size differs.
  Status ApplyToRow(std::span<float> row) const;

  // {"mean": [...], "std": [...]}. FromJson returns InvalidArgument for a missing or mistyped field, arrays of
  // different lengths, or a non-positive or non-finite std.
  nlohmann::json ToJson() const;
  static StatusOr<Standardizer> FromJson(const nlohmann::json& json);
};

// ---------------------------------------------------------------------------------------------------------------
// Seeded shuffling and splits. Deterministic from the seed on every platform and standard library: the generator is
// SplitMix64 implemented here, bounded draws use rejection sampling (no modulo bias, no std:: distributions).

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, bound); bound must be > 0.
  uint64_t Below(uint64_t bound);

 private:
  uint64_t state_;
};

// A permutation of 0..n-1 (Fisher-Yates driven by SplitMix64(seed)).
std::vector<int64_t> ShuffledIndices(int64_t n, uint64_t seed);

struct TrainValidationSplit {
  std::vector<int64_t> train;       // shuffled order (the trainer's first epoch order may use it as is)
  std::vector<int64_t> validation;  // ascending
};

// Holds out round(n * validation_fraction) rows, chosen by ShuffledIndices(n, seed), at least 1 when n >= 2 and the
// fraction is > 0, and never all of them (at least 1 training row when n >= 1).
// InvalidArgument unless 0 <= validation_fraction < 1.
StatusOr<TrainValidationSplit> SplitTrainValidation(int64_t n, double validation_fraction, uint64_t seed);

// Splits 0..n-1 into `num_shards` random shards: ShuffledIndices(n, seed) cut into consecutive pieces whose sizes
// differ by at most 1 (the first n % num_shards pieces get the extra row). Each shard keeps the permutation's order,
// so any prefix of it is a random sample of the shard (the coordinator takes its validation rows that way).
// InvalidArgument if num_shards < 1 or num_shards > n.
StatusOr<std::vector<std::vector<int64_t>>> ShuffledShards(int64_t n, int64_t num_shards, uint64_t seed);

// ShuffledShards with each shard sorted ascending (ready for WriteSubsetFile).
StatusOr<std::vector<std::vector<int64_t>>> ShardIndices(int64_t n, int64_t num_shards, uint64_t seed);

}  // namespace parsyn::data
