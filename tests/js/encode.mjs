// Prints the token ids a JavaScript tokenizer (@lenml/tokenizers, a dependency-free fork of transformers.js) gives
// for a corpus, so the C++ tests can compare ours against it.
//
//   node encode.mjs TOKENIZER_JSON CORPUS_JSON [--add-special-tokens]
//
// CORPUS_JSON holds an array of strings. Output (stdout): {"ids": [[...], ...], "decoded": ["...", ...]}.
// The tokenizer is built from tokenizer.json alone, as the generic PreTrainedTokenizer (what tokenizer.json says,
// without any model-specific class behaviour layered on top), which is also what our C++ tokenizer implements.
import { readFileSync } from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";

const [tokenizerPath, corpusPath, ...flags] = process.argv.slice(2);
if (!tokenizerPath || !corpusPath) {
  console.error("usage: node encode.mjs TOKENIZER_JSON CORPUS_JSON [--add-special-tokens]");
  process.exit(2);
}
const addSpecialTokens = flags.includes("--add-special-tokens");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tokenizerPath, "utf8")),
  // clean_up_tokenization_spaces is a transformers decode option (" !" -> "!"), not part of tokenizer.json.
  tokenizerConfig: { tokenizer_class: "PreTrainedTokenizerFast", clean_up_tokenization_spaces: false },
});
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const ids = corpus.map((text) => tokenizer.encode(text, { add_special_tokens: addSpecialTokens }));
// decode() rejects an empty list, which the empty string encodes to.
const decoded = ids.map((row) => (row.length ? tokenizer.decode(row, { skip_special_tokens: false }) : ""));
process.stdout.write(JSON.stringify({ ids, decoded }));
