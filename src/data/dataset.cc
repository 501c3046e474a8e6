#include "data/dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "data/io.h"
#include "data/unicode.h"

namespace parsyn::data {
namespace {

using internal::BufferedInput;
using json = nlohmann::json;

std::string LinePrefix(int64_t line) { return "line " + std::to_string(line) + ": "; }

// Shortens user text quoted in an error message.
// Error messages end up in JSON bodies, which must be UTF-8: invalid bytes become U+FFFD.
std::string Excerpt(std::string_view text, size_t max_bytes = 40) {
  if (text.size() <= max_bytes) return internal::ValidUtf8Lossy(text);
  // Cut at a UTF-8 boundary so a valid character is not split.
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return internal::ValidUtf8Lossy(text.substr(0, cut)) + "...";
}

std::string Quoted(std::string_view text) {
  // Built by appending: GCC 12 warns falsely (-Wrestrict) on `"\"" + std::string + "\""`.
  std::string out(1, '"');
  out += Excerpt(text);
  out += '"';
  return out;
}

bool IsBlank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

std::string_view TrimSpaces(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// A reader's status: its own parse error first, else a failed read of the input (after `line_number` lines).
Status ReaderStatus(const Status& parse_error, const BufferedInput& input, int64_t line_number) {
  if (!parse_error.ok()) return parse_error;
  if (input.failed()) return UnavailableError("reading the dataset failed after line " + std::to_string(line_number));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------------
// JSONL

// Reads physical lines (terminator "\n"; a trailing "\r" is dropped), counting them from 1.
class LineReader {
 public:
  LineReader(std::istream& in, const Limits& limits) : input_(in), limits_(limits) {}

  // Reads the next line into `line`. Returns false at the end of input (then check status()).
  bool Next(std::string& line) {
    line.clear();
    int c = input_.Get();
    if (c < 0) return false;
    ++line_number_;
    while (c >= 0 && c != '\n') {
      if (line.size() >= limits_.max_line_bytes) {
        status_ = ResourceExhaustedError(LinePrefix(line_number_) + "longer than " +
                                         std::to_string(limits_.max_line_bytes) + " bytes");
        return false;
      }
      line.push_back(static_cast<char>(c));
      c = input_.Get();
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A UTF-8 byte order mark is not part of the first row.
    if (line_number_ == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
    return true;
  }

  int64_t line_number() const { return line_number_; }
  uint64_t bytes_read() const { return input_.consumed(); }
  Status status() const { return ReaderStatus(status_, input_, line_number_); }

 private:
  BufferedInput input_;
  const Limits& limits_;
  int64_t line_number_ = 0;
  Status status_;
};

std::string DescribeJsonType(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "invalid JSON";
    default: return "a number";
  }
}

constexpr std::string_view kExpectedRow = "expected a JSON object with \"text\" or \"prompt\"+\"completion\" strings";

// Up to five of the object's keys, with "..." when the parser dropped more (see ParseRowJson).
std::string DescribeObjectKeys(const json& object, bool more_keys) {
  if (object.empty()) return "an empty object";
  std::string keys;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (!keys.empty()) keys += ", ";
    keys += '"';
    keys += Excerpt(it.key(), 30);
    keys += '"';
  }
  if (more_keys) keys += ", ...";
  return "an object with keys " + keys;
}

// Parses a line, keeping only what a row needs, so that a hostile line (a 16 MiB array of numbers, deep nesting)
// costs no more memory than the line itself: the top-level object's "text"/"prompt"/"completion" values and at most
// five other keys (for the error message), without anything nested inside them; of any other top-level value, only
// its type. Syntax is still checked in full. Throws json::parse_error.
json ParseRowJson(std::string_view line, bool& more_keys) {
  bool top_is_object = false;
  int other_keys = 0;
  more_keys = false;
  auto keep = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 0) {
      if (event == json::parse_event_t::object_start) top_is_object = true;
      return true;
    }
    if (depth > 1 || !top_is_object) return false;
    if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (key == "text" || key == "prompt" || key == "completion") return true;
      if (other_keys++ < 5) return true;
      more_keys = true;
      return false;
    }
    return true;
  };
  return json::parse(line, keep);
}

// Parses one non-blank JSONL line into `row`, returning its kind.
StatusOr<TextKind> ParseTextLine(std::string_view line, int64_t line_number, TextRow& row) {
  json value;
  bool more_keys = false;
  try {
    value = ParseRowJson(line, more_keys);
  } catch (const json::exception& e) {
    // nlohmann's message reads "[json.exception.parse_error.101] parse error at line 1, column 7: ..."; the
    // column is the useful part and the line is ours.
    std::string what = e.what();
    size_t at = what.find("column");
    std::string detail = internal::ValidUtf8Lossy(at == std::string::npos ? what : what.substr(at));
    return InvalidArgumentError(LinePrefix(line_number) + std::string(kExpectedRow) + ", got invalid JSON (" + detail +
                                ")");
  }
  if (!value.is_object()) {
    return InvalidArgumentError(LinePrefix(line_number) + std::string(kExpectedRow) + ", got " +
                                DescribeJsonType(value));
  }
  auto text = value.find("text");
  auto prompt = value.find("prompt");
  auto completion = value.find("completion");
  bool has_text = text != value.end();
  bool has_pair = prompt != value.end() || completion != value.end();
  if (has_text && has_pair) {
    return InvalidArgumentError(LinePrefix(line_number) +
                                "has both \"text\" and \"prompt\"/\"completion\"; a row is one or the other");
  }
  if (has_text) {
    if (!text->is_string()) {
      return InvalidArgumentError(LinePrefix(line_number) + "\"text\" must be a string, got " +
                                  DescribeJsonType(*text));
    }
    row.text = text->get<std::string>();
    if (row.text.empty()) return InvalidArgumentError(LinePrefix(line_number) + "\"text\" is empty");
    return TextKind::kText;
  }
  if (has_pair) {
    if (prompt == value.end() || completion == value.end()) {
      return InvalidArgumentError(LinePrefix(line_number) + "has \"" +
                                  (prompt == value.end() ? "completion" : "prompt") + "\" without \"" +
                                  (prompt == value.end() ? "prompt" : "completion") + "\"");
    }
    if (!prompt->is_string()) {
      return InvalidArgumentError(LinePrefix(line_number) + "\"prompt\" must be a string, got " +
                                  DescribeJsonType(*prompt));
    }
    if (!completion->is_string()) {
      return InvalidArgumentError(LinePrefix(line_number) + "\"completion\" must be a string, got " +
                                  DescribeJsonType(*completion));
    }
    row.prompt = prompt->get<std::string>();
    row.completion = completion->get<std::string>();
    // An empty completion would contribute no loss at all; an empty prompt is fine (plain continuation).
    if (row.completion.empty()) return InvalidArgumentError(LinePrefix(line_number) + "\"completion\" is empty");
    return TextKind::kPromptCompletion;
  }
  return InvalidArgumentError(LinePrefix(line_number) + std::string(kExpectedRow) + ", got " +
                              DescribeObjectKeys(value, more_keys));
}

// Walks a JSONL stream, calling on_row(row_index, line_number, raw_line, row) for every non-blank line.
template <typename OnRow>
StatusOr<TextStats> ScanText(std::istream& in, const Limits& limits, OnRow&& on_row) {
  LineReader reader(in, limits);
  TextStats stats;
  std::optional<TextKind> kind;
  int64_t first_row_line = 0;
  std::string line;
  TextRow row;
  while (reader.Next(line)) {
    if (IsBlank(line)) continue;
    row = TextRow{};
    PARSYN_ASSIGN_OR_RETURN(TextKind row_kind, ParseTextLine(line, reader.line_number(), row));
    if (!kind) {
      kind = row_kind;
      first_row_line = reader.line_number();
    } else if (*kind != row_kind) {
      return InvalidArgumentError(LinePrefix(reader.line_number()) + "a " +
                                  (row_kind == TextKind::kText ? "\"text\"" : "\"prompt\"/\"completion\"") +
                                  " row in a file whose first row (line " + std::to_string(first_row_line) + ") is a " +
                                  (*kind == TextKind::kText ? "\"text\"" : "\"prompt\"/\"completion\"") +
                                  " row; use one kind per file");
    }
    PARSYN_RETURN_IF_ERROR(on_row(stats.num_rows, line, std::move(row)));
    ++stats.num_rows;
  }
  PARSYN_RETURN_IF_ERROR(reader.status());
  if (stats.num_rows == 0) return InvalidArgumentError("no rows: the file is empty or has only blank lines");
  stats.kind = *kind;
  stats.size_bytes = reader.bytes_read();
  return stats;
}

// ---------------------------------------------------------------------------------------------------------------
// CSV (RFC 4180)

struct CsvRecord {
  std::vector<std::string> fields;
  std::string raw;          // the record's bytes without its final line terminator
  int64_t line_number = 0;  // physical line where the record starts
  bool blank = false;       // an empty line: skipped by callers
};

// Inside CsvReader::Next(): stores a failed Status and returns false.
#define PARSYN_RETURN_IF_ERROR_BOOL(expr) \
  do {                                    \
    Status s_ = (expr);                   \
    if (!s_.ok()) {                       \
      status_ = std::move(s_);            \
      return false;                       \
    }                                     \
  } while (0)

class CsvReader {
 public:
  CsvReader(std::istream& in, const Limits& limits) : input_(in), limits_(limits) {}

