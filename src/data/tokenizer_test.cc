#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/regex_split.h"
#include "data/unicode.h"

namespace parsyn::data {
namespace {

using json = nlohmann::json;
using internal::SplitPattern;
using internal::SplitWithPattern;

std::vector<std::string> Split(std::string_view text, SplitPattern pattern) {
  std::vector<std::string> out;
  for (std::string_view piece : SplitWithPattern(text, pattern)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;

// ---------------------------------------------------------------------------------------------------------------
// The hand-written regexes, on the cases where their alternatives interact. Expected pieces are what node's
// RegExp (with the u flag) gives for the same patterns.

TEST(RegexSplitTest, Gpt2Pattern) {
  EXPECT_EQ(Split("Hello world's  end\n", SplitPattern::kGpt2), (Pieces{"Hello", " world", "'s", " ", " end", "\n"}));
  EXPECT_EQ(Split("I'M 2024 ok!!", SplitPattern::kGpt2), (Pieces{"I", "'", "M", " 2024", " ok", "!!"}));
  EXPECT_EQ(Split("   ", SplitPattern::kGpt2), (Pieces{"   "}));
  EXPECT_EQ(Split("x  \ty", SplitPattern::kGpt2), (Pieces{"x", "  ", "\t", "y"}));
}

TEST(RegexSplitTest, Llama3Pattern) {
  EXPECT_EQ(Split("I'M 12345 abc\n\n  x", SplitPattern::kLlama3),
            (Pieces{"I", "'M", " ", "123", "45", " abc", "\n\n", " ", " x"}));
  EXPECT_EQ(Split("foo!!\n\nbar", SplitPattern::kLlama3), (Pieces{"foo", "!!\n\n", "bar"}));
  EXPECT_EQ(Split("na\xC3\xAFve caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87", SplitPattern::kLlama3),
            (Pieces{"na\xC3\xAFve", " caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(Split("(hello) \tworld", SplitPattern::kLlama3), (Pieces{"(hello", ")", " ", "\tworld"}));
  EXPECT_EQ(Split("a \n b", SplitPattern::kLlama3), (Pieces{"a", " \n", " b"}));
}

TEST(RegexSplitTest, Qwen2PatternSplitsDigitsSingly) {
  EXPECT_EQ(Split("x 12345", SplitPattern::kQwen2), (Pieces{"x", " ", "1", "2", "3", "4", "5"}));
}

TEST(RegexSplitTest, InvalidUtf8BytesArePunctuationLike) {
  EXPECT_EQ(Split("ab\xFF\xFE cd", SplitPattern::kLlama3), (Pieces{"ab", "\xFF\xFE", " cd"}));
}

TEST(RegexSplitTest, RecognizesOnlyTheKnownPatterns) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    EXPECT_EQ(internal::RecognizeSplitPattern(internal::SplitPatternRegex(p)), p);
  }
  EXPECT_FALSE(internal::RecognizeSplitPattern("\\w+|\\s+").has_value());
}

// ---------------------------------------------------------------------------------------------------------------
// Unicode helpers (expected values from Python's unicodedata.normalize("NFC", ...)).

TEST(UnicodeTest, Nfc) {
  EXPECT_EQ(internal::NormalizeNfc("e\xCC\x81"), "\xC3\xA9");                         // e + U+0301 -> é
  EXPECT_EQ(internal::NormalizeNfc("\xE2\x84\xAB"), "\xC3\x85");                      // Angstrom sign -> Å
  EXPECT_EQ(internal::NormalizeNfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");  // reordering, then composing
  EXPECT_EQ(internal::NormalizeNfc("\xCD\x84"), "\xCC\x88\xCC\x81");                  // U+0344: composition exclusion
  EXPECT_EQ(internal::NormalizeNfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul L V T
  EXPECT_EQ(internal::NormalizeNfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");                // canonical order only
  EXPECT_EQ(internal::NormalizeNfc("\xCC\x81"
                                   "a"),
            "\xCC\x81"
            "a");                                                       // leading mark stays
  EXPECT_EQ(internal::NormalizeNfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");  // invalid byte kept, blocks
  EXPECT_EQ(internal::NormalizeNfc("plain ascii"), "plain ascii");
}

TEST(UnicodeTest, LossyDecodingReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(internal::ValidUtf8Lossy("a\xF0\x9F\x98"
                                     "b"),
            "a\xEF\xBF\xBD"
            "b");                                                               // truncated 4-byte sequence
  EXPECT_EQ(internal::ValidUtf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two bytes, two marks
  EXPECT_EQ(internal::ValidUtf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_TRUE(internal::IsValidUtf8("\xF0\x9F\xA6\x99"));
  EXPECT_FALSE(internal::IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(UnicodeTest, Categories) {
  EXPECT_TRUE(internal::IsLetter(U'a'));
  EXPECT_TRUE(internal::IsLetter(U'\u4E2D'));
  EXPECT_FALSE(internal::IsLetter(U'1'));
  EXPECT_TRUE(internal::IsNumber(U'\u216B'));  // Roman numeral twelve (Nl)
  EXPECT_TRUE(internal::IsNumber(U'\u00BD'));  // ½ (No)
  EXPECT_FALSE(internal::IsNumber(U'x'));
  EXPECT_TRUE(internal::IsWhitespace(U'\u3000'));
  EXPECT_FALSE(internal::IsWhitespace(U'\u200B'));  // zero width space is not White_Space
}

// ---------------------------------------------------------------------------------------------------------------
// Tiny tokenizer.json files written by the tests.

// Byte-level: the vocabulary-free tokenizer plus a few merges, with the Llama-3 Split before ByteLevel.
json TinyByteLevelJson() {
  json root = json::parse(ByteLevelTokenizerJson());
  json& vocab = root["model"]["vocab"];
  int32_t next_id = kByteLevelVocabSize;
  json merges = json::array();
  for (auto [left, right] : {std::pair{"t", "h"},
                             {"th", "e"},
                             {"\xC4\xA0", "c"},
                             {"\xC4\xA0"
                              "c",
                              "a"},
                             {"\xC4\xA0"
                              "ca",
                              "t"}}) {
    vocab[std::string(left) + right] = next_id++;
    merges.push_back(std::string(left) + " " + right);
  }
  root["model"]["merges"] = merges;
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", internal::SplitPatternRegex(SplitPattern::kLlama3)}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  return root;
}

// SentencePiece-style, as Llama-2's tokenizer.json is laid out.
json TinySentencePieceJson(bool byte_fallback = true) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int32_t id = 259;
  for (const char* token : {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi", "l", "o", "ll", "e"}) {
    vocab[token] = id++;
  }
  json added = json::array();
  for (auto [i, content] : {std::pair{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
    added.push_back({{"id", i},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", byte_fallback},
        {"vocab", vocab},
        {"merges", {"\xE2\x96\x81 h", "\xE2\x96\x81h i", "l l"}}}},
  };
}

Tokenizer Load(const json& root) {
  auto tokenizer = Tokenizer::FromJson(root.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return std::move(tokenizer).value();
}

std::vector<int32_t> Ids(const Tokenizer& tokenizer, std::string_view text, bool add_special_tokens = false) {
  auto ids = tokenizer.Encode(text, add_special_tokens);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Text(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special = false) {
  auto text = tokenizer.Decode(ids, skip_special);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : std::string();
}

TEST(ByteLevelTokenizerTest, MergesByRankWithinRegexPieces) {
  Tokenizer tokenizer = Load(TinyByteLevelJson());
  EXPECT_EQ(tokenizer.kind(), TokenizerKind::kByteLevel);
  // "the" -> t h e -> th e -> the;  " cat" -> Ġ c a t -> Ġc a t -> Ġca t -> Ġcat.
  EXPECT_EQ(Ids(tokenizer, "the cat"), (std::vector<int32_t>{260, 263}));
  EXPECT_EQ(Ids(tokenizer, "the cat", true), (std::vector<int32_t>{kByteLevelBosId, 260, 263}));
  // "thethe" is one piece: merges apply wherever ranks say, leftmost first among equal ranks.
  EXPECT_EQ(Ids(tokenizer, "thethe"), (std::vector<int32_t>{260, 260}));
  // "cat" without a space: no Ġ merges, so plain bytes.
  EXPECT_EQ(Ids(tokenizer, "cat"), (std::vector<int32_t>{'c', 'a', 't'}));
}

TEST(ByteLevelTokenizerTest, RoundTripsArbitraryText) {
  Tokenizer tokenizer = Load(TinyByteLevelJson());
  for (std::string text : {"the cat sat", "  spaces  \n\n\ttabs", "\xF0\x9F\xA6\x99 llama \xE4\xB8\xAD\xE6\x96\x87",
                           "x = f(1, 2) // 3;", ""}) {
    EXPECT_EQ(Text(tokenizer, Ids(tokenizer, text)), text);
  }
}

TEST(ByteLevelTokenizerTest, SpecialTokensAreSplitOutBeforeTheModel) {
  Tokenizer tokenizer = Load(TinyByteLevelJson());
  EXPECT_EQ(Ids(tokenizer, "<bos>the<eos> cat<pad>"),
            (std::vector<int32_t>{kByteLevelBosId, 260, kByteLevelEosId, 263, kByteLevelPadId}));
  EXPECT_EQ(Text(tokenizer, {kByteLevelBosId, 260, kByteLevelEosId}), "<bos>the<eos>");
  EXPECT_EQ(Text(tokenizer, {kByteLevelBosId, 260, kByteLevelEosId}, /*skip_special=*/true), "the");
}

TEST(ByteLevelTokenizerTest, InvalidIdIsAnError) {
  Tokenizer tokenizer = Load(TinyByteLevelJson());
  auto text = tokenizer.Decode(std::vector<int32_t>{1, 9999});
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "token id 9999 is not in the vocabulary (size 264)");
}

TEST(VocabularyFreeTokenizerTest, WritesAFileThatLoadsAndRoundTripsBytes) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("parsyn_tokenizer_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteByteLevelTokenizer(dir).ok());
  auto tokenizer = Tokenizer::FromFile(dir / "tokenizer.json");
  auto config = json::parse(std::ifstream(dir / "tokenizer_config.json"));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  EXPECT_EQ(config["eos_token"], "<eos>");
  EXPECT_EQ(tokenizer->vocab_size(), kByteLevelVocabSize);
  EXPECT_EQ(tokenizer->bos_id(), kByteLevelBosId);
  EXPECT_EQ(tokenizer->eos_id(), kByteLevelEosId);
  EXPECT_EQ(tokenizer->pad_id(), kByteLevelPadId);
  EXPECT_EQ(Ids(*tokenizer, "h\xC3\xA9!", true), (std::vector<int32_t>{kByteLevelBosId, 'h', 0xC3, 0xA9, '!'}));
  // Every byte is its own id, invalid UTF-8 included; decoding replaces what is not UTF-8.
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  std::vector<int32_t> ids = Ids(*tokenizer, all_bytes);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  EXPECT_EQ(Text(*tokenizer, {'o', 'k', 0xFF}), "ok\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer->IdToToken(' '), "\xC4\xA0");  // GPT-2's Ġ
  EXPECT_EQ(tokenizer->TokenToId("<eos>"), kByteLevelEosId);
}

TEST(SentencePieceTokenizerTest, PrependsMetaspaceAndMerges) {
  Tokenizer tokenizer = Load(TinySentencePieceJson());
  EXPECT_EQ(tokenizer.kind(), TokenizerKind::kSentencePiece);
  // "hi hello" -> "▁hi▁hello" -> ▁h i ▁h e l l o -> ▁hi ▁h e ll o
  EXPECT_EQ(Ids(tokenizer, "hi hello"), (std::vector<int32_t>{263, 262, 267, 266, 265}));
  EXPECT_EQ(Ids(tokenizer, "hi hello", true), (std::vector<int32_t>{1, 263, 262, 267, 266, 265}));
  EXPECT_EQ(Text(tokenizer, {1, 263, 262, 267, 266, 265}, true), "hi hello");
  EXPECT_EQ(Ids(tokenizer, ""), (std::vector<int32_t>{}));
}

TEST(SentencePieceTokenizerTest, ByteFallbackForUnknownCharacters) {
  Tokenizer tokenizer = Load(TinySentencePieceJson());
  // é = C3 A9, not in the vocabulary: <0xC3> <0xA9> (ids 3 + byte).
  EXPECT_EQ(Ids(tokenizer, "hi \xC3\xA9"), (std::vector<int32_t>{263, 259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(Text(tokenizer, {263, 259, 3 + 0xC3, 3 + 0xA9}), "hi \xC3\xA9");
  // A lone continuation byte decodes to U+FFFD, one per byte as Hugging Face's ByteFallback decoder does.
  EXPECT_EQ(Text(tokenizer, {263, 3 + 0xA9}), "hi\xEF\xBF\xBD");
}

TEST(SentencePieceTokenizerTest, UnknownWithoutByteFallbackUsesFusedUnk) {
  Tokenizer tokenizer = Load(TinySentencePieceJson(/*byte_fallback=*/false));
  EXPECT_EQ(Ids(tokenizer, "hi \xC3\xA9\xC3\xA9"), (std::vector<int32_t>{263, 259, 0}));
}

TEST(SentencePieceTokenizerTest, NoUnkAndNoByteFallbackIsAnError) {
  json root = TinySentencePieceJson(false);
  root["model"]["unk_token"] = nullptr;
  Tokenizer tokenizer = Load(root);
  auto ids = tokenizer.Encode("hi z");
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ids.status().message(),
            "cannot encode \"z\": it is not in the vocabulary and the tokenizer has neither "
            "byte fallback nor an unk token");
}

TEST(SentencePieceTokenizerTest, SpecialTokensSplitTheTextAndEachPieceIsNormalised) {
  Tokenizer tokenizer = Load(TinySentencePieceJson());
  EXPECT_EQ(Ids(tokenizer, "<s>hi</s>"), (std::vector<int32_t>{1, 263, 2}));
  EXPECT_EQ(Text(tokenizer, {1, 263, 2}), "<s> hi</s>");
  EXPECT_EQ(Text(tokenizer, {1, 263, 2}, true), "hi");
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_FALSE(tokenizer.pad_id().has_value());
}

TEST(SentencePieceTokenizerTest, MetaspacePreTokenizerGivesTheSameIds) {
  json root = TinySentencePieceJson();
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  root["decoder"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  Tokenizer tokenizer = Load(root);
  EXPECT_EQ(Ids(tokenizer, "hi hello"), (std::vector<int32_t>{263, 262, 267, 266, 265}));
  EXPECT_EQ(Text(tokenizer, {263, 262, 267, 266, 265}), "hi hello");
}

TEST(TokenizerLoadTest, UnsupportedConfigurationsAreNamed) {
  struct Case {
    std::function<void(json&)> edit;
    std::string message;
  };
  const Case cases[] = {
      {[](json& r) { r["model"]["type"] = "WordPiece"; },
       "tokenizer.json model: type \"WordPiece\" is not supported (only BPE; WordPiece, Unigram and WordLevel are "
       "not)"},
      {[](json& r) { r["model"]["type"] = "Unigram"; },
       "tokenizer.json model: type \"Unigram\" is not supported (only BPE; WordPiece, Unigram and WordLevel are "
       "not)"},
      {[](json& r) { r["model"]["dropout"] = 0.1; }, "tokenizer.json model: BPE \"dropout\" is not supported"},
      {[](json& r) {
         r["normalizer"] = {{"type", "NFKC"}};
       },
       "tokenizer.json normalizer: normalizer type \"NFKC\" is not supported (supported: Sequence, Prepend, "
       "Replace, NFC)"},
      {[](json& r) {
         r["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
       },
       "tokenizer.json pre_tokenizer: Split regex \"\\\\w+\" is not supported (supported: the GPT-2, Llama-3 and "
       "Qwen2 patterns)"},
      {[](json& r) {
         r["post_processor"] = {{"type", "BertProcessing"}};
       },
       "tokenizer.json post_processor: post_processor type \"BertProcessing\" is not supported (supported: "
       "TemplateProcessing, ByteLevel, Sequence)"},
      {[](json& r) {
         r["decoder"] = {{"type", "WordPiece"}};
       },
       "tokenizer.json decoder: decoder type \"WordPiece\" is not supported (supported: Sequence, Replace, "
       "ByteFallback, Fuse, Strip, ByteLevel, Metaspace)"},
      {[](json& r) { r["model"]["merges"] = {"h zz"}; },
       "tokenizer.json model.merges[0]: \"h zz\" uses a token that is not in the vocab"},
  };
  for (const Case& c : cases) {
    json root = TinySentencePieceJson();
    c.edit(root);
    auto tokenizer = Tokenizer::FromJson(root.dump());
    ASSERT_FALSE(tokenizer.ok()) << c.message;
    EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(tokenizer.status().message(), c.message);
  }
}

TEST(TokenizerLoadTest, BadFilesAndJson) {
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(), StatusCode::kNotFound);
  auto bad = Tokenizer::FromJson("{not json");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(bad.status().message().starts_with("tokenizer.json is not valid JSON")) << bad.status().message();
  EXPECT_EQ(Tokenizer::FromJson("[]").status().message(), "tokenizer.json: expected a JSON object");
  json missing_byte = TinyByteLevelJson();
  missing_byte["model"]["vocab"].erase("A");
  EXPECT_EQ(Tokenizer::FromJson(missing_byte.dump()).status().message(),
            "tokenizer.json: ByteLevel tokenizer's vocab lacks the token for byte 65 (\"A\")");
}

// Random text drawn from ASCII, Latin, combining marks, CJK, emoji and, when `stray_bytes`, bytes that are not UTF-8.
std::string RandomText(SplitMix64& rng, size_t length, bool stray_bytes) {
  static const char32_t kPool[] = {U'a',  U'Z',      U' ',      U' ',      U'\n',         U'\t',     U'1', U'!',
                                   U'\'', U'\u00e9', U'\u0301', U'\u4e2d', U'\U0001F999', U'\u00a0', U'<'};
  constexpr uint64_t kPoolSize = sizeof(kPool) / sizeof(kPool[0]);
  std::string text;
  for (size_t i = 0; i < length; ++i) {
    uint64_t pick = rng.Below(kPoolSize + (stray_bytes ? 1 : 0));
    if (pick == kPoolSize) {
      text.push_back(static_cast<char>(0x80 + rng.Below(0x80)));
    } else {
      internal::AppendUtf8(kPool[pick], text);
    }
  }
  return text;
}

TEST(TokenizerRoundTripTest, RandomTextDecodesBackToItself) {
  Tokenizer byte_level = Load(TinyByteLevelJson());
  Tokenizer sentence_piece = Load(TinySentencePieceJson());
  SplitMix64 rng(2024);
  for (int i = 0; i < 300; ++i) {
    // Byte-level: any bytes; decoding returns valid UTF-8, so stray bytes come back as U+FFFD (maximal subparts).
    std::string text = RandomText(rng, rng.Below(40), /*stray_bytes=*/true);
    EXPECT_EQ(Text(byte_level, Ids(byte_level, text)), internal::ValidUtf8Lossy(text)) << i;
    // SentencePiece-style: valid UTF-8 round-trips exactly (through byte fallback for most of these characters).
    // With stray bytes it would not: Hugging Face's ByteFallback decoder turns a whole run of byte tokens holding
    // an invalid sequence into one U+FFFD per byte.
    std::string valid = RandomText(rng, rng.Below(40), /*stray_bytes=*/false);
    EXPECT_EQ(Text(sentence_piece, Ids(sentence_piece, valid)), valid) << i;
  }
}

TEST(TokenizerRoundTripTest, MangledTokenizerFilesFailCleanly) {
  // Every field of the tiny files replaced by values of other types: loading must return a Status, never crash.
  const json replacements[] = {nullptr, 1, -5, "x", json::array(), json::object(), json::array({1, "a"}), true};
  for (const json& original : {TinySentencePieceJson(), TinyByteLevelJson()}) {
    std::vector<json::json_pointer> pointers;
    const json flat = original.flatten();
    int vocab_entries = 0;  // a few vocabulary entries stand for all of them
    for (auto it = flat.begin(); it != flat.end(); ++it) {
      if (it.key().starts_with("/model/vocab/") && ++vocab_entries > 3) continue;
      pointers.emplace_back(it.key());
    }
    for (const char* container : {"/model", "/model/vocab", "/model/merges", "/added_tokens", "/normalizer",
                                  "/pre_tokenizer", "/post_processor", "/decoder", "/post_processor/special_tokens"}) {
      pointers.emplace_back(container);
    }
    for (const auto& pointer : pointers) {
      for (const json& replacement : replacements) {
        json mangled = original;
        if (!mangled.contains(pointer)) continue;
        mangled[pointer] = replacement;
        auto tokenizer = Tokenizer::FromJson(mangled.dump());
        if (tokenizer.ok()) {
          auto ids = tokenizer->Encode("hi there \xC3\xA9 <s>");
          if (ids.ok()) {
            EXPECT_TRUE(tokenizer->Decode(*ids).ok()) << pointer.to_string();
          }
        } else {
          EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument) << pointer.to_string();
        }
      }
    }
  }
}

TEST(DatasetRandomInputTest, RandomBytesNeverCrashTheParsers) {
  SplitMix64 rng(7);
  const std::string alphabet =
      "{}[]\",:\\ \n\r\t0123456789.-+eEtextpromptcompletionlabel\xC3\xA9\xFF"
      "abc";
  for (int i = 0; i < 2000; ++i) {
    std::string input;
    size_t length = rng.Below(80);
    for (size_t k = 0; k < length; ++k) input.push_back(alphabet[rng.Below(alphabet.size())]);
    auto text = ParseText(input);
    if (!text.ok()) {
      EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << input;
    }
    auto table = ParseTabular("a,label\n" + input);
    if (!table.ok()) {
      EXPECT_EQ(table.status().code(), StatusCode::kInvalidArgument) << input;
    } else {
      EXPECT_EQ(table->features.size(), static_cast<size_t>(table->num_rows() * table->num_features()));
    }
  }
}

}  // namespace
}  // namespace parsyn::data
