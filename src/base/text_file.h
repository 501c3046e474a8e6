// Small files read whole: one value (a key, a secret, a URL, a JSON line), a PEM bundle, a masked vector.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "base/status.h"

namespace parsyn {

// The file's bytes, as they are. Unavailable ("cannot read <path>") when it cannot be opened or read. Thread-safe.
StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path);

// The file's contents without trailing line ends and spaces ('\n', '\r', ' '). Unavailable ("cannot read <path>")
// when it cannot be opened. Thread-safe.
StatusOr<std::string> ReadTrimmedTextFile(const std::filesystem::path& path);

// Writes `contents` to a new file of mode 0600 (a key, a secret), fsynced. AlreadyExists if it is there; Unavailable
// naming the file on other errors. Thread-safe.
Status WriteNewSecretFile(const std::filesystem::path& path, std::string_view contents);

}  // namespace parsyn
