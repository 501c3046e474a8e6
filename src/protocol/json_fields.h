// JsonFields: reads the fields of one JSON object of the worker protocol (messages.h), collecting every problem;
// status() reports them all at once: InvalidArgument "unknown field 'worker_id'; 'round' must be in 1..1000000, got
// 0". The wording is the coordinator's API's for request bodies (coordinator/api_json.h has the same class for the
// other routes). A field given as JSON null reads as absent.
// Not thread-safe; one instance per object being read.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace parsyn::protocol {

class JsonFields {
 public:
  // A request body: InvalidArgument when `body` is not valid JSON or not an object; a field outside `allowed` is a
  // problem.
  static StatusOr<JsonFields> Parse(std::string_view body, std::initializer_list<std::string_view> allowed);
  // The same for a parsed value; `prefix` names a nested object ("local_data." gives 'local_data.rows').
  static StatusOr<JsonFields> Strict(nlohmann::json object, std::initializer_list<std::string_view> allowed,
                                     std::string prefix = "");
  // Fields of an answer or task from the coordinator, which may carry fields this version does not know: they are
  // ignored. `prefix` names a nested object in messages ("global_weights." gives 'global_weights.url'). A value that
  // is not an object is a problem (named by the prefix without its dot).
  static JsonFields Lenient(nlohmann::json object, std::string prefix = "");

  // A string of 1..max_bytes bytes without control characters (0..max_bytes when allow_empty).
  std::optional<std::string> String(std::string_view name, bool required, size_t max_bytes = 256,
                                    bool allow_empty = false);
  // The same for multi-line text (PEM): line breaks (\n, \r) are its only control characters.
  std::optional<std::string> Lines(std::string_view name, bool required, size_t max_bytes);
  std::optional<int64_t> Int(std::string_view name, bool required, int64_t min, int64_t max);
  // Any unsigned 64-bit integer (seeds).
  std::optional<uint64_t> Uint64(std::string_view name, bool required);
  // A finite number.
  std::optional<double> Number(std::string_view name, bool required);
  std::optional<bool> Bool(std::string_view name, bool required);
  // The raw value of an object-typed field of at most max_fields fields.
  std::optional<nlohmann::json> Object(std::string_view name, bool required, size_t max_fields = 1024);
  // The raw value of an array-typed field of at most max_items items.
  std::optional<nlohmann::json> Array(std::string_view name, bool required, size_t max_items);
  // A string → string object (HTTP headers) of at most max_fields entries.
  std::optional<std::vector<std::pair<std::string, std::string>>> StringMap(std::string_view name, bool required,
                                                                            size_t max_fields);
  void AddProblem(std::string problem) { problems_.push_back(std::move(problem)); }
  // Adds the problems of a nested reader (their names carry its prefix).
  void Absorb(const JsonFields& nested);
  // The quoted name of a field in messages: 'round', or 'global_weights.url' with a prefix.
  std::string Quoted(std::string_view name) const { return "'" + prefix_ + std::string(name) + "'"; }
  Status status() const;

 private:
  std::optional<std::string> Text(std::string_view name, bool required, size_t max_bytes, bool allow_empty,
                                  bool line_breaks);
  JsonFields(nlohmann::json object, std::string prefix) : object_(std::move(object)), prefix_(std::move(prefix)) {}
  const nlohmann::json* Find(std::string_view name, bool required);

  nlohmann::json object_;
  std::string prefix_;
  std::vector<std::string> problems_;
};

// A message from the coordinator must be an object before its fields can be read: InvalidArgument "`what` must be a
// JSON object, got array" otherwise.
Status RequireObject(const nlohmann::json& body, std::string_view what);

}  // namespace parsyn::protocol
