#include "cli/config_file.h"

#include <cstdlib>
#include <map>
#include <set>

#include "base/strings.h"
#include "base/text_file.h"

namespace parsyn::cli {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

enum class ValueType { kString, kInteger, kFloat, kBoolean };

const char* TypeName(ValueType type) {
  switch (type) {
    case ValueType::kString: return "a string";
    case ValueType::kInteger: return "an integer";
    case ValueType::kFloat: return "a float";
    case ValueType::kBoolean: return "a boolean";
  }
  return "a value";
}

struct Value {
  ValueType type = ValueType::kString;
  std::string text;  // the string's contents, or the number or boolean as written
};

bool IsBareKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Appends the code point of the \uXXXX or \UXXXXXXXX escape whose 'u' or 'U' is at rest[i] to `out`; returns the
// index of its last hex digit.
StatusOr<size_t> AppendUnicodeEscape(std::string_view rest, size_t i, std::string& out) {
  const size_t digits = rest[i] == 'u' ? 4 : 8;
  if (i + digits >= rest.size()) return InvalidArgumentError("a \\u escape needs hex digits");
  uint32_t cp = 0;
  for (size_t k = 1; k <= digits; ++k) {
    const char h = rest[i + k];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return InvalidArgumentError("a \\u escape needs hex digits");
    cp = cp * 16 + static_cast<uint32_t>(d);
  }
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return InvalidArgumentError("a \\u escape that is not a Unicode scalar value");
  }
  AppendUtf8(out, cp);
  return i + digits;
}

// Parses the basic string ("...", with escapes) at the start of `rest`, as ParseValue.
StatusOr<Value> ParseBasicString(std::string_view& rest) {
  Value value;
  size_t i = 1;
  for (; i < rest.size() && rest[i] != '"'; ++i) {
    const char c = rest[i];
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
      return InvalidArgumentError("a control character in a string (escape it)");
    }
    if (c != '\\') {
      value.text += c;
      continue;
    }
    if (++i >= rest.size()) break;
    switch (rest[i]) {
      case '"': value.text += '"'; break;
      case '\\': value.text += '\\'; break;
      case 'b': value.text += '\b'; break;
      case 't': value.text += '\t'; break;
      case 'n': value.text += '\n'; break;
      case 'f': value.text += '\f'; break;
      case 'r': value.text += '\r'; break;
      case 'u':
      case 'U': {
        PARSYN_ASSIGN_OR_RETURN(i, AppendUnicodeEscape(rest, i, value.text));
        break;
      }
      default: return InvalidArgumentError(std::string("unknown escape \\") + rest[i] + " in a string");
    }
  }
  if (i >= rest.size()) return InvalidArgumentError("the string has no closing \"");
  rest.remove_prefix(i + 1);
  return value;
}

// Parses the bare token (a boolean or a number) at the start of `rest`, as ParseValue.
StatusOr<Value> ParseBareValue(std::string_view& rest) {
  Value value;
  size_t end = 0;
  while (end < rest.size() && rest[end] != ' ' && rest[end] != '\t' && rest[end] != '#') ++end;
  const std::string token(rest.substr(0, end));
  rest.remove_prefix(end);
  if (token == "true" || token == "false") {
    value.type = ValueType::kBoolean;
    value.text = token;
    return value;
  }
  std::string digits;  // TOML allows '_' between digits
  for (char c : token) {
    if (c != '_') digits += c;
  }
  if (!digits.empty() && digits.find_first_not_of("+-0123456789.eE") == std::string::npos) {
    char* parsed_end = nullptr;
    const bool integer = digits.find_first_of(".eE") == std::string::npos;
    if (integer) {
      std::strtoll(digits.c_str(), &parsed_end, 10);
    } else {
      std::strtod(digits.c_str(), &parsed_end);
    }
    if (parsed_end == digits.c_str() + digits.size()) {
      value.type = integer ? ValueType::kInteger : ValueType::kFloat;
      value.text = token;
      return value;
    }
  }
  if (token.empty()) return InvalidArgumentError("a key needs a value after '='");
  return InvalidArgumentError("'" + token +
                              "' is not a value: write a \"quoted string\", a number, true or false (strings need "
                              "quotes in TOML)");
}

// Parses the value at the start of `rest`; on success `rest` is left with what follows it. Errors are the reason
// only (the caller adds FILE:LINE).
StatusOr<Value> ParseValue(std::string_view& rest) {
  if (rest.starts_with("\"\"\"") || rest.starts_with("'''")) {
    return InvalidArgumentError("multi-line strings are not supported; write the value on one line");
  }
  if (rest.starts_with('\'')) {  // a literal string: no escapes
    const size_t end = rest.find('\'', 1);
    if (end == std::string_view::npos) return InvalidArgumentError("the string has no closing '");
    Value value;
    value.text = std::string(rest.substr(1, end - 1));
    rest.remove_prefix(end + 1);
    return value;
  }
  if (rest.starts_with('"')) return ParseBasicString(rest);
  return ParseBareValue(rest);
}

