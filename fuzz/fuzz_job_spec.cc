// libFuzzer entry for the job spec parser (request bodies of POST /api/v1/training-jobs). Besides the sanitizers'
// checks it asserts the header's contract: every rejection is InvalidArgument with a message, and any accepted spec
// survives JobSpecToJsonString -> ParseJobSpec unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "coordinator/job_spec.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_job_spec: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::coordinator;
  auto spec = ParseJobSpec(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) {
    if (spec.status().code() != parsyn::StatusCode::kInvalidArgument) Fail("rejection is not InvalidArgument");
    if (spec.status().message().empty()) Fail("rejection without a message");
    return 0;
  }
  auto again = ParseJobSpec(JobSpecToJsonString(*spec));
  if (!again.ok()) {
    std::fprintf(stderr, "%s\n", again.status().ToString().c_str());
    Fail("the normalised form of an accepted spec does not parse");
  }
  if (!(*again == *spec)) Fail("the normalised form parses to a different spec");
  return 0;
}
