// Prints the token ids a JavaScript tokenizer (@lenml/tokenizers, a dependency-free fork of transformers.js'
// tokenizers) gives for a corpus, so the C++ tests can compare ours against it.
//
//   node encode.mjs TOKENIZER_JSON CORPUS_JSON
//
// CORPUS_JSON holds an array of strings. Output (stdout), one entry per string:
//   {"ids": [[...]], "decoded": ["..."],                                   without special tokens
//    "ids_with_special_tokens": [[...]], "decoded_with_special_tokens": ["..."]}   with the post-processor's
// The tokenizer is built from tokenizer.json alone, as the generic PreTrainedTokenizer (what tokenizer.json says,
// without model-specific class behaviour layered on top), which is what our C++ tokenizer implements.
import { readFileSync } from "node:fs";
import { TokenizerLoader } from "@lenml/tokenizers";

const [tokenizerPath, corpusPath] = process.argv.slice(2);
if (!tokenizerPath || !corpusPath) {
  console.error("usage: node encode.mjs TOKENIZER_JSON CORPUS_JSON");
  process.exit(2);
}
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(tokenizerPath, "utf8")),
  // clean_up_tokenization_spaces is a transformers decode option (" !" -> "!"), not part of tokenizer.json.
  tokenizerConfig: { tokenizer_class: "PreTrainedTokenizerFast", clean_up_tokenization_spaces: false },
});
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
// decode() rejects an empty list, which the empty string encodes to.
const decode = (row) => (row.length ? tokenizer.decode(row, { skip_special_tokens: false }) : "");
const ids = corpus.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
const withSpecial = corpus.map((text) => tokenizer.encode(text, { add_special_tokens: true }));
process.stdout.write(
  JSON.stringify({
    ids,
    decoded: ids.map(decode),
    ids_with_special_tokens: withSpecial,
    decoded_with_special_tokens: withSpecial.map(decode),
  }),
);
