#include "data/regex_split.h"

#include "data/unicode.h"

namespace parsyn::data::internal {
namespace {

constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Character classes over the decoded text; positions past the end belong to no class.
class Chars {
 public:
  explicit Chars(const std::vector<DecodedChar>& chars) : chars_(chars) {}
  size_t size() const { return chars_.size(); }
  char32_t at(size_t k) const { return k < chars_.size() ? chars_[k].code_point : 0; }
  bool Letter(size_t k) const { return k < size() && IsLetter(at(k)); }
  bool Number(size_t k) const { return k < size() && IsNumber(at(k)); }
  bool Space(size_t k) const { return k < size() && IsWhitespace(at(k)); }
  // [^\s\p{L}\p{N}]
  bool Other(size_t k) const { return k < size() && !Space(k) && !Letter(k) && !Number(k); }
  bool Newline(size_t k) const { return k < size() && (at(k) == '\r' || at(k) == '\n'); }
  bool Is(size_t k, char32_t c) const { return k < size() && at(k) == c; }

 private:
  const std::vector<DecodedChar>& chars_;
};

char32_t AsciiLower(char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII case-insensitive. Returns the end, or `i` when nothing matches.
size_t MatchContraction(const Chars& c, size_t i, bool ignore_case) {
  if (!c.Is(i, '\'')) return i;
  static constexpr std::u32string_view kSuffixes[] = {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"};
  for (std::u32string_view suffix : kSuffixes) {
    bool matched = true;
    for (size_t k = 0; k < suffix.size() && matched; ++k) {
      char32_t ch = c.at(i + 1 + k);
      if (i + 1 + k >= c.size())
        matched = false;
      else
        matched = (ignore_case ? AsciiLower(ch) : ch) == suffix[k];
    }
    if (matched) return i + 1 + suffix.size();
  }
  return i;
}

// " ?X+" for a class X: an optional leading space only when X follows it.
template <typename Class>
size_t MatchOptionalSpaceRun(const Chars& c, size_t i, Class in_class) {
  size_t j = i;
  if (c.Is(j, ' ') && in_class(j + 1)) ++j;
  if (!in_class(j)) return i;
  while (in_class(j)) ++j;
  return j;
}

size_t SpaceRunEnd(const Chars& c, size_t i) {
  size_t j = i;
  while (c.Space(j)) ++j;
  return j;
}

// \s+(?!\S) then \s+ : a whitespace run, leaving its last space to the next token when a non-space follows.
size_t MatchTrailingSpaces(const Chars& c, size_t i) {
  if (!c.Space(i)) return i;
  size_t end = SpaceRunEnd(c, i);
  if (end == c.size()) return end;
  if (end - 1 > i) return end - 1;  // \s+(?!\S) after backtracking one space
  return end;                       // \s+
}

size_t MatchGpt2(const Chars& c, size_t i) {
  size_t e;
  if ((e = MatchContraction(c, i, false)) != i) return e;
  if ((e = MatchOptionalSpaceRun(c, i, [&](size_t k) { return c.Letter(k); })) != i) return e;
  if ((e = MatchOptionalSpaceRun(c, i, [&](size_t k) { return c.Number(k); })) != i) return e;
  if ((e = MatchOptionalSpaceRun(c, i, [&](size_t k) { return c.Other(k); })) != i) return e;
  return MatchTrailingSpaces(c, i);
}

size_t MatchLlama3(const Chars& c, size_t i, size_t max_digits) {
  size_t e;
  if ((e = MatchContraction(c, i, true)) != i) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  {
    size_t j = i;
    bool prefix = j < c.size() && !c.Newline(j) && !c.Letter(j) && !c.Number(j);
    if (prefix && c.Letter(j + 1)) ++j;
    if (c.Letter(j)) {
      while (c.Letter(j)) ++j;
      return j;
    }
  }
  // \p{N}{1,max}
  if (c.Number(i)) {
    size_t j = i;
    while (c.Number(j) && j - i < max_digits) ++j;
    return j;
  }
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  if ((e = MatchOptionalSpaceRun(c, i, [&](size_t k) { return c.Other(k); })) != i) {
    while (c.Newline(e)) ++e;
    return e;
  }
  // \s*[\r\n]+ : greedy \s* backtracks to the last newline of the whitespace run.
  if (c.Space(i)) {
    size_t end = SpaceRunEnd(c, i);
    for (size_t k = end; k > i; --k) {
      if (c.Newline(k - 1)) return k;
    }
  }
  return MatchTrailingSpaces(c, i);
}

}  // namespace

std::optional<SplitPattern> RecognizeSplitPattern(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

const char* SplitPatternRegex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
  }
  return "";
}

std::vector<std::string_view> SplitWithPattern(std::string_view text, SplitPattern pattern) {
  std::vector<DecodedChar> decoded = DecodeUtf8(text);
  Chars c(decoded);
  auto byte_offset = [&](size_t k) { return k < decoded.size() ? decoded[k].offset : text.size(); };
  std::vector<std::string_view> pieces;
  size_t gap_begin = 0;  // start (in chars) of text no alternative matched
  size_t i = 0;
  while (i < c.size()) {
    size_t end = pattern == SplitPattern::kGpt2     ? MatchGpt2(c, i)
                 : pattern == SplitPattern::kLlama3 ? MatchLlama3(c, i, 3)
                                                    : MatchLlama3(c, i, 1);
    if (end == i) {
      ++i;
      continue;
    }
    if (gap_begin < i) pieces.push_back(text.substr(byte_offset(gap_begin), byte_offset(i) - byte_offset(gap_begin)));
    pieces.push_back(text.substr(byte_offset(i), byte_offset(end) - byte_offset(i)));
    i = end;
    gap_begin = end;
  }
  if (gap_begin < c.size()) pieces.push_back(text.substr(byte_offset(gap_begin)));
  return pieces;
}

}  // namespace parsyn::data::internal
