// The log line format (kept out of log.h, which every file includes). log::Init() also reads PARSYN_LOG_FORMAT
// (these names) at its first call, so every subcommand (the worker too) can log JSON lines.
#pragma once

#include <string_view>

namespace parsyn::log {

// "text" (the default): "2026-12-01T16:20:34.123Z I message". "json": one object a line,
// {"time":"2026-12-01T16:20:34.123Z","level":"info","msg":"..."}, for log collectors. Times are UTC (RFC 3339) in
// both. False for another name.
bool SetFormat(std::string_view format);

}  // namespace parsyn::log
