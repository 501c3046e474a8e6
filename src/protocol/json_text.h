// JSON text written straight into a string, for messages the coordinator sends thousands of times a round (a task
// per worker): nlohmann::json builds a tree of std::maps and then walks it again to dump it, which was ~12% of the
// coordinator's loop in a 10,000-worker round. Everything else uses nlohmann::json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace parsyn::protocol {

// Writes one JSON value: objects and arrays nest, and commas go where they belong. The caller pairs Begin/End and
// gives a Key before each value in an object; the writer does not check either (the messages that use it are fixed
// shapes, and their tests parse what it wrote).
class JsonTextWriter {
 public:
  JsonTextWriter& BeginObject();
  JsonTextWriter& EndObject();
  JsonTextWriter& BeginArray();
  JsonTextWriter& EndArray();
  JsonTextWriter& Key(std::string_view key);
  JsonTextWriter& String(std::string_view value);  // escaped as JSON requires; bytes >= 0x80 are copied as they are
  JsonTextWriter& Int(int64_t value);
  JsonTextWriter& UInt(uint64_t value);
  JsonTextWriter& Double(double value);  // shortest text that reads back the same; null when not finite
  JsonTextWriter& Bool(bool value);
  JsonTextWriter& Raw(std::string_view json_text);  // a value that is JSON text already

  // A key and its value.
  JsonTextWriter& Field(std::string_view key, std::string_view value) { return Key(key).String(value); }
  JsonTextWriter& Field(std::string_view key, const char* value) { return Key(key).String(value); }
  JsonTextWriter& Field(std::string_view key, const std::string& value) { return Key(key).String(value); }
  JsonTextWriter& Field(std::string_view key, int value) { return Key(key).Int(value); }
  JsonTextWriter& Field(std::string_view key, int64_t value) { return Key(key).Int(value); }
  JsonTextWriter& Field(std::string_view key, uint64_t value) { return Key(key).UInt(value); }
  JsonTextWriter& Field(std::string_view key, bool value) { return Key(key).Bool(value); }

  void Reserve(size_t bytes) { out_.reserve(bytes); }
  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();

  std::string out_;
  bool after_value_ = false;  // the last thing written was a value (or a closed object/array): a comma comes next
};

}  // namespace parsyn::protocol
