// FieldReader: reads the fields of one JSON object against a schema, collecting every problem with its field path
// ("config.lora_r (0) must be between 1 and 1024"), so one answer lists them all. The reader of the job spec and of
// every object nested in it (src/coordinator/job_spec.h) and of the trainer's task file (trainer_task.h).
//
// A field given as JSON null reads as absent (its default applies). Each read marks its key as known, and
// RejectUnknown() then reports every other key ("unknown field config.lerning_rate").
// Not thread-safe; one reader per object being read.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace parsyn::protocol {

// An integer field's maximum where only its minimum is checked.
inline constexpr int64_t kNoUpperBound = std::numeric_limits<int64_t>::max();

class FieldReader {
 public:
  // `prefix` is the object's path with its dot ("config."), "" at the top; problems are appended to `errors`.
  FieldReader(const nlohmann::json& object, std::string prefix, std::vector<std::string>& errors)
      : object_(object), prefix_(std::move(prefix)), errors_(errors) {}

  std::string Path(std::string_view key) const { return prefix_ + std::string(key); }
  void Error(std::string message) { errors_.push_back(std::move(message)); }

  // The value under `key`, or nullptr when absent or null. Marks the key as known.
  const nlohmann::json* Get(std::string_view key);
  // Reports "<path> is required" and returns false when `key` is absent or null.
  bool Required(std::string_view key);

  // An integer in [min, max]; `out` keeps its value when absent or invalid.
  template <typename Int>
  void Integer(std::string_view key, Int& out, int64_t min, int64_t max) {
    const nlohmann::json* v = Get(key);
    if (v == nullptr) return;
    if (auto parsed = ReadInteger(*v, Path(key), min, max)) out = static_cast<Int>(*parsed);
  }
  // A finite number in [min, max] (or the open bound where exclusive).
  void Number(std::string_view key, double& out, double min, double max, bool min_exclusive = false,
              bool max_exclusive = false);
  void Boolean(std::string_view key, bool& out);
  // A string of min_bytes..max_bytes bytes without control characters.
  void String(std::string_view key, std::string& out, size_t min_bytes, size_t max_bytes);

  // One of `choices`' spellings; returns false after reporting an invalid value.
  template <typename Enum, size_t N>
  bool Choice(std::string_view key, Enum& out, const std::pair<std::string_view, Enum> (&choices)[N]) {
    const nlohmann::json* v = Get(key);
    if (v == nullptr) return true;
    for (const auto& [spelling, value] : choices) {
      if (v->is_string() && v->get_ref<const std::string&>() == spelling) {
        out = value;
        return true;
      }
    }
    std::string allowed;
    for (const auto& [spelling, value] : choices) allowed += (allowed.empty() ? "" : ", ") + Quoted(spelling);
    Error(Path(key) + " must be one of " + allowed + ", got " + (v->is_string() ? v->dump() : v->type_name()));
    return false;
  }

  // An array of at most `max_items` integers in [min, max]: empty when absent, nullopt after reporting a problem.
  std::optional<std::vector<int64_t>> IntegerList(std::string_view key, size_t max_items, int64_t min, int64_t max);
  // The object under `key` (nullptr when absent or null); reports a value that is not an object.
  const nlohmann::json* Object(std::string_view key);
  // Reports every key no read asked for.
  void RejectUnknown();

  // `s` as a JSON string literal, for messages.
  static std::string Quoted(std::string_view s);
  // `v` as printf's %g writes it, for messages.
  static std::string FormatNumber(double v);

 private:
  std::optional<int64_t> ReadInteger(const nlohmann::json& v, const std::string& path, int64_t min, int64_t max);

  const nlohmann::json& object_;
  std::string prefix_;
  std::vector<std::string>& errors_;
  std::set<std::string, std::less<>> known_;
};

// OK when `errors` is empty, else InvalidArgument listing them, separated by "; ".
Status ErrorsToStatus(const std::vector<std::string>& errors);

// Parses `text`; InvalidArgument "<what> is not valid JSON: parse error at line 1, column 2: ..." otherwise, and
// when it nests deeper than base/json_nesting.h allows or repeats a key in one object ("<what> has the key 'a'
// twice in one object": which of two values counts is up to each parser, so neither is taken).
StatusOr<nlohmann::json> ParseJsonText(std::string_view text, std::string_view what);

}  // namespace parsyn::protocol
