#include "data/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <variant>

#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "data/io.h"
#include "data/regex_split.h"
#include "data/unicode.h"

namespace parsyn::data {
namespace {

using json = nlohmann::json;
using internal::SplitPattern;

constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581 "▁"

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others are shifted to U+0100 and up, so
// every byte has a visible, non-space character.
const std::array<std::string, 256>& ByteToUnicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + shifted++);
      internal::AppendUtf8(cp, t[static_cast<size_t>(b)]);
    }
    return t;
  }();
  return table;
}

const std::unordered_map<char32_t, uint8_t>& UnicodeToByte() {
  static const std::unordered_map<char32_t, uint8_t> table = [] {
    std::unordered_map<char32_t, uint8_t> t;
    for (int b = 0; b < 256; ++b) {
      auto decoded = internal::DecodeUtf8(ByteToUnicode()[static_cast<size_t>(b)]);
      t.emplace(decoded[0].code_point, static_cast<uint8_t>(b));
    }
    return t;
  }();
  return table;
}

std::string ByteFallbackToken(uint8_t b) {
  static const char* kHex = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

// "<0xNN>" -> NN.
std::optional<uint8_t> ParseByteFallbackToken(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(token[3]), lo = hex(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

void ReplaceAll(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Pipeline steps, parsed from tokenizer.json.

struct NormalizePrepend {
  std::string prefix;
};
struct NormalizeReplace {
  std::string from;
  std::string to;
};
struct NormalizeNfc {};
using NormalizerStep = std::variant<NormalizePrepend, NormalizeReplace, NormalizeNfc>;

struct PreSplit {
  SplitPattern pattern;
};
struct PreByteLevel {
  bool add_prefix_space = false;
  bool use_regex = true;
};
struct PreMetaspace {
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};
using PreTokenizerStep = std::variant<PreSplit, PreByteLevel, PreMetaspace>;

struct DecodeReplace {
  std::string from;
  std::string to;
};
struct DecodeByteFallback {};
struct DecodeFuse {};
struct DecodeStrip {
  std::string content;
  int start = 0;
  int stop = 0;
};
struct DecodeByteLevel {};
struct DecodeMetaspace {
  std::string replacement;
  bool strip_leading_space = true;
};
using DecoderStep =
    std::variant<DecodeReplace, DecodeByteFallback, DecodeFuse, DecodeStrip, DecodeByteLevel, DecodeMetaspace>;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One item of the post-processor's single-sequence template: special token ids, or the input itself.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

// Ids index a table, so an id far beyond the number of tokens (a hostile or corrupt file) would allocate gigabytes;
// real vocabularies are dense, so allow only this much slack.
constexpr int64_t kMaxIdGap = 65536;

struct Merge {
  int32_t rank;
  int32_t new_id;
};

// Lets the vocabulary be searched with a string_view, without building a std::string per lookup.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocabulary = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// ---------------------------------------------------------------------------------------------------------------
// Reading the JSON: every shape error names its place.

// root[key], or null when absent, without copying (a tokenizer.json's model is megabytes).
const json& Field(const json& root, const char* key) {
  static const json kNull;
  auto it = root.find(key);
  return it == root.end() ? kNull : *it;
}

std::string Where(std::string_view path) { return "tokenizer.json " + std::string(path) + ": "; }

StatusOr<std::string> GetString(const json& object, const char* key, std::string_view path) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return InvalidArgumentError(Where(path) + "\"" + key + "\" must be a string");
  }
  return it->get<std::string>();
}

bool GetBool(const json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

std::string TypeOf(const json& object) {
  auto it = object.find("type");
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string("(no type)");
}

// The "pattern" of Replace/Split: {"String": s} or {"Regex": r}.
StatusOr<std::string> GetStringPattern(const json& step, std::string_view path) {
  auto it = step.find("pattern");
  if (it == step.end() || !it->is_object()) return InvalidArgumentError(Where(path) + "missing \"pattern\"");
  if (it->contains("String") && (*it)["String"].is_string()) return (*it)["String"].get<std::string>();
  if (it->contains("Regex")) {
    return InvalidArgumentError(Where(path) + "Regex patterns are not supported here (only String patterns)");
  }
  return InvalidArgumentError(Where(path) + "\"pattern\" must hold \"String\"");
}

Status ParseNormalizer(const json& node, std::string_view path, std::vector<NormalizerStep>& steps) {
  if (node.is_null()) return Status::Ok();
  std::string type = TypeOf(node);
  if (type == "Sequence") {
    auto list = node.find("normalizers");
    if (list == node.end() || !list->is_array()) return InvalidArgumentError(Where(path) + "missing \"normalizers\"");
    for (size_t i = 0; i < list->size(); ++i) {
      PARSYN_RETURN_IF_ERROR(ParseNormalizer((*list)[i], std::string(path) + "[" + std::to_string(i) + "]", steps));
    }
    return Status::Ok();
  }
  if (type == "Prepend") {
    PARSYN_ASSIGN_OR_RETURN(std::string prefix, GetString(node, "prepend", path));
    steps.push_back(NormalizePrepend{prefix});
    return Status::Ok();
  }
  if (type == "Replace") {
    PARSYN_ASSIGN_OR_RETURN(std::string from, GetStringPattern(node, path));
    PARSYN_ASSIGN_OR_RETURN(std::string to, GetString(node, "content", path));
    steps.push_back(NormalizeReplace{from, to});
    return Status::Ok();
  }
  if (type == "NFC") {
    steps.push_back(NormalizeNfc{});
    return Status::Ok();
  }
  return InvalidArgumentError(Where(path) + "normalizer type \"" + type +
                              "\" is not supported (supported: Sequence, Prepend, Replace, NFC)");
}

Status ParsePreTokenizer(const json& node, std::string_view path, std::vector<PreTokenizerStep>& steps) {
  if (node.is_null()) return Status::Ok();
  std::string type = TypeOf(node);
  if (type == "Sequence") {
    auto list = node.find("pretokenizers");
    if (list == node.end() || !list->is_array()) {
      return InvalidArgumentError(Where(path) + "missing \"pretokenizers\"");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      PARSYN_RETURN_IF_ERROR(ParsePreTokenizer((*list)[i], std::string(path) + "[" + std::to_string(i) + "]", steps));
    }
    return Status::Ok();
  }
  if (type == "Split") {
    auto pattern = node.find("pattern");
    if (pattern == node.end() || !pattern->is_object() || !pattern->contains("Regex") ||
        !(*pattern)["Regex"].is_string()) {
      return InvalidArgumentError(Where(path) + "Split needs a \"Regex\" pattern");
    }
    std::string regex = (*pattern)["Regex"].get<std::string>();
    std::optional<SplitPattern> known = internal::RecognizeSplitPattern(regex);
    if (!known) {
      return InvalidArgumentError(Where(path) + "Split regex " + json(regex).dump() +
                                  " is not supported (supported: the GPT-2, Llama-3 and Qwen2 patterns)");
    }
    std::string behavior = node.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated" || GetBool(node, "invert", false)) {
      return InvalidArgumentError(Where(path) + "Split behavior \"" + behavior +
                                  "\" (or invert) is not supported (supported: Isolated)");
    }
    steps.push_back(PreSplit{*known});
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    steps.push_back(PreByteLevel{GetBool(node, "add_prefix_space", true), GetBool(node, "use_regex", true)});
    return Status::Ok();
  }
  if (type == "Metaspace") {
    PreMetaspace step;
    PARSYN_ASSIGN_OR_RETURN(step.replacement, GetString(node, "replacement", path));
    std::string scheme = node.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = GetBool(node, "add_prefix_space", true) ? "always" : "never";
    if (scheme == "always")
      step.prepend = PreMetaspace::Prepend::kAlways;
    else if (scheme == "first")
      step.prepend = PreMetaspace::Prepend::kFirst;
    else if (scheme == "never")
      step.prepend = PreMetaspace::Prepend::kNever;
    else
      return InvalidArgumentError(Where(path) + "Metaspace prepend_scheme \"" + scheme + "\" is not supported");
    step.split = GetBool(node, "split", true);
    steps.push_back(step);
    return Status::Ok();
  }
  return InvalidArgumentError(Where(path) + "pre_tokenizer type \"" + type +
                              "\" is not supported (supported: Sequence, Split, ByteLevel, Metaspace)");
}

Status ParseDecoder(const json& node, std::string_view path, std::vector<DecoderStep>& steps) {
  if (node.is_null()) return Status::Ok();
  std::string type = TypeOf(node);
  if (type == "Sequence") {
    auto list = node.find("decoders");
    if (list == node.end() || !list->is_array()) return InvalidArgumentError(Where(path) + "missing \"decoders\"");
    for (size_t i = 0; i < list->size(); ++i) {
      PARSYN_RETURN_IF_ERROR(ParseDecoder((*list)[i], std::string(path) + "[" + std::to_string(i) + "]", steps));
    }
    return Status::Ok();
  }
  if (type == "Replace") {
    PARSYN_ASSIGN_OR_RETURN(std::string from, GetStringPattern(node, path));
    PARSYN_ASSIGN_OR_RETURN(std::string to, GetString(node, "content", path));
    steps.push_back(DecodeReplace{from, to});
  } else if (type == "ByteFallback") {
    steps.push_back(DecodeByteFallback{});
  } else if (type == "Fuse") {
    steps.push_back(DecodeFuse{});
  } else if (type == "Strip") {
    PARSYN_ASSIGN_OR_RETURN(std::string content, GetString(node, "content", path));
    steps.push_back(DecodeStrip{content, node.value("start", 0), node.value("stop", 0)});
  } else if (type == "ByteLevel") {
    steps.push_back(DecodeByteLevel{});
  } else if (type == "Metaspace") {
    DecodeMetaspace step;
    PARSYN_ASSIGN_OR_RETURN(step.replacement, GetString(node, "replacement", path));
    std::string scheme = node.value("prepend_scheme", std::string());
    step.strip_leading_space = scheme.empty() ? GetBool(node, "add_prefix_space", true) : scheme != "never";
    steps.push_back(step);
  } else {
    return InvalidArgumentError(Where(path) + "decoder type \"" + type +
                                "\" is not supported (supported: Sequence, Replace, ByteFallback, Fuse, Strip, "
                                "ByteLevel, Metaspace)");
  }
  return Status::Ok();
}

// The two tokens of model.merges[rank]: "left right" (older files) or ["left", "right"].
StatusOr<std::pair<std::string, std::string>> MergePair(const json& entry, size_t rank) {
  std::string left, right;
  if (entry.is_string()) {
    // Older files: "left right". Tokens hold no plain spaces (they are Ġ or ▁), so one space separates them.
    std::string s = entry.get<std::string>();
    size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return InvalidArgumentError("tokenizer.json model.merges[" + std::to_string(rank) + "]: " + json(s).dump() +
                                  " is not two tokens separated by one space");
    }
    left = s.substr(0, space);
    right = s.substr(space + 1);
  } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    left = entry[0].get<std::string>();
    right = entry[1].get<std::string>();
  } else {
    return InvalidArgumentError("tokenizer.json model.merges[" + std::to_string(rank) +
                                "]: expected \"a b\" or [\"a\", \"b\"]");
  }
  return std::pair{std::move(left), std::move(right)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  TokenizerKind kind = TokenizerKind::kSentencePiece;
  Vocabulary vocab;                      // model vocabulary
  std::vector<std::string> id_to_token;  // model and added tokens; "" for unused ids
  std::unordered_map<uint64_t, Merge> merges;
  std::optional<int32_t> unk_id;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_token_ids{};  // "<0xNN>" ids when byte_fallback and all 256 exist, else -1
  bool has_byte_tokens = false;

  std::vector<AddedToken> added;                             // longest content first, for leftmost-longest matching
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // indices into `added`, longest first
  std::unordered_map<int32_t, bool> added_is_special;
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;
  std::vector<TemplateItem> single_template;  // empty: add_special_tokens adds nothing

  std::optional<int32_t> bos, eos, pad;

  Status ParseModel(const json& model);
  // The model's "vocab" (token -> id) into vocab and id_to_token.
  Status ParseVocab(const json& model);
  // The model's "merges", ranked by their order, into merges (the vocab parsed first).
  Status ParseMerges(const json& model);
  Status ParseAddedTokens(const json& list);
  Status ParsePostProcessor(const json& node, std::string_view path);
  void GuessSpecialTokens();

  // Splits `text` into runs of plain text (id -1) and added tokens (their id).
  std::vector<std::pair<std::string_view, int32_t>> SplitOnAddedTokens(std::string_view text) const;
  std::string Normalize(std::string_view text) const;
  std::vector<std::string> PreTokenize(std::string text, bool first_segment) const;
  Status EncodePiece(std::string_view piece, std::vector<int32_t>& out) const;
};

Status Tokenizer::Impl::ParseModel(const json& model) {
  if (!model.is_object()) return InvalidArgumentError("tokenizer.json: missing \"model\"");
  std::string type = TypeOf(model);
  if (type != "BPE") {
    return InvalidArgumentError("tokenizer.json model: type \"" + type +
                                "\" is not supported (only BPE; WordPiece, Unigram and WordLevel are not)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return InvalidArgumentError("tokenizer.json model: BPE \"dropout\" is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return InvalidArgumentError(std::string("tokenizer.json model: BPE \"") + key + "\" is not supported");
    }
  }
  byte_fallback = GetBool(model, "byte_fallback", false);
  fuse_unk = GetBool(model, "fuse_unk", false);
  ignore_merges = GetBool(model, "ignore_merges", false);

  PARSYN_RETURN_IF_ERROR(ParseVocab(model));

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    std::string unk = model["unk_token"].get<std::string>();
    auto it = vocab.find(unk);
    if (it == vocab.end()) return InvalidArgumentError("tokenizer.json model: unk_token \"" + unk + "\" not in vocab");
    unk_id = it->second;
  }

  byte_token_ids.fill(-1);
  if (byte_fallback) {
    has_byte_tokens = true;
    for (int b = 0; b < 256; ++b) {
      auto it = vocab.find(ByteFallbackToken(static_cast<uint8_t>(b)));
      if (it == vocab.end()) {
        has_byte_tokens = false;
        break;
      }
      byte_token_ids[static_cast<size_t>(b)] = it->second;
    }
  }

  return ParseMerges(model);
}

