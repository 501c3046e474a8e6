#include "protocol/json_text.h"

#include <charconv>
#include <cmath>

namespace parsyn::protocol {

void JsonTextWriter::BeforeValue() {
  if (after_value_) out_.push_back(',');
}

JsonTextWriter& JsonTextWriter::BeginObject() {
  BeforeValue();
  out_.push_back('{');
  after_value_ = false;
  return *this;
}

JsonTextWriter& JsonTextWriter::EndObject() {
  out_.push_back('}');
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::BeginArray() {
  BeforeValue();
  out_.push_back('[');
  after_value_ = false;
  return *this;
}

JsonTextWriter& JsonTextWriter::EndArray() {
  out_.push_back(']');
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::Key(std::string_view key) {
  String(key);
  out_.push_back(':');
  after_value_ = false;
  return *this;
}

JsonTextWriter& JsonTextWriter::String(std::string_view value) {
  BeforeValue();
  out_.push_back('"');
  // Runs of plain bytes are appended whole: URLs and hashes, most of a task, need no escape at all.
  size_t plain_from = 0;
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out_.append(value.data() + plain_from, i - plain_from);
    plain_from = i + 1;
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\r': out_ += "\\r"; break;
      case '\t': out_ += "\\t"; break;
      case '\b': out_ += "\\b"; break;
      case '\f': out_ += "\\f"; break;
      default: {
        constexpr char kHex[] = "0123456789abcdef";
        out_ += "\\u00";
        out_.push_back(kHex[c >> 4]);
        out_.push_back(kHex[c & 0xF]);
      }
    }
  }
  out_.append(value.data() + plain_from, value.size() - plain_from);
  out_.push_back('"');
  after_value_ = true;
  return *this;
}

namespace {

template <typename T>
void AppendNumber(std::string& out, T value) {
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc() ? end : buffer);
}

}  // namespace

JsonTextWriter& JsonTextWriter::Int(int64_t value) {
  BeforeValue();
  AppendNumber(out_, value);
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::UInt(uint64_t value) {
  BeforeValue();
  AppendNumber(out_, value);
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::Double(double value) {
  BeforeValue();
  if (std::isfinite(value)) {
    const size_t start = out_.size();
    AppendNumber(out_, value);  // shortest round-trip form, e.g. "0.01", "1e-05", "3"
    // "3" would read back as an integer: JSON readers that tell the two apart get a double, as nlohmann writes it.
    if (out_.find_first_of(".eE", start) == std::string::npos) out_ += ".0";
  } else {
    out_ += "null";
  }
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  after_value_ = true;
  return *this;
}

JsonTextWriter& JsonTextWriter::Raw(std::string_view json_text) {
  BeforeValue();
  out_.append(json_text);
  after_value_ = true;
  return *this;
}

}  // namespace parsyn::protocol
