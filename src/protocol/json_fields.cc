#include "protocol/json_fields.h"

#include <cmath>
#include <limits>

#include "protocol/field_reader.h"

namespace parsyn::protocol {

using nlohmann::json;

StatusOr<JsonFields> JsonFields::Parse(std::string_view body, std::initializer_list<std::string_view> allowed) {
  PARSYN_ASSIGN_OR_RETURN(json object, ParseJsonText(body, "request body"));
  return Strict(std::move(object), allowed);
}

StatusOr<JsonFields> JsonFields::Strict(json object, std::initializer_list<std::string_view> allowed,
                                        std::string prefix) {
  if (!object.is_object()) {
    const std::string what =
        prefix.empty() ? "request body" : "'" + prefix.substr(0, prefix.size() - 1) + "'";  // drop the dot
    return InvalidArgumentError(what + " must be a JSON object, got " + object.type_name());
  }
  JsonFields fields(std::move(object), std::move(prefix));
  for (const auto& [key, value] : fields.object_.items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || a == key;
    if (!known) fields.problems_.push_back("unknown field '" + fields.prefix_ + key + "'");
  }
  return fields;
}

JsonFields JsonFields::Lenient(json object, std::string prefix) {
  const bool is_object = object.is_object();
  const std::string type = object.type_name();
  JsonFields fields(is_object ? std::move(object) : json::object(), std::move(prefix));
  if (!is_object) {
    const std::string name = fields.prefix_.substr(0, fields.prefix_.empty() ? 0 : fields.prefix_.size() - 1);
    fields.problems_.push_back("'" + name + "' must be an object, got " + type);
  }
  return fields;
}

const json* JsonFields::Find(std::string_view name, bool required) {
  auto it = object_.find(std::string(name));
  if (it == object_.end() || it->is_null()) {
    if (required) problems_.push_back("missing field " + Quoted(name));
    return nullptr;
  }
  return &*it;
}

std::optional<std::string> JsonFields::String(std::string_view name, bool required, size_t max_bytes,
                                              bool allow_empty) {
  return Text(name, required, max_bytes, allow_empty, /*line_breaks=*/false);
}

std::optional<std::string> JsonFields::Lines(std::string_view name, bool required, size_t max_bytes) {
  return Text(name, required, max_bytes, /*allow_empty=*/false, /*line_breaks=*/true);
}

std::optional<std::string> JsonFields::Text(std::string_view name, bool required, size_t max_bytes, bool allow_empty,
                                            bool line_breaks) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    problems_.push_back(Quoted(name) + " must be a string, got " + v->type_name());
    return std::nullopt;
  }
  std::string s = v->get<std::string>();
  if ((s.empty() && !allow_empty) || s.size() > max_bytes) {
    problems_.push_back(Quoted(name) + " must be " + (allow_empty ? "0" : "1") + ".." + std::to_string(max_bytes) +
                        " bytes");
    return std::nullopt;
  }
  for (unsigned char c : s) {
    if ((c < 0x20 || c == 0x7f) && !(line_breaks && (c == '\n' || c == '\r'))) {
      problems_.push_back(Quoted(name) + (line_breaks ? " must not contain control characters other than line breaks"
                                                      : " must not contain control characters"));
      return std::nullopt;
    }
  }
  return s;
}

std::optional<int64_t> JsonFields::Int(std::string_view name, bool required, int64_t min, int64_t max) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) {
    problems_.push_back(Quoted(name) + " must be an integer, got " + v->type_name());
    return std::nullopt;
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    problems_.push_back(Quoted(name) + " is out of range");
    return std::nullopt;
  }
  int64_t n = v->get<int64_t>();
  if (n < min || n > max) {
    problems_.push_back(Quoted(name) + " must be in " + std::to_string(min) + ".." + std::to_string(max) + ", got " +
                        std::to_string(n));
    return std::nullopt;
  }
  return n;
}

std::optional<uint64_t> JsonFields::Uint64(std::string_view name, bool required) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0)) {
    problems_.push_back(Quoted(name) + " must be a non-negative integer, got " + v->dump());
    return std::nullopt;
  }
  return v->get<uint64_t>();
}

std::optional<double> JsonFields::Number(std::string_view name, bool required) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    problems_.push_back(Quoted(name) + " must be a number, got " + v->type_name());
    return std::nullopt;
  }
  double d = v->get<double>();
  if (!std::isfinite(d)) {
    problems_.push_back(Quoted(name) + " must be finite");
    return std::nullopt;
  }
  return d;
}

std::optional<bool> JsonFields::Bool(std::string_view name, bool required) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    problems_.push_back(Quoted(name) + " must be a boolean, got " + v->type_name());
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<json> JsonFields::Object(std::string_view name, bool required, size_t max_fields) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) {
    problems_.push_back(Quoted(name) + " must be an object, got " + v->type_name());
    return std::nullopt;
  }
  if (v->size() > max_fields) {
    problems_.push_back(Quoted(name) + " has " + std::to_string(v->size()) + " fields, at most " +
                        std::to_string(max_fields) + " are allowed");
    return std::nullopt;
  }
  return *v;
}

std::optional<json> JsonFields::Array(std::string_view name, bool required, size_t max_items) {
  const json* v = Find(name, required);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    problems_.push_back(Quoted(name) + " must be an array, got " + v->type_name());
    return std::nullopt;
  }
  if (v->size() > max_items) {
    problems_.push_back(Quoted(name) + " has " + std::to_string(v->size()) + " items, at most " +
                        std::to_string(max_items) + " are allowed");
    return std::nullopt;
  }
  return *v;
}

std::optional<std::vector<std::pair<std::string, std::string>>> JsonFields::StringMap(std::string_view name,
                                                                                      bool required,
                                                                                      size_t max_fields) {
  std::optional<json> object = Object(name, required, max_fields);
  if (!object) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : object->items()) {
    if (!value.is_string()) {
      problems_.push_back(Quoted(std::string(name) + "." + key) + " must be a string, got " + value.type_name());
      return std::nullopt;
    }
    out.emplace_back(key, value.get<std::string>());
  }
  return out;
}

void JsonFields::Absorb(const JsonFields& nested) {
  problems_.insert(problems_.end(), nested.problems_.begin(), nested.problems_.end());
}

Status JsonFields::status() const {
  if (problems_.empty()) return Status::Ok();
  std::string message;
  for (const std::string& p : problems_) {
    if (!message.empty()) message += "; ";
    message += p;
  }
  return InvalidArgumentError(message);
}

Status RequireObject(const nlohmann::json& body, std::string_view what) {
  if (body.is_object()) return Status::Ok();
  return InvalidArgumentError(std::string(what) + " must be a JSON object, got " + body.type_name());
}

}  // namespace parsyn::protocol
