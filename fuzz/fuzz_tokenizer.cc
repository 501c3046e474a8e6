// libFuzzer entry for tokenizer.json loading and for Encode/Decode of arbitrary input.
//
// The first byte picks the mode:
//   0: the rest is a tokenizer.json; loading must fail cleanly (a message) or give a tokenizer that encodes and
//      decodes a fixed sample text without crashing.
//   1: the rest is text for the vocabulary-free byte-level tokenizer: Decode(Encode(text)) must equal the text with
//      invalid UTF-8 replaced (ValidUtf8Lossy), as the header promises for byte-level models.
//   2: the rest is text for a small SentencePiece-style tokenizer (byte fallback): encode and decode must not crash.
//   3: the rest, read as little-endian int32 ids, is decoded by the byte-level tokenizer: an id outside the
//      vocabulary must be InvalidArgument, anything else must decode.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/unicode.h"

namespace {

using parsyn::data::Tokenizer;

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
  std::abort();
}

Tokenizer MustLoad(const std::string& json) {
  auto tokenizer = Tokenizer::FromJson(json);
  if (!tokenizer.ok()) Fail("a built-in tokenizer failed to load");
  return std::move(tokenizer).value();
}

// Llama-2's layout in miniature: Prepend/Replace normaliser, byte fallback, a few merges, <s> prepended.
std::string TinySentencePieceJson() {
  using nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int32_t id = 259;
  for (const char* token : {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi", "l", "ll"})
    vocab[token] = id++;
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
  json root = {
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
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", {"\xE2\x96\x81 h", "\xE2\x96\x81h i", "l l"}}}},
  };
  return root.dump();
}

void EncodeAndDecode(const Tokenizer& tokenizer, std::string_view text) {
  for (bool special : {false, true}) {
    auto ids = tokenizer.Encode(text, special);
    if (!ids.ok()) {
      if (ids.status().message().empty()) Fail("encode rejection without a message");
      continue;
    }
    for (int32_t id : *ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) Fail("encode produced an id outside the vocabulary");
    }
    auto text_again = tokenizer.Decode(*ids, special);
    if (!text_again.ok()) Fail("decoding ids that Encode produced failed");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const Tokenizer byte_level = MustLoad(parsyn::data::ByteLevelTokenizerJson());
  static const Tokenizer sentence_piece = MustLoad(TinySentencePieceJson());
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  switch (data[0] % 4) {
    case 0: {
      auto loaded = Tokenizer::FromJson(rest);
      if (!loaded.ok()) {
        if (loaded.status().message().empty()) Fail("load rejection without a message");
        return 0;
      }
      EncodeAndDecode(*loaded, "Hello, world! \xE4\xB8\xAD\xE6\x96\x87 <s> </s> 123 \xFF");
      return 0;
    }
    case 1: {
      auto ids = byte_level.Encode(rest, /*add_special_tokens=*/false);
      if (!ids.ok()) Fail("the byte-level tokenizer failed to encode");
      auto text = byte_level.Decode(*ids);
      if (!text.ok()) Fail("the byte-level tokenizer failed to decode its own ids");
      if (*text != parsyn::data::internal::ValidUtf8Lossy(rest)) Fail("byte-level round trip changed the text");
      EncodeAndDecode(byte_level, rest);
      return 0;
    }
    case 2: EncodeAndDecode(sentence_piece, rest); return 0;
    default: {
      std::vector<int32_t> ids(rest.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
      bool all_known = true;
      for (int32_t id : ids) all_known = all_known && id >= 0 && id < byte_level.vocab_size();
      for (bool skip : {false, true}) {
        auto text = byte_level.Decode(ids, skip);
        if (text.ok() != all_known) Fail("Decode's acceptance does not match the ids' range");
        if (!text.ok() && text.status().code() != parsyn::StatusCode::kInvalidArgument) Fail("not InvalidArgument");
      }
      return 0;
    }
  }
}