Status Tokenizer::Impl::ParseVocab(const json& model) {
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return InvalidArgumentError("tokenizer.json model: \"vocab\" must be an object of token -> id");
  }
  int32_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return InvalidArgumentError("tokenizer.json model.vocab: id of " + json(it.key()).dump() +
                                  " must be a non-negative integer");
    }
    if (it->get<int64_t>() >= static_cast<int64_t>(vocab_it->size()) + kMaxIdGap) {
      return InvalidArgumentError("tokenizer.json model.vocab: id " + std::to_string(it->get<int64_t>()) + " of " +
                                  json(it.key()).dump() + " is far beyond the vocabulary's " +
                                  std::to_string(vocab_it->size()) + " tokens");
    }
    int32_t id = it->get<int32_t>();
    vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab) id_to_token[static_cast<size_t>(id)] = token;
  return Status::Ok();
}

Status Tokenizer::Impl::ParseMerges(const json& model) {
  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return InvalidArgumentError("tokenizer.json model: \"merges\" must be an array");
  }
  merges.reserve(merges_it->size());
  for (size_t rank = 0; rank < merges_it->size(); ++rank) {
    const json& entry = (*merges_it)[rank];
    PARSYN_ASSIGN_OR_RETURN(const auto pair, MergePair(entry, rank));
    const auto& [left, right] = pair;
    auto a = vocab.find(left), b = vocab.find(right), ab = vocab.find(left + right);
    if (a == vocab.end() || b == vocab.end() || ab == vocab.end()) {
      return InvalidArgumentError("tokenizer.json model.merges[" + std::to_string(rank) +
                                  "]: " + json(left + " " + right).dump() + " uses a token that is not in the vocab");
    }
    // The first listing of a pair wins, as in Hugging Face tokenizers.
    merges.emplace(PairKey(a->second, b->second), Merge{static_cast<int32_t>(rank), ab->second});
  }
  return Status::Ok();
}

