// Internal to src/data: the pre-tokenizer regexes of the byte-level BPE tokenizers we support, matched by hand-written
// code instead of a regex engine (the patterns need \p{L}, \p{N}, lookahead and case-insensitive groups, which
// std::regex lacks). Each function follows the regex's leftmost-alternative, greedy-with-backtracking semantics
// exactly; regex_split_test.cc pins the behaviour on the cases where the alternatives interact.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace parsyn::data::internal {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // As kLlama3 with \p{N} in place of \p{N}{1,3}.
  kQwen2,
};

// The pattern a tokenizer.json Split regex spells, or nullopt for any other regex.
std::optional<SplitPattern> RecognizeSplitPattern(std::string_view regex);
const char* SplitPatternRegex(SplitPattern pattern);

// Splits `text` into the pattern's matches and the gaps between them, in order ("Isolated" behaviour); the pieces
// concatenate to `text`. Invalid UTF-8 bytes count as characters that are neither letters, numbers nor spaces.
std::vector<std::string_view> SplitWithPattern(std::string_view text, SplitPattern pattern);

}  // namespace parsyn::data::internal
