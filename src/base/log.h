// Logging through spdlog. Every layer logs with PARSYN_LOG_{DEBUG,INFO,WARN,ERROR}("round {} committed", n) using
// fmt syntax. Thread-safe. Logs go to stderr so stdout stays free for program output (JSON lines, tables).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace parsyn::log {

// Sets up the stderr logger once; `level` is "debug", "info", "warn" or "error" (unknown names mean "info").
// Also honours PARSYN_LOG_LEVEL from the environment when `level` is empty.
void Init(std::string_view level = "");

}  // namespace parsyn::log

#define PARSYN_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define PARSYN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define PARSYN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define PARSYN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