  // Reads the next record. Returns false at the end of input or on error (then check status()).
  bool Next(CsvRecord& record) {
    record.fields.clear();
    record.raw.clear();
    record.blank = false;
    if (input_.Peek() < 0) return false;
    record.line_number = ++line_number_;
    if (record.line_number == 1) SkipByteOrderMark();
    std::string field;
    bool field_quoted = false;
    enum class State { kFieldStart, kUnquoted, kQuoted, kAfterQuote } state = State::kFieldStart;
    while (true) {
      int c = input_.Get();
      if (c >= 0) {
        if (record.raw.size() >= limits_.max_line_bytes) {
          status_ = ResourceExhaustedError(LinePrefix(record.line_number) + "record longer than " +
                                           std::to_string(limits_.max_line_bytes) + " bytes");
          return false;
        }
        record.raw.push_back(static_cast<char>(c));
      }
      bool end_of_record = c < 0 || (c == '\n' && state != State::kQuoted);
      if (end_of_record) {
        if (c == '\n') record.raw.pop_back();
        if (state == State::kQuoted) {
          status_ = InvalidArgumentError(LinePrefix(record.line_number) + "column " +
                                         std::to_string(record.fields.size() + 1) +
                                         ": quoted field is never closed (missing '\"')");
          return false;
        }
        if (!field_quoted && !field.empty() && field.back() == '\r') field.pop_back();
        if (!record.raw.empty() && record.raw.back() == '\r') record.raw.pop_back();
        record.blank = record.fields.empty() && !field_quoted && field.empty();
        record.fields.push_back(std::move(field));
        break;
      }
      char ch = static_cast<char>(c);
      if (c == '\n') ++line_number_;  // only inside quotes: the record spans lines
      switch (state) {
        case State::kFieldStart:
          if (ch == '"') {
            state = State::kQuoted;
            field_quoted = true;
          } else if (ch == ',') {
            PARSYN_RETURN_IF_ERROR_BOOL(EndField(record, field, field_quoted));
          } else {
            field.push_back(ch);
            state = State::kUnquoted;
          }
          break;
        case State::kUnquoted:
          if (ch == ',') {
            PARSYN_RETURN_IF_ERROR_BOOL(EndField(record, field, field_quoted));
            state = State::kFieldStart;
          } else if (ch == '"') {
            status_ =
                InvalidArgumentError(LinePrefix(line_number_) + "column " + std::to_string(record.fields.size() + 1) +
                                     ": '\"' inside an unquoted field (quote the whole field and write "
                                     "'\"\"' for a quote)");
            return false;
          } else {
            field.push_back(ch);
          }
          break;
        case State::kQuoted:
          if (ch == '"') {
            state = State::kAfterQuote;
          } else {
            field.push_back(ch);
          }
          break;
        case State::kAfterQuote:
          if (ch == '"') {
            field.push_back('"');
            state = State::kQuoted;
          } else if (ch == ',') {
            PARSYN_RETURN_IF_ERROR_BOOL(EndField(record, field, field_quoted));
            state = State::kFieldStart;
          } else if (ch == '\r' && input_.Peek() == '\n') {
            // CRLF after a closing quote: the '\n' ends the record on the next turn.
          } else {
            status_ =
                InvalidArgumentError(LinePrefix(line_number_) + "column " + std::to_string(record.fields.size() + 1) +
                                     ": text after the closing quote of a quoted field");
            return false;
          }
          break;
      }
    }
    return true;
  }

