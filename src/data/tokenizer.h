// Tokenizers loaded from a Hugging Face `tokenizer.json` whose model is BPE, in the two kinds Llama-family models use:
//
//   byte-level (GPT-2, Llama-3, Qwen2): pre_tokenizer ByteLevel, alone or in a Sequence after a Split whose regex is
//     the GPT-2 pattern or the Llama-3/Qwen2 pattern (matched by hand-written code, not a regex engine; another
//     pattern is InvalidArgument naming it); bytes mapped to printable characters by GPT-2's byte-to-unicode table;
//     decoder ByteLevel.
//   SentencePiece-style (Llama-2, TinyLlama, Mistral): normalizer Prepend("▁") + Replace(" ", "▁") or pre_tokenizer
//     Metaspace; BPE with byte_fallback to "<0xNN>" tokens; decoder Replace/ByteFallback/Fuse/Strip (or Metaspace).
//
// Both: merges applied by rank (lowest first, leftmost among equals; "ignore_merges" honoured); added tokens (the
// file's "added_tokens") are split out of the raw text (leftmost, longest first; lstrip/rstrip/single_word
// honoured; their "normalized" flag is not: they always match the text as given) and encode to their own ids;
// post_processor TemplateProcessing (or a missing one) decides what add_special_tokens adds (bos/eos).
// The file's "truncation" and "padding" are ignored (the trainer truncates and pads), and so is transformers'
// clean_up_tokenization_spaces (it is a tokenizer_config.json option, not part of tokenizer.json).
// Ids and decoded text equal transformers.js' (npm @lenml/tokenizers) on the cross-checked corpus (README.md);
// Unicode categories are from Unicode 14, so characters assigned later are neither letters nor numbers here.
//
// Not supported, each InvalidArgument naming what is unsupported: models WordPiece, Unigram, WordLevel; BPE with
// "dropout" or "continuing_subword_prefix"; normalizer, pre-tokenizer, post-processor or decoder types other than
// those listed above.
//
// A Tokenizer is immutable after loading: Encode/Decode are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace parsyn::data {

enum class TokenizerKind { kByteLevel, kSentencePiece };

class Tokenizer {
 public:
  // NotFound if the file is missing; InvalidArgument for malformed JSON or an unsupported configuration (named).
  static StatusOr<Tokenizer> FromFile(const std::filesystem::path& path);
  static StatusOr<Tokenizer> FromJson(std::string_view tokenizer_json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids for `text` (UTF-8; invalid bytes are encoded as the bytes they are: byte-level maps every byte,
  // SentencePiece-style uses byte fallback). With add_special_tokens, the post_processor's template (e.g. bos first)
  // is applied. InvalidArgument only when a piece has no token and the model has neither byte fallback nor an unk
  // token.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Text for `ids`, as the file's decoder produces it. With skip_special_tokens, added tokens marked special are
  // left out. InvalidArgument naming the first id outside the vocabulary.
  StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  TokenizerKind kind() const;
  // One more than the largest id (model vocabulary and added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string as stored in the vocabulary (byte-level tokens in their byte-to-unicode spelling).
  // Empty for an id that no token has.
  std::string IdToToken(int32_t id) const;

  // bos: the special token the post_processor puts first (absent when it adds none). eos: the special token the
  // post_processor puts last, else the first added token among "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>",
  // "<|im_end|>". pad: "<pad>", "<|pad|>" or "[PAD]" when present. config.json's ids, when a model has them, win over
  // these guesses; the trainer should prefer them.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A tokenizer that needs no vocabulary, for models that have none of their own (`parsyn model init`): ids 0..255 are
// the bytes 0..255 (spelled with GPT-2's byte-to-unicode characters, no merges), then 256 "<pad>", 257 "<bos>",
// 258 "<eos>" (special added tokens). Its post_processor prepends <bos>. Pre-tokenizer ByteLevel without regex split
// and without prefix space, decoder ByteLevel, so Hugging Face tokenizers and transformers.js load it as it is.
inline constexpr int32_t kByteLevelPadId = 256;
inline constexpr int32_t kByteLevelBosId = 257;
inline constexpr int32_t kByteLevelEosId = 258;
inline constexpr int32_t kByteLevelVocabSize = 259;

// The tokenizer.json text of that tokenizer.
std::string ByteLevelTokenizerJson();
// A matching tokenizer_config.json (bos/eos/pad tokens, tokenizer_class PreTrainedTokenizerFast), which
// transformers' AutoTokenizer wants beside tokenizer.json.
std::string ByteLevelTokenizerConfigJson();
// Writes both files into `model_dir` (which must exist), each atomically (temporary file, fsync, rename).
Status WriteByteLevelTokenizer(const std::filesystem::path& model_dir);

}  // namespace parsyn::data
