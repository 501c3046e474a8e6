// Small string helpers that several layers need: case, whitespace, hex.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace parsyn {

// ASCII lower case ("Content-Type" -> "content-type"); other bytes unchanged.
std::string ToLower(std::string_view text);
// `text` without leading and trailing spaces, tabs, CR and LF.
std::string_view Trim(std::string_view text);
// Lowercase hex, two digits per byte.
std::string HexEncode(std::span<const unsigned char> bytes);
std::string HexEncode(std::string_view bytes);

}  // namespace parsyn
