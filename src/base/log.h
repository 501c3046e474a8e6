// Logging through spdlog. Every layer logs with PARSYN_LOG_{DEBUG,INFO,WARN,ERROR}("round {} committed", n) using
// fmt syntax. Thread-safe. Logs go to stderr so stdout stays free for program output (JSON lines, tables).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace parsyn::log {

// Sets up the stderr logger once; `level` is "debug", "info", "warn" or "error" (unknown names mean "info").
// Also honours PARSYN_LOG_LEVEL from the environment when `level` is empty, and PARSYN_LOG_FORMAT (SetFormat's
// names) at the first call.
void Init(std::string_view level = "");

// "text" (the default): "2026-12-01T16:20:34.123Z I message". "json": one object a line,
// {"time":"2026-12-01T16:20:34.123Z","level":"info","msg":"..."}, for log collectors. Times are UTC (RFC 3339) in
// both. False for another name.
bool SetFormat(std::string_view format);

}  // namespace parsyn::log

#define PARSYN_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define PARSYN_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define PARSYN_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define PARSYN_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