  uint64_t bytes_read() const { return input_.consumed(); }
  Status status() const { return ReaderStatus(status_, input_, line_number_); }

 private:
  Status EndField(CsvRecord& record, std::string& field, bool& field_quoted) {
    if (static_cast<int64_t>(record.fields.size()) + 1 >= limits_.max_columns) {
      return ResourceExhaustedError(LinePrefix(record.line_number) + "more than " +
                                    std::to_string(limits_.max_columns) + " columns");
    }
    record.fields.push_back(std::move(field));
    field.clear();
    field_quoted = false;
    return Status::Ok();
  }

  void SkipByteOrderMark() {
    // Only consumed when all three bytes are there; BufferedInput cannot un-read, so peek byte by byte.
    if (input_.Peek() != 0xEF) return;
    input_.Get();
    if (input_.Peek() == 0xBB) input_.Get();
    if (input_.Peek() == 0xBF) input_.Get();
  }

  BufferedInput input_;
  const Limits& limits_;
  int64_t line_number_ = 0;
  Status status_;
};
#undef PARSYN_RETURN_IF_ERROR_BOOL

// Parses a finite decimal number ("1", "-2.5e3", "+4"); surrounding spaces are allowed.
std::optional<double> ParseNumber(std::string_view text) {
  text = TrimSpaces(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  if (text.empty()) return std::nullopt;
  // from_chars also takes "inf", "nan" and hex-less forms; only digits, sign, '.', and exponents are numbers here.
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E')) return std::nullopt;
  }
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

bool IsInteger(std::string_view s) {
  if (!s.empty() && s.front() == '-') s.remove_prefix(1);
  return !s.empty() && s.size() <= 18 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Sorted class names: numerically when every label is an integer, else by bytes.
std::vector<std::string> SortClassNames(std::vector<std::string> names) {
  bool all_integers = std::all_of(names.begin(), names.end(), [](const std::string& n) { return IsInteger(n); });
  if (all_integers) {
    std::sort(names.begin(), names.end(),
              [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
  } else {
    std::sort(names.begin(), names.end());
  }
  return names;
}

std::string ColumnName(const std::vector<std::string>& header, size_t column) {
  return "column " + std::to_string(column + 1) + " (" + Quoted(header[column]) + ")";
}

// The header's layout: which column is the label, and the feature names.
struct CsvLayout {
  std::vector<std::string> header;
  size_t label_column = 0;
  std::vector<std::string> feature_names;
};

StatusOr<CsvLayout> ParseHeader(const CsvRecord& record, const TabularOptions& options) {
  CsvLayout layout;
  layout.header = record.fields;
  std::optional<size_t> label;
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < layout.header.size(); ++i) {
    std::string name(TrimSpaces(layout.header[i]));
    if (name.empty()) {
      return InvalidArgumentError(LinePrefix(record.line_number) + "header column " + std::to_string(i + 1) +
                                  " has no name");
    }
    // Names and labels end up in JSON (API responses, the model's class list), which must be UTF-8.
    if (!internal::IsValidUtf8(name)) {
      return InvalidArgumentError(LinePrefix(record.line_number) + "header column " + std::to_string(i + 1) +
                                  " is not valid UTF-8");
    }
    auto [it, inserted] = seen.emplace(name, i);
    if (!inserted) {
      return InvalidArgumentError(LinePrefix(record.line_number) + "header name " + Quoted(name) +
                                  " appears twice (columns " + std::to_string(it->second + 1) + " and " +
                                  std::to_string(i + 1) + ")");
    }
    layout.header[i] = name;
    if (name == options.label_column) {
      label = i;
    } else {
      layout.feature_names.push_back(name);
    }
  }
  if (!label) {
    return InvalidArgumentError(LinePrefix(record.line_number) + "the header has no label column " +
                                Quoted(options.label_column) + " (columns: " +
                                Excerpt(
                                    [&] {
                                      std::string all;
                                      for (const auto& h : layout.header) all += (all.empty() ? "" : ", ") + h;
                                      return all;
                                    }(),
                                    120) +
                                ")");
  }
  layout.label_column = *label;
  if (layout.feature_names.empty()) {
    return InvalidArgumentError(LinePrefix(record.line_number) +
                                "the header has no feature columns besides the label " + Quoted(options.label_column));
  }
  return layout;
}

// Checks one data record against the layout; fills `features` (in header order, label excluded) and `label`.
Status ParseDataRecord(const CsvRecord& record, const CsvLayout& layout, std::vector<double>& features,
                       std::string& label) {
  if (record.fields.size() != layout.header.size()) {
    return InvalidArgumentError(LinePrefix(record.line_number) + "has " + std::to_string(record.fields.size()) +
                                " columns, the header has " + std::to_string(layout.header.size()));
  }
  features.clear();
  for (size_t i = 0; i < record.fields.size(); ++i) {
    const std::string& field = record.fields[i];
    if (i == layout.label_column) {
      label = std::string(TrimSpaces(field));
      if (label.empty()) {
        return InvalidArgumentError(LinePrefix(record.line_number) + ColumnName(layout.header, i) +
                                    ": the label is empty");
      }
      if (!internal::IsValidUtf8(label)) {
        return InvalidArgumentError(LinePrefix(record.line_number) + ColumnName(layout.header, i) +
                                    ": the label is not valid UTF-8");
      }
      continue;
    }
    if (TrimSpaces(field).empty()) {
      return InvalidArgumentError(LinePrefix(record.line_number) + ColumnName(layout.header, i) + ": missing value");
    }
    std::optional<double> value = ParseNumber(field);
    if (!value) {
      return InvalidArgumentError(LinePrefix(record.line_number) + ColumnName(layout.header, i) + ": " + Quoted(field) +
                                  " is not a finite number");
    }
    if (std::fabs(*value) > std::numeric_limits<float>::max()) {
      return InvalidArgumentError(LinePrefix(record.line_number) + ColumnName(layout.header, i) + ": " + Quoted(field) +
                                  " is outside the float32 range");
    }
    features.push_back(*value);
  }
  return Status::Ok();
}

// Walks a CSV stream: on_header(layout, raw) once, then on_row(row_index, record, features, label) per data row.
template <typename OnHeader, typename OnRow>
Status ScanTabular(std::istream& in, const TabularOptions& options, const Limits& limits, uint64_t& size_bytes,
                   OnHeader&& on_header, OnRow&& on_row) {
  CsvReader reader(in, limits);
  CsvRecord record;
  std::optional<CsvLayout> layout;
  std::vector<double> features;
  std::string label;
  int64_t num_rows = 0;
  while (reader.Next(record)) {
    if (record.blank) continue;
    if (!layout) {
      PARSYN_ASSIGN_OR_RETURN(layout, ParseHeader(record, options));
      PARSYN_RETURN_IF_ERROR(on_header(*layout, record));
      continue;
    }
    PARSYN_RETURN_IF_ERROR(ParseDataRecord(record, *layout, features, label));
    PARSYN_RETURN_IF_ERROR(on_row(num_rows, record, features, label));
    ++num_rows;
  }
  PARSYN_RETURN_IF_ERROR(reader.status());
  if (!layout) return InvalidArgumentError("no header: the file is empty");
  if (num_rows == 0) return InvalidArgumentError("no rows: the file has a header but no data rows");
  size_bytes = reader.bytes_read();
  return Status::Ok();
}

// Maps label names to class ids, either from a given list or by discovery (ids assigned once all names are known).
class LabelMapper {
 public:
  LabelMapper(const std::vector<std::string>& given, const Limits& limits) : limits_(limits) {
    for (size_t i = 0; i < given.size(); ++i) fixed_.emplace(given[i], static_cast<int64_t>(i));
  }

  // Records a label; returns its provisional key (the final id once Finish() ran, for fixed mappings).
  Status Add(const std::string& label, int64_t line_number) {
    if (!fixed_.empty()) {
      auto it = fixed_.find(label);
      if (it == fixed_.end()) {
        return InvalidArgumentError(LinePrefix(line_number) + "label " + Quoted(label) +
                                    " is not one of the dataset's classes");
      }
      counts_[label]++;
      return Status::Ok();
    }
    auto [it, inserted] = counts_.emplace(label, 0);
    if (inserted && static_cast<int64_t>(counts_.size()) > limits_.max_classes) {
      return ResourceExhaustedError(LinePrefix(line_number) + "more than " + std::to_string(limits_.max_classes) +
                                    " distinct labels; is the label column " + "numeric features by mistake?");
    }
    ++it->second;
    return Status::Ok();
  }

  // Class names in id order.
  std::vector<std::string> ClassNames() const {
    if (!fixed_.empty()) {
      std::vector<std::string> names(fixed_.size());
      for (const auto& [name, id] : fixed_) names[static_cast<size_t>(id)] = name;
      return names;
    }
    std::vector<std::string> names;
    for (const auto& [name, count] : counts_) names.push_back(name);
    return SortClassNames(std::move(names));
  }

  std::vector<int64_t> ClassCounts(const std::vector<std::string>& names) const {
    std::vector<int64_t> counts;
    for (const auto& name : names) {
      auto it = counts_.find(name);
      counts.push_back(it == counts_.end() ? 0 : it->second);
    }
    return counts;
  }

 private:
  const Limits& limits_;
  std::map<std::string, int64_t> fixed_;
  std::map<std::string, int64_t> counts_;
};

std::unique_ptr<std::ifstream> OpenFile(const std::filesystem::path& path, Status& status) {
  status = internal::CheckReadable(path);
  if (!status.ok()) return nullptr;
  auto file = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*file) status = UnavailableError("cannot open " + path.string());
  return file;
}

}  // namespace

std::string_view DatasetFormatName(DatasetFormat format) { return format == DatasetFormat::kJsonl ? "jsonl" : "csv"; }

StatusOr<DatasetFormat> DatasetFormatFromName(std::string_view name) {
  if (name == "jsonl") return DatasetFormat::kJsonl;
  if (name == "csv") return DatasetFormat::kCsv;
  return InvalidArgumentError("unknown dataset format \"" + std::string(name) + "\" (expected \"jsonl\" or \"csv\")");
}

std::string_view TextKindName(TextKind kind) { return kind == TextKind::kText ? "text" : "prompt_completion"; }

StatusOr<TextStats> ValidateText(std::istream& in, const Limits& limits) {
  return ScanText(in, limits, [](int64_t, std::string_view, TextRow&&) { return Status::Ok(); });
}

StatusOr<TextStats> ValidateTextFile(const std::filesystem::path& path, const Limits& limits) {
  Status status;
  auto file = OpenFile(path, status);
  if (!status.ok()) return status;
  return ValidateText(*file, limits);
}

StatusOr<TextDataset> ParseText(std::string_view contents, const Limits& limits) {
  internal::MemoryStreambuf buffer(contents);
  std::istream in(&buffer);
  TextDataset dataset;
  PARSYN_ASSIGN_OR_RETURN(TextStats stats, ScanText(in, limits, [&](int64_t, std::string_view, TextRow&& row) {
                            dataset.rows.push_back(std::move(row));
                            return Status::Ok();
                          }));
  dataset.kind = stats.kind;
  return dataset;
}

StatusOr<TextDataset> LoadTextFile(const std::filesystem::path& path, const Limits& limits) {
  Status status;
  auto file = OpenFile(path, status);
  if (!status.ok()) return status;
  TextDataset dataset;
  PARSYN_ASSIGN_OR_RETURN(TextStats stats, ScanText(*file, limits, [&](int64_t, std::string_view, TextRow&& row) {
                            dataset.rows.push_back(std::move(row));
                            return Status::Ok();
                          }));
  dataset.kind = stats.kind;
  return dataset;
}

std::string TextRowToJsonl(const TextRow& row, TextKind kind) {
  json object = json::object();
  if (kind == TextKind::kText) {
    object["text"] = row.text;
  } else {
    object["prompt"] = row.prompt;
    object["completion"] = row.completion;
  }
  // Rows came from valid JSON, so their strings are valid UTF-8; replace rather than throw if a caller built one.
  return object.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---------------------------------------------------------------------------------------------------------------

namespace {

// Streams a CSV dataset into stats and, when `dataset` is given, its rows.
StatusOr<TabularStats> ScanTabularInto(std::istream& in, const TabularOptions& options, const Limits& limits,
                                       TabularDataset* dataset) {
  TabularStats stats;
  LabelMapper labels(options.class_names, limits);
  std::vector<std::string> row_labels;  // names while loading; mapped to ids once every name is known
  // Welford's running mean and sum of squared deviations, per feature (stable for large files).
  std::vector<double> mean;
  std::vector<double> m2;
  Status status = ScanTabular(
      in, options, limits, stats.size_bytes,
      [&](const CsvLayout& layout, const CsvRecord&) {
        stats.feature_names = layout.feature_names;
        mean.assign(layout.feature_names.size(), 0.0);
        m2.assign(layout.feature_names.size(), 0.0);
        return Status::Ok();
      },
      [&](int64_t row, const CsvRecord& record, const std::vector<double>& features, const std::string& label) {
        PARSYN_RETURN_IF_ERROR(labels.Add(label, record.line_number));
        double count = static_cast<double>(row + 1);
        for (size_t f = 0; f < features.size(); ++f) {
          double delta = features[f] - mean[f];
          mean[f] += delta / count;
          m2[f] += delta * (features[f] - mean[f]);
        }
        if (dataset != nullptr) {
          for (double v : features) dataset->features.push_back(static_cast<float>(v));
          row_labels.push_back(label);
        }
        stats.num_rows = row + 1;
        return Status::Ok();
      });
  if (!status.ok()) return status;
  stats.class_names = labels.ClassNames();
  stats.class_counts = labels.ClassCounts(stats.class_names);
  stats.feature_mean = mean;
  stats.feature_std.resize(m2.size());
  for (size_t f = 0; f < m2.size(); ++f) stats.feature_std[f] = std::sqrt(m2[f] / static_cast<double>(stats.num_rows));
  if (dataset != nullptr) {
    dataset->feature_names = stats.feature_names;
    dataset->class_names = stats.class_names;
    std::map<std::string, int64_t> ids;
    for (size_t i = 0; i < stats.class_names.size(); ++i) ids.emplace(stats.class_names[i], static_cast<int64_t>(i));
    dataset->labels.reserve(row_labels.size());
    for (const auto& name : row_labels) dataset->labels.push_back(ids.at(name));
  }
  return stats;
}

}  // namespace

StatusOr<TabularStats> ValidateTabular(std::istream& in, const TabularOptions& options, const Limits& limits) {
  return ScanTabularInto(in, options, limits, nullptr);
}

StatusOr<TabularStats> ValidateTabularFile(const std::filesystem::path& path, const TabularOptions& options,
                                           const Limits& limits) {
  Status status;
  auto file = OpenFile(path, status);
  if (!status.ok()) return status;
  return ValidateTabular(*file, options, limits);
}

StatusOr<TabularDataset> ParseTabular(std::string_view contents, const TabularOptions& options, const Limits& limits) {
  internal::MemoryStreambuf buffer(contents);
  std::istream in(&buffer);
  TabularDataset dataset;
  PARSYN_RETURN_IF_ERROR(ScanTabularInto(in, options, limits, &dataset).status());
  return dataset;
}

StatusOr<TabularDataset> LoadTabularFile(const std::filesystem::path& path, const TabularOptions& options,
                                         const Limits& limits) {
  Status status;
  auto file = OpenFile(path, status);
  if (!status.ok()) return status;
  TabularDataset dataset;
  PARSYN_RETURN_IF_ERROR(ScanTabularInto(*file, options, limits, &dataset).status());
  return dataset;
}

// ---------------------------------------------------------------------------------------------------------------

namespace {

// Which subset each listed row belongs to (-1: none), checked: no negative row, none listed twice.
StatusOr<std::vector<int32_t>> RowOwners(std::span<const std::span<const int64_t>> subsets) {
  int64_t max_row = -1;
  for (std::span<const int64_t> rows : subsets) {
    for (int64_t row : rows) {
      if (row < 0) return InvalidArgumentError("row index " + std::to_string(row) + " is negative");
      max_row = std::max(max_row, row);
    }
  }
  std::vector<int32_t> owners(static_cast<size_t>(max_row + 1), -1);
  for (size_t i = 0; i < subsets.size(); ++i) {
    for (int64_t row : subsets[i]) {
      int32_t& owner = owners[static_cast<size_t>(row)];
      if (owner >= 0) return InvalidArgumentError("row index " + std::to_string(row) + " is listed twice");
      owner = static_cast<int32_t>(i);
    }
  }
  return owners;
}

// One pass over `source` for subsets [begin, end): each row is copied byte for byte (with "\n") to its owner, through
// `append(k, bytes)` for k = owner - begin (CSV: the header first, to every subset). Checks that every listed row
// exists.
Status SubsetPass(const std::filesystem::path& source, DatasetFormat format, const std::vector<int32_t>& owners,
                  size_t begin, size_t end, const TabularOptions& options, const Limits& limits,
                  const std::function<Status(size_t, std::string_view)>& append) {
  Status status;
  auto file = OpenFile(source, status);
  if (!status.ok()) return status;
  int64_t num_rows = 0;
  auto copy_if_wanted = [&](int64_t row, std::string_view raw) -> Status {
    num_rows = row + 1;
    if (static_cast<size_t>(row) >= owners.size()) return Status::Ok();
    const int32_t owner = owners[static_cast<size_t>(row)];
    if (owner < static_cast<int32_t>(begin) || owner >= static_cast<int32_t>(end)) return Status::Ok();
    return append(static_cast<size_t>(owner) - begin, raw);
  };
  if (format == DatasetFormat::kJsonl) {
    PARSYN_RETURN_IF_ERROR(ScanText(*file, limits, [&](int64_t row, std::string_view raw, TextRow&&) {
                             return copy_if_wanted(row, raw);
                           }).status());
  } else {
    // Labels are checked against options.class_names when given, exactly as loading the shard later will.
    LabelMapper labels(options.class_names, limits);
    uint64_t size_bytes = 0;
    PARSYN_RETURN_IF_ERROR(ScanTabular(
        *file, options, limits, size_bytes,
        [&](const CsvLayout&, const CsvRecord& header) {
          for (size_t k = 0; k < end - begin; ++k) PARSYN_RETURN_IF_ERROR(append(k, header.raw));
          return Status::Ok();
        },
        [&](int64_t row, const CsvRecord& record, const std::vector<double>&, const std::string& label) {
          PARSYN_RETURN_IF_ERROR(labels.Add(label, record.line_number));
          return copy_if_wanted(row, record.raw);
        }));
  }
  for (size_t row = static_cast<size_t>(num_rows); row < owners.size(); ++row) {
    if (owners[row] >= 0) {
      return InvalidArgumentError("row index " + std::to_string(row) + " is out of range: " +
                                  source.filename().string() + " has " + std::to_string(num_rows) + " rows");
    }
  }
  return Status::Ok();
}

}  // namespace

Status WriteSubsetFile(const std::filesystem::path& source, DatasetFormat format, std::span<const int64_t> row_indices,
                       const std::filesystem::path& destination, const TabularOptions& options, const Limits& limits) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<int32_t> owners, RowOwners(std::span(&row_indices, 1)));
  PARSYN_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(destination));
  constexpr size_t kBufferBytes = 64 * 1024;
  std::string buffer;
  PARSYN_RETURN_IF_ERROR(SubsetPass(source, format, owners, 0, 1, options, limits, [&](size_t, std::string_view raw) {
    buffer.append(raw);
    buffer.push_back('\n');
    if (buffer.size() < kBufferBytes) return Status::Ok();
    Status s = writer.Append(buffer);
    buffer.clear();
    return s;
  }));
  PARSYN_RETURN_IF_ERROR(writer.Append(buffer));
  return writer.Commit(/*durable=*/true);
}