const std::set<std::string, std::less<>> kKeys = {"server", "key_file", "ca_file", "data_dir", "project"};

}  // namespace

StatusOr<CliConfig> ParseCliConfig(std::string_view text, const fs::path& path) {
  CliConfig config;
  config.path = path;
  const fs::path folder = path.parent_path();
  std::map<std::string, int, std::less<>> seen;  // key -> the line it was set on ("trainers.NAME" in [trainers])
  bool in_trainers = false;                      // after the [trainers] line
  int line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    auto error = [&](const std::string& reason) {
      return InvalidArgumentError(path.string() + ":" + std::to_string(line_number) + ": " + reason);
    };
    line = Trim(line);
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[') {
      const std::string_view header = Trim(line.substr(0, line.find('#')));
      if (header != "[trainers]") {
        return error(
            "the only section is [trainers] (the worker's trainers, NAME = \"COMMAND\"); write the other "
            "keys at the top level (server, key_file, ca_file, data_dir, project)");
      }
      if (in_trainers) return error("[trainers] appears twice");
      in_trainers = true;
      continue;
    }
    size_t key_end = 0;
    while (key_end < line.size() && IsBareKeyChar(line[key_end])) ++key_end;
    const std::string key(line.substr(0, key_end));
    std::string_view rest = Trim(line.substr(key_end));
    if (key.empty() || !rest.starts_with('=')) {
      return error("expected `key = value`, got '" + std::string(line) + "'");
    }
    if (!in_trainers && !kKeys.contains(key)) {
      return error("unknown key '" + key + "' (known: server, key_file, ca_file, data_dir, project, and [trainers])");
    }
    const std::string seen_key = in_trainers ? "trainers." + key : key;
    if (auto before = seen.find(seen_key); before != seen.end()) {
      return error("'" + key + "' is set twice (first on line " + std::to_string(before->second) + ")");
    }
    seen[seen_key] = line_number;
    rest = Trim(rest.substr(1));
    StatusOr<Value> value = ParseValue(rest);
    if (!value.ok()) return error(key + ": " + std::string(value.status().message()));
    rest = Trim(rest);
    if (!rest.empty() && rest.front() != '#') {
      return error("unexpected '" + std::string(rest) + "' after the value of '" + key + "'");
    }
    if (value->type != ValueType::kString) {
      return error(key + " must be a string (in quotes), got " + TypeName(value->type) + " (" + value->text + ")");
    }
    if (value->text.empty()) return error(key + " must not be empty");
    if (in_trainers) {
      config.trainers.emplace_back(key, value->text);  // the worker checks the name and the command
    } else if (key == "server") {
      config.server = value->text;
    } else if (key == "project") {
      config.project = value->text;
    } else {
      // Paths relative to the file's folder, so the file means the same from any working directory.
      const fs::path file = fs::path(value->text).is_absolute() ? fs::path(value->text) : folder / value->text;
      (key == "key_file" ? config.key_file : key == "ca_file" ? config.ca_file : config.data_dir) = file;
    }
  }
  return config;
}

ConfigLocation FindCliConfig(const std::string& flag) {
  if (!flag.empty()) return {flag, true};
  if (std::string env = Env("PARSYN_CONFIG"); !env.empty()) return {env, true};
  if (std::string xdg = Env("XDG_CONFIG_HOME"); !xdg.empty()) return {fs::path(xdg) / "parsyn" / "config.toml", false};
  if (std::string home = Env("HOME"); !home.empty()) {
    return {fs::path(home) / ".config" / "parsyn" / "config.toml", false};
  }
  return {};
}

StatusOr<CliConfig> LoadCliConfig(const std::string& flag) {
  const ConfigLocation where = FindCliConfig(flag);
  if (where.path.empty()) return CliConfig();
  std::error_code ec;
  if (!fs::exists(where.path, ec)) {
    if (!where.required) return CliConfig();
    return NotFoundError("config file " + where.path.string() + " does not exist (named by " +
                         (flag.empty() ? "PARSYN_CONFIG" : "--config") + ")");
  }
  StatusOr<std::string> text = ReadTrimmedTextFile(where.path);
  if (!text.ok()) return text.status();
  fs::path absolute = fs::absolute(where.path, ec);
  return ParseCliConfig(*text, ec ? where.path : absolute);
}

}  // namespace parsyn::cli
