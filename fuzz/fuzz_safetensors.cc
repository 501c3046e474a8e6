// libFuzzer entry for the safetensors reader. Besides the sanitizers' checks, it asserts that an accepted image
// survives Serialize -> Parse unchanged, so a reader that accepts something it cannot represent is caught too, and
// that the header-only check (ReadSafetensorsLayout) accepts exactly what the reader accepts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "weights/safetensors.h"
#include "weights/weight_set.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::weights;
  // Small caps keep each run cheap and make the cap checks reachable.
  const SafetensorsLimits limits{.max_header_bytes = 1 << 16, .max_tensors = 256};
  const std::span<const std::byte> input = std::as_bytes(std::span<const uint8_t>(data, size));
  auto parsed = ParseSafetensors(input, limits);
  // The header-only check (model registration) must give the reader's verdict without the tensor bytes.
  size_t offset = 0;
  auto layout = ReadSafetensorsLayout(
      size,
      [&](std::span<std::byte> buffer) -> parsyn::StatusOr<size_t> {
        const size_t n = std::min(buffer.size(), size - offset);
        if (n > 0) std::memcpy(buffer.data(), data + offset, n);
        offset += n;
        return n;
      },
      limits);
  if (layout.ok() != parsed.ok()) Fail("the header-only check and the reader disagree");
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) Fail("rejection without a message");
    return 0;
  }
  // Exercise the scans an accepted update goes through.
  CheckFinite(*parsed).IgnoreError();  // NaNs are legal in a file; only the scan's safety is under test here

  std::vector<std::byte> image = SerializeSafetensors(*parsed);
  auto again = ParseSafetensors(image, SafetensorsLimits{.max_header_bytes = 1 << 20, .max_tensors = 256});
  if (!again.ok()) Fail("re-reading our own serialisation failed");
  if (!parsed->CheckSameLayout(*again).ok()) Fail("layout changed in a round trip");
  if (parsed->metadata() != again->metadata()) Fail("metadata changed in a round trip");
  for (size_t i = 0; i < parsed->size(); ++i) {
    const Tensor& a = (*parsed)[i];
    const Tensor& b = (*again)[i];
    if (a.data.size() != b.data.size() ||
        (a.data.size() > 0 && std::memcmp(a.data.data(), b.data.data(), a.data.size()) != 0)) {
      Fail("tensor bytes changed in a round trip");
    }
  }
  return 0;
}
