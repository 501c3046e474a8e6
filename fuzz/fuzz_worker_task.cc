// libFuzzer entry for what the worker parses from the coordinator: the task of GET /api/v1/worker/tasks/next, and
// the answers to its hello and heartbeat. The text goes the worker's way (http::ClientResponse::Json: the nesting
// check, then nlohmann's parser), then into the protocol reader. The first byte picks the message, the rest is the
// body. Besides the sanitizers' checks it asserts the readers' contract: a rejection is InvalidArgument with a
// message, and whatever is accepted is written back (TaskJsonText, ...) and read again to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "http/client.h"
#include "protocol/messages.h"

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_worker_task: %s %s\n", what, detail.c_str());
  std::abort();
}

// The worker's own reading of a response body. (Its rejections are checked too: InvalidArgument, never a throw.)
std::optional<json> WorkerJson(std::string_view body) {
  const parsyn::http::ClientResponse response{.status = 200, .body = std::string(body), .headers = {}};
  parsyn::StatusOr<json> parsed = response.Json();
  if (parsed.ok()) return *std::move(parsed);
  if (parsed.status().code() != parsyn::StatusCode::kInvalidArgument)
    Fail("Json() refused with", parsed.status().ToString());
  return std::nullopt;
}

template <typename Message, typename Parse, typename Write>
void RoundTrip(const json& body, Parse parse, Write write) {
  parsyn::StatusOr<Message> message = parse(body);
  if (!message.ok()) {
    if (message.status().code() != parsyn::StatusCode::kInvalidArgument) Fail("rejection is not InvalidArgument");
    if (message.status().message().empty()) Fail("rejection without a message");
    return;
  }
  // What the coordinator writes goes over the wire as text: the worker reads it back from there.
  const std::string written = write(*message);
  std::optional<json> text = WorkerJson(written);
  if (!text) Fail("the written form is not JSON the worker reads", written);
  parsyn::StatusOr<Message> again = parse(*text);
  if (!again.ok()) Fail("the written form of an accepted message does not parse:", again.status().ToString());
  if (!(*again == *message)) Fail("the written form parses to a different message", written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace parsyn::protocol;
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::optional<json> parsed = WorkerJson(body);
  if (!parsed) return 0;
  switch (data[0] % 3) {
    case 0:
      RoundTrip<Task>(
          *parsed, [](const json& j) { return ParseTask(j); }, [](const Task& t) { return TaskJsonText(t); });
      break;
    case 1:
      RoundTrip<HelloAnswer>(
          *parsed, [](const json& j) { return ParseHelloAnswer(j); },
          [](const HelloAnswer& a) { return HelloAnswerToJson(a).dump(); });
      break;
    default:
      RoundTrip<HeartbeatAnswer>(
          *parsed, [](const json& j) { return ParseHeartbeatAnswer(j); },
          [](const HeartbeatAnswer& a) { return HeartbeatAnswerToJson(a).dump(); });
      break;
  }
  return 0;
}
