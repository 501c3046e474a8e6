#include "data/unicode.h"

#include <algorithm>

namespace parsyn::data::internal {
namespace {

// Length of the valid UTF-8 sequence at `i`, or the length of its maximal invalid prefix (at least 1) negated.
// Byte ranges per the Unicode standard's table of well-formed sequences (no overlongs, surrogates or > U+10FFFF).
int SequenceAt(std::string_view s, size_t i, char32_t& code_point) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b0 = byte(i);
  if (b0 < 0x80) {
    code_point = b0;
    return 1;
  }
  int length;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
    code_point = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    code_point = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    code_point = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < length; ++k) {
    if (i + k >= s.size()) return -k;
    unsigned char b = byte(i + k);
    unsigned char min = k == 1 ? lo : 0x80;
    unsigned char max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return -k;
    code_point = (code_point << 6) | (b & 0x3F);
  }
  return length;
}

bool InRanges(const CodePointRange* ranges, size_t size, char32_t c) {
  const CodePointRange* end = ranges + size;
  const CodePointRange* it =
      std::upper_bound(ranges, end, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  if (it == ranges) return false;
  --it;
  return c <= it->last;
}

uint32_t CombiningClass(char32_t c) {
  const CombiningClassRange* begin = kCombiningClassRanges;
  const CombiningClassRange* end = begin + kCombiningClassRangesSize;
  const CombiningClassRange* it =
      std::upper_bound(begin, end, c, [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  if (it == begin) return 0;
  --it;
  return c <= it->last ? it->combining_class : 0;
}

// Hangul syllables decompose and compose algorithmically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void Decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* begin = kCanonicalDecompositions;
  const Decomposition* end = begin + kCanonicalDecompositionsSize;
  const Decomposition* it =
      std::lower_bound(begin, end, c, [](const Decomposition& d, char32_t v) { return d.code_point < v; });
  if (it == end || it->code_point != c) {
    out.push_back(c);
    return;
  }
  Decompose(it->first, out);
  if (it->second != 0) Decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* begin = kCompositions;
  const Composition* end = begin + kCompositionsSize;
  const Composition* it = std::lower_bound(
      begin, end, std::pair(a, b), [](const Composition& x, auto key) { return std::pair(x.first, x.second) < key; });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

// NFC of valid UTF-8.
void NfcOfValid(std::string_view text, std::string& out) {
  std::u32string chars;
  for (const DecodedChar& d : DecodeUtf8(text)) Decompose(d.code_point, chars);
  // Canonical ordering: a stable sort by combining class within each run of non-starters.
  for (size_t i = 0; i < chars.size();) {
    if (CombiningClass(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && CombiningClass(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + static_cast<std::ptrdiff_t>(i), chars.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t x, char32_t y) { return CombiningClass(x) < CombiningClass(y); });
    i = j;
  }
  // Canonical composition (the reference algorithm of UAX #15).
  if (!chars.empty()) {
    size_t starter = 0;
    uint32_t last_class = CombiningClass(chars[0]);
    if (last_class != 0) last_class = 256;  // a leading non-starter has no starter to join
    size_t write = 1;
    for (size_t read = 1; read < chars.size(); ++read) {
      char32_t c = chars[read];
      uint32_t c_class = CombiningClass(c);
      char32_t composite = Compose(chars[starter], c);
      if (composite != 0 && (last_class < c_class || last_class == 0)) {
        chars[starter] = composite;
        continue;
      }
      if (c_class == 0) starter = write;
      last_class = c_class;
      chars[write++] = c;
    }
    chars.resize(write);
  }
  for (char32_t c : chars) AppendUtf8(c, out);
}

}  // namespace

std::vector<DecodedChar> DecodeUtf8(std::string_view text) {
  std::vector<DecodedChar> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    int n = SequenceAt(text, i, cp);
    if (n > 0) {
      out.push_back({cp, i, static_cast<size_t>(n)});
      i += static_cast<size_t>(n);
    } else {
      out.push_back({kInvalidCodePoint, i, 1});
      ++i;
    }
  }
  return out;
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsLetter(char32_t c) { return InRanges(kLetterRanges, kLetterRangesSize, c); }
bool IsNumber(char32_t c) { return InRanges(kNumberRanges, kNumberRangesSize, c); }

bool IsWhitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

std::string NormalizeNfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
  std::string out;
  out.reserve(text.size());
  size_t valid_begin = 0;
  for (size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    int n = SequenceAt(text, i, cp);
    if (n > 0) {
      i += static_cast<size_t>(n);
      continue;
    }
    NfcOfValid(text.substr(valid_begin, i - valid_begin), out);
    out.push_back(text[i]);
    ++i;
    valid_begin = i;
  }
  NfcOfValid(text.substr(valid_begin), out);
  return out;
}

std::string ValidUtf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    int n = SequenceAt(bytes, i, cp);
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp = 0;
    int n = SequenceAt(bytes, i, cp);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace parsyn::data::internal
