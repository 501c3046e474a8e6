// Small string helpers that several layers need: case, whitespace, hex, paths in messages.
#pragma once

#include <optional>
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
// The bytes of hex text (either case, two digits per byte); nullopt for an odd length or a non-hex character.
std::optional<std::string> HexDecode(std::string_view hex);
// Base64url without padding (RFC 4648 §5: '-' and '_'), as JWTs and signed URLs use it.
std::string Base64UrlEncode(std::string_view bytes);
// The bytes of base64url text (padding '=' accepted at the end); nullopt for another character or a length no
// encoding has.
std::optional<std::string> Base64UrlDecode(std::string_view text);
// `text` safe inside XML or SVG text and attribute values: & < > " as entities.
std::string XmlEscape(std::string_view text);

// 'text', in single quotes: how error messages name a tensor or a field.
std::string SingleQuoted(std::string_view text);
// `message` with every absolute file path in it replaced by the path's last part, for messages that leave the
// machine (a worker's failure reason shown on the dashboard): "/home/u/.cache/parsyn/tasks/1-1-3-w1/task.json: bad"
// becomes "task.json: bad". A path starts with '/' at the start or after a space, quote, bracket, '=' or ',', has at
// least two parts, and ends before whitespace, a quote, a closing bracket, ',' or ';', or a ':' that ends the text or
// is followed by a space. API routes ("/api/...") are kept.
std::string WithoutLocalPaths(std::string_view message);

}  // namespace parsyn
