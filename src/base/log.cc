#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

namespace parsyn::log {

void Init(std::string_view level) {
  std::string name(level);
  if (name.empty()) {
    const char* env = std::getenv("PARSYN_LOG_LEVEL");
    name = env ? env : "info";
  }
  auto logger = spdlog::get("parsyn");  // Init may run more than once (tests, subcommands)
  if (!logger) logger = spdlog::stderr_color_mt("parsyn");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  spdlog::level::level_enum lvl = spdlog::level::from_str(name);
  if (lvl == spdlog::level::off && name != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
}

}  // namespace parsyn::log