Status Tokenizer::Impl::ParseAddedTokens(const json& list) {
  if (list.is_null()) return Status::Ok();
  if (!list.is_array()) return InvalidArgumentError("tokenizer.json: \"added_tokens\" must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& entry = list[i];
    std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
        entry["id"].get<int64_t>() < 0) {
      return InvalidArgumentError(Where(path) + "needs a non-negative integer \"id\"");
    }
    if (entry["id"].get<int64_t>() >= static_cast<int64_t>(id_to_token.size() + list.size()) + kMaxIdGap) {
      return InvalidArgumentError(Where(path) + "id " + std::to_string(entry["id"].get<int64_t>()) +
                                  " is far beyond the vocabulary's " + std::to_string(id_to_token.size()) + " ids");
    }
    AddedToken token;
    token.id = entry["id"].get<int32_t>();
    PARSYN_ASSIGN_OR_RETURN(token.content, GetString(entry, "content", path));
    if (token.content.empty()) return InvalidArgumentError(Where(path) + "\"content\" is empty");
    token.special = GetBool(entry, "special", false);
    token.lstrip = GetBool(entry, "lstrip", false);
    token.rstrip = GetBool(entry, "rstrip", false);
    token.single_word = GetBool(entry, "single_word", false);
    if (static_cast<size_t>(token.id) >= id_to_token.size()) id_to_token.resize(static_cast<size_t>(token.id) + 1);
    id_to_token[static_cast<size_t>(token.id)] = token.content;
    added_is_special[token.id] = token.special;
    added.push_back(std::move(token));
  }
  // Longest first, so that at one position the longest added token matches (leftmost-longest, as HF does).
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < added.size(); ++i) {
    added_by_first_byte[static_cast<unsigned char>(added[i].content[0])].push_back(i);
  }
  return Status::Ok();
}