Status SplitIntoSubsets(const std::filesystem::path& source, DatasetFormat format,
                        std::span<const std::span<const int64_t>> subsets,
                        const std::function<Status(size_t subset, std::string&& bytes)>& take,
                        const TabularOptions& options, const Limits& limits, uint64_t budget_bytes) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<int32_t> owners, RowOwners(subsets));
  PARSYN_RETURN_IF_ERROR(internal::CheckReadable(source));
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(source, ec);
  if (ec) return UnavailableError("cannot read the size of " + source.string() + ": " + ec.message());
  // Groups of subsets by their estimated bytes (rows x the mean row size; the CSV header repeats in each).
  const double row_bytes = static_cast<double>(file_bytes) / static_cast<double>(std::max<size_t>(1, owners.size()));
  for (size_t begin = 0; begin < subsets.size();) {
    size_t end = begin;
    double group_bytes = 0;
    while (end < subsets.size() && (end == begin || group_bytes < static_cast<double>(budget_bytes))) {
      group_bytes += static_cast<double>(subsets[end].size()) * row_bytes;
      ++end;
    }
    std::vector<std::string> buffers(end - begin);
    PARSYN_RETURN_IF_ERROR(
        SubsetPass(source, format, owners, begin, end, options, limits, [&](size_t k, std::string_view raw) {
          buffers[k].append(raw);
          buffers[k].push_back('\n');
          return Status::Ok();
        }));
    for (size_t k = 0; k < buffers.size(); ++k) PARSYN_RETURN_IF_ERROR(take(begin + k, std::move(buffers[k])));
    begin = end;
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------------

namespace {

// The top-level field `field` of one JSONL record, keeping nothing else (syntax still checked in full).
StatusOr<std::string> JsonlLabel(std::string_view line, int64_t line_number, const std::string& field) {
  json value;
  bool top_is_object = false;
  try {
    value = json::parse(line, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 0) {
        if (event == json::parse_event_t::object_start) top_is_object = true;
        return true;
      }
      if (depth == 1 && top_is_object && event == json::parse_event_t::key) {
        return parsed.get_ref<const std::string&>() == field;
      }
      return true;
    });
  } catch (const json::exception& e) {
    return InvalidArgumentError(LinePrefix(line_number) + "invalid JSON (" + internal::ValidUtf8Lossy(e.what()) + ")");
  }
  if (!value.is_object()) {
    return InvalidArgumentError(LinePrefix(line_number) + "expected a JSON object, got " + DescribeJsonType(value));
  }
  auto it = value.find(field);
  if (it == value.end()) {
    return InvalidArgumentError(LinePrefix(line_number) + "the record has no " + Quoted(field) + " field");
  }
  std::string label;
  if (it->is_string()) {
    label = std::string(TrimSpaces(it->get<std::string>()));
  } else if (it->is_number() || it->is_boolean()) {
    label = it->dump();
  } else {
    return InvalidArgumentError(LinePrefix(line_number) + Quoted(field) +
                                " must be a string, number or boolean to serve as a label, got " +
                                DescribeJsonType(*it));
  }
  if (label.empty()) return InvalidArgumentError(LinePrefix(line_number) + Quoted(field) + " is empty");
  return label;
}

}  // namespace

