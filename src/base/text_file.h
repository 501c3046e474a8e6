// Small text files that hold one value (a key, a secret, a URL, a JSON line), read whole.
#pragma once

#include <filesystem>
#include <string>

#include "base/status.h"

namespace parsyn {

// The file's contents without trailing line ends and spaces ('\n', '\r', ' '). Unavailable ("cannot read <path>")
// when it cannot be opened. Thread-safe.
StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path);

}  // namespace parsyn