Status Tokenizer::Impl::ParsePostProcessor(const json& node, std::string_view path) {
  if (node.is_null()) return Status::Ok();
  std::string type = TypeOf(node);
  if (type == "Sequence") {
    auto list = node.find("processors");
    if (list == node.end() || !list->is_array()) return InvalidArgumentError(Where(path) + "missing \"processors\"");
    for (size_t i = 0; i < list->size(); ++i) {
      PARSYN_RETURN_IF_ERROR(ParsePostProcessor((*list)[i], std::string(path) + "[" + std::to_string(i) + "]"));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // it adjusts offsets only; ids are unchanged
  if (type != "TemplateProcessing") {
    return InvalidArgumentError(Where(path) + "post_processor type \"" + type +
                                "\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
  }
  auto single = node.find("single");
  auto specials = node.find("special_tokens");
  if (single == node.end() || !single->is_array()) return InvalidArgumentError(Where(path) + "missing \"single\"");
  single_template.clear();
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    std::string item_path = std::string(path) + ".single[" + std::to_string(i) + "]";
    if (item.contains("Sequence")) {
      single_template.push_back(TemplateItem{true, {}});
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
      return InvalidArgumentError(Where(item_path) + "expected \"Sequence\" or \"SpecialToken\"");
    }
    PARSYN_ASSIGN_OR_RETURN(std::string name, GetString(item["SpecialToken"], "id", item_path + ".SpecialToken"));
    if (specials == node.end() || !specials->is_object() || !specials->contains(name)) {
      return InvalidArgumentError(Where(item_path) + "special token " + json(name).dump() +
                                  " is not listed in \"special_tokens\"");
    }
    const json& special_token = (*specials)[name];
    static const json kMissing;
    const json& ids = special_token.is_object() && special_token.contains("ids") ? special_token["ids"] : kMissing;
    if (!ids.is_array() || ids.empty()) {
      return InvalidArgumentError(Where(path) + ".special_tokens." + name + ": \"ids\" must be a non-empty array");
    }
    TemplateItem special;
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(id_to_token.size())) {
        return InvalidArgumentError(Where(path) + ".special_tokens." + name + ": id " + id.dump() +
                                    " is not a token id");
      }
      special.ids.push_back(id.get<int32_t>());
    }
    single_template.push_back(std::move(special));
  }
  return Status::Ok();
}

