#include "protocol/field_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/json_nesting.h"

namespace parsyn::protocol {

using nlohmann::json;

std::string FieldReader::Quoted(std::string_view s) { return json(std::string(s)).dump(); }

std::string FieldReader::FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const json* FieldReader::Get(std::string_view key) {
  known_.insert(std::string(key));
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool FieldReader::Required(std::string_view key) {
  if (Get(key) != nullptr) return true;
  Error(Path(key) + " is required");
  return false;
}

void FieldReader::Number(std::string_view key, double& out, double min, double max, bool min_exclusive,
                         bool max_exclusive) {
  const json* v = Get(key);
  if (v == nullptr) return;
  const std::string path = Path(key);
  if (!v->is_number()) {
    Error(path + " must be a number, got " + v->type_name());
    return;
  }
  const double x = v->get<double>();
  const bool below = min_exclusive ? !(x > min) : !(x >= min);
  const bool above = max_exclusive ? !(x < max) : !(x <= max);
  if (!std::isfinite(x) || below || above) {
    Error(path + " (" + FormatNumber(x) + ") must be " + (min_exclusive ? "> " : ">= ") + FormatNumber(min) + " and " +
          (max_exclusive ? "< " : "<= ") + FormatNumber(max));
    return;
  }
  out = x;
}

void FieldReader::Boolean(std::string_view key, bool& out) {
  const json* v = Get(key);
  if (v == nullptr) return;
  if (!v->is_boolean()) {
    Error(Path(key) + " must be a boolean, got " + v->type_name());
    return;
  }
  out = v->get<bool>();
}

void FieldReader::String(std::string_view key, std::string& out, size_t min_bytes, size_t max_bytes) {
  const json* v = Get(key);
  if (v == nullptr) return;
  const std::string path = Path(key);
  if (!v->is_string()) {
    Error(path + " must be a string, got " + v->type_name());
    return;
  }
  const std::string& s = v->get_ref<const std::string&>();
  if (s.size() < min_bytes || s.size() > max_bytes) {
    Error(path + " must be " + std::to_string(min_bytes) + ".." + std::to_string(max_bytes) + " bytes long, got " +
          std::to_string(s.size()));
    return;
  }
  if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    Error(path + " must not contain control characters");
    return;
  }
  out = s;
}

std::optional<std::vector<int64_t>> FieldReader::IntegerList(std::string_view key, size_t max_items, int64_t min,
                                                             int64_t max) {
  const json* v = Get(key);
  if (v == nullptr) return std::vector<int64_t>{};
  const std::string path = Path(key);
  if (!v->is_array()) {
    Error(path + " must be an array of integers, got " + v->type_name());
    return std::nullopt;
  }
  if (v->size() > max_items) {
    Error(path + " has " + std::to_string(v->size()) + " entries, at most " + std::to_string(max_items) +
          " are allowed");
    return std::nullopt;
  }
  std::vector<int64_t> out;
  bool ok = true;
  for (size_t i = 0; i < v->size(); ++i) {
    auto parsed = ReadInteger((*v)[i], path + "[" + std::to_string(i) + "]", min, max);
    if (parsed) out.push_back(*parsed);
    ok = ok && parsed.has_value();
  }
  if (!ok) return std::nullopt;
  return out;
}

const json* FieldReader::Object(std::string_view key) {
  const json* v = Get(key);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) {
    Error(Path(key) + " must be an object, got " + v->type_name());
    return nullptr;
  }
  return v;
}

void FieldReader::RejectUnknown() {
  for (const auto& [key, value] : object_.items()) {
    if (known_.count(key) == 0) Error("unknown field " + Path(key));
  }
}

std::optional<int64_t> FieldReader::ReadInteger(const json& v, const std::string& path, int64_t min, int64_t max) {
  if (!v.is_number_integer()) {
    Error(path + " must be an integer, got " + (v.is_number() ? FormatNumber(v.get<double>()) : v.type_name()));
    return std::nullopt;
  }
  const bool too_big =
      v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const std::string shown =
      v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
  if (too_big || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    Error(path + " (" + shown + ") must be between " + std::to_string(min) + " and " + std::to_string(max));
    return std::nullopt;
  }
  return v.get<int64_t>();
}

Status ErrorsToStatus(const std::vector<std::string>& errors) {
  if (errors.empty()) return Status::Ok();
  std::string message;
  for (const std::string& e : errors) message += (message.empty() ? "" : "; ") + e;
  return InvalidArgumentError(std::move(message));
}

StatusOr<json> ParseJsonText(std::string_view text, std::string_view what) {
  PARSYN_RETURN_IF_ERROR(CheckJsonNesting(text, what));
  // The keys seen so far in each object being parsed, innermost last.
  std::vector<std::set<std::string, std::less<>>> open_objects;
  std::optional<std::string> repeated_key;
  json::parser_callback_t check_keys = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second && !repeated_key) {
          repeated_key = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(text, check_keys);
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 2: ..."; keep the readable part.
    std::string message = e.what();
    if (size_t end = message.find("] "); message.starts_with("[json.exception") && end != std::string::npos) {
      message.erase(0, end + 2);
    }
    return InvalidArgumentError(std::string(what) + " is not valid JSON: " + message);
  }
  if (repeated_key) {
    const std::string shown = repeated_key->size() > 80 ? repeated_key->substr(0, 80) + "..." : *repeated_key;
    return InvalidArgumentError(std::string(what) + " has the key '" + shown + "' twice in one object");
  }
  return parsed;
}

}  // namespace parsyn::protocol
