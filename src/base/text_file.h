// Small files read whole: one value (a key, a secret, a URL, a JSON line), a PEM bundle, a masked vector.
#pragma once

#include <filesystem>
#include <string>

#include "base/status.h"

namespace parsyn {

// The file's contents without trailing line ends and spaces ('\n', '\r', ' '). Unavailable ("cannot read <path>")
// when it cannot be opened. Thread-safe.
// The file's bytes, as they are. Unavailable ("cannot read <path>") when it cannot be opened or read. Thread-safe.
StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path);

StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path);

}  // namespace parsyn