void Tokenizer::Impl::GuessSpecialTokens() {
  auto sequence = std::find_if(single_template.begin(), single_template.end(),
                               [](const TemplateItem& item) { return item.is_sequence; });
  if (!single_template.empty() && !single_template.front().is_sequence) bos = single_template.front().ids.front();
  if (sequence != single_template.end() && sequence + 1 != single_template.end()) eos = (sequence + 1)->ids.front();
  auto find_added = [&](std::initializer_list<std::string_view> names) -> std::optional<int32_t> {
    for (std::string_view name : names) {
      for (const AddedToken& token : added) {
        if (token.content == name) return token.id;
      }
    }
    return std::nullopt;
  };
  if (!eos) eos = find_added({"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"});
  pad = find_added({"<pad>", "<|pad|>", "[PAD]"});
}

std::vector<std::pair<std::string_view, int32_t>> Tokenizer::Impl::SplitOnAddedTokens(std::string_view text) const {
  std::vector<std::pair<std::string_view, int32_t>> parts;
  auto is_word_char = [](unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; };
  size_t plain_begin = 0;
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t index : added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& token = added[index];
      if (text.compare(i, token.content.size(), token.content) != 0) continue;
      if (token.single_word) {
        size_t end = i + token.content.size();
        bool word_before = i > 0 && is_word_char(static_cast<unsigned char>(text[i - 1]));
        bool word_after = end < text.size() && is_word_char(static_cast<unsigned char>(text[end]));
        if (word_before || word_after) continue;
      }
      match = &token;
      break;
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i;
    size_t end = i + match->content.size();
    // lstrip/rstrip: the token swallows the whitespace beside it.
    if (match->lstrip) {
      while (begin > plain_begin && std::isspace(static_cast<unsigned char>(text[begin - 1]))) --begin;
    }
    if (match->rstrip) {
      while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    }
    if (begin > plain_begin) parts.emplace_back(text.substr(plain_begin, begin - plain_begin), -1);
    parts.emplace_back(text.substr(begin, end - begin), match->id);
    i = end;
    plain_begin = end;
  }
  if (plain_begin < text.size()) parts.emplace_back(text.substr(plain_begin), -1);
  return parts;
}

