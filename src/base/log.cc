#include "base/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "base/log_format.h"

namespace parsyn::log {

namespace {

constexpr const char* kTextPattern = "%Y-%m-%dT%H:%M:%S.%eZ %^%L%$ %v";

// The message as a JSON string's contents: quotes, backslashes and control characters escaped.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(c);
      } else if (c == '\n') {
        dest.append(std::string_view("\\n"));
      } else if (u < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        dest.append(esc, esc + sizeof esc);
      } else {
        dest.push_back(c);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonMessageFlag>(); }
};

void SetTextPattern() {
  spdlog::set_formatter(std::make_unique<spdlog::pattern_formatter>(kTextPattern, spdlog::pattern_time_type::utc));
}

}  // namespace

void Init(std::string_view level) {
  std::string name(level);
  if (name.empty()) {
    const char* env = std::getenv("PARSYN_LOG_LEVEL");
    name = env ? env : "info";
  }
  auto logger = spdlog::get("parsyn");  // Init may run more than once (tests, subcommands)
  if (!logger) {
    logger = spdlog::stderr_color_mt("parsyn");
    spdlog::set_default_logger(logger);
    // PARSYN_LOG_FORMAT=json gives every subcommand (the worker too) JSON lines; `parsyn server --log-format` wins.
    const char* format = std::getenv("PARSYN_LOG_FORMAT");
    if (format == nullptr || !SetFormat(format)) SetTextPattern();
  }
  spdlog::set_default_logger(logger);
  spdlog::level::level_enum lvl = spdlog::level::from_str(name);
  if (lvl == spdlog::level::off && name != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
}

bool SetFormat(std::string_view format) {
  if (format == "text") {
    SetTextPattern();
    return true;
  }
  if (format != "json") return false;
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<JsonMessageFlag>('*');
  // %l is spdlog's level name (trace, debug, info, warning, error, critical).
  formatter->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","msg":"%*"})");
  spdlog::set_formatter(std::move(formatter));
  return true;
}

}  // namespace parsyn::log
