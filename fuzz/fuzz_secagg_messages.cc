// libFuzzer entry for secure aggregation's messages (src/secagg/messages.h), which both sides read from untrusted
// peers: the first byte picks 0 a round setup (a worker reads it from the coordinator), 1 advertised keys, 2 a sealed
// share, 3 a revealed share (the coordinator reads them from workers), 4 a masked input vector (its bytes as they
// are, 16- or 32-bit elements by the second byte), 5 dp_fedavg's distributed noise (sent with the setup). The text goes
// through the nesting check and nlohmann's parser, then the reader. Besides the sanitizers' checks it asserts the
// readers' contract: a rejection is InvalidArgument with a message, and whatever is accepted is written back and read
// again to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/json_nesting.h"
#include "secagg/messages.h"
#include "secagg/ring.h"

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_secagg_messages: %s %s\n", what, detail.c_str());
  std::abort();
}

void CheckRejection(const parsyn::Status& status) {
  if (status.code() != parsyn::StatusCode::kInvalidArgument)
    Fail("rejection is not InvalidArgument", status.ToString());
  if (status.message().empty()) Fail("rejection without a message");
}

template <typename Parse>
void RoundTrip(const json& body, Parse parse) {
  auto message = parse(body);
  if (!message.ok()) {
    CheckRejection(message.status());
    return;
  }
  const std::string written = parsyn::secagg::ToJson(*message).dump();
  auto again = parse(json::parse(written, nullptr, false));
  if (!again.ok()) Fail("the written form of an accepted message does not parse:", again.status().ToString());
  if (!(*again == *message)) Fail("the written form parses to a different message", written);
}

void MaskedInput(std::string_view bytes) {
  if (bytes.empty()) return;
  const int ring_bits = bytes[0] % 2 ? 32 : 16;
  bytes.remove_prefix(1);
  const size_t elements = bytes.size() / static_cast<size_t>(ring_bits / 8);
  auto values = parsyn::secagg::UnpackRing(bytes, ring_bits, elements);
  if (!values.ok()) {
    CheckRejection(values.status());
    return;
  }
  if (parsyn::secagg::PackRing(*values, ring_bits) != bytes) Fail("a masked vector does not pack back to its bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::secagg;
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 6 == 4) {
    MaskedInput(body);
    return 0;
  }
  if (!parsyn::CheckJsonNesting(body, "message").ok()) return 0;
  const json parsed = json::parse(body, nullptr, false);
  if (parsed.is_discarded()) return 0;
  switch (data[0] % 6) {
    case 0: RoundTrip(parsed, [](const json& j) { return ParseRoundSetup(j); }); break;
    case 1: RoundTrip(parsed, [](const json& j) { return ParseAdvertisedKeys(j); }); break;
    case 2: RoundTrip(parsed, [](const json& j) { return ParseSealedShare(j); }); break;
    case 3: RoundTrip(parsed, [](const json& j) { return ParseRevealedShare(j); }); break;
    default: RoundTrip(parsed, [](const json& j) { return ParseDistributedNoise(j); }); break;
  }
  return 0;
}