std::string Tokenizer::Impl::Normalize(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : normalizer) {
    if (const auto* prepend = std::get_if<NormalizePrepend>(&step)) {
      if (!s.empty()) s.insert(0, prepend->prefix);  // HF prepends to non-empty text only
    } else if (const auto* replace = std::get_if<NormalizeReplace>(&step)) {
      ReplaceAll(s, replace->from, replace->to);
    } else {
      s = internal::NormalizeNfc(s);
    }
  }
  return s;
}

std::vector<std::string> Tokenizer::Impl::PreTokenize(std::string text, bool first_segment) const {
  std::vector<std::string> pieces;
  pieces.push_back(std::move(text));
  for (const PreTokenizerStep& step : pre_tokenizer) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (const auto* split = std::get_if<PreSplit>(&step)) {
        for (std::string_view part : internal::SplitWithPattern(piece, split->pattern)) next.emplace_back(part);
      } else if (const auto* byte_level = std::get_if<PreByteLevel>(&step)) {
        if (byte_level->add_prefix_space && !piece.starts_with(' ')) piece.insert(0, " ");
        std::vector<std::string> parts;
        if (byte_level->use_regex) {
          for (std::string_view part : internal::SplitWithPattern(piece, SplitPattern::kGpt2)) parts.emplace_back(part);
        } else {
          parts.push_back(piece);
        }
        for (const std::string& part : parts) {
          std::string mapped;
          for (unsigned char b : part) mapped += ByteToUnicode()[b];
          next.push_back(std::move(mapped));
        }
      } else {
        const auto& meta = std::get<PreMetaspace>(step);
        ReplaceAll(piece, " ", meta.replacement);
        bool prepend = meta.prepend == PreMetaspace::Prepend::kAlways ||
                       (meta.prepend == PreMetaspace::Prepend::kFirst && first_segment);
        if (prepend && !piece.starts_with(meta.replacement)) piece.insert(0, meta.replacement);
        if (!meta.split) {
          next.push_back(std::move(piece));
          continue;
        }
        // Split so each replacement character starts a new piece (HF's MergedWithNext).
        size_t begin = 0;
        for (size_t pos = piece.find(meta.replacement, 1); pos != std::string::npos;
             pos = piece.find(meta.replacement, pos + meta.replacement.size())) {
          next.push_back(piece.substr(begin, pos - begin));
          begin = pos;
        }
        next.push_back(piece.substr(begin));
      }
    }
    pieces.clear();
    for (std::string& p : next) {
      if (!p.empty()) pieces.push_back(std::move(p));
    }
  }
  return pieces;
}

