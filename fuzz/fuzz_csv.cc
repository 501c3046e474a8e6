// libFuzzer entry for the CSV tabular dataset parser. Besides the sanitizers' checks it asserts that the streaming
// validator and the in-memory parser agree, that every rejection carries a message, and that what the parser accepts
// is internally consistent (one label per row, features = rows x columns, ids within the class list).
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
  std::fprintf(stderr, "fuzz_csv: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::data;
  const std::string_view contents(reinterpret_cast<const char*>(data), size);
  // Small caps keep runs cheap and make the caps' error paths reachable.
  const Limits limits{.max_line_bytes = 4096, .max_columns = 64, .max_classes = 16};
  const TabularOptions options;  // label column "label", classes from the data

  auto parsed = ParseTabular(contents, options, limits);
  std::istringstream stream{std::string(contents)};
  auto validated = ValidateTabular(stream, options, limits);
  if (parsed.ok() != validated.ok()) Fail("ParseTabular and ValidateTabular disagree on acceptance");
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) Fail("rejection without a message");
    if (parsed.status() != validated.status()) Fail("ParseTabular and ValidateTabular give different errors");
    return 0;
  }
  if (validated->num_rows != parsed->num_rows()) Fail("row count differs");
  if (validated->feature_names != parsed->feature_names) Fail("feature names differ");
  if (validated->class_names != parsed->class_names) Fail("class names differ");
  if (parsed->features.size() != static_cast<size_t>(parsed->num_rows() * parsed->num_features())) {
    Fail("feature matrix size is not rows x columns");
  }
  for (int64_t label : parsed->labels) {
    if (label < 0 || label >= static_cast<int64_t>(parsed->class_names.size())) Fail("label id out of range");
  }
  // Loading again with the class list given (as a shard is loaded) must map labels alike.
  TabularOptions with_classes;
  with_classes.class_names = parsed->class_names;
  auto shard = ParseTabular(contents, with_classes, limits);
  if (!shard.ok() || shard->labels != parsed->labels) Fail("loading with the same class list maps labels differently");
  return 0;
}
