// libFuzzer entry for the JSONL text dataset parser. Besides the sanitizers' checks it asserts that the streaming
// validator and the in-memory parser agree (both on a whole file and on its first line alone), that every rejection
// carries a message, and that accepted rows survive TextRowToJsonl -> ParseText unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "data/dataset.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_jsonl: %s\n", what);
  std::abort();
}

void Check(std::string_view contents) {
  using namespace parsyn::data;
  // A small line cap keeps runs cheap and makes the cap's error path reachable.
  const Limits limits{.max_line_bytes = 4096};
  auto parsed = ParseText(contents, limits);
  std::istringstream stream{std::string(contents)};
  auto validated = ValidateText(stream, limits);
  if (parsed.ok() != validated.ok()) Fail("ParseText and ValidateText disagree on acceptance");
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) Fail("rejection without a message");
    if (parsed.status() != validated.status()) Fail("ParseText and ValidateText give different errors");
    return;
  }
  if (validated->kind != parsed->kind) Fail("kind differs");
  if (validated->num_rows != static_cast<int64_t>(parsed->rows.size())) Fail("row count differs");
  if (validated->size_bytes != contents.size()) Fail("size_bytes is not the input's size");

  std::string rewritten;
  for (const TextRow& row : parsed->rows) rewritten += TextRowToJsonl(row, parsed->kind) + "\n";
  auto again = ParseText(rewritten, Limits{.max_line_bytes = 1 << 20});
  if (!again.ok()) Fail("re-reading our own JSONL failed");
  if (again->kind != parsed->kind || again->rows.size() != parsed->rows.size()) Fail("round trip changed the shape");
  for (size_t i = 0; i < parsed->rows.size(); ++i) {
    const TextRow& a = parsed->rows[i];
    const TextRow& b = again->rows[i];
    if (a.text != b.text || a.prompt != b.prompt || a.completion != b.completion) Fail("round trip changed a row");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view contents(reinterpret_cast<const char*>(data), size);
  Check(contents);
  // One line alone: the per-line path without the file-level context.
  const size_t newline = contents.find('\n');
  if (newline != std::string_view::npos) Check(contents.substr(0, newline));
  return 0;
}