Status Tokenizer::Impl::EncodePiece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto whole = vocab.find(piece);
    if (whole != vocab.end()) {
      out.push_back(whole->second);
      return Status::Ok();
    }
  }
  // Initial symbols: one per character (or per byte, through byte fallback).
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  bool last_is_unk = false;
  for (const internal::DecodedChar& ch : internal::DecodeUtf8(piece)) {
    std::string_view bytes = piece.substr(ch.offset, ch.length);
    auto it = ch.code_point == internal::kInvalidCodePoint ? vocab.end() : vocab.find(bytes);
    if (it != vocab.end()) {
      symbols.push_back({it->second, 0, 0, true});
      last_is_unk = false;
    } else if (has_byte_tokens) {
      for (unsigned char b : bytes) symbols.push_back({byte_token_ids[b], 0, 0, true});
      last_is_unk = false;
    } else if (unk_id) {
      if (!(fuse_unk && last_is_unk)) symbols.push_back({*unk_id, 0, 0, true});
      last_is_unk = true;
    } else {
      return InvalidArgumentError("cannot encode " +
                                  json(std::string(bytes)).dump(-1, ' ', false, json::error_handler_t::replace) +
                                  ": it is not in the vocabulary and the tokenizer has neither byte fallback nor an "
                                  "unk token");
    }
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    symbols[static_cast<size_t>(i)].prev = i - 1;
    symbols[static_cast<size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }
  // Merge the lowest-ranked adjacent pair first, the leftmost among equals, as Hugging Face's BPE does; stale queue
  // entries (a side already merged away) are skipped when popped.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int left) {
    if (left < 0) return;
    int right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    auto m = merges.find(PairKey(symbols[static_cast<size_t>(left)].id, symbols[static_cast<size_t>(right)].id));
    if (m != merges.end()) queue.push({m->second.rank, left, m->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    auto m = merges.find(PairKey(left.id, right.id));
    if (m == merges.end() || m->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

StatusOr<Tokenizer> Tokenizer::FromFile(const std::filesystem::path& path) {
  PARSYN_RETURN_IF_ERROR(internal::CheckReadable(path));
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return UnavailableError("reading " + path.string() + " failed");
  StatusOr<Tokenizer> tokenizer = FromJson(contents.str());
  if (!tokenizer.ok()) return tokenizer.status().WithContext(path.string());
  return tokenizer;
}

StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json) {
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return InvalidArgumentError("tokenizer.json is not valid JSON: " + internal::ValidUtf8Lossy(e.what()));
  }
  if (!root.is_object()) return InvalidArgumentError("tokenizer.json: expected a JSON object");
  auto impl = std::make_unique<Impl>();
  try {
    PARSYN_RETURN_IF_ERROR(impl->ParseModel(Field(root, "model")));
    PARSYN_RETURN_IF_ERROR(impl->ParseAddedTokens(Field(root, "added_tokens")));
    PARSYN_RETURN_IF_ERROR(ParseNormalizer(Field(root, "normalizer"), "normalizer", impl->normalizer));
    PARSYN_RETURN_IF_ERROR(ParsePreTokenizer(Field(root, "pre_tokenizer"), "pre_tokenizer", impl->pre_tokenizer));
    PARSYN_RETURN_IF_ERROR(ParseDecoder(Field(root, "decoder"), "decoder", impl->decoder));
    PARSYN_RETURN_IF_ERROR(impl->ParsePostProcessor(Field(root, "post_processor"), "post_processor"));
  } catch (const json::exception& e) {
    // value()/get() on a field of an unexpected type.
    return InvalidArgumentError(std::string("tokenizer.json has a field of the wrong type: ") + e.what());
  }
  bool byte_level = std::any_of(impl->pre_tokenizer.begin(), impl->pre_tokenizer.end(),
                                [](const PreTokenizerStep& s) { return std::holds_alternative<PreByteLevel>(s); });
  impl->kind = byte_level ? TokenizerKind::kByteLevel : TokenizerKind::kSentencePiece;
  if (byte_level) {
    // Byte-level BPE must be able to spell every byte: all 256 byte characters in the vocabulary.
    for (int b = 0; b < 256; ++b) {
      if (!impl->vocab.contains(ByteToUnicode()[static_cast<size_t>(b)])) {
        return InvalidArgumentError("tokenizer.json: ByteLevel tokenizer's vocab lacks the token for byte " +
                                    std::to_string(b) + " (" + json(ByteToUnicode()[static_cast<size_t>(b)]).dump() +
                                    ")");
      }
    }
  }
  impl->GuessSpecialTokens();
  return Tokenizer(std::move(impl));
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  bool first_segment = true;
  for (const auto& [part, added_id] : impl_->SplitOnAddedTokens(text)) {
    if (added_id >= 0) {
      ids.push_back(added_id);
    } else {
      for (const std::string& piece : impl_->PreTokenize(impl_->Normalize(part), first_segment)) {
        PARSYN_RETURN_IF_ERROR(impl_->EncodePiece(piece, ids));
      }
    }
    first_segment = false;
  }
  if (!add_special_tokens || impl_->single_template.empty()) return ids;
  std::vector<int32_t> with_specials;
  for (const TemplateItem& item : impl_->single_template) {
    if (item.is_sequence) {
      with_specials.insert(with_specials.end(), ids.begin(), ids.end());
    } else {
      with_specials.insert(with_specials.end(), item.ids.begin(), item.ids.end());
    }
  }
  return with_specials;
}

StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() ||
        impl_->id_to_token[static_cast<size_t>(id)].empty()) {
      return InvalidArgumentError("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                                  std::to_string(impl_->id_to_token.size()) + ")");
    }
    auto added = impl_->added_is_special.find(id);
    if (skip_special_tokens && added != impl_->added_is_special.end() && added->second) continue;
    tokens.push_back(impl_->id_to_token[static_cast<size_t>(id)]);
  }
  // Decoders transform the list of token strings, each step over the output of the one before (HF decode_chain).
  for (const DecoderStep& step : impl_->decoder) {
    if (const auto* replace = std::get_if<DecodeReplace>(&step)) {
      for (std::string& t : tokens) ReplaceAll(t, replace->from, replace->to);
    } else if (std::holds_alternative<DecodeByteFallback>(step)) {
      std::vector<std::string> next;
      std::string bytes;
      size_t num_bytes = 0;
      auto flush = [&] {
        if (num_bytes == 0) return;
        if (internal::IsValidUtf8(bytes)) {
          next.push_back(bytes);
        } else {
          for (size_t k = 0; k < num_bytes; ++k) next.push_back("\xEF\xBF\xBD");  // one U+FFFD per byte, as HF
        }
        bytes.clear();
        num_bytes = 0;
      };
      for (std::string& t : tokens) {
        if (auto b = ParseByteFallbackToken(t)) {
          bytes.push_back(static_cast<char>(*b));
          ++num_bytes;
        } else {
          flush();
          next.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(next);
    } else if (std::holds_alternative<DecodeFuse>(step)) {
      std::string fused;
      for (const std::string& t : tokens) fused += t;
      tokens = {fused};
    } else if (const auto* strip = std::get_if<DecodeStrip>(&step)) {
      for (std::string& t : tokens) {
        for (int k = 0; k < strip->start && t.starts_with(strip->content); ++k) t.erase(0, strip->content.size());
        for (int k = 0; k < strip->stop && t.ends_with(strip->content); ++k) t.resize(t.size() - strip->content.size());
      }
    } else if (std::holds_alternative<DecodeByteLevel>(step)) {
      std::string bytes;
      for (const std::string& t : tokens) {
        for (const internal::DecodedChar& ch : internal::DecodeUtf8(t)) {
          auto it = UnicodeToByte().find(ch.code_point);
          if (it != UnicodeToByte().end()) {
            bytes.push_back(static_cast<char>(it->second));
          } else {
            bytes.append(t, ch.offset, ch.length);  // not a byte character (an added token's text): kept as is
          }
        }
      }
      tokens = {internal::ValidUtf8Lossy(bytes)};
    } else {
      const auto& meta = std::get<DecodeMetaspace>(step);
      for (size_t k = 0; k < tokens.size(); ++k) {
        ReplaceAll(tokens[k], meta.replacement, " ");
        if (k == 0 && meta.strip_leading_space && tokens[k].starts_with(' ')) tokens[k].erase(0, 1);
      }
    }
  }
  std::string text;
  for (const std::string& t : tokens) text += t;
  return internal::ValidUtf8Lossy(text);
}

TokenizerKind Tokenizer::kind() const { return impl_->kind; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& added : impl_->added) {
    if (added.content == token) return added.id;
  }
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return std::string();
  return impl_->id_to_token[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }

// ---------------------------------------------------------------------------------------------------------------

std::string ByteLevelTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteToUnicode()[static_cast<size_t>(b)]] = b;
  json added = json::array();
  for (auto [id, content] : {std::pair{kByteLevelPadId, "<pad>"}, std::pair{kByteLevelBosId, "<bos>"},
                             std::pair{kByteLevelEosId, "<eos>"}}) {
    vocab[content] = id;
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  json bos_item = {{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}};
  json post = {
      {"type", "TemplateProcessing"},
      {"single", {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {bos_item, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {kByteLevelBosId}}, {"tokens", {"<bos>"}}}}}},
  };
  json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", post},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}},
  };
  return root.dump(2, ' ', false);
}

std::string ByteLevelTokenizerConfigJson() {
  json config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"bos_token", "<bos>"},
      {"eos_token", "<eos>"},
      {"pad_token", "<pad>"},
      {"add_bos_token", true},
      {"add_eos_token", false},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 1000000},
  };
  return config.dump(2);
}

Status WriteByteLevelTokenizer(const std::filesystem::path& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return NotFoundError("model folder " + model_dir.string() + " does not exist");
  }
  PARSYN_RETURN_IF_ERROR(WriteFileAtomically(model_dir / "tokenizer.json", ByteLevelTokenizerJson() + "\n"));
  return WriteFileAtomically(model_dir / "tokenizer_config.json", ByteLevelTokenizerConfigJson() + "\n");
}

}  // namespace parsyn::data