StatusOr<RowLabels> ReadRowLabels(const std::filesystem::path& path, DatasetFormat format, const std::string& label,
                                  const Limits& limits) {
  Status status;
  auto file = OpenFile(path, status);
  if (!status.ok()) return status;
  LabelMapper mapper({}, limits);
  // Each row's label as a provisional id (order of first appearance), renumbered once every label is known: memory
  // is one integer per row, not one string.
  std::map<std::string, int32_t> provisional;
  std::vector<int32_t> row_ids;
  auto add = [&](const std::string& value, int64_t line_number) -> Status {
    PARSYN_RETURN_IF_ERROR(mapper.Add(value, line_number));
    auto [it, inserted] = provisional.emplace(value, static_cast<int32_t>(provisional.size()));
    row_ids.push_back(it->second);
    return Status::Ok();
  };
  if (format == DatasetFormat::kJsonl) {
    LineReader reader(*file, limits);
    std::string line;
    while (reader.Next(line)) {
      if (IsBlank(line)) continue;
      PARSYN_ASSIGN_OR_RETURN(std::string value, JsonlLabel(line, reader.line_number(), label));
      PARSYN_RETURN_IF_ERROR(add(value, reader.line_number()));
    }
    PARSYN_RETURN_IF_ERROR(reader.status());
    if (row_ids.empty()) return InvalidArgumentError("no rows: the file is empty or has only blank lines");
  } else {
    TabularOptions options;
    options.label_column = label;
    uint64_t size_bytes = 0;
    PARSYN_RETURN_IF_ERROR(ScanTabular(
        *file, options, limits, size_bytes, [](const CsvLayout&, const CsvRecord&) { return Status::Ok(); },
        [&](int64_t, const CsvRecord& record, const std::vector<double>&, const std::string& value) {
          return add(value, record.line_number);
        }));
  }
  RowLabels out;
  out.class_names = mapper.ClassNames();
  std::vector<int32_t> final_id(provisional.size());
  for (size_t i = 0; i < out.class_names.size(); ++i) {
    final_id[static_cast<size_t>(provisional.at(out.class_names[i]))] = static_cast<int32_t>(i);
  }
  out.labels.reserve(row_ids.size());
  for (int32_t id : row_ids) out.labels.push_back(final_id[static_cast<size_t>(id)]);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------

Standardizer Standardizer::Fit(const TabularDataset& dataset, std::span<const int64_t> rows) {
  size_t num_features = static_cast<size_t>(dataset.num_features());
  std::vector<double> sum(num_features, 0.0);
  std::vector<double> sum_sq(num_features, 0.0);
  int64_t count = 0;
  auto add_row = [&](int64_t r) {
    std::span<const float> row = dataset.Row(r);
    for (size_t f = 0; f < num_features; ++f) sum[f] += row[f];
    ++count;
  };
  if (rows.empty()) {
    for (int64_t r = 0; r < dataset.num_rows(); ++r) add_row(r);
  } else {
    for (int64_t r : rows) add_row(r);
  }
  Standardizer result;
  result.mean.assign(num_features, 0.0f);
  result.std.assign(num_features, 1.0f);
  if (count == 0) return result;
  std::vector<double> mean(num_features);
  for (size_t f = 0; f < num_features; ++f) mean[f] = sum[f] / static_cast<double>(count);
  // Second pass over deviations (not sum of squares minus square of sums), which cancels badly for large offsets.
  auto add_deviation = [&](int64_t r) {
    std::span<const float> row = dataset.Row(r);
    for (size_t f = 0; f < num_features; ++f) sum_sq[f] += (row[f] - mean[f]) * (row[f] - mean[f]);
  };
  if (rows.empty()) {
    for (int64_t r = 0; r < dataset.num_rows(); ++r) add_deviation(r);
  } else {
    for (int64_t r : rows) add_deviation(r);
  }
  for (size_t f = 0; f < num_features; ++f) {
    double sd = std::sqrt(sum_sq[f] / static_cast<double>(count));
    result.mean[f] = static_cast<float>(mean[f]);
    result.std[f] = sd > 1e-12 ? static_cast<float>(sd) : 1.0f;
  }
  return result;
}

Standardizer Standardizer::FromStats(const TabularStats& stats) {
  Standardizer result;
  for (size_t f = 0; f < stats.feature_mean.size(); ++f) {
    result.mean.push_back(static_cast<float>(stats.feature_mean[f]));
    double sd = f < stats.feature_std.size() ? stats.feature_std[f] : 0.0;
    result.std.push_back(sd > 1e-12 ? static_cast<float>(sd) : 1.0f);
  }
  return result;
}

Status Standardizer::ApplyToRow(std::span<float> row) const {
  if (row.size() != mean.size()) {
    return InvalidArgumentError("row has " + std::to_string(row.size()) + " features, the standardizer " +
                                std::to_string(mean.size()));
  }
  for (size_t f = 0; f < row.size(); ++f) row[f] = (row[f] - mean[f]) / std[f];
  return Status::Ok();
}

Status Standardizer::Apply(TabularDataset& dataset) const {
  if (static_cast<size_t>(dataset.num_features()) != mean.size()) {
    return InvalidArgumentError("dataset has " + std::to_string(dataset.num_features()) +
                                " features, the standardizer " + std::to_string(mean.size()));
  }
  size_t width = mean.size();
  for (int64_t r = 0; r < dataset.num_rows(); ++r) {
    std::span<float> row(dataset.features.data() + static_cast<size_t>(r) * width, width);
    PARSYN_RETURN_IF_ERROR(ApplyToRow(row));
  }
  return Status::Ok();
}

nlohmann::json Standardizer::ToJson() const { return json{{"mean", mean}, {"std", std}}; }

StatusOr<Standardizer> Standardizer::FromJson(const nlohmann::json& value) {
  auto read_array = [&](const char* key, std::vector<float>& out) -> Status {
    if (!value.is_object() || !value.contains(key)) {
      return InvalidArgumentError(std::string("standardizer: missing \"") + key + "\"");
    }
    const json& array = value.at(key);
    if (!array.is_array()) return InvalidArgumentError(std::string("standardizer: \"") + key + "\" is not an array");
    for (size_t i = 0; i < array.size(); ++i) {
      if (!array[i].is_number()) {
        return InvalidArgumentError(std::string("standardizer: \"") + key + "\"[" + std::to_string(i) +
                                    "] is not a number");
      }
      double v = array[i].get<double>();
      if (!std::isfinite(v)) {
        return InvalidArgumentError(std::string("standardizer: \"") + key + "\"[" + std::to_string(i) +
                                    "] is not finite");
      }
      out.push_back(static_cast<float>(v));
    }
    return Status::Ok();
  };
  Standardizer result;
  PARSYN_RETURN_IF_ERROR(read_array("mean", result.mean));
  PARSYN_RETURN_IF_ERROR(read_array("std", result.std));
  if (result.mean.size() != result.std.size()) {
    return InvalidArgumentError("standardizer: \"mean\" has " + std::to_string(result.mean.size()) +
                                " entries, \"std\" has " + std::to_string(result.std.size()));
  }
  for (size_t i = 0; i < result.std.size(); ++i) {
    if (!(result.std[i] > 0)) {
      return InvalidArgumentError("standardizer: \"std\"[" + std::to_string(i) + "] must be positive");
    }
  }
  return result;
}

// ---------------------------------------------------------------------------------------------------------------

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t bound) {
  // Reject the low values that would make `r % bound` favour small results.
  uint64_t threshold = (0 - bound) % bound;
  while (true) {
    uint64_t r = Next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<int64_t> ShuffledIndices(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  SplitMix64 rng(seed);
  for (size_t i = order.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.Below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

StatusOr<TrainValidationSplit> SplitTrainValidation(int64_t n, double validation_fraction, uint64_t seed) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    return InvalidArgumentError("validation fraction must be in [0, 1), got " + std::to_string(validation_fraction));
  }
  if (n < 0) return InvalidArgumentError("row count is negative");
  int64_t num_validation = std::llround(static_cast<double>(n) * validation_fraction);
  if (validation_fraction > 0 && n >= 2) num_validation = std::max<int64_t>(num_validation, 1);
  num_validation = std::min<int64_t>(num_validation, std::max<int64_t>(n - 1, 0));
  std::vector<int64_t> order = ShuffledIndices(n, seed);
  TrainValidationSplit split;
  split.validation.assign(order.begin(), order.begin() + num_validation);
  std::sort(split.validation.begin(), split.validation.end());
  split.train.assign(order.begin() + num_validation, order.end());
  return split;
}

StatusOr<std::vector<std::vector<int64_t>>> ShuffledShards(int64_t n, int64_t num_shards, uint64_t seed) {
  if (num_shards < 1) return InvalidArgumentError("need at least one shard, got " + std::to_string(num_shards));
  if (num_shards > n) {
    return InvalidArgumentError("cannot split " + std::to_string(n) + " rows into " + std::to_string(num_shards) +
                                " non-empty shards");
  }
  std::vector<int64_t> order = ShuffledIndices(n, seed);
  std::vector<std::vector<int64_t>> shards(static_cast<size_t>(num_shards));
  int64_t base = n / num_shards;
  int64_t extra = n % num_shards;  // the first `extra` shards take one more row
  int64_t begin = 0;
  for (int64_t s = 0; s < num_shards; ++s) {
    int64_t size = base + (s < extra ? 1 : 0);
    shards[static_cast<size_t>(s)].assign(order.begin() + begin, order.begin() + begin + size);
    begin += size;
  }
  return shards;
}

StatusOr<std::vector<std::vector<int64_t>>> ShardIndices(int64_t n, int64_t num_shards, uint64_t seed) {
  PARSYN_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> shards, ShuffledShards(n, num_shards, seed));
  for (auto& shard : shards) std::sort(shard.begin(), shard.end());
  return shards;
}

}  // namespace parsyn::data
